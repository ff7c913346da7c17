// FaultInjectingEnv: an os::Env (common/os.h) that passes every call to the
// direct system calls except the ones a test chose to fail or shorten.
//
// A rule names a kind of call (open, read, stat, opendir, rename, chmod,
// ...), the paths it applies to (a substring, or any predicate), and what
// happens: the call fails with an errno, or, for reads, returns fewer bytes
// than asked. Paths are what the call names: for *at calls relative to a
// directory descriptor, and for calls on a descriptor (read, pread, fstat,
// ftruncate, fallocate), the path is rebuilt from /proc/self/fd, so
// "file3.bin" matches however the file was reached. A rename matches on
// either of its paths.
//
// Thread-safe: rules may be added while Monarch's threads call in. The Env
// itself must be installed before, and removed after, the code under test
// runs (ScopedEnvForTesting in a scope that ends after the instance is
// destroyed): see os.h.

#ifndef MONARCH_TESTS_FAULT_ENV_H_
#define MONARCH_TESTS_FAULT_ENV_H_

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/mutex.h"
#include "common/os.h"

namespace monarch::testing {

class FaultInjectingEnv final : public os::Env {
 public:
  enum class Op {
    kOpen,      // open, openat
    kRead,      // read, pread
    kWrite,     // write, pwrite
    kStat,      // stat, lstat, fstat, fstatat
    kOpenDir,   // opendir
    kRename,    // rename (either path)
    kUnlink,    // unlink, unlinkat
    kMkdir,     // mkdir
    kUtimens,   // utimensat
    kTruncate,  // ftruncate
    kAllocate,  // fallocate, posix_fallocate
    kChmod,     // chmod
    kCount,
  };
  using PathMatcher = std::function<bool(const std::string& path)>;

  // Fails the next `times` calls of `op` on a path containing `substring`
  // (every one if `times` < 0) with `error`.
  void Fail(Op op, std::string substring, int error, int times = -1) {
    FailIf(op, Contains(std::move(substring)), error, times);
  }
  void FailIf(Op op, PathMatcher match, int error, int times = -1) {
    MutexLock lock(&mu_);
    rules_.push_back({op, std::move(match), error, 0, times});
  }
  // Every read of a path containing `substring` returns at most `max_bytes`
  // (a partial transfer, as from a signal or a network file system).
  void ShortenReads(std::string substring, size_t max_bytes) {
    MutexLock lock(&mu_);
    rules_.push_back({Op::kRead, Contains(std::move(substring)), 0, max_bytes, -1});
  }
  void Clear() {
    MutexLock lock(&mu_);
    rules_.clear();
  }

  // Calls of `op` failed or shortened so far.
  uint64_t injected(Op op) const { return injected_[static_cast<int>(op)].load(); }
  // Calls of `op` seen so far, on any path.
  uint64_t calls(Op op) const { return calls_[static_cast<int>(op)].load(); }

  // os::Env.
  int OpenAt(int dir_fd, const char* path, int flags, mode_t mode) override {
    if (int e = Check(Op::kOpen, [&] { return AtPath(dir_fd, path); }); e != 0) return Fail(e);
    return os::Env::OpenAt(dir_fd, path, flags, mode);
  }
  ssize_t Read(int fd, void* buffer, size_t n) override {
    size_t limit = SIZE_MAX;
    if (int e = Check(Op::kRead, [&] { return FdPath(fd); }, &limit); e != 0) return Fail(e);
    return os::Env::Read(fd, buffer, std::min(n, limit));
  }
  ssize_t Pread(int fd, void* buffer, size_t n, off_t offset) override {
    size_t limit = SIZE_MAX;
    if (int e = Check(Op::kRead, [&] { return FdPath(fd); }, &limit); e != 0) return Fail(e);
    return os::Env::Pread(fd, buffer, std::min(n, limit), offset);
  }
  // A read of bytes in memory is a read like any other to the faults.
  ssize_t PreadNoWait(int fd, void* buffer, size_t n, off_t offset) override {
    size_t limit = SIZE_MAX;
    if (int e = Check(Op::kRead, [&] { return FdPath(fd); }, &limit); e != 0) return Fail(e);
    return os::Env::PreadNoWait(fd, buffer, std::min(n, limit), offset);
  }
  ssize_t Write(int fd, const void* buffer, size_t n) override {
    if (int e = Check(Op::kWrite, [&] { return FdPath(fd); }); e != 0) return Fail(e);
    return os::Env::Write(fd, buffer, n);
  }
  ssize_t Pwrite(int fd, const void* buffer, size_t n, off_t offset) override {
    if (int e = Check(Op::kWrite, [&] { return FdPath(fd); }); e != 0) return Fail(e);
    return os::Env::Pwrite(fd, buffer, n, offset);
  }
  int FstatAt(int dir_fd, const char* path, struct stat* st, int flags) override {
    auto where = [&] {
      return (flags & AT_EMPTY_PATH) && path[0] == '\0' ? FdPath(dir_fd) : AtPath(dir_fd, path);
    };
    if (int e = Check(Op::kStat, where); e != 0) return Fail(e);
    return os::Env::FstatAt(dir_fd, path, st, flags);
  }
  DIR* OpenDir(const char* path) override {
    if (int e = Check(Op::kOpenDir, [&] { return std::string(path); }); e != 0) {
      errno = e;
      return nullptr;
    }
    return os::Env::OpenDir(path);
  }
  int Rename(const char* from, const char* to) override {
    if (int e = Check(Op::kRename, [&] { return absl::StrCat(from, "\n", to); }); e != 0) {
      return Fail(e);
    }
    return os::Env::Rename(from, to);
  }
  int UnlinkAt(int dir_fd, const char* path, int flags) override {
    if (int e = Check(Op::kUnlink, [&] { return AtPath(dir_fd, path); }); e != 0) return Fail(e);
    return os::Env::UnlinkAt(dir_fd, path, flags);
  }
  int Mkdir(const char* path, mode_t mode) override {
    if (int e = Check(Op::kMkdir, [&] { return std::string(path); }); e != 0) return Fail(e);
    return os::Env::Mkdir(path, mode);
  }
  int UtimensAt(int dir_fd, const char* path, const struct timespec times[2],
                int flags) override {
    if (int e = Check(Op::kUtimens, [&] { return AtPath(dir_fd, path); }); e != 0) return Fail(e);
    return os::Env::UtimensAt(dir_fd, path, times, flags);
  }
  int Ftruncate(int fd, off_t length) override {
    if (int e = Check(Op::kTruncate, [&] { return FdPath(fd); }); e != 0) return Fail(e);
    return os::Env::Ftruncate(fd, length);
  }
  int Fallocate(int fd, int mode, off_t offset, off_t length) override {
    if (int e = Check(Op::kAllocate, [&] { return FdPath(fd); }); e != 0) return Fail(e);
    return os::Env::Fallocate(fd, mode, offset, length);
  }
  int PosixFallocate(int fd, off_t offset, off_t length) override {
    // Returns the error number, as posix_fallocate does.
    if (int e = Check(Op::kAllocate, [&] { return FdPath(fd); }); e != 0) return e;
    return os::Env::PosixFallocate(fd, offset, length);
  }
  int Chmod(const char* path, mode_t mode) override {
    if (int e = Check(Op::kChmod, [&] { return std::string(path); }); e != 0) return Fail(e);
    return os::Env::Chmod(path, mode);
  }

 private:
  struct Rule {
    Op op;
    PathMatcher match;
    int error;         // 0: no failure, see max_read.
    size_t max_read;   // For a read rule without an error: bytes per call at most.
    int remaining;     // Failures left; < 0: unlimited.
  };

  static PathMatcher Contains(std::string substring) {
    return [substring = std::move(substring)](const std::string& path) {
      return absl::StrContains(path, substring);
    };
  }

  static int Fail(int error) {
    errno = error;
    return -1;
  }

  // The path a descriptor was opened with, or "" if it has none.
  static std::string FdPath(int fd) {
    char link[64];
    char target[PATH_MAX];
    std::snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    const ssize_t n = ::readlink(link, target, sizeof(target) - 1);
    return n > 0 ? std::string(target, static_cast<size_t>(n)) : std::string();
  }
  static std::string AtPath(int dir_fd, const char* path) {
    if (dir_fd == AT_FDCWD || path[0] == '/') return path;
    return absl::StrCat(FdPath(dir_fd), "/", path);
  }

  // The errno the call must fail with (0: none); for a read, lowers
  // `*max_read` if a shortening rule matches. `where` names the path, and is
  // computed only when a rule for `op` exists.
  template <typename Where>
  int Check(Op op, const Where& where, size_t* max_read = nullptr) {
    calls_[static_cast<int>(op)].fetch_add(1);
    MutexLock lock(&mu_);
    std::string path;
    bool have_path = false;
    for (Rule& rule : rules_) {
      if (rule.op != op || rule.remaining == 0) continue;
      if (!have_path) {
        path = where();
        have_path = true;
      }
      if (!rule.match(path)) continue;
      if (rule.error == 0) {
        if (max_read != nullptr && rule.max_read < *max_read) {
          *max_read = rule.max_read;
          injected_[static_cast<int>(op)].fetch_add(1);
        }
        continue;
      }
      if (rule.remaining > 0) --rule.remaining;
      injected_[static_cast<int>(op)].fetch_add(1);
      return rule.error;
    }
    return 0;
  }

  Mutex mu_;
  std::vector<Rule> rules_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> calls_[static_cast<int>(Op::kCount)] = {};
  std::atomic<uint64_t> injected_[static_cast<int>(Op::kCount)] = {};
};

}  // namespace monarch::testing

#endif  // MONARCH_TESTS_FAULT_ENV_H_
