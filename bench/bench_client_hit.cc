// bench_client_hit: the cost of a RAM-tier hit served in a node service's
// client, against the same hit in an in-process Monarch and a plain memcpy,
// all measured in the same run.
//
// Setup: `files` random files of `file_mib` MiB; one in-process Monarch (RAM
// tier over the source, no node section) and one node service over the same
// dataset with the same tiers, started as a child process (`monarch serve
// --config FILE`, found next to this binary's directory or given with
// --monarch PATH; --in-process-service starts a NodeService in this process
// instead), plus a client of it (`node.shared: true`). Both are fully warm:
// every file read once, WaitForPlacement(), every file in the RAM tier
// (checked), and every file read once more, so the client has touched its
// read-only mapping of the service's arena.
//
// Each repetition measures, in a rotating order so no variant always goes
// first:
//   1. single-thread latency of 4 KiB reads at random (file, offset), the
//      same operation list for each variant: p50 and p99 (ns, timer
//      included), in-process, client and memcpy from plain buffers;
//   2. throughput of 256 KiB reads (`threads` readers), same op list:
//      memcpy from plain buffers, in-process, client (GiB/s);
//   3. first touch: a fresh client (new mappings of the service's arena, so
//      its first hits take page faults) reads the whole dataset once in
//      256 KiB pieces, then the warm client reads the same (GiB/s, ratio).
// It prints each repetition, then min/median/max over the repetitions of
// every figure and of the ratios, with the targets:
//   client 4 KiB p50 <= 1000 ns; client 256 KiB throughput / memcpy >= 0.8.
//
// usage: bench_client_hit [--files N=64] [--file-mib M=4] [--threads T=1]
//                         [--reps R=7] [--monarch PATH] [--in-process-service]
//                         [--huge-pages]
// --huge-pages gives the RAM tier `huge_pages: true`; it takes effect only
// where /sys/kernel/mm/transparent_hugepage/shmem_enabled allows (printed).

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "monarch/config.h"
#include "monarch/monarch.h"
#include "service/node_service.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * (v.size() - 1))];
}

struct Spread {
  double min, median, max;
};
Spread SpreadOf(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v.front(), v[v.size() / 2], v.back()};
}

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "bench_client_hit: %s\n", message.c_str());
  std::exit(1);
}

// The `monarch` binary: build/bench/bench_client_hit -> build/monarch.
std::string DefaultMonarchBinary() {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "";
  std::string path(self, static_cast<size_t>(n));
  path = path.substr(0, path.rfind('/'));    // build/bench
  path = path.substr(0, path.rfind('/'));    // build
  return path + "/monarch";
}

// Keeps the warm-up loop's reads from being optimized away.
void Consume(const void* p) { asm volatile("" : : "r"(p) : "memory"); }

}  // namespace

int main(int argc, char** argv) {
  int files = 64, file_mib = 4, threads = 1, reps = 7;
  bool in_process_service = false, huge_pages = false;
  std::string monarch_binary = DefaultMonarchBinary();
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) Die(flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--files") files = std::atoi(value());
    else if (flag == "--file-mib") file_mib = std::atoi(value());
    else if (flag == "--threads") threads = std::atoi(value());
    else if (flag == "--reps") reps = std::atoi(value());
    else if (flag == "--monarch") monarch_binary = value();
    else if (flag == "--in-process-service") in_process_service = true;
    else if (flag == "--huge-pages") huge_pages = true;
    else Die("usage: bench_client_hit [--files N] [--file-mib M] [--threads T] [--reps R] "
             "[--monarch PATH] [--in-process-service] [--huge-pages]");
  }
  if (files < 1 || file_mib < 1 || threads < 1 || reps < 1) Die("bad arguments");
  const size_t file_bytes = static_cast<size_t>(file_mib) << 20;
  if (!in_process_service && ::access(monarch_binary.c_str(), X_OK) != 0) {
    std::printf("note: %s not found, starting the NodeService in this process\n",
                monarch_binary.c_str());
    in_process_service = true;
  }

  char pattern[] = "/tmp/monarch-chit-XXXXXX";
  if (::mkdtemp(pattern) == nullptr) Die("mkdtemp");
  const std::string work = pattern;
  const std::string root = work + "/data";
  const std::string runtime_dir = work + "/run";
  std::system(("mkdir -p " + root).c_str());

  std::mt19937_64 rng(7);
  std::vector<std::string> names;
  std::vector<std::vector<char>> plain(files, std::vector<char>(file_bytes));
  for (int i = 0; i < files; ++i) {
    for (size_t b = 0; b + 8 <= file_bytes; b += 8) {
      const uint64_t r = rng();
      std::memcpy(&plain[i][b], &r, 8);
    }
    names.push_back("f" + std::to_string(i) + ".bin");
    std::ofstream(root + "/" + names.back(), std::ios::binary).write(plain[i].data(), file_bytes);
  }

  // The same tiers for both; the client's config adds the node section.
  const uint64_t capacity = uint64_t{2} * files * file_bytes;
  const std::string embedded_yaml =
      absl::StrCat("dataset: {path: ", root, "}\ntiers:\n  - {name: ram, kind: ram, capacity: ",
                   capacity, huge_pages ? ", huge_pages: true" : "",
                   "}\n  - {name: source, kind: source}\n");
  if (huge_pages) {
    std::string shmem;
    std::getline(std::ifstream("/sys/kernel/mm/transparent_hugepage/shmem_enabled"), shmem);
    std::printf("RAM tier huge_pages: true; transparent_hugepage/shmem_enabled: %s\n",
                shmem.c_str());
  }
  const std::string node_yaml = absl::StrCat(
      embedded_yaml, "node: {shared: true, runtime_dir: ", runtime_dir,
      ", autostart: false, idle_exit: 0}\n");

  auto embedded_or = monarch::Monarch::CreateFromYamlString(embedded_yaml);
  if (!embedded_or.ok()) Die(embedded_or.status().ToString());
  std::unique_ptr<monarch::Monarch> embedded = std::move(*embedded_or);

  // The service: a child `monarch serve`, or a NodeService in this process.
  pid_t service_pid = -1;
  std::unique_ptr<monarch::service::NodeService> in_process;
  const std::string config_file = work + "/node.yaml";
  std::ofstream(config_file) << node_yaml;
  if (in_process_service) {
    auto config = monarch::ParseValidConfigString(node_yaml);
    if (!config.ok()) Die(config.status().ToString());
    auto started = monarch::service::NodeService::Start(*config);
    if (!started.ok()) Die(started.status().ToString());
    in_process = std::move(*started);
  } else {
    const std::string log = work + "/serve.log";
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    std::string a0 = monarch_binary, a1 = "serve", a2 = "--config", a3 = config_file;
    char* args[] = {a0.data(), a1.data(), a2.data(), a3.data(), nullptr};
    if (posix_spawn(&service_pid, a0.c_str(), &actions, nullptr, args, environ) != 0) {
      Die("cannot start " + monarch_binary);
    }
    posix_spawn_file_actions_destroy(&actions);
  }
  std::unique_ptr<monarch::Monarch> client;
  for (auto give_up = Clock::now() + std::chrono::seconds(30);;) {
    auto made = monarch::Monarch::CreateFromYamlString(node_yaml);
    if (made.ok()) {
      client = std::move(*made);
      break;
    }
    int status;
    if (service_pid > 0 && ::waitpid(service_pid, &status, WNOHANG) == service_pid) {
      Die("monarch serve exited; see " + work + "/serve.log");
    }
    if (Clock::now() > give_up) Die(made.status().ToString());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  // Warm both: every file promoted to RAM, then read once more (the client
  // faults its mapping of the service's arena in).
  std::vector<char> scratch(file_bytes);
  for (monarch::Monarch* m : {embedded.get(), client.get()}) {
    for (const std::string& name : names) (void)m->Read(name, scratch.data(), file_bytes, 0);
    m->WaitForPlacement();
    const uint64_t in_ram = m->GetStats().Tier(0, "files");
    if (in_ram != static_cast<uint64_t>(files)) {
      Die(absl::StrCat("only ", in_ram, " of ", files, " files promoted to RAM"));
    }
    for (const std::string& name : names) {
      auto got = m->Read(name, scratch.data(), file_bytes, 0);
      if (!got.ok() || *got != file_bytes) Die("warm read failed");
      if (std::memcmp(scratch.data(), plain[&name - names.data()].data(), file_bytes) != 0) {
        Die("warm read returned wrong bytes");
      }
    }
  }
  const uint64_t hits_before = client->GetStats().Tier(0, "reads");

  // Op lists, shared by the variants.
  constexpr int kLatencyReads = 200000;
  constexpr size_t kSmall = 4096;
  std::vector<std::pair<int, uint64_t>> small_ops(kLatencyReads);
  for (auto& op : small_ops) op = {static_cast<int>(rng() % files), rng() % (file_bytes - kSmall)};
  constexpr size_t kLarge = 256 << 10;
  const int large_reads = std::max<int>(4000, static_cast<int>((uint64_t{10} << 30) / kLarge / 4));
  std::vector<std::pair<int, uint64_t>> large_ops(large_reads);
  for (auto& op : large_ops) {
    op = {static_cast<int>(rng() % files), (rng() % (file_bytes / kLarge)) * kLarge};
  }

  enum Variant { kMemcpy = 0, kEmbedded = 1, kClient = 2 };
  const char* variant_names[] = {"memcpy", "in-process", "client"};
  auto read_one = [&](int variant, int file, uint64_t offset, char* dst, size_t n) {
    if (variant == kMemcpy) {
      std::memcpy(dst, plain[file].data() + offset, n);
      Consume(dst);
    } else {
      monarch::Monarch* m = variant == kEmbedded ? embedded.get() : client.get();
      auto got = m->Read(names[file], dst, n, offset);
      if (!got.ok() || *got != n) Die("read failed during the measurement");
    }
  };
  auto latency = [&](int variant, double* p50, double* p99) {
    std::vector<double> ns(kLatencyReads);
    char small[kSmall];
    for (int i = 0; i < kLatencyReads; ++i) {
      const auto start = Clock::now();
      read_one(variant, small_ops[i].first, small_ops[i].second, small, kSmall);
      ns[i] = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
    }
    *p50 = Percentile(ns, 0.5);
    *p99 = Percentile(ns, 0.99);
  };
  auto throughput = [&](int variant) {
    const auto start = Clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        std::vector<char> buffer(kLarge);
        for (int i = t; i < large_reads; i += threads) {
          read_one(variant, large_ops[i].first, large_ops[i].second, buffer.data(), kLarge);
        }
      });
    }
    for (auto& t : pool) t.join();
    return static_cast<double>(large_reads) * kLarge / Seconds(start) / (1 << 30);
  };
  for (int v = 0; v < 3; ++v) throughput(v);  // Warm every path once.

  // A client's first hits on a copy fault its read-only mapping of the
  // service's arena in (the service populates only its own page tables). A
  // fresh client (new mappings) reads the whole dataset once in 256 KiB
  // pieces, then the warm client reads the same sequence.
  auto sequential = [&](monarch::Monarch* m) {
    std::vector<char> buffer(kLarge);
    const auto start = Clock::now();
    for (int f = 0; f < files; ++f) {
      for (uint64_t offset = 0; offset < file_bytes; offset += kLarge) {
        auto got = m->Read(names[f], buffer.data(), kLarge, offset);
        if (!got.ok() || *got != kLarge) Die("read failed during the first-touch measurement");
      }
    }
    return static_cast<double>(files) * file_bytes / Seconds(start) / (1 << 30);
  };
  auto first_touch = [&](double* fresh_gibps, double* warm_gibps) {
    auto fresh = monarch::Monarch::CreateFromYamlString(node_yaml);
    if (!fresh.ok()) Die(fresh.status().ToString());
    *fresh_gibps = sequential(fresh->get());
    *warm_gibps = sequential(client.get());
  };

  std::printf("client hit vs in-process hit vs memcpy: %d files x %d MiB, %d thread(s) for "
              "256 KiB, 1 thread for 4 KiB; service %s; %d repetitions\n",
              files, file_mib, threads,
              in_process_service ? "NodeService in this process" : "child `monarch serve`", reps);
  std::printf("%4s %-10s %10s %10s %12s\n", "rep", "variant", "4K p50 ns", "4K p99 ns",
              "256K GiB/s");
  // [variant] -> per repetition.
  std::vector<double> p50[3], p99[3], gibps[3], fresh_gibps, warm_gibps;
  for (int rep = 0; rep < reps; ++rep) {
    for (int k = 0; k < 3; ++k) {
      const int v = (rep + k) % 3;  // Rotate who goes first.
      double a, b;
      latency(v, &a, &b);
      p50[v].push_back(a);
      p99[v].push_back(b);
      gibps[v].push_back(throughput(v));
    }
    double fresh, warm;
    first_touch(&fresh, &warm);
    fresh_gibps.push_back(fresh);
    warm_gibps.push_back(warm);
    for (int v = 0; v < 3; ++v) {
      std::printf("%4d %-10s %10.0f %10.0f %12.2f\n", rep + 1, variant_names[v], p50[v].back(),
                  p99[v].back(), gibps[v].back());
    }
    std::printf("%4d first touch: fresh client %.2f GiB/s, warm client %.2f GiB/s (whole dataset "
                "once, 256 KiB sequential)\n", rep + 1, fresh, warm);
    std::fflush(stdout);
  }

  auto ratio = [&](const std::vector<double>& a, const std::vector<double>& b) {
    std::vector<double> r;
    for (size_t i = 0; i < a.size(); ++i) r.push_back(a[i] / b[i]);
    return r;
  };
  auto row = [](const char* what, const std::vector<double>& v, const char* format,
                const char* target) {
    const Spread s = SpreadOf(v);
    std::printf("%-44s ", what);
    std::printf(format, s.min);
    std::printf(" / ");
    std::printf(format, s.median);
    std::printf(" / ");
    std::printf(format, s.max);
    std::printf("  %s\n", target);
  };
  std::printf("\nover %d repetitions: min / median / max\n", reps);
  row("4KiB p50 ns, memcpy", p50[kMemcpy], "%.0f", "");
  row("4KiB p50 ns, in-process", p50[kEmbedded], "%.0f", "");
  row("4KiB p50 ns, client", p50[kClient], "%.0f", "(target <= 1000)");
  row("4KiB p99 ns, memcpy", p99[kMemcpy], "%.0f", "");
  row("4KiB p99 ns, in-process", p99[kEmbedded], "%.0f", "");
  row("4KiB p99 ns, client", p99[kClient], "%.0f", "");
  row("256KiB GiB/s, memcpy", gibps[kMemcpy], "%.2f", "");
  row("256KiB GiB/s, in-process", gibps[kEmbedded], "%.2f", "");
  row("256KiB GiB/s, client", gibps[kClient], "%.2f", "");
  row("ratio 4KiB p50 client / in-process", ratio(p50[kClient], p50[kEmbedded]), "%.2f", "");
  row("ratio 4KiB p99 client / in-process", ratio(p99[kClient], p99[kEmbedded]), "%.2f", "");
  row("ratio 256KiB client / memcpy", ratio(gibps[kClient], gibps[kMemcpy]), "%.2f",
      "(target >= 0.80)");
  row("ratio 256KiB in-process / memcpy", ratio(gibps[kEmbedded], gibps[kMemcpy]), "%.2f", "");
  row("ratio 256KiB client / in-process", ratio(gibps[kClient], gibps[kEmbedded]), "%.2f", "");
  row("sequential GiB/s, fresh client (first touch)", fresh_gibps, "%.2f", "");
  row("sequential GiB/s, warm client", warm_gibps, "%.2f", "");
  row("ratio first touch / warm", ratio(fresh_gibps, warm_gibps), "%.2f", "");

  // Every measured client read must have been a hit served in the client.
  const monarch::Stats after = client->GetStats();
  const uint64_t expected =
      uint64_t{static_cast<uint64_t>(reps)} *
          (kLatencyReads + large_reads + 2 * uint64_t{static_cast<uint64_t>(files)} *
                                             (file_bytes / kLarge)) +
      large_reads;
  std::printf("\nclient hits counted by the service during the measurement: %llu (expected %llu); "
              "RAM tier files %llu, source reads %llu\n",
              static_cast<unsigned long long>(after.Tier(0, "reads") - hits_before),
              static_cast<unsigned long long>(expected),
              static_cast<unsigned long long>(after.Tier(0, "files")),
              static_cast<unsigned long long>(after.Tier(1, "reads")));

  client.reset();
  embedded.reset();
  if (in_process != nullptr) {
    in_process->RequestStop();
    in_process->Wait();
    in_process.reset();
  }
  if (service_pid > 0) {
    ::kill(service_pid, SIGTERM);
    int status;
    ::waitpid(service_pid, &status, 0);
  }
  std::system(("rm -rf " + work).c_str());
  return 0;
}
