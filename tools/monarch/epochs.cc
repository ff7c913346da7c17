// monarch-epochs: plays a training job's I/O against Monarch (or plain pread).
//
// Reads every file of the dataset once per epoch (or, with --records, every
// record of every file: the way a job reads a few big files), in a seeded
// shuffled order, from T reader threads, and prints per-epoch wall time, throughput
// and where the bytes were served from. With --generate it first writes a
// synthetic dataset (ImageNet-like ~110 KiB files, or large shards).
//
//   monarch-epochs --dataset /tmp/ds --generate 2000 --profile imagenet
//   monarch-epochs --config config/ram-source.yaml --epochs 3 --threads 8
//   monarch-epochs --dataset /tmp/ds --mode plain   # baseline: open/pread/close
//
// --before-epoch CMD runs CMD through /bin/sh -c before every epoch, with
// MONARCH_EPOCH set to the epoch number (1-based), and waits for it: after
// the page cache drop and the previous epoch's --settle wait, right before
// the epoch's timer starts. It runs once more after the last epoch (and its
// --settle wait), with MONARCH_EPOCH=E+1, so per-epoch counters can be
// collected, e.g. a PFS's counters read and reset at each boundary:
//
//   monarch-epochs --config c.yaml --before-epoch 'pfs-emulator stats /mnt/pfs \
//       >/tmp/phase-$MONARCH_EPOCH.json && pfs-emulator reset /mnt/pfs'
//
// Exit code: 0 on success, 1 if any read failed, (with --verify) returned
// wrong bytes, or the --before-epoch command failed, 2 for bad arguments.

#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"
#include "monarch/monarch.h"

extern char** environ;  // The process environment, for posix_spawn.

namespace {

// A reader's buffer at a chosen place in its page, so that plain and Monarch
// reads copy into the same alignment: where a buffer starts in its page
// can change a read's time tenfold on some CPUs (src/common/copy_bytes.h),
// and a heap's state, which differs between the two modes, decides it for
// a std::vector.
class ReadBuffer {
 public:
  explicit ReadBuffer(uint64_t offset) : offset_(offset) {}
  // Room for `n` bytes at data().
  void Reserve(uint64_t n) {
    if (n <= capacity_) return;
    const uint64_t bytes = (offset_ + n + 4095) / 4096 * 4096;
    memory_.reset(static_cast<char*>(std::aligned_alloc(4096, bytes)));
    if (memory_ == nullptr) {
      std::fprintf(stderr, "out of memory for a %llu-byte read buffer\n",
                   static_cast<unsigned long long>(n));
      std::exit(1);
    }
    capacity_ = n;
  }
  char* data() { return memory_.get() + offset_; }

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  const uint64_t offset_;
  uint64_t capacity_ = 0;
  std::unique_ptr<char, Free> memory_;
};

struct Options {
  std::string config;
  std::string dataset;
  std::string plain_dir;  // --mode plain reads here (default: the dataset).
  std::string mode = "monarch";
  std::string profile = "imagenet";
  std::string json_out;
  std::string before_epoch;  // Shell command run before each epoch.
  uint64_t generate = 0;
  uint64_t file_size = 0;  // 0: from the profile.
  uint64_t read_size = 0;  // 0: whole file (or record) in one call.
  uint64_t record_bytes = 0;  // --records: the unit of the order; 0: whole files.
  uint64_t buffer_offset = 0;  // Where each reader's buffer starts in its page.
  uint64_t sample_us = 0;      // --sample-us: each reader's time per sample after its read.
  int epochs = 3;
  int threads = 4;
  uint64_t seed = 42;
  bool drop_caches = false;
  bool drop_source_cache = false;
  bool settle = false;
  bool verify = false;
  bool announce = false;  // --announce: tell Monarch each epoch's order (prefetch).
  bool announce_all = false;  // --announce-all: every epoch's order at once, as epoch 1 starts.
  std::string barrier_dir;  // With --partition: all N processes meet here around each epoch.
  int part = 0;             // --partition R/N: read every N-th file of each epoch's order, from R.
  int parts = 1;
};

[[noreturn]] void Usage(const std::string& error) {
  std::fprintf(stderr,
               "monarch-epochs: %s\n"
               "usage: monarch-epochs (--dataset DIR | --config FILE) [options]\n"
               "  --mode monarch|plain   read through Monarch (default) or with plain pread\n"
               "  --plain-dir DIR        directory --mode plain reads (default: the dataset)\n"
               "  --epochs N (3)  --threads N (4)  --seed N (42)\n"
               "  --read-size BYTES      bytes per read call; 0 = whole file or record (default)\n"
               "  --records BYTES        shuffle and read records of BYTES (each file cut in\n"
               "                         records front to back, the last one shorter) instead\n"
               "                         of whole files; --partition and --announce then\n"
               "                         deal in records (announced as ranges)\n"
               "  --buffer-offset BYTES  each reader's buffer starts this many bytes into a\n"
               "                         page (default 0). 16 is where malloc() puts a\n"
               "                         buffer above 128 KiB (a std::vector of 256 KiB)\n"
               "  --sample-us US         each reader spends US microseconds on each sample\n"
               "                         after reading it (sleeping), as a model's step would\n"
               "  --generate N           first write N synthetic files into --dataset\n"
               "  --profile imagenet|shards  sizes for --generate (~110 KiB / 64 MiB)\n"
               "  --file-size BYTES      fixed size for --generate instead of the profile\n"
               "  --drop-caches          drop the page cache before every epoch (root)\n"
               "  --drop-source-cache    evict only the dataset's files (and --plain-dir's) from\n"
               "                         the page cache before every epoch, as a PFS client whose\n"
               "                         cache went cold would be; tier copies keep theirs\n"
               "  --settle               wait for background placement between epochs\n"
               "  --verify               compare every read with the source (slow)\n"
               "  --announce             announce each epoch's order to Monarch as it starts\n"
               "                         (clairvoyant prefetch; counted in the epoch's time)\n"
               "  --announce-all         announce the orders of all epochs at once as epoch 1\n"
               "                         starts (prefetch, and eviction by next use)\n"
               "  --partition R/N        read only this process's 1/N of each epoch (every N-th\n"
               "                         file of the shared shuffled order, from R), as a\n"
               "                         data-parallel job's rank R of N does\n"
               "  --barrier-dir DIR      with --partition: the N processes wait for each other\n"
               "                         (files in DIR) before each epoch and before its\n"
               "                         counters are read, so per-epoch figures line up\n"
               "  --json FILE            also write the per-epoch figures as JSON\n"
               "  --before-epoch CMD     run CMD with /bin/sh -c right before each epoch's timer\n"
               "                         starts (after the cache drop and --settle), with\n"
               "                         MONARCH_EPOCH=N (1-based), and once more after the last\n"
               "                         epoch with MONARCH_EPOCH=E+1, so per-epoch counters can\n"
               "                         be collected; a non-zero exit aborts with exit code 1\n",
               error.c_str());
  std::exit(2);
}

uint64_t ParseCount(const char* flag, const char* value) {
  absl::StatusOr<uint64_t> v = monarch::ParseByteSize(value);
  if (!v.ok()) Usage(absl::StrCat(flag, ": ", v.status().message()));
  return *v;
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) Usage(absl::StrCat(flag, " needs a value"));
      return argv[++i];
    };
    if (flag == "--config")
      o.config = value();
    else if (flag == "--dataset")
      o.dataset = value();
    else if (flag == "--plain-dir")
      o.plain_dir = value();
    else if (flag == "--mode")
      o.mode = value();
    else if (flag == "--profile")
      o.profile = value();
    else if (flag == "--json")
      o.json_out = value();
    else if (flag == "--before-epoch")
      o.before_epoch = value();
    else if (flag == "--generate")
      o.generate = ParseCount("--generate", value());
    else if (flag == "--file-size")
      o.file_size = ParseCount("--file-size", value());
    else if (flag == "--read-size")
      o.read_size = ParseCount("--read-size", value());
    else if (flag == "--records")
      o.record_bytes = ParseCount("--records", value());
    else if (flag == "--sample-us")
      o.sample_us = ParseCount("--sample-us", value());
    else if (flag == "--buffer-offset") {
      o.buffer_offset = ParseCount("--buffer-offset", value());
      if (o.buffer_offset >= 4096) {
        std::fprintf(stderr, "--buffer-offset: expected 0..4095 bytes, got %llu\n",
                     static_cast<unsigned long long>(o.buffer_offset));
        std::exit(2);
      }
    }
    else if (flag == "--epochs")
      o.epochs = static_cast<int>(ParseCount("--epochs", value()));
    else if (flag == "--threads")
      o.threads = static_cast<int>(ParseCount("--threads", value()));
    else if (flag == "--seed")
      o.seed = ParseCount("--seed", value());
    else if (flag == "--drop-caches")
      o.drop_caches = true;
    else if (flag == "--drop-source-cache")
      o.drop_source_cache = true;
    else if (flag == "--settle")
      o.settle = true;
    else if (flag == "--verify")
      o.verify = true;
    else if (flag == "--announce")
      o.announce = true;
    else if (flag == "--announce-all")
      o.announce_all = true;
    else if (flag == "--barrier-dir")
      o.barrier_dir = value();
    else if (flag == "--partition") {
      std::vector<std::string> rn = absl::StrSplit(value(), '/');
      if (rn.size() != 2 || !absl::SimpleAtoi(rn[0], &o.part) ||
          !absl::SimpleAtoi(rn[1], &o.parts) || o.parts < 1 || o.part < 0 || o.part >= o.parts) {
        Usage("--partition: expected R/N with 0 <= R < N");
      }
    } else if (flag == "--help" || flag == "-h")
      Usage("help");
    else
      Usage(absl::StrCat("unknown flag '", flag, "'"));
  }
  if (o.mode != "monarch" && o.mode != "plain") Usage("--mode: expected monarch or plain");
  if (o.profile != "imagenet" && o.profile != "shards")
    Usage("--profile: expected imagenet or shards");
  if (o.threads < 1 || o.threads > 1024) Usage("--threads: expected 1 to 1024");
  if (o.epochs < 0) Usage("--epochs: expected 0 (generate only) or more");
  if (o.dataset.empty() && o.config.empty()) Usage("give --dataset DIR or --config FILE");
  if (o.generate > 0 && o.dataset.empty()) Usage("--generate needs --dataset DIR");
  if (!o.barrier_dir.empty() && o.parts < 2) Usage("--barrier-dir needs --partition R/N");
  return o;
}

// Writes `count` files of pseudo-random bytes (seeded, so reruns produce the
// same dataset) spread over 10 class directories, like ImageNet's layout.
void Generate(const Options& o) {
  std::mt19937_64 rng(o.seed);
  // ImageNet JPEGs: median ~110 KiB with a long tail; a log-normal fits.
  std::lognormal_distribution<double> imagenet(std::log(110.0 * 1024), 0.45);
  std::vector<char> buffer;
  uint64_t total = 0;
  for (uint64_t i = 0; i < o.generate; ++i) {
    uint64_t size = o.file_size;
    if (size == 0) {
      size = o.profile == "shards"
                 ? (64ull << 20)
                 : static_cast<uint64_t>(std::clamp(imagenet(rng), 4096.0, 4194304.0));
    }
    std::string dir = absl::StrFormat("%s/class%02d", o.dataset, i % 10);
    std::string path = absl::StrFormat("%s/%s%06d.%s", dir, o.profile == "shards" ? "shard" : "img",
                                       i, o.profile == "shards" ? "tfrecord" : "jpg");
    if (absl::Status s = monarch::MakeDirectories(dir); !s.ok()) Usage(s.ToString());
    buffer.resize(size);
    uint64_t state = rng();
    for (size_t b = 0; b + 8 <= size; b += 8) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      std::memcpy(&buffer[b], &state, 8);
    }
    for (size_t b = size & ~size_t{7}; b < size; ++b) buffer[b] = static_cast<char>(rng());
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(buffer.data(), static_cast<std::streamsize>(size));
    if (!out) Usage(absl::StrCat("cannot write ", path));
    total += size;
  }
  std::printf("generated %llu files, %.1f MiB in %s\n", static_cast<unsigned long long>(o.generate),
              total / 1048576.0, o.dataset.c_str());
}

// Evicts `files` under `root` from the page cache: written back first (dirty
// pages cannot be dropped), then POSIX_FADV_DONTNEED. Needs no privileges.
void DropFileCaches(const std::string& root, const std::vector<std::string>& files) {
  for (const std::string& f : files) {
    int fd = ::open(monarch::JoinPath(root, f).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

void DropCaches() {
  ::sync();
  std::ofstream drop("/proc/sys/vm/drop_caches");
  drop << "3\n";
  if (!drop) std::fprintf(stderr, "warning: cannot drop the page cache (not root?)\n");
}

// Runs `command` through /bin/sh -c with MONARCH_EPOCH=`epoch` added to the
// environment and waits for it. Returns false (after printing why) unless it
// exits with status 0. posix_spawn with its own environment block, not
// setenv() + system(): Monarch's threads are running.
bool RunBeforeEpoch(const std::string& command, int epoch) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "MONARCH_EPOCH=", 14) != 0) env_strings.emplace_back(*e);
  }
  env_strings.push_back(absl::StrCat("MONARCH_EPOCH=", epoch));
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string sh = "/bin/sh", dash_c = "-c", cmd = command;
  char* argv[] = {sh.data(), dash_c.data(), cmd.data(), nullptr};
  std::fflush(stdout);  // Keep our output and the command's in order.
  pid_t pid;
  int err = ::posix_spawn(&pid, "/bin/sh", nullptr, nullptr, argv, envp.data());
  if (err != 0) {
    std::fprintf(stderr, "monarch-epochs: --before-epoch: cannot run /bin/sh: %s\n",
                 std::strerror(err));
    return false;
  }
  int status;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      std::fprintf(stderr, "monarch-epochs: --before-epoch: waitpid: %s\n", std::strerror(errno));
      return false;
    }
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
  const std::string how = WIFEXITED(status)
                              ? absl::StrCat("exited with status ", WEXITSTATUS(status))
                              : absl::StrCat("was killed by signal ", WTERMSIG(status));
  std::fprintf(stderr, "monarch-epochs: --before-epoch command %s (MONARCH_EPOCH=%d): %s\n",
               how.c_str(), epoch, command.c_str());
  return false;
}

struct EpochResult {
  double seconds = 0;
  double cpu_seconds = 0;  // This process's, user and system: work apart from waiting.
  uint64_t bytes = 0;
  uint64_t errors = 0;
  uint64_t mismatches = 0;
};

// The CPU time this process has used so far, user and system. Jobs that
// share fewer cores than they have readers wait for them; CPU time per epoch
// says whether their work grew too (bench/many_jobs.py).
double ProcessCpuSeconds() {
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

}  // namespace

// Replaces `path` with `contents` by a rename, so a reader (or a rank killed
// mid-write) never leaves half a file.
void WriteJsonAtomically(const std::string& path, const std::string& contents) {
  const std::string temporary = path + ".tmp";
  absl::Status written = monarch::WriteSmallFile(temporary, contents);
  if (written.ok() && std::rename(temporary.c_str(), path.c_str()) != 0) {
    written = absl::InternalError(absl::StrCat("rename ", temporary, ": ", std::strerror(errno)));
  }
  if (!written.ok()) std::fprintf(stderr, "monarch-epochs: --json: %s\n", written.ToString().c_str());
}

// A file barrier: each of the `o.parts` processes creates `<dir>/<name>.<part>`
// and waits until all have. False after 10 minutes.
bool Barrier(const Options& o, const std::string& name) {
  if (o.barrier_dir.empty()) return true;
  const std::string mine = absl::StrCat(o.barrier_dir, "/", name, ".", o.part);
  std::ofstream(mine).flush();
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(10);
  for (;;) {
    int present = 0;
    for (int p = 0; p < o.parts; ++p) {
      struct stat st;
      present += ::stat(absl::StrCat(o.barrier_dir, "/", name, ".", p).c_str(), &st) == 0;
    }
    if (present == o.parts) return true;
    if (std::chrono::steady_clock::now() > give_up) {
      std::fprintf(stderr, "monarch-epochs: barrier %s: only %d of %d processes arrived\n",
                   name.c_str(), present, o.parts);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

int RunEpochs(int argc, char** argv) {
  Options o = ParseArgs(argc, argv);
  if (o.generate > 0) Generate(o);
  if (o.epochs == 0) return 0;

  absl::StatusOr<std::unique_ptr<monarch::Monarch>> created =
      o.config.empty() ? monarch::Monarch::Create(monarch::DefaultConfig(o.dataset))
                       : monarch::Monarch::CreateFromYamlFile(o.config);
  if (!created.ok()) {
    std::fprintf(stderr, "monarch-epochs: %s\n", created.status().ToString().c_str());
    return 2;
  }
  std::unique_ptr<monarch::Monarch> monarch = std::move(*created);
  const std::string root = monarch->dataset_root();
  const std::string plain_root = o.plain_dir.empty() ? root : o.plain_dir;
  std::vector<std::string> files = monarch->ListFiles();
  std::vector<uint64_t> sizes;
  uint64_t dataset_bytes = 0;
  for (const std::string& f : files) {
    sizes.push_back(*monarch->FileSize(f));
    dataset_bytes += sizes.back();
  }
  std::printf("dataset %s: %zu files, %.1f MiB; mode %s, %d threads, %d epochs\n", root.c_str(),
              files.size(), dataset_bytes / 1048576.0, o.mode.c_str(), o.threads, o.epochs);

  // What an epoch reads, one unit at a time: whole files, or records.
  struct Unit {
    uint32_t file;
    uint64_t offset;
    uint64_t length;
  };
  std::vector<Unit> units;
  for (uint32_t id = 0; id < files.size(); ++id) {
    if (o.record_bytes == 0) {
      units.push_back({id, 0, sizes[id]});
      continue;
    }
    for (uint64_t offset = 0; offset < sizes[id]; offset += o.record_bytes) {
      units.push_back({id, offset, std::min(o.record_bytes, sizes[id] - offset)});
    }
  }
  if (o.record_bytes > 0) {
    std::printf("%zu records of up to %llu bytes\n", units.size(),
                static_cast<unsigned long long>(o.record_bytes));
  }
  // Records are read from files held open, as a reader of a few big files
  // does; whole files are opened per read, as a loader of small files does.
  std::vector<int> record_fds;
  if (o.record_bytes > 0 && (o.mode == "plain" || o.verify)) {
    for (const std::string& f : files) {
      record_fds.push_back(::open(monarch::JoinPath(plain_root, f).c_str(), O_RDONLY | O_CLOEXEC));
    }
  }

  std::string json = "[";
  monarch::Stats previous = monarch->GetStats();
  // This process's units in epoch `epoch`, in reading order.
  auto order_of = [&](int epoch) {
    std::vector<uint32_t> order(units.size());
    for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
    std::mt19937_64 shuffle_rng(o.seed * 1000 + epoch);
    std::shuffle(order.begin(), order.end(), shuffle_rng);
    if (o.parts > 1) {
      std::vector<uint32_t> mine;
      for (size_t k = o.part; k < order.size(); k += o.parts) mine.push_back(order[k]);
      order.swap(mine);
    }
    return order;
  };
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    std::vector<uint32_t> order = order_of(epoch);
    if (o.drop_caches) DropCaches();
    if (o.drop_source_cache) {
      DropFileCaches(root, files);
      if (plain_root != root) DropFileCaches(plain_root, files);
    }
    if (!o.before_epoch.empty() && !RunBeforeEpoch(o.before_epoch, epoch)) return 1;
    if (!Barrier(o, absl::StrCat("start-", epoch))) return 1;

    std::atomic<size_t> next{0};
    std::atomic<uint64_t> bytes{0}, errors{0}, mismatches{0};
    auto reader = [&] {
      ReadBuffer buffer(o.buffer_offset);
      std::vector<char> check;
      for (size_t k; (k = next.fetch_add(1)) < order.size();) {
        const Unit& unit = units[order[k]];
        const uint32_t id = unit.file;
        const uint64_t end = unit.offset + unit.length;
        const uint64_t chunk =
            o.read_size == 0 ? std::max<uint64_t>(unit.length, 1) : o.read_size;
        buffer.Reserve(chunk);
        int fd = -1;
        if (!record_fds.empty()) {
          fd = record_fds[id];
        } else if (o.mode == "plain" || o.verify) {
          fd = ::open(monarch::JoinPath(plain_root, files[id]).c_str(), O_RDONLY | O_CLOEXEC);
        }
        if ((o.mode == "plain" || o.verify) && fd < 0) {
          errors.fetch_add(1);
          continue;
        }
        for (uint64_t offset = unit.offset; offset < end; offset += chunk) {
          const uint64_t n = std::min(chunk, end - offset);
          ssize_t got;
          if (o.mode == "plain") {
            got = ::pread(fd, buffer.data(), n, static_cast<off_t>(offset));
          } else {
            absl::StatusOr<size_t> r = monarch->Read(files[id], buffer.data(), n, offset);
            got = r.ok() ? static_cast<ssize_t>(*r) : -1;
            if (!r.ok())
              std::fprintf(stderr, "read %s: %s\n", files[id].c_str(),
                           r.status().ToString().c_str());
            if (r.ok() && o.verify) {
              check.resize(n);
              ssize_t want = ::pread(fd, check.data(), n, static_cast<off_t>(offset));
              if (want != got ||
                  std::memcmp(check.data(), buffer.data(), static_cast<size_t>(got)) != 0) {
                mismatches.fetch_add(1);
              }
            }
          }
          if (got <= 0) {
            errors.fetch_add(1);
            break;
          }
          bytes.fetch_add(static_cast<uint64_t>(got));
        }
        if (fd >= 0 && record_fds.empty()) ::close(fd);
        if (o.sample_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(o.sample_us));
      }
    };
    auto start = std::chrono::steady_clock::now();
    const double cpu_start = ProcessCpuSeconds();
    if ((o.announce || (o.announce_all && epoch == 1)) && o.mode == "monarch") {
      std::vector<std::string> names;
      std::vector<monarch::Monarch::SampleRange> ranges;
      for (int e = epoch; e <= (o.announce_all ? o.epochs : epoch); ++e) {
        for (uint32_t k : order_of(e)) {
          const Unit& unit = units[k];
          if (o.record_bytes == 0) {
            names.push_back(files[unit.file]);
          } else {
            ranges.push_back({files[unit.file], unit.offset, unit.length});
          }
        }
      }
      absl::Status announced =
          o.record_bytes == 0 ? monarch->AnnounceOrder(names) : monarch->AnnounceRanges(ranges);
      if (!announced.ok()) {
        std::fprintf(stderr, "monarch-epochs: announce: %s\n", announced.ToString().c_str());
        return 1;
      }
    }
    std::vector<std::thread> threads;
    for (int t = 0; t < o.threads; ++t) threads.emplace_back(reader);
    for (std::thread& t : threads) t.join();
    EpochResult result;
    result.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    result.cpu_seconds = ProcessCpuSeconds() - cpu_start;
    result.bytes = bytes.load();
    result.errors = errors.load();
    result.mismatches = mismatches.load();
    // Peers still fetching from us count in this epoch, not the next.
    if (!Barrier(o, absl::StrCat("end-", epoch))) return 1;

    monarch::Stats now = monarch->GetStats();
    const std::vector<std::string> tier_names = now.TierNames();
    // A counter that went down was reset (a node service restarted during
    // the epoch): count from zero.
    auto Since = [](uint64_t after, uint64_t before) { return after >= before ? after - before : after; };
    auto Delta = [&](std::string_view name) { return Since(now.Get(name), previous.Get(name)); };
    std::string served;
    std::string served_json;
    {
      const uint64_t reads = Delta("staging_reads");
      const uint64_t staged = Delta("staging_bytes_read");
      if (reads > 0) {
        absl::StrAppend(&served, "in-flight promotions ", reads, " reads/",
                        absl::StrFormat("%.1f", staged / 1048576.0), " MiB, ");
      }
      absl::StrAppend(&served_json, "\"staging\":{\"reads\":", reads, ",\"bytes\":", staged, "},");
    }
    {
      // Hits on a file tier the speed model sent to the source's page cache
      // (placement.route_by_speed); the source's own reads are below.
      const uint64_t reads = Delta("speed_source_cache_reads");
      const uint64_t bytes = Delta("speed_source_cache_bytes");
      if (reads > 0) {
        absl::StrAppend(&served, "the source's page cache ", reads, " reads/",
                        absl::StrFormat("%.1f", bytes / 1048576.0), " MiB, ");
      }
      absl::StrAppend(&served_json, "\"source_cache\":{\"reads\":", reads, ",\"bytes\":", bytes,
                      "},");
    }
    if (now.Get("remote.enabled") != 0) {
      // What the peers tier read is in the tier list below.
      const uint64_t served_reqs = Delta("remote.requests_served");
      const uint64_t fallbacks = Delta("remote.fallbacks");
      absl::StrAppend(&served, "peer fetches that fell back ", fallbacks, ", served ", served_reqs,
                      " for peers, ");
      absl::StrAppend(&served_json, "\"remote\":{\"fallbacks\":", fallbacks,
                      ",\"served_for_peers\":", served_reqs, "},");
    }
    for (size_t t = 0; t < tier_names.size(); ++t) {
      uint64_t reads = Since(now.Tier(t, "reads"), previous.Tier(t, "reads"));
      uint64_t tier_bytes = Since(now.Tier(t, "bytes_read"), previous.Tier(t, "bytes_read"));
      absl::StrAppend(&served, t ? ", " : "", tier_names[t], " ", reads, " reads/",
                      absl::StrFormat("%.1f", tier_bytes / 1048576.0), " MiB");
      absl::StrAppend(&served_json, t ? "," : "", "\"", tier_names[t], "\":{\"reads\":", reads,
                      ",\"bytes\":", tier_bytes, "}");
    }
    std::printf("epoch %d: %.3f s, %.1f MiB/s, %llu errors%s | %s%s\n", epoch, result.seconds,
                result.bytes / 1048576.0 / result.seconds,
                static_cast<unsigned long long>(result.errors),
                o.verify ? absl::StrCat(", ", result.mismatches, " mismatches").c_str() : "",
                o.mode == "plain" ? "plain pread" : "served from ",
                o.mode == "plain" ? "" : served.c_str());
    // Complete copies in the tiers when the epoch ended: how far placement got.
    uint64_t published = 0;
    for (size_t t = 0; t + 1 < tier_names.size(); ++t) published += now.Tier(t, "files");
    if (o.mode != "plain") std::printf("  %llu of %zu files in tiers at the end of the epoch\n",
                                       static_cast<unsigned long long>(published), files.size());
    absl::StrAppend(&json, epoch > 1 ? "," : "", "{\"epoch\":", epoch,
                    ",\"seconds\":", absl::StrFormat("%.6f", result.seconds),
                    ",\"cpu_seconds\":", absl::StrFormat("%.6f", result.cpu_seconds),
                    ",\"published_files\":", published,
                    ",\"bytes\":", result.bytes, ",\"errors\":", result.errors,
                    ",\"mismatches\":", result.mismatches, ",\"served\":{",
                    absl::StripSuffix(served_json, ","), "}}");
    // Rewritten after every epoch, so a rank killed later still leaves the
    // figures of the epochs it finished (the peer tests account for them).
    if (!o.json_out.empty()) WriteJsonAtomically(o.json_out, json + "]\n");
    if (result.errors > 0 || result.mismatches > 0) {
      std::fprintf(stderr, "monarch-epochs: epoch %d had %llu errors, %llu mismatches\n", epoch,
                   static_cast<unsigned long long>(result.errors),
                   static_cast<unsigned long long>(result.mismatches));
      return 1;
    }
    if (o.settle) {
      auto settle_start = std::chrono::steady_clock::now();
      monarch->WaitForPlacement();
      std::printf(
          "  placement settled %.3f s after the epoch\n",
          std::chrono::duration<double>(std::chrono::steady_clock::now() - settle_start).count());
    }
    previous = monarch->GetStats();
  }
  for (int fd : record_fds) {
    if (fd >= 0) ::close(fd);
  }
  if (!o.before_epoch.empty() && !RunBeforeEpoch(o.before_epoch, o.epochs + 1)) return 1;
  // Peers may still need our files until they are done too.
  if (!Barrier(o, "done")) return 1;
  monarch->Shutdown(monarch::Monarch::ShutdownMode::kDrain);
  std::printf("stats: %s\n", monarch->GetStats().ToJson().c_str());
  return 0;
}
