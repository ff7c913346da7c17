// Remote fetch throughput between two processes, through the full read path.
//
// Forks a "home" (rank 1) that promotes its share of the files into its RAM
// tier, and a "client" (rank 0) with no tier of its own (policy none), so
// every read of a file homed at rank 1 is a peer fetch: request, the reply
// sent from the home's RAM copy with a CRC32C combined from the copy's block
// sums (eagerly up to 256 KiB, straight into the caller's buffer; larger
// ones into a registered receive buffer, then copied to the caller), length
// and CRC checks.
// Each size class is read whole-file by T threads until ~4 GiB have moved.
// Prints one line per class; bench/remote_fetch.py compares them with
// ucx_perftest on the same transport in the same run.
//
//   bench_remote_fetch DIR [threads] [transports]

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "monarch/monarch.h"
#include "remote/rendezvous_hash.h"

namespace {

struct SizeClass {
  const char* dir;
  uint64_t size;
  int files;
};
const SizeClass kClasses[] = {
    {"s128k", 128 << 10, 2048}, {"s1m", 1 << 20, 512}, {"s16m", 16 << 20, 48}};

void Generate(const std::string& dataset) {
  std::mt19937_64 rng(1);
  std::vector<uint64_t> block(1 << 17);
  for (const SizeClass& c : kClasses) {
    const std::string dir = dataset + "/" + c.dir;
    ::mkdir(dir.c_str(), 0755);
    for (int i = 0; i < c.files; ++i) {
      const std::string path = dir + "/f" + std::to_string(i);
      struct stat st;
      if (::stat(path.c_str(), &st) == 0 && static_cast<uint64_t>(st.st_size) == c.size) continue;
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      for (uint64_t done = 0; done < c.size; done += block.size() * 8) {
        for (auto& w : block) w = rng();
        out.write(reinterpret_cast<const char*>(block.data()),
                  std::min<uint64_t>(block.size() * 8, c.size - done));
      }
    }
  }
}

std::string Config(const std::string& dataset, const std::string& rdv, int rank,
                   const std::string& transports) {
  return "dataset: {path: " + dataset + "}\n" +
         "tiers:\n  - {kind: ram, capacity: 2GiB}\n  - {kind: source}\n" +
         (rank == 0 ? "placement: {policy: none}\n" : "") +
         "remote:\n  enabled: true\n  rank: " + std::to_string(rank) +
         "\n  size: 2\n  rendezvous_dir: " + rdv + "\n  transports: " + transports + "\n";
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

void WaitFor(const std::string& path) {
  while (!Exists(path)) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

// CPU seconds (user + system) `pid` has used so far, from /proc.
double CpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t end_of_name = text.rfind(')');  // The name may hold spaces.
  if (end_of_name == std::string::npos) return 0;
  std::istringstream fields(text.substr(end_of_name + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_remote_fetch DIR [threads] [transports]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const int threads = argc > 2 ? std::atoi(argv[2]) : 4;
  const std::string transports = argc > 3 ? argv[3] : "tcp";
  const std::string dataset = dir + "/dataset";
  const std::string rdv = dir + "/rdv-" + std::to_string(::getpid());
  ::mkdir(dir.c_str(), 0755);
  ::mkdir(dataset.c_str(), 0755);
  Generate(dataset);
  const std::string ready = rdv + "/home-ready", done = rdv + "/client-done";

  const pid_t home = ::fork();
  const int rank = home == 0 ? 1 : 0;
  auto created = monarch::Monarch::CreateFromYamlString(Config(dataset, rdv, rank, transports));
  if (!created.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, created.status().ToString().c_str());
    return 1;
  }
  monarch::Monarch& m = **created;
  std::vector<std::vector<std::string>> home_files(std::size(kClasses));
  for (size_t c = 0; c < std::size(kClasses); ++c) {
    for (int i = 0; i < kClasses[c].files; ++i) {
      std::string name = std::string(kClasses[c].dir) + "/f" + std::to_string(i);
      if (monarch::HomeRank(monarch::StableNameHash(name), 2) == 1) home_files[c].push_back(name);
    }
  }

  if (rank == 1) {  // The home: load its share into RAM, then serve until the client is done.
    std::vector<char> buffer(16 << 20);
    for (const auto& names : home_files)
      for (const auto& name : names) (void)m.Read(name, buffer.data(), buffer.size(), 0);
    m.WaitForPlacement();
    std::ofstream(ready).flush();
    WaitFor(done);
    m.Shutdown(monarch::Monarch::ShutdownMode::kCancel);
    created->reset();
    ::_exit(0);
  }

  WaitFor(ready);
  int failures = 0;
  for (size_t c = 0; c < std::size(kClasses); ++c) {
    const std::vector<std::string>& names = home_files[c];
    const uint64_t size = kClasses[c].size;
    // Warm-up (connections, first touches of the buffers), then the timed rounds.
    const uint64_t target = 4ull << 30;
    const int rounds = static_cast<int>(std::max<uint64_t>(1, target / (size * names.size())));
    std::atomic<uint64_t> bytes{0};
    std::atomic<int> bad{0};
    auto run = [&](int round_count) {
      std::atomic<size_t> next{0};
      const size_t total = names.size() * round_count;
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&] {
          std::vector<char> buffer(size);
          for (size_t k; (k = next.fetch_add(1)) < total;) {
            auto got = m.Read(names[k % names.size()], buffer.data(), size, 0);
            if (!got.ok() || *got != size) bad.fetch_add(1);
            bytes.fetch_add(size);
          }
        });
      }
      for (auto& t : pool) t.join();
    };
    run(1);
    const monarch::Stats before = m.GetStats();
    bytes = 0;
    const double home_cpu_before = CpuSeconds(home), client_cpu_before = CpuSeconds(::getpid());
    const auto start = std::chrono::steady_clock::now();
    run(rounds);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // What a GiB moved costs each side's cores (the kernel's TCP work included).
    const double gib = static_cast<double>(bytes.load()) / (1 << 30);
    const double home_cpu = (CpuSeconds(home) - home_cpu_before) / gib;
    const double client_cpu = (CpuSeconds(::getpid()) - client_cpu_before) / gib;
    const monarch::Stats after = m.GetStats();
    const uint64_t source_reads = after.Source("reads") - before.Source("reads");
    const uint64_t fallbacks = after.Get("remote.fallbacks") - before.Get("remote.fallbacks");
    failures += bad.load() + static_cast<int>(source_reads) + static_cast<int>(fallbacks);
    std::printf(
        "fetch size=%llu threads=%d files=%zu rounds=%d seconds=%.3f MBps=%.1f source_reads=%llu "
        "fallbacks=%llu errors=%d home_cpu_s_per_gib=%.3f client_cpu_s_per_gib=%.3f\n",
        static_cast<unsigned long long>(size), threads, names.size(), rounds, seconds,
        bytes.load() / seconds / 1e6, static_cast<unsigned long long>(source_reads),
        static_cast<unsigned long long>(fallbacks), bad.load(), home_cpu, client_cpu);
    std::fflush(stdout);
  }
  std::ofstream(done).flush();
  int status = 0;
  ::waitpid(home, &status, 0);
  std::printf("stats: %s\n", m.GetStats().ToJson().c_str());
  std::system(("rm -rf '" + rdv + "'").c_str());
  return failures == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
