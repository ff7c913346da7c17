// monarch-pfs-emulator: a read-only FUSE file system that exposes a local
// directory as if it lived on a busy parallel file system (Lustre), and counts
// every operation that reaches it.
//
// It injects per-op metadata latency, per-read latency, an aggregate bandwidth
// cap (token bucket) and a cap on concurrently served operations. Kernel
// caching is disabled (direct_io, zero attr/entry timeouts), so every read the
// application issues is seen, delayed and counted here. Optionally (off by
// default) each open file reads ahead the way a Lustre client does; the
// counters then still show what reached the backing store. Counters are
// published as JSON in a stats file outside the mount; see README.md.
//
// Why the low-level libfuse API: one kernel request maps to exactly one
// handler call, so LOOKUP and GETATTR can be counted separately (the
// high-level API turns lookups into getattr calls) and counts are exact. The
// price is a small inode table (nodeid -> backing-relative path).
//
// Threading rules:
//  * FUSE handlers run on the libfuse worker pool (fuse_session_loop_mt with
//    clone_fd). They share: Counters (atomics), ConcurrencyLimiter,
//    BandwidthLimiter and ReadaheadBudget (own mutex each), InodeTable (own
//    mutex), and each DirHandle and FileHandle (own mutex). Without
//    read-ahead a FileHandle is only its fd, used with pread.
//  * One stats thread owns the stats file: it rewrites it every 100 ms and
//    handles SIGUSR1 (reset + write) and SIGUSR2 (write now) via sigtimedwait.
//    SIGUSR1/SIGUSR2 are blocked in every thread so only it receives them.
//  * Every counter is incremented before the reply is sent, so once a syscall
//    on the mount returns, its counts are visible to the next snapshot.

#define FUSE_USE_VERSION 312

#include <dirent.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace monarch::pfs_emulator {
namespace {

constexpr char kProgram[] = "monarch-pfs-emulator";
constexpr int kExitUsage = 2;
constexpr int64_t kStatsIntervalNs = 100'000'000;
// Token bucket depth: 10 ms worth of bandwidth may be consumed in a burst, so
// a short idle gap does not let a reader exceed the cap for long.
constexpr int64_t kBurstNs = 10'000'000;
constexpr int64_t kMaxLatencyUs = 60'000'000;
constexpr int64_t kMaxConcurrent = 1024;
// Upper bound for a control client waiting for the emulator to answer.
constexpr int64_t kControlTimeoutNs = 10'000'000'000;
constexpr int64_t kKiB = 1024;
constexpr int64_t kMaxReadaheadKiB = int64_t{1} << 30;  // 1 TiB; guards overflow.
// A Lustre client's read-ahead window starts at one RPC and grows by one RPC
// per sequential miss (1 MiB: 256 pages per RPC, Lustre's long-standing
// default).
constexpr int64_t kReadaheadStepBytes = 1024 * kKiB;
// --lustre-readahead: the llite tunables' defaults (see README.md):
// max_read_ahead_per_file_mb, max_read_ahead_whole_mb, max_read_ahead_mb.
constexpr int64_t kLustrePerFileKiB = 256 * 1024;
constexpr int64_t kLustreWholeKiB = 2 * 1024;
constexpr int64_t kLustreTotalKiB = 1024 * 1024;

// Defaults model a loaded Lustre: ~1 ms per MDS round trip, ~0.5 ms per OSS
// read RPC, a few hundred MB/s for one client node, and a handful of RPCs in
// flight (Lustre's max_rpcs_in_flight defaults to 8).
struct Options {
  int64_t meta_latency_us = 1000;
  int64_t read_latency_us = 500;
  double bandwidth_mbps = 300;  // 10^6 bytes/s; 0 = unlimited.
  int64_t max_concurrent = 8;   // 0 = unlimited.
  // Read-ahead per open file; all three in bytes. 0 = no read-ahead.
  int64_t readahead_bytes = 0;        // Largest window of one open file.
  int64_t readahead_whole_bytes = 0;  // Files up to this are read whole.
  int64_t readahead_total_bytes = 0;  // All windows together; 0 = no cap.
  bool allow_other = false;
  bool fuse_debug = false;
  std::string backing_dir;
  std::string mountpoint;
  std::string stats_file;
};

int64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// Sleeps (never spins) until the CLOCK_MONOTONIC deadline.
void SleepUntilNs(int64_t deadline_ns) {
  timespec ts{static_cast<time_t>(deadline_ns / 1'000'000'000),
              static_cast<long>(deadline_ns % 1'000'000'000)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

void SleepUs(int64_t us) {
  if (us > 0) SleepUntilNs(MonotonicNs() + us * 1000);
}

[[noreturn]] void UsageError(const std::string& message) {
  std::fprintf(stderr, "%s: error: %s\n(run '%s --help' for usage)\n", kProgram, message.c_str(),
               kProgram);
  std::exit(kExitUsage);
}

void PrintUsage() {
  std::printf(
      "usage: %s [flags] BACKING_DIR MOUNTPOINT\n"
      "       %s --sync-stats STATS_FILE   (flush and print exact stats JSON)\n"
      "       %s --reset-stats STATS_FILE  (zero counters, wait until done)\n\n"
      "Mounts BACKING_DIR read-only at MOUNTPOINT with Lustre-like delays.\n"
      "Runs in the foreground until unmounted or sent SIGINT/SIGTERM.\n\n"
      "  --meta-latency-us N   delay per metadata op (lookup, getattr, open,\n"
      "                        opendir, readdir, statfs, ...)    default 1000\n"
      "  --read-latency-us N   delay per read request            default 500\n"
      "  --bandwidth-mbps X    aggregate read cap in MB/s (10^6 B/s),\n"
      "                        shared by all readers; 0 = none   default 300\n"
      "  --max-concurrent N    ops served at once; more queue\n"
      "                        (FIFO); 0 = unlimited             default 8\n"
      "  --no-delay            set both latencies to 0 and bandwidth to\n"
      "                        unlimited (later flags still apply)\n"
      "  --readahead-kb N      read ahead on sequential reads of an open\n"
      "                        file, window up to N KiB; 0 = off default 0\n"
      "  --readahead-whole-kb N  with read-ahead, files up to N KiB are\n"
      "                        read whole on a handle's 2nd read  default 0\n"
      "  --readahead-total-kb N  cap on all windows together; 0 = none\n"
      "  --lustre-readahead    a Lustre client's defaults: --readahead-kb\n"
      "                        262144 --readahead-whole-kb 2048\n"
      "                        --readahead-total-kb 1048576\n"
      "  --stats-file PATH     counters JSON, must be outside MOUNTPOINT;\n"
      "                        hidden from the mount if inside BACKING_DIR\n"
      "                        default MOUNTPOINT.stats.json\n"
      "  --allow-other         let other users access the mount\n"
      "  --fuse-debug          print every FUSE request (libfuse -d)\n"
      "Signals: SIGUSR1 resets counters, SIGUSR2 rewrites the stats file now.\n"
      "Bad arguments exit with code 2.\n",
      kProgram, kProgram, kProgram);
}

int64_t ParseInt(const std::string& flag, const std::string& value, int64_t max) {
  if (value.empty()) UsageError(flag + ": empty value");
  if (value[0] == '-') UsageError(flag + ": must be >= 0, got '" + value + "'");
  if (value.find_first_not_of("0123456789") != std::string::npos) {
    UsageError(flag + ": '" + value + "' is not a non-negative integer");
  }
  errno = 0;
  const long long parsed = std::strtoll(value.c_str(), nullptr, 10);
  if (errno == ERANGE || parsed > max) {
    UsageError(flag + ": must be <= " + std::to_string(max) + ", got '" + value + "'");
  }
  return parsed;
}

double ParseDouble(const std::string& flag, const std::string& value) {
  char* end = nullptr;
  errno = 0;
  const double parsed = value.empty() ? NAN : std::strtod(value.c_str(), &end);
  if (value.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(parsed)) {
    UsageError(flag + ": '" + value + "' is not a number");
  }
  if (parsed < 0) UsageError(flag + ": must be >= 0, got '" + value + "'");
  return parsed;
}

// Canonical absolute path of an existing directory; exits 2 naming `what`.
std::string RequireDir(const std::string& what, const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    UsageError(what + " '" + path + "': " + std::strerror(errno));
  }
  if (!S_ISDIR(st.st_mode)) UsageError(what + " '" + path + "' is not a directory");
  char resolved[PATH_MAX];
  if (realpath(path.c_str(), resolved) == nullptr) {
    UsageError(what + " '" + path + "': " + std::strerror(errno));
  }
  return resolved;
}

// True if `path` equals `dir` or lies below it (both canonical).
bool IsUnder(const std::string& path, const std::string& dir) {
  if (dir == "/") return true;
  return path == dir || (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
                         path[dir.size()] == '/');
}

Options ParseArgs(int argc, char** argv) {
  Options opts;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    bool has_inline_value = false;
    if (arg.rfind("--", 0) == 0 && arg.find('=') != std::string::npos) {
      value = arg.substr(arg.find('=') + 1);
      arg = arg.substr(0, arg.find('='));
      has_inline_value = true;
    }
    auto next_value = [&]() -> std::string {
      if (has_inline_value) return value;
      if (i + 1 >= argc) UsageError(arg + " requires a value");
      return argv[++i];
    };
    auto no_value = [&]() {
      if (has_inline_value) UsageError(arg + " takes no value");
    };
    if (arg == "-h" || arg == "--help") {
      PrintUsage();
      std::exit(0);
    } else if (arg == "--meta-latency-us") {
      opts.meta_latency_us = ParseInt(arg, next_value(), kMaxLatencyUs);
    } else if (arg == "--read-latency-us") {
      opts.read_latency_us = ParseInt(arg, next_value(), kMaxLatencyUs);
    } else if (arg == "--bandwidth-mbps") {
      opts.bandwidth_mbps = ParseDouble(arg, next_value());
    } else if (arg == "--max-concurrent") {
      opts.max_concurrent = ParseInt(arg, next_value(), kMaxConcurrent);
    } else if (arg == "--no-delay") {
      no_value();
      opts.meta_latency_us = 0;
      opts.read_latency_us = 0;
      opts.bandwidth_mbps = 0;
    } else if (arg == "--readahead-kb") {
      opts.readahead_bytes = ParseInt(arg, next_value(), kMaxReadaheadKiB) * kKiB;
    } else if (arg == "--readahead-whole-kb") {
      opts.readahead_whole_bytes = ParseInt(arg, next_value(), kMaxReadaheadKiB) * kKiB;
    } else if (arg == "--readahead-total-kb") {
      opts.readahead_total_bytes = ParseInt(arg, next_value(), kMaxReadaheadKiB) * kKiB;
    } else if (arg == "--lustre-readahead") {
      no_value();
      opts.readahead_bytes = kLustrePerFileKiB * kKiB;
      opts.readahead_whole_bytes = kLustreWholeKiB * kKiB;
      opts.readahead_total_bytes = kLustreTotalKiB * kKiB;
    } else if (arg == "--stats-file") {
      opts.stats_file = next_value();
      if (opts.stats_file.empty()) UsageError("--stats-file: empty path");
    } else if (arg == "--allow-other") {
      no_value();
      opts.allow_other = true;
    } else if (arg == "--fuse-debug") {
      no_value();
      opts.fuse_debug = true;
    } else if (arg.size() > 1 && arg[0] == '-') {
      UsageError("unknown flag '" + arg + "'");
    } else {
      positional.push_back(arg);
    }
  }
  // Lustre refuses a whole-file size above the per-file window, too.
  if (opts.readahead_whole_bytes > opts.readahead_bytes && opts.readahead_bytes > 0) {
    UsageError("--readahead-whole-kb must not exceed --readahead-kb");
  }
  if (positional.size() < 2) UsageError("missing BACKING_DIR and/or MOUNTPOINT");
  if (positional.size() > 2) UsageError("unexpected argument '" + positional[2] + "'");
  opts.backing_dir = RequireDir("BACKING_DIR", positional[0]);
  opts.mountpoint = RequireDir("MOUNTPOINT", positional[1]);
  // A mount point inside the backing dir would make the emulator read through
  // its own mount (recursion / deadlock).
  if (opts.mountpoint != opts.backing_dir && IsUnder(opts.mountpoint, opts.backing_dir)) {
    UsageError("MOUNTPOINT '" + opts.mountpoint + "' must not be inside BACKING_DIR");
  }
  if (opts.stats_file.empty()) {
    opts.stats_file = opts.mountpoint + ".stats.json";
  } else {
    // Canonicalize the parent (the file itself may not exist yet).
    const size_t slash = opts.stats_file.rfind('/');
    const std::string parent = slash == std::string::npos ? "."
                               : slash == 0               ? "/"
                                                          : opts.stats_file.substr(0, slash);
    const std::string base = opts.stats_file.substr(slash + 1);
    if (base.empty() || base == "." || base == "..") {
      UsageError("--stats-file '" + opts.stats_file + "' is not a file path");
    }
    const std::string dir = RequireDir("--stats-file directory", parent);
    opts.stats_file = (dir == "/" ? "" : dir) + "/" + base;
  }
  // Writing the stats through our own read-only mount cannot work, and it
  // would show up in dataset listings.
  if (IsUnder(opts.stats_file, opts.mountpoint)) {
    UsageError("--stats-file '" + opts.stats_file + "' must not be inside MOUNTPOINT");
  }
  return opts;
}

enum Counter : int {
  kOpens,
  kReads,
  kBytesRead,
  kLookups,
  kGetattrs,
  kOpendirs,
  kReaddirs,
  kStatfs,
  kReadlinks,
  kAccesses,
  kReleases,
  kRejectedWrites,
  kErrors,
  kQueuedOps,
  // Read-ahead: requests that fetched more than was asked, and those extra
  // bytes (both also in kReads/kBytesRead); READs answered without a request,
  // and the bytes they took from a window.
  kReadaheadReads,
  kReadaheadBytes,
  kReadaheadHits,
  kReadaheadHitBytes,
  kNumCounters,
};

constexpr const char* kCounterNames[kNumCounters] = {
    "opens",           "reads",           "bytes_read",     "lookups",
    "getattrs",        "opendirs",        "readdirs",       "statfs",
    "readlinks",       "accesses",        "releases",       "rejected_writes",
    "errors",          "queued_ops",      "readahead_reads", "readahead_bytes",
    "readahead_hits",  "readahead_hit_bytes",
};

// Counters that make up "metadata_ops": everything that costs an MDS round
// trip on Lustre (and gets --meta-latency-us here). Opens are included.
constexpr Counter kMetadataCounters[] = {kLookups,  kGetattrs,  kOpens,  kOpendirs,
                                         kReaddirs, kReadlinks, kStatfs, kAccesses};

// Caps concurrently served operations; extra callers queue in FIFO order
// (ticket lock) and sleep on a condition variable.
class ConcurrencyLimiter {
 public:
  explicit ConcurrencyLimiter(int64_t max) : max_(max) {}

  // Returns true if the caller had to queue behind the limit.
  bool Acquire() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t ticket = next_ticket_++;
    const bool queued = max_ > 0 && in_flight_ + static_cast<int64_t>(ticket - serving_) >= max_;
    cv_.wait(lock, [&] { return ticket == serving_ && (max_ == 0 || in_flight_ < max_); });
    ++serving_;
    ++in_flight_;
    peak_ = std::max(peak_, in_flight_);
    cv_.notify_all();  // The next ticket may fit as well.
    return queued;
  }

  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    --in_flight_;
    cv_.notify_all();
  }

  void Snapshot(int64_t* in_flight, int64_t* peak) {
    std::lock_guard<std::mutex> lock(mu_);
    *in_flight = in_flight_;
    *peak = peak_;
  }

  void ResetPeak() {
    std::lock_guard<std::mutex> lock(mu_);
    peak_ = in_flight_;
  }

 private:
  const int64_t max_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t next_ticket_ = 0;
  uint64_t serving_ = 0;
  int64_t in_flight_ = 0;
  int64_t peak_ = 0;
};

// Aggregate bandwidth cap as a token bucket expressed in virtual time: the
// "link" is busy until next_free_ns_. Each read reserves its transfer time in
// arrival order (fair, FIFO) under a short lock and then sleeps until its slot
// ends, so waiting readers burn no CPU.
class BandwidthLimiter {
 public:
  explicit BandwidthLimiter(double mbps) : ns_per_byte_(mbps > 0 ? 1e3 / mbps : 0) {}

  void Consume(size_t bytes) {
    if (ns_per_byte_ == 0 || bytes == 0) return;
    int64_t deadline;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // An idle link accumulates at most kBurstNs of credit (bucket depth).
      next_free_ns_ = std::max(next_free_ns_, MonotonicNs() - kBurstNs);
      next_free_ns_ += static_cast<int64_t>(static_cast<double>(bytes) * ns_per_byte_);
      deadline = next_free_ns_;
    }
    SleepUntilNs(deadline);
  }

 private:
  const double ns_per_byte_;
  std::mutex mu_;
  int64_t next_free_ns_ = 0;
};

// Bytes held in all open files' read-ahead windows, against
// --readahead-total-kb (Lustre's max_read_ahead_mb): a window shrinks to what
// is left rather than overrun the cap.
class ReadaheadBudget {
 public:
  explicit ReadaheadBudget(int64_t cap) : cap_(cap) {}

  // Returns how many of `want` bytes may be held (all of them without a cap).
  int64_t Take(int64_t want) {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t granted = cap_ == 0 ? want : std::clamp<int64_t>(cap_ - held_, 0, want);
    held_ += granted;
    return granted;
  }

  void Give(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    held_ -= bytes;
  }

 private:
  const int64_t cap_;
  std::mutex mu_;
  int64_t held_ = 0;
};

// Maps FUSE node ids to paths relative to the backing dir. Ids are never
// reused, so the generation number can stay 0.
class InodeTable {
 public:
  InodeTable() {
    nodes_[FUSE_ROOT_ID] = Node{".", 1};
    by_path_["."] = FUSE_ROOT_ID;
  }

  bool Path(fuse_ino_t ino, std::string* path) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = nodes_.find(ino);
    if (it == nodes_.end()) return false;
    *path = it->second.path;
    return true;
  }

  // Returns the id for `path`, taking one kernel lookup reference.
  fuse_ino_t Ref(const std::string& path) {
    std::lock_guard<std::mutex> lock(mu_);
    auto [it, inserted] = by_path_.emplace(path, next_id_);
    if (inserted) nodes_[next_id_++] = Node{path, 0};
    ++nodes_[it->second].nlookup;
    return it->second;
  }

  void Forget(fuse_ino_t ino, uint64_t nlookup) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = nodes_.find(ino);
    if (it == nodes_.end() || ino == FUSE_ROOT_ID) return;
    it->second.nlookup -= std::min(nlookup, it->second.nlookup);
    if (it->second.nlookup == 0) {
      by_path_.erase(it->second.path);
      nodes_.erase(it);
    }
  }

 private:
  struct Node {
    std::string path;
    uint64_t nlookup;
  };
  std::mutex mu_;
  std::unordered_map<fuse_ino_t, Node> nodes_;
  std::unordered_map<std::string, fuse_ino_t> by_path_;
  fuse_ino_t next_id_ = FUSE_ROOT_ID + 1;
};

struct DirHandle {
  // The kernel serializes READDIRs per open directory; the lock makes that
  // explicit (and visible to ThreadSanitizer). Never held across a reply.
  std::mutex mu;
  DIR* dir = nullptr;
  std::string path;
  off_t offset = 0;
  dirent* pending = nullptr;  // Entry read but not yet returned (buffer full).
};

// One open file, and with read-ahead its window (a Lustre client keeps the
// read-ahead state per open file). Reads on one handle are served one at a
// time under `mu` when read-ahead is on, so a read that the fetch in flight
// will cover waits for it instead of paying a request of its own. The window
// holds only bytes fetched beyond what was asked, so every byte served from
// it is a read-ahead byte put to use. Never held across a reply: a RELEASE on
// another thread may delete the handle once the last read is answered.
struct FileHandle {
  explicit FileHandle(int fd_in) : fd(fd_in) {}
  const int fd;
  std::mutex mu;
  int64_t misses = 0;     // Reads that paid a request; the 2nd may read whole.
  int64_t run_end = -1;   // End of the current sequential run; -1: no read yet.
  int64_t last_off = -1;  // Offset of the previous read.
  int64_t window = 0;     // Read-ahead size of the next sequential miss.
  // Window bytes [ahead_off, ahead_off + ahead_len) sit in ahead at
  // ahead_skip; the buffer is immutable once installed, so a reply may use
  // it after `mu` is released.
  std::shared_ptr<const char[]> ahead;
  int64_t ahead_off = 0;
  int64_t ahead_len = 0;
  int64_t ahead_skip = 0;
};

std::string JoinPath(const std::string& parent, const char* name) {
  return parent == "." ? std::string(name) : parent + "/" + name;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

class Emulator {
 public:
  Emulator(const Options& opts, int backing_fd)
      : opts_(opts),
        backing_fd_(backing_fd),
        limiter_(opts.max_concurrent),
        bandwidth_(opts.bandwidth_mbps),
        readahead_budget_(opts.readahead_total_bytes) {
    // Hide the stats file (and its temp file) if it sits inside the backing
    // dir, so it never pollutes dataset listings.
    if (IsUnder(opts.stats_file, opts.backing_dir)) {
      const std::string rel = opts.stats_file.substr(opts.backing_dir.size() + 1);
      hidden_.insert(rel);
      hidden_.insert(rel + ".tmp");
    }
  }

  // --- Stats (stats thread only, except the final write after it joined).

  void StatsLoop(const std::atomic<bool>* stop) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGUSR2);
    const timespec interval{0, kStatsIntervalNs};
    while (!stop->load()) {
      if (sigtimedwait(&set, nullptr, &interval) == SIGUSR1) ResetCounters();
      WriteStats(/*running=*/true);
    }
  }

  void ResetCounters() {
    // Stamp before zeroing: a reset_ns >= T proves the zeroing happened after T.
    last_reset_ns_ = MonotonicNs();
    for (auto& c : counters_) c.store(0);
    limiter_.ResetPeak();
  }

  bool WriteStats(bool running) {
    // Stamp before reading counters: every op that completed before this
    // instant is included in the values below.
    const int64_t now_ns = MonotonicNs();
    uint64_t values[kNumCounters];
    for (int i = 0; i < kNumCounters; ++i) values[i] = counters_[i].load();
    int64_t in_flight, peak;
    limiter_.Snapshot(&in_flight, &peak);
    uint64_t metadata_ops = 0;
    for (const Counter c : kMetadataCounters) metadata_ops += values[c];

    std::ostringstream json;
    json << "{\n  \"pid\": " << getpid() << ",\n  \"running\": " << (running ? "true" : "false")
         << ",\n  \"generation\": " << ++generation_ << ",\n  \"monotonic_ns\": " << now_ns
         << ",\n  \"last_reset_monotonic_ns\": " << last_reset_ns_
         << ",\n  \"backing_dir\": " << JsonString(opts_.backing_dir)
         << ",\n  \"mountpoint\": " << JsonString(opts_.mountpoint)
         << ",\n  \"config\": {\"meta_latency_us\": " << opts_.meta_latency_us
         << ", \"read_latency_us\": " << opts_.read_latency_us
         << ", \"bandwidth_mbps\": " << opts_.bandwidth_mbps
         << ", \"max_concurrent\": " << opts_.max_concurrent
         << ", \"readahead_kb\": " << opts_.readahead_bytes / kKiB
         << ", \"readahead_whole_kb\": " << opts_.readahead_whole_bytes / kKiB
         << ", \"readahead_total_kb\": " << opts_.readahead_total_bytes / kKiB
         << "},\n  \"counters\": {\n"
         << "    \"metadata_ops\": " << metadata_ops;
    for (int i = 0; i < kNumCounters; ++i) {
      json << ",\n    \"" << kCounterNames[i] << "\": " << values[i];
    }
    json << ",\n    \"max_in_flight\": " << peak << ",\n    \"in_flight\": " << in_flight
         << "\n  }\n}\n";

    // Atomic replace: readers see either the old or the new complete file.
    const std::string tmp = opts_.stats_file + ".tmp";
    bool ok;
    {
      std::ofstream out(tmp, std::ios::trunc);
      ok = static_cast<bool>(out << json.str() << std::flush);
    }
    ok = ok && rename(tmp.c_str(), opts_.stats_file.c_str()) == 0;
    if (!ok && !stats_error_reported_) {  // Once: this runs every 100 ms.
      std::fprintf(stderr, "%s: cannot write %s: %s\n", kProgram, opts_.stats_file.c_str(),
                   std::strerror(errno));
      stats_error_reported_ = true;
    }
    return ok;
  }

  // --- FUSE handlers (worker threads).

  static Emulator* From(fuse_req_t req) { return static_cast<Emulator*>(fuse_req_userdata(req)); }

  // RAII for one served request: counts it, takes a concurrency slot and
  // applies the injected latency while holding the slot (a busy server is busy
  // for the whole RPC).
  class Op {
   public:
    Op(Emulator* emu, Counter counter, int64_t latency_us) : emu_(emu) {
      emu_->Count(counter);
      if (emu_->limiter_.Acquire()) emu_->Count(kQueuedOps);
      SleepUs(latency_us);
    }
    ~Op() { emu_->limiter_.Release(); }
    Op(const Op&) = delete;
    Op& operator=(const Op&) = delete;

   private:
    Emulator* emu_;
  };

  // Relaxed is enough: a snapshot that must include this increment is always
  // ordered after it by syscalls (reply -> caller's syscall returns -> caller
  // signals or reads the stats file).
  void Count(Counter c, uint64_t n = 1) { counters_[c].fetch_add(n, std::memory_order_relaxed); }

  void ReplyErr(fuse_req_t req, int err) {
    if (err != 0) Count(kErrors);  // Counted before the reply, like everything.
    fuse_reply_err(req, err);
  }

  bool IsHidden(const std::string& rel_path) const { return hidden_.count(rel_path) > 0; }

  static void Init(void* /*userdata*/, fuse_conn_info* conn) {
    // Plain READDIR only: READDIRPLUS would create lookup references behind
    // the counters' back. No readahead: every read must reach us.
    conn->want &= ~FUSE_CAP_READDIRPLUS;
    conn->max_readahead = 0;
  }

  static void Lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
    Emulator* emu = From(req);
    Op op(emu, kLookups, emu->opts_.meta_latency_us);
    std::string dir;
    if (!emu->inodes_.Path(parent, &dir)) return emu->ReplyErr(req, ESTALE);
    const std::string path = JoinPath(dir, name);
    fuse_entry_param entry{};
    if (emu->IsHidden(path)) return emu->ReplyErr(req, ENOENT);
    if (fstatat(emu->backing_fd_, path.c_str(), &entry.attr, AT_SYMLINK_NOFOLLOW) != 0) {
      return emu->ReplyErr(req, errno);
    }
    // Zero timeouts: the kernel revalidates on every access (no dentry/attr
    // caching, and an ENOENT reply is never cached negatively).
    entry.ino = emu->inodes_.Ref(path);
    if (fuse_reply_entry(req, &entry) != 0) emu->inodes_.Forget(entry.ino, 1);
  }

  static void Forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
    From(req)->inodes_.Forget(ino, nlookup);
    fuse_reply_none(req);
  }

  static void ForgetMulti(fuse_req_t req, size_t count, fuse_forget_data* forgets) {
    for (size_t i = 0; i < count; ++i) {
      From(req)->inodes_.Forget(forgets[i].ino, forgets[i].nlookup);
    }
    fuse_reply_none(req);
  }

  static void Getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info* /*fi*/) {
    Emulator* emu = From(req);
    Op op(emu, kGetattrs, emu->opts_.meta_latency_us);
    std::string path;
    struct stat st;
    if (!emu->inodes_.Path(ino, &path)) return emu->ReplyErr(req, ESTALE);
    if (fstatat(emu->backing_fd_, path.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      return emu->ReplyErr(req, errno);
    }
    fuse_reply_attr(req, &st, /*attr_timeout=*/0.0);
  }

  static void Readlink(fuse_req_t req, fuse_ino_t ino) {
    Emulator* emu = From(req);
    Op op(emu, kReadlinks, emu->opts_.meta_latency_us);
    std::string path;
    char target[PATH_MAX + 1];
    if (!emu->inodes_.Path(ino, &path)) return emu->ReplyErr(req, ESTALE);
    const ssize_t n = readlinkat(emu->backing_fd_, path.c_str(), target, PATH_MAX);
    if (n < 0) return emu->ReplyErr(req, errno);
    target[n] = '\0';
    fuse_reply_readlink(req, target);
  }

  static void Open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
    Emulator* emu = From(req);
    Op op(emu, kOpens, emu->opts_.meta_latency_us);
    if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC)) {
      emu->Count(kRejectedWrites);
      return emu->ReplyErr(req, EROFS);
    }
    std::string path;
    if (!emu->inodes_.Path(ino, &path)) return emu->ReplyErr(req, ESTALE);
    const int fd = openat(emu->backing_fd_, path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return emu->ReplyErr(req, errno);
    auto handle = std::make_unique<FileHandle>(fd);
    fi->fh = reinterpret_cast<uint64_t>(handle.get());
    // Bypass the page cache: every read() becomes a READ, and read-ahead (if
    // on) is the emulator's own, per handle, where it can be counted.
    fi->direct_io = 1;
    fi->keep_cache = 0;  // Drop anything cached from an earlier open.
    fi->noflush = 1;     // close() needs no FLUSH round trip on a read-only fs.
    if (fuse_reply_open(req, fi) == 0) {
      handle.release();
    } else {
      close(fd);
    }
  }

  static void Read(fuse_req_t req, fuse_ino_t /*ino*/, size_t size, off_t off, fuse_file_info* fi) {
    Emulator* emu = From(req);
    auto* h = reinterpret_cast<FileHandle*>(fi->fh);
    if (emu->opts_.readahead_bytes > 0) return emu->ReadAhead(req, h, size, off);
    Op op(emu, kReads, emu->opts_.read_latency_us);
    thread_local std::vector<char> buffer;
    if (buffer.size() < size) buffer.resize(size);
    const ssize_t n = pread(h->fd, buffer.data(), size, off);
    if (n < 0) return emu->ReplyErr(req, errno);
    emu->bandwidth_.Consume(static_cast<size_t>(n));
    emu->Count(kBytesRead, static_cast<uint64_t>(n));
    fuse_reply_buf(req, buffer.data(), static_cast<size_t>(n));
  }

  // A read with read-ahead, modelled on a Lustre client's: the second of two
  // contiguous reads starts a window of one step, each further sequential
  // miss grows it by one step up to --readahead-kb, and a read elsewhere
  // collapses it. A miss costs one request (latency, one slot, and the
  // transfer of what was asked plus the window); reads inside the window cost
  // none. Unlike Lustre, the next window is fetched when a read first passes
  // the end of the last one, not in the background, so a reader still waits
  // once per window.
  void ReadAhead(fuse_req_t req, FileHandle* h, size_t size, off_t off) {
    std::unique_lock<std::mutex> lock(h->mu);
    struct stat st;
    if (fstat(h->fd, &st) != 0) {
      const int err = errno;
      lock.unlock();  // Every reply comes after the unlock (see FileHandle).
      return ReplyErr(req, err);
    }
    const int64_t end = std::min<int64_t>(off + static_cast<int64_t>(size), st.st_size);
    if (off >= end) {
      // At or past EOF: a client knows the size (Lustre holds it under its
      // lock), so no request reaches a server.
      Count(kReadaheadHits);
      lock.unlock();
      fuse_reply_buf(req, nullptr, 0);
      return;
    }
    // Contiguous with the run, or the half of a split read() that arrived
    // second and ends where the previous read began.
    const bool sequential = off == h->run_end || end == h->last_off;
    const bool forward = !sequential || end > h->run_end;
    h->run_end = sequential ? std::max(h->run_end, end) : end;
    h->last_off = off;
    std::shared_ptr<const char[]> ahead = h->ahead;
    const int64_t ahead_end = h->ahead_off + h->ahead_len;
    const bool in_ahead = ahead && off >= h->ahead_off && off < ahead_end;
    const char* ahead_at = in_ahead ? ahead.get() + h->ahead_skip + (off - h->ahead_off) : nullptr;
    if (in_ahead && end <= ahead_end) {
      Count(kReadaheadHits);
      Count(kReadaheadHitBytes, static_cast<uint64_t>(end - off));
      lock.unlock();
      fuse_reply_buf(req, ahead_at, static_cast<size_t>(end - off));
      return;
    }
    // The read may begin inside the window and run past it.
    const int64_t from = in_ahead ? ahead_end : off;
    ++h->misses;
    h->window = sequential ? std::min(h->window + kReadaheadStepBytes, opts_.readahead_bytes) : 0;
    int64_t want_end = forward ? std::min<int64_t>(end + h->window, st.st_size) : end;
    if (h->misses == 2 && st.st_size <= opts_.readahead_whole_bytes) want_end = st.st_size;
    // The old window is dropped whatever happens: it lies behind this read,
    // or it is replaced by the new one.
    readahead_budget_.Give(h->ahead_len);
    h->ahead.reset();
    h->ahead_len = 0;
    const int64_t granted = readahead_budget_.Take(want_end - end);
    want_end = end + granted;

    Op op(this, kReads, opts_.read_latency_us);
    // Not value-initialized: pread fills what is used, and zeroing a large
    // window would cost the reader time a real client does not spend.
    std::shared_ptr<char[]> data(new char[static_cast<size_t>(want_end - from)]);
    const ssize_t n = pread(h->fd, data.get(), static_cast<size_t>(want_end - from), from);
    if (n < 0) {
      const int err = errno;
      readahead_budget_.Give(granted);
      lock.unlock();
      return ReplyErr(req, err);
    }
    bandwidth_.Consume(static_cast<size_t>(n));
    Count(kBytesRead, static_cast<uint64_t>(n));
    const int64_t asked = std::min<int64_t>(n, end - from);  // Short if the file shrank.
    const int64_t extra = n - asked;
    readahead_budget_.Give(granted - extra);
    if (extra > 0) {
      Count(kReadaheadReads);
      Count(kReadaheadBytes, static_cast<uint64_t>(extra));
      h->ahead = data;
      h->ahead_off = end;
      h->ahead_len = extra;
      h->ahead_skip = end - from;
    }
    if (from > off) Count(kReadaheadHitBytes, static_cast<uint64_t>(from - off));
    lock.unlock();
    iovec iov[2] = {{const_cast<char*>(ahead_at), static_cast<size_t>(from - off)},
                    {data.get(), static_cast<size_t>(asked)}};
    fuse_reply_iov(req, from > off ? iov : iov + 1, from > off ? 2 : 1);
  }

  static void Release(fuse_req_t req, fuse_ino_t /*ino*/, fuse_file_info* fi) {
    Emulator* emu = From(req);
    emu->Count(kReleases);
    // The kernel sends RELEASE after the last READ on the handle was
    // answered, so no read holds it now.
    auto* h = reinterpret_cast<FileHandle*>(fi->fh);
    emu->readahead_budget_.Give(h->ahead_len);
    close(h->fd);
    delete h;
    fuse_reply_err(req, 0);
  }

  static void Opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
    Emulator* emu = From(req);
    Op op(emu, kOpendirs, emu->opts_.meta_latency_us);
    auto handle = std::make_unique<DirHandle>();
    if (!emu->inodes_.Path(ino, &handle->path)) return emu->ReplyErr(req, ESTALE);
    const int fd =
        openat(emu->backing_fd_, handle->path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return emu->ReplyErr(req, errno);
    handle->dir = fdopendir(fd);
    if (handle->dir == nullptr) {
      const int err = errno;
      close(fd);
      return emu->ReplyErr(req, err);
    }
    fi->fh = reinterpret_cast<uint64_t>(handle.get());
    fi->cache_readdir = 0;
    if (fuse_reply_open(req, fi) == 0) {
      handle.release();
    } else {
      closedir(handle->dir);
    }
  }

  static void Readdir(fuse_req_t req, fuse_ino_t /*ino*/, size_t size, off_t off,
                      fuse_file_info* fi) {
    Emulator* emu = From(req);
    Op op(emu, kReaddirs, emu->opts_.meta_latency_us);
    auto* d = reinterpret_cast<DirHandle*>(fi->fh);
    std::vector<char> buf(size);
    size_t used = 0;
    int err = 0;
    {
      // Unlock before replying: once the reply is out, a RELEASEDIR on
      // another thread may delete `d` (found by ThreadSanitizer).
      std::lock_guard<std::mutex> lock(d->mu);
      if (off != d->offset) {
        seekdir(d->dir, off);
        d->offset = off;
        d->pending = nullptr;
      }
      while (true) {
        if (d->pending == nullptr) {
          errno = 0;
          d->pending = readdir(d->dir);
          if (d->pending == nullptr) {
            if (used == 0) err = errno;
            break;
          }
        }
        const dirent* e = d->pending;
        if (emu->hidden_.empty() || !emu->IsHidden(JoinPath(d->path, e->d_name))) {
          struct stat st {};
          st.st_ino = e->d_ino;
          st.st_mode = static_cast<mode_t>(e->d_type) << 12;
          const size_t entsize =
              fuse_add_direntry(req, buf.data() + used, size - used, e->d_name, &st, e->d_off);
          if (entsize > size - used) break;  // Full; keep `pending` for the next call.
          used += entsize;
        }
        d->offset = e->d_off;
        d->pending = nullptr;
      }
    }
    if (err != 0) return emu->ReplyErr(req, err);
    fuse_reply_buf(req, buf.data(), used);
  }

  static void Releasedir(fuse_req_t req, fuse_ino_t /*ino*/, fuse_file_info* fi) {
    auto* d = reinterpret_cast<DirHandle*>(fi->fh);
    closedir(d->dir);
    delete d;
    fuse_reply_err(req, 0);
  }

  static void Statfs(fuse_req_t req, fuse_ino_t /*ino*/) {
    Emulator* emu = From(req);
    Op op(emu, kStatfs, emu->opts_.meta_latency_us);
    struct statvfs st;
    if (fstatvfs(emu->backing_fd_, &st) != 0) return emu->ReplyErr(req, errno);
    fuse_reply_statfs(req, &st);
  }

  static void Access(fuse_req_t req, fuse_ino_t ino, int mask) {
    Emulator* emu = From(req);
    Op op(emu, kAccesses, emu->opts_.meta_latency_us);
    std::string path;
    if (!emu->inodes_.Path(ino, &path)) return emu->ReplyErr(req, ESTALE);
    if (mask & W_OK) return emu->ReplyErr(req, EROFS);
    emu->ReplyErr(req, faccessat(emu->backing_fd_, path.c_str(), mask, 0) == 0 ? 0 : errno);
  }

  // Every modifying request. The mount is also "ro", so the kernel normally
  // rejects these before they get here; this is the second line of defense.
  static void RejectWrite(fuse_req_t req) {
    From(req)->Count(kRejectedWrites);
    From(req)->ReplyErr(req, EROFS);
  }

  static fuse_lowlevel_ops MakeOps() {
    fuse_lowlevel_ops ops{};
    ops.init = Init;
    ops.lookup = Lookup;
    ops.forget = Forget;
    ops.forget_multi = ForgetMulti;
    ops.getattr = Getattr;
    ops.readlink = Readlink;
    ops.open = Open;
    ops.read = Read;
    ops.release = Release;
    ops.opendir = Opendir;
    ops.readdir = Readdir;
    ops.releasedir = Releasedir;
    ops.statfs = Statfs;
    ops.access = Access;
    ops.setattr = [](fuse_req_t req, fuse_ino_t, struct stat*, int, fuse_file_info*) {
      RejectWrite(req);
    };
    ops.mknod = [](fuse_req_t req, fuse_ino_t, const char*, mode_t, dev_t) { RejectWrite(req); };
    ops.mkdir = [](fuse_req_t req, fuse_ino_t, const char*, mode_t) { RejectWrite(req); };
    ops.unlink = [](fuse_req_t req, fuse_ino_t, const char*) { RejectWrite(req); };
    ops.rmdir = [](fuse_req_t req, fuse_ino_t, const char*) { RejectWrite(req); };
    ops.symlink = [](fuse_req_t req, const char*, fuse_ino_t, const char*) { RejectWrite(req); };
    ops.rename = [](fuse_req_t req, fuse_ino_t, const char*, fuse_ino_t, const char*,
                    unsigned int) { RejectWrite(req); };
    ops.link = [](fuse_req_t req, fuse_ino_t, fuse_ino_t, const char*) { RejectWrite(req); };
    ops.write = [](fuse_req_t req, fuse_ino_t, const char*, size_t, off_t, fuse_file_info*) {
      RejectWrite(req);
    };
    ops.create = [](fuse_req_t req, fuse_ino_t, const char*, mode_t, fuse_file_info*) {
      RejectWrite(req);
    };
    ops.setxattr = [](fuse_req_t req, fuse_ino_t, const char*, const char*, size_t, int) {
      RejectWrite(req);
    };
    ops.removexattr = [](fuse_req_t req, fuse_ino_t, const char*) { RejectWrite(req); };
    ops.fallocate = [](fuse_req_t req, fuse_ino_t, int, off_t, off_t, fuse_file_info*) {
      RejectWrite(req);
    };
    return ops;
  }

 private:
  const Options opts_;
  const int backing_fd_;
  std::set<std::string> hidden_;  // Immutable after construction.
  std::atomic<uint64_t> counters_[kNumCounters] = {};
  ConcurrencyLimiter limiter_;
  BandwidthLimiter bandwidth_;
  ReadaheadBudget readahead_budget_;
  InodeTable inodes_;
  // Stats thread only (or main, before it starts / after it joined).
  uint64_t generation_ = 0;
  int64_t last_reset_ns_ = 0;
  bool stats_error_reported_ = false;
};

// --- Control client: --sync-stats / --reset-stats.

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Reads a top-level integer field; the stats file is our own fixed format.
bool ReadJsonInt(const std::string& path, const char* key, int64_t* value) {
  const std::string text = ReadFile(path);
  const std::string needle = std::string("\"") + key + "\": ";
  const size_t pos = text.find(needle);
  if (pos == std::string::npos) return false;
  *value = std::strtoll(text.c_str() + pos + needle.size(), nullptr, 10);
  return true;
}

// Asks the emulator that owns `stats_file` to act, then waits until the file
// proves the action happened after this call started (timestamps on the
// shared CLOCK_MONOTONIC, so concurrent callers and the periodic rewrite
// cannot produce a stale answer).
int RunControl(const std::string& mode, const std::string& stats_file) {
  int64_t pid = 0;
  if (!ReadJsonInt(stats_file, "pid", &pid) || pid <= 0) {
    std::fprintf(stderr, "%s: no emulator stats at '%s'\n", kProgram, stats_file.c_str());
    return 1;
  }
  const bool reset = mode == "--reset-stats";
  const char* stamp_key = reset ? "last_reset_monotonic_ns" : "monotonic_ns";
  const int64_t start_ns = MonotonicNs();
  if (kill(static_cast<pid_t>(pid), reset ? SIGUSR1 : SIGUSR2) != 0) {
    std::fprintf(stderr, "%s: emulator pid %lld (from %s) is not running: %s\n", kProgram,
                 static_cast<long long>(pid), stats_file.c_str(), std::strerror(errno));
    return 1;
  }
  int64_t stamp = 0;
  while (!ReadJsonInt(stats_file, stamp_key, &stamp) || stamp < start_ns) {
    if (MonotonicNs() - start_ns > kControlTimeoutNs) {
      std::fprintf(stderr, "%s: timed out waiting for %s\n", kProgram, stats_file.c_str());
      return 1;
    }
    SleepUs(1000);
  }
  if (!reset) std::fputs(ReadFile(stats_file).c_str(), stdout);
  return 0;
}

int Main(int argc, char** argv) {
  if (argc >= 2 &&
      (std::strcmp(argv[1], "--sync-stats") == 0 || std::strcmp(argv[1], "--reset-stats") == 0)) {
    if (argc != 3) UsageError(std::string(argv[1]) + " takes exactly one STATS_FILE argument");
    return RunControl(argv[1], argv[2]);
  }
  const Options opts = ParseArgs(argc, argv);

  // Block the stats signals before any thread exists so every thread
  // (including libfuse workers) inherits the mask; the stats thread takes
  // them with sigtimedwait.
  sigset_t stats_signals;
  sigemptyset(&stats_signals);
  sigaddset(&stats_signals, SIGUSR1);
  sigaddset(&stats_signals, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &stats_signals, nullptr);

  // Opened before mounting: even when mounting over BACKING_DIR itself, this
  // fd keeps pointing at the real directory underneath.
  const int backing_fd = open(opts.backing_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (backing_fd < 0) UsageError("BACKING_DIR '" + opts.backing_dir + "': " + strerror(errno));

  Emulator emulator(opts, backing_fd);
  std::string mount_opts = "ro,fsname=monarch-pfs,subtype=monarch-pfs";
  if (opts.allow_other) mount_opts += ",allow_other,default_permissions";
  std::vector<const char*> fuse_argv = {argv[0], "-o", mount_opts.c_str()};
  if (opts.fuse_debug) fuse_argv.push_back("-d");
  fuse_args args =
      FUSE_ARGS_INIT(static_cast<int>(fuse_argv.size()), const_cast<char**>(fuse_argv.data()));
  const fuse_lowlevel_ops ops = Emulator::MakeOps();
  fuse_session* session = fuse_session_new(&args, &ops, sizeof(ops), &emulator);
  if (session == nullptr) return 1;
  if (fuse_set_signal_handlers(session) != 0 ||
      fuse_session_mount(session, opts.mountpoint.c_str()) != 0) {
    fuse_session_destroy(session);
    return 1;
  }
  if (!emulator.WriteStats(/*running=*/true)) {
    fuse_session_unmount(session);
    fuse_session_destroy(session);
    return 1;
  }
  std::atomic<bool> stop_stats{false};
  std::thread stats_thread([&] { emulator.StatsLoop(&stop_stats); });

  // The kernel sends requests in parallel, so serve them from a thread pool
  // (libfuse 3.14 grows it on demand up to max_threads). It is larger than
  // --max-concurrent so that excess requests are taken and wait in our FIFO
  // limiter, where they are counted (queued_ops), instead of waiting unseen in
  // the kernel. clone_fd gives each worker its own /dev/fuse fd (libfuse's
  // suggested setting for the multi-threaded loop).
  fuse_loop_config* loop_config = fuse_loop_cfg_create();
  const int64_t workers = opts.max_concurrent == 0 ? 64 : opts.max_concurrent + 4;
  fuse_loop_cfg_set_max_threads(loop_config,
                                static_cast<unsigned>(std::min<int64_t>(workers, 256)));
  fuse_loop_cfg_set_clone_fd(loop_config, 1);
  const int loop_result = fuse_session_loop_mt(session, loop_config);
  fuse_loop_cfg_destroy(loop_config);

  fuse_remove_signal_handlers(session);
  fuse_session_unmount(session);
  fuse_session_destroy(session);
  stop_stats.store(true);
  pthread_kill(stats_thread.native_handle(), SIGUSR2);
  stats_thread.join();
  emulator.WriteStats(/*running=*/false);
  fuse_opt_free_args(&args);
  close(backing_fd);
  // A positive result is the signal (SIGINT/SIGTERM/SIGHUP) that stopped us.
  return loop_result < 0 ? 1 : 0;
}

}  // namespace
}  // namespace monarch::pfs_emulator

int main(int argc, char** argv) { return monarch::pfs_emulator::Main(argc, argv); }
