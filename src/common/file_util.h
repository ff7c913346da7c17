// Small POSIX file helpers used by the drivers and the namespace walk.
//
// All file calls go through the OS seam (common/os.h), so tests can inject
// failures into them. Every helper retries EINTR and short transfers, and turns any other
// failure into a status (never a loop): a read that returns 0 bytes ends the
// transfer as end-of-file. All are thread-safe.

#ifndef MONARCH_COMMON_FILE_UTIL_H_
#define MONARCH_COMMON_FILE_UTIL_H_

#include <sys/types.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace monarch {

// An owned file descriptor, closed on destruction.
class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd();
  ScopedFd(ScopedFd&& other) noexcept : fd_(other.release()) {}
  ScopedFd& operator=(ScopedFd&& other) noexcept;
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// A timespec (a stat's st_mtim, a clock's reading) in nanoseconds.
inline int64_t TimespecNanos(const struct timespec& t) {
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

// Calls `open` (which returns a descriptor, or -1 with errno set) again for
// as long as it fails with EINTR; returns its last result.
template <typename Open>
int RetryOnEintr(Open open) {
  int fd;
  do {
    fd = open();
  } while (fd < 0 && errno == EINTR);
  return fd;
}

// The whole of a small file (a config, a log, /proc/meminfo), read through
// the OS seam; fails with ResourceExhausted past `limit` bytes.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, size_t limit = 64 << 20);

// Creates or truncates `path` (mode 0666 less the umask) and writes
// `contents` to it, through the OS seam. Errors name the path and the call.
absl::Status WriteSmallFile(const std::string& path, absl::string_view contents);

// Opens `path` read-only (O_CLOEXEC). NotFound if it does not exist.
absl::StatusOr<ScopedFd> OpenForRead(const std::string& path);

// Same, shared: the form the descriptor caches hold.
absl::StatusOr<std::shared_ptr<ScopedFd>> OpenShared(const std::string& path);

// A directory opened once (O_PATH), so that files under it are opened by
// their relative names: the kernel then walks only those components, not the
// directory's own path again. Invalid (and OpenShared falls back to full
// paths) if the directory could not be opened.
class DirectoryHandle {
 public:
  explicit DirectoryHandle(std::string path);
  const std::string& path() const { return path_; }
  // The O_PATH descriptor of the directory; -1 if it could not be opened.
  int fd() const { return fd_.get(); }
  // Opens `relative` under the directory read-only (O_CLOEXEC), without
  // blocking (OpenSharedAt).
  absl::StatusOr<std::shared_ptr<ScopedFd>> OpenShared(absl::string_view relative) const;
  // The same, for files Monarch wrote itself: no component may be a symlink
  // (openat2 RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH; on kernels without
  // openat2, O_NOFOLLOW on the last one), and O_NONBLOCK so that a FIFO put
  // in the file's place cannot block the open. ELOOP and ENXIO read as
  // DataLoss: the file is not what was written there.
  absl::StatusOr<std::shared_ptr<ScopedFd>> OpenBeneath(absl::string_view relative) const;

 private:
  std::string path_;
  ScopedFd fd_;
};

// Opens `name` relative to the directory descriptor `directory`, read-only
// (O_CLOEXEC) and without blocking (O_NONBLOCK: a FIFO in a file's place
// cannot hang the open, and its reads fail). The type is not checked here;
// `path` names the file in errors.
absl::StatusOr<std::shared_ptr<ScopedFd>> OpenSharedAt(int directory, const std::string& name,
                                                       absl::string_view path);

// Reads up to `n` bytes at `offset`; fewer only at end of file.
absl::StatusOr<size_t> PreadFull(int fd, char* buffer, size_t n, uint64_t offset,
                                 absl::string_view path);

// Writes all `n` bytes at `offset`.
absl::Status PwriteFull(int fd, const char* buffer, size_t n, uint64_t offset,
                        absl::string_view path);

// Creates `dir` and its missing parents (mode 0755). OK if it exists.
absl::Status MakeDirectories(const std::string& dir);

// Creates `dir` 0700 (its parents as MakeDirectories) if needed, and checks
// that it is a real directory of this user closed to others (tightening
// its mode if it is not): what may hold what other users must not read or
// replace. Errors name `what` (a config key) and the directory.
absl::Status MakePrivateDirectory(const std::string& dir, absl::string_view what);
// The same for a directory that group `gid` shares: created with `mode`
// (02770, or 03770 for a parent that must keep members from removing each
// other's entries) and given to the group (EPERM, named, for a user not in
// it). An existing one may be any member's: it must be the group's and
// closed to others. Only a member (or root) can give a directory to a
// group, so one passing the check was made by the group, not by an outsider.
absl::Status MakeGroupDirectory(const std::string& dir, gid_t gid, mode_t mode,
                                absl::string_view what);

// "a/b/c" + "d" -> "a/b/c/d".
std::string JoinPath(absl::string_view a, absl::string_view b);

// Physical memory in bytes, and memory currently available (MemAvailable).
uint64_t PhysicalMemoryBytes();
uint64_t AvailableMemoryBytes();

}  // namespace monarch

#endif  // MONARCH_COMMON_FILE_UTIL_H_
