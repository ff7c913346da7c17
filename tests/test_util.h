// Shared helpers for Monarch's tests: scratch directories, synthetic
// datasets with verifiable contents, configs built in code, and a
// fault-injecting / counting driver.

#ifndef MONARCH_TESTS_TEST_UTIL_H_
#define MONARCH_TESTS_TEST_UTIL_H_

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "skip.h"
#include "common/mutex.h"
#include "config/valid_config.h"
#include "drivers/forwarding_driver.h"
#include "monarch/config.h"

namespace monarch::testing {


// A directory under $TMPDIR (or /tmp), removed with its contents on destruction.
class ScratchDir {
 public:
  ScratchDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base ? base : "/tmp") + "/monarch-test-XXXXXX";
    char* made = ::mkdtemp(pattern.data());
    if (made == nullptr) std::abort();
    path_ = made;
  }
  ~ScratchDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const {
    std::string p = path_ + "/" + name;
    std::system(("mkdir -p '" + p + "'").c_str());
    return p;
  }

 private:
  std::string path_;
};

// The byte at `offset` of a synthetic file: depends on both, so a read of the
// wrong file or the wrong offset is caught.
inline char ExpectedByte(uint32_t file_seed, uint64_t offset) {
  uint64_t x = (offset + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t{file_seed} << 32 | file_seed);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<char>(x);
}

inline void WriteFile(const std::string& path, uint32_t seed, uint64_t size) {
  std::string dir = path.substr(0, path.find_last_of('/'));
  std::system(("mkdir -p '" + dir + "'").c_str());
  std::string data(size, '\0');
  for (uint64_t i = 0; i < size; ++i) data[i] = ExpectedByte(seed, i);
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(data.data(), data.size());
}

struct TestFile {
  std::string name;  // Dataset-relative.
  uint32_t seed;
  uint64_t size;
};

// Writes `count` files named "dir<k>/file<i>.bin" with sizes from `sizes`
// (cycled), and returns their descriptions.
inline std::vector<TestFile> MakeDataset(const std::string& root, int count,
                                         const std::vector<uint64_t>& sizes) {
  std::vector<TestFile> files;
  for (int i = 0; i < count; ++i) {
    TestFile f{"dir" + std::to_string(i % 4) + "/file" + std::to_string(i) + ".bin",
               static_cast<uint32_t>(1000 + i), sizes[i % sizes.size()]};
    WriteFile(root + "/" + f.name, f.seed, f.size);
    files.push_back(f);
  }
  return files;
}

inline uint64_t TotalBytes(const std::vector<TestFile>& files) {
  uint64_t total = 0;
  for (const TestFile& f : files) total += f.size;
  return total;
}

// What /proc/self/maps says is mapped at `address`: the file's path, "" for
// anonymous memory, "?" for nothing.
inline std::string MappedAt(const void* address) {
  const auto at = reinterpret_cast<uintptr_t>(address);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    std::istringstream fields(line);
    std::string range, perms, offset, device, path;
    uint64_t inode;
    fields >> range >> perms >> offset >> device >> inode;
    std::getline(fields >> std::ws, path);
    const size_t dash = range.find('-');
    if (at >= std::stoull(range.substr(0, dash), nullptr, 16) &&
        at < std::stoull(range.substr(dash + 1), nullptr, 16)) {
      return path;
    }
  }
  return "?";
}

inline bool BytesMatch(const TestFile& f, const char* data, uint64_t offset, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (data[i] != ExpectedByte(f.seed, offset + i)) return false;
  }
  return true;
}

// Minor page faults the calling thread has taken so far.
inline uint64_t ThreadMinorFaults() {
  struct rusage usage {};
  ::getrusage(RUSAGE_THREAD, &usage);
  return static_cast<uint64_t>(usage.ru_minflt);
}

// Polls `condition` every 2 ms until it holds, `seconds` at most; whether
// it held. How a test waits for what another thread does: on the event,
// with a deadline, never for a fixed time.
template <typename Condition>
bool Eventually(Condition condition, double seconds = 30) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// Runs the commands at once (stdout to /dev/null) and waits for them all, at
// most `timeout_seconds`: their exit codes (128 + the signal for one killed
// by a signal), -1 for one still running then (it is killed).
inline std::vector<int> RunAll(const std::vector<std::vector<std::string>>& commands,
                               double timeout_seconds) {
  std::vector<pid_t> pids;
  for (const std::vector<std::string>& command : commands) {
    std::vector<char*> argv;
    for (const std::string& arg : command) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    pid_t pid = -1;
    if (posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), ::environ) != 0) pid = -1;
    posix_spawn_file_actions_destroy(&actions);
    pids.push_back(pid);
  }
  std::vector<int> codes(pids.size(), -1);
  std::vector<bool> done(pids.size(), false);
  const auto give_up =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  for (size_t left = pids.size(); left > 0;) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (done[i]) continue;
      int status = 0;
      if (pids[i] < 0 || ::waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        done[i] = true;
        --left;
        if (pids[i] >= 0) {
          codes[i] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
      }
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > give_up) {
      for (size_t i = 0; i < pids.size(); ++i) {
        if (done[i]) continue;
        ::kill(pids[i], SIGKILL);
        ::waitpid(pids[i], nullptr, 0);
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return codes;
}

// `config` validated, for what takes a ValidConfig (tests build theirs in
// code); fails the test case if it is not valid.
inline ValidConfig Valid(const Config& config) {
  absl::StatusOr<ValidConfig> valid = ValidConfig::Validate(config);
  REQUIRE_MESSAGE(valid.ok(), valid.status().ToString());
  return *std::move(valid);
}

inline TierConfig RamTier(uint64_t capacity, const std::string& name = "ram") {
  TierConfig t;
  t.name = name;
  t.kind = TierKind::kRam;
  t.capacity_bytes = capacity;
  return t;
}

inline TierConfig FileTier(TierKind kind, const std::string& path, uint64_t capacity,
                           const std::string& name) {
  TierConfig t;
  t.name = name;
  t.kind = kind;
  t.path = path;
  t.capacity_bytes = capacity;
  return t;
}

inline TierConfig SourceTier() {
  TierConfig t;
  t.name = "pfs";
  t.kind = TierKind::kSource;
  return t;
}

inline Config MakeConfig(const std::string& dataset, std::vector<TierConfig> upper) {
  Config c;
  c.dataset.path = dataset;
  c.tiers = std::move(upper);
  c.tiers.push_back(SourceTier());
  c.placement.threads = 2;
  // The tests count which tier served each read: a hit on a file tier is
  // not sent to the source's page cache, which holds every test dataset
  // (tests of placement.route_by_speed turn it on).
  c.placement.route_by_speed = false;
  return c;
}

// Counts calls per file and injects failures on demand. Thread-safe.
class FaultInjectingDriver final : public ForwardingDriver {
 public:
  struct Faults {
    std::atomic<bool> fail_reads{false};
    std::atomic<bool> fail_stores{false};
    absl::StatusCode store_error = absl::StatusCode::kDataLoss;
    std::atomic<int> read_delay_us{0};
    std::atomic<int> write_delay_us{0};  // Before every chunk written to a copy.
    std::atomic<uint64_t> reads{0};
    std::atomic<uint64_t> bytes{0};
    std::atomic<uint64_t> stores{0};      // Copies started.
    std::atomic<uint64_t> identifies{0};  // Identify() calls: a stat of the source file.
    Mutex mu;
    absl::flat_hash_map<std::string, uint64_t> bytes_per_file ABSL_GUARDED_BY(mu);
    uint64_t BytesOf(const std::string& name) {
      MutexLock lock(&mu);
      auto it = bytes_per_file.find(name);
      return it == bytes_per_file.end() ? 0 : it->second;
    }

    // Reads from `offset` on wait in Read() until Unhold(): a test acts at
    // a known point of a copy (WaitUntilHeld), not after a guessed time.
    void HoldFrom(uint64_t offset) {
      MutexLock lock(&mu);
      hold_from = offset;
      holding_reads = true;
    }
    // Whether a read waits there, within `seconds`.
    bool WaitUntilHeld(double seconds = 30) {
      const auto deadline =
          std::chrono::steady_clock::now() +
          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
              std::chrono::duration<double>(seconds));
      MutexLock lock(&mu);
      while (held == 0) {
        if (!hold_changed.WaitUntil(&mu, deadline) && held == 0) return false;
      }
      return true;
    }
    void Unhold() {
      MutexLock lock(&mu);
      holding_reads = false;
      hold_changed.SignalAll();
    }
    // Called by each Read() of `offset` before it reads.
    void PassOrHold(uint64_t offset) {
      MutexLock lock(&mu);
      while (holding_reads && offset >= hold_from) {
        ++held;
        hold_changed.SignalAll();
        hold_changed.Wait(&mu);
        --held;
      }
    }

   private:
    CondVar hold_changed;
    bool holding_reads ABSL_GUARDED_BY(mu) = false;
    uint64_t hold_from ABSL_GUARDED_BY(mu) = 0;
    int held ABSL_GUARDED_BY(mu) = 0;  // Reads waiting now.
  };

  FaultInjectingDriver(std::unique_ptr<StorageDriver> target, Faults* faults)
      : ForwardingDriver(std::move(target)), faults_(faults) {}

  absl::StatusOr<size_t> Read(const FileRef& file, uint64_t offset, char* dst, size_t n) override {
    faults_->PassOrHold(offset);
    if (int delay = faults_->read_delay_us.load(); delay > 0) ::usleep(delay);
    faults_->reads.fetch_add(1);
    if (faults_->fail_reads.load()) return absl::DataLossError("injected read error (EIO)");
    absl::StatusOr<size_t> r = ForwardingDriver::Read(file, offset, dst, n);
    if (r.ok()) {
      faults_->bytes.fetch_add(*r);
      MutexLock lock(&faults_->mu);
      faults_->bytes_per_file[std::string(file.name.data(), file.name.size())] += *r;
    }
    return r;
  }

  absl::StatusOr<SourceIdentity> Identify(const FileRef& file,
                                          Clock::time_point opened_since) override {
    faults_->identifies.fetch_add(1);
    return ForwardingDriver::Identify(file, opened_since);
  }

  absl::StatusOr<std::unique_ptr<CopyWriter>> NewWriter(const FileRef& file) override {
    faults_->stores.fetch_add(1);
    absl::StatusOr<std::unique_ptr<CopyWriter>> writer = ForwardingDriver::NewWriter(file);
    if (!writer.ok()) return writer;
    if (faults_->fail_stores.load()) {
      return std::unique_ptr<CopyWriter>(
          new FailingWriter(std::move(*writer), faults_->store_error));
    }
    if (faults_->write_delay_us.load() > 0) {
      return std::unique_ptr<CopyWriter>(new SlowWriter(std::move(*writer), faults_));
    }
    return writer;
  }

 private:
  // Sleeps before every write, as a tier on a busy device would take time.
  class SlowWriter final : public CopyWriter {
   public:
    SlowWriter(std::unique_ptr<CopyWriter> target, Faults* faults)
        : target_(std::move(target)), faults_(faults) {}
    absl::Status Write(uint64_t offset, const char* data, size_t n) override {
      ::usleep(faults_->write_delay_us.load());
      return target_->Write(offset, data, n);
    }
    absl::StatusOr<size_t> ReadBack(uint64_t offset, char* dst, size_t n) override {
      return target_->ReadBack(offset, dst, n);
    }
    absl::Status Commit(const SourceIdentity& source) override { return target_->Commit(source); }

   private:
    std::unique_ptr<CopyWriter> target_;
    Faults* faults_;
  };

  // Accepts the first write, fails the next ones (as a device that fills up
  // or breaks mid-copy would) and the commit.
  class FailingWriter final : public CopyWriter {
   public:
    FailingWriter(std::unique_ptr<CopyWriter> target, absl::StatusCode code)
        : target_(std::move(target)), code_(code) {}
    absl::Status Write(uint64_t offset, const char* data, size_t n) override {
      if (writes_++ > 0) return absl::Status(code_, "injected write error");
      return target_->Write(offset, data, n);
    }
    absl::StatusOr<size_t> ReadBack(uint64_t offset, char* dst, size_t n) override {
      return target_->ReadBack(offset, dst, n);
    }
    absl::Status Commit(const SourceIdentity&) override {
      return absl::Status(code_, "injected write error");
    }

   private:
    std::unique_ptr<CopyWriter> target_;
    absl::StatusCode code_;
    int writes_ = 0;
  };

  Faults* faults_;
};

}  // namespace monarch::testing

#endif  // MONARCH_TESTS_TEST_UTIL_H_
