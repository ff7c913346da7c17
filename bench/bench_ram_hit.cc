// bench_ram_hit: the cost of a read served from the RAM tier.
//
// 1. Per-call latency of 4 KiB reads at random (file, offset) through
//    Monarch::Read, as percentiles. Target: p50 under 1 us.
// 2. Throughput of 256 KiB reads through Monarch::Read relative to a plain
//    memcpy loop over the same bytes held in plain buffers, same order, same
//    thread count. Target: at least 70% of memcpy.
//
// usage: bench_ram_hit [files=64] [file_mib=4] [threads=1] [memory_watch=1]
// (memory_watch 0: memory.watch off, so hits do not pin their copy).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "monarch/monarch.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int files = argc > 1 ? std::atoi(argv[1]) : 64;
  const size_t file_bytes = (argc > 2 ? std::atoi(argv[2]) : 4) << 20;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 1;
  char pattern[] = "/tmp/monarch-bench-XXXXXX";
  const std::string root = ::mkdtemp(pattern);

  std::mt19937_64 rng(7);
  std::vector<std::string> names;
  std::vector<std::vector<char>> plain(files, std::vector<char>(file_bytes));
  for (int i = 0; i < files; ++i) {
    for (char& c : plain[i]) c = static_cast<char>(rng());
    names.push_back("f" + std::to_string(i) + ".bin");
    std::ofstream(root + "/" + names.back(), std::ios::binary).write(plain[i].data(), file_bytes);
  }

  monarch::Config config = monarch::DefaultConfig(root);
  config.tiers[0].capacity_bytes = uint64_t{2} * files * file_bytes;
  if (argc > 4) config.memory.watch = std::atoi(argv[4]) != 0;
  auto created = monarch::Monarch::Create(config);
  if (!created.ok()) {
    std::fprintf(stderr, "%s\n", created.status().ToString().c_str());
    return 1;
  }
  auto& m = *created;
  std::vector<char> scratch(file_bytes);
  for (const std::string& name : names) (void)m->Read(name, scratch.data(), file_bytes, 0);
  m->WaitForPlacement();
  if (m->GetStats().Tier(0, "files") != static_cast<uint64_t>(files)) {
    std::fprintf(stderr, "not everything was promoted\n");
    return 1;
  }

  // 1. 4 KiB latency.
  constexpr int kLatencyReads = 200000;
  constexpr size_t kSmall = 4096;
  std::vector<std::pair<int, uint64_t>> small_ops(kLatencyReads);
  for (auto& op : small_ops) op = {static_cast<int>(rng() % files), rng() % (file_bytes - kSmall)};
  std::vector<double> latency_ns(kLatencyReads);
  char small[kSmall];
  for (int i = 0; i < kLatencyReads; ++i) {
    auto start = Clock::now();
    (void)m->Read(names[small_ops[i].first], small, kSmall, small_ops[i].second);
    latency_ns[i] = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
  }
  // Baseline: the timer alone plus a 4 KiB memcpy from the plain buffers.
  std::vector<double> memcpy_ns(kLatencyReads);
  for (int i = 0; i < kLatencyReads; ++i) {
    auto start = Clock::now();
    std::memcpy(small, plain[small_ops[i].first].data() + small_ops[i].second, kSmall);
    asm volatile("" : : "r"(small) : "memory");
    memcpy_ns[i] = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
  }
  auto percentile = [](std::vector<double> v, double p) {
    std::sort(v.begin(), v.end());
    return v[static_cast<size_t>(p * (v.size() - 1))];
  };

  // 2. 256 KiB throughput, `threads` readers, same op sequence for both.
  constexpr size_t kLarge = 256 << 10;
  const int large_reads = 40000;
  std::vector<std::pair<int, uint64_t>> large_ops(large_reads);
  for (auto& op : large_ops)
    op = {static_cast<int>(rng() % files), (rng() % (file_bytes / kLarge)) * kLarge};
  auto run = [&](bool through_monarch) {
    auto start = Clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        std::vector<char> buffer(kLarge);
        for (int i = t; i < large_reads; i += threads) {
          const auto& [file, offset] = large_ops[i];
          if (through_monarch) {
            (void)m->Read(names[file], buffer.data(), kLarge, offset);
          } else {
            std::memcpy(buffer.data(), plain[file].data() + offset, kLarge);
            asm volatile("" : : "r"(buffer.data()) : "memory");
          }
        }
      });
    }
    for (auto& t : pool) t.join();
    return static_cast<double>(large_reads) * kLarge / Seconds(start) / (1 << 30);
  };
  run(false);  // Warm both paths once.
  run(true);
  double best_memcpy = 0, best_monarch = 0;
  for (int rep = 0; rep < 5; ++rep) {
    best_memcpy = std::max(best_memcpy, run(false));
    best_monarch = std::max(best_monarch, run(true));
  }

  std::printf("RAM-tier hit, %d files x %zu MiB, %d thread(s)\n", files, file_bytes >> 20, threads);
  std::printf(
      "4KiB read latency through Monarch: p50 %.0f ns, p90 %.0f ns, p99 %.0f ns (target p50 < 1000 "
      "ns)\n",
      percentile(latency_ns, 0.5), percentile(latency_ns, 0.9), percentile(latency_ns, 0.99));
  std::printf("4KiB plain memcpy baseline:        p50 %.0f ns, p99 %.0f ns\n",
              percentile(memcpy_ns, 0.5), percentile(memcpy_ns, 0.99));
  std::printf(
      "256KiB throughput: Monarch %.2f GiB/s, memcpy %.2f GiB/s, ratio %.2f (target >= 0.70)\n",
      best_monarch, best_memcpy, best_monarch / best_memcpy);
  m.reset();
  std::system(("rm -rf " + root).c_str());
  return 0;
}
