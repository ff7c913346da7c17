// Small POSIX file helpers.

#include "common/file_util.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/copy_bytes.h"
#include "common/os.h"
#include "common/status_macros.h"

namespace monarch {

ScopedFd::~ScopedFd() {
  if (fd_ >= 0) os::Close(fd_);
}

ScopedFd& ScopedFd::operator=(ScopedFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) os::Close(fd_);
    fd_ = other.release();
  }
  return *this;
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, size_t limit) {
  MONARCH_ASSIGN_OR_RETURN(ScopedFd fd, OpenForRead(path));
  std::string text;
  char buffer[16384];
  for (;;) {
    const ssize_t n = os::Read(fd.get(), buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, absl::StrCat("read ", path));
    if (n == 0) return text;
    if (text.size() + static_cast<size_t>(n) > limit) {
      return absl::ResourceExhaustedError(
          absl::StrCat(path, " is larger than ", limit, " bytes"));
    }
    text.append(buffer, static_cast<size_t>(n));
  }
}

absl::Status WriteSmallFile(const std::string& path, absl::string_view contents) {
  const int fd = RetryOnEintr(
      [&] { return os::Open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666); });
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("create ", path));
  ScopedFd owned(fd);
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = os::Write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, absl::StrCat("write ", path));
    if (n == 0) return ErrnoToStatus(EIO, absl::StrCat("write ", path));
    done += static_cast<size_t>(n);
  }
  // Some file systems (NFS, Lustre) report a failed write-back only here.
  if (os::Close(owned.release()) != 0) return ErrnoToStatus(errno, absl::StrCat("close ", path));
  return absl::OkStatus();
}

absl::StatusOr<ScopedFd> OpenForRead(const std::string& path) {
  const int fd = RetryOnEintr([&] { return os::Open(path.c_str(), O_RDONLY | O_CLOEXEC); });
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  return ScopedFd(fd);
}

absl::StatusOr<std::shared_ptr<ScopedFd>> OpenShared(const std::string& path) {
  MONARCH_ASSIGN_OR_RETURN(ScopedFd fd, OpenForRead(path));
  return std::make_shared<ScopedFd>(std::move(fd));
}

DirectoryHandle::DirectoryHandle(std::string path) : path_(std::move(path)) {
  fd_ = ScopedFd(os::Open(path_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
}

absl::StatusOr<std::shared_ptr<ScopedFd>> DirectoryHandle::OpenShared(
    absl::string_view relative) const {
  if (!fd_.valid()) return monarch::OpenShared(JoinPath(path_, relative));
  return OpenSharedAt(fd_.get(), std::string(relative), JoinPath(path_, relative));
}

absl::StatusOr<std::shared_ptr<ScopedFd>> OpenSharedAt(int directory, const std::string& name,
                                                       absl::string_view path) {
  // O_NONBLOCK: a dataset file replaced by a FIFO during the run must not
  // block the open (a regular file's reads ignore the flag; a FIFO's pread
  // fails with ESPIPE, a directory's with EISDIR). No fstat to check the
  // type: on a PFS that is one more metadata round trip per file, and a
  // copy is only committed after Identify(), which checks it.
  const int fd = RetryOnEintr(
      [&] { return os::OpenAt(directory, name.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK); });
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  return std::make_shared<ScopedFd>(fd);
}

absl::StatusOr<std::shared_ptr<ScopedFd>> DirectoryHandle::OpenBeneath(
    absl::string_view relative) const {
  const std::string name(relative);
  const std::string path = JoinPath(path_, relative);
  constexpr int kFlags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW;
  int fd = -1;
  if (fd_.valid()) {
#ifdef SYS_openat2
    open_how how = {};
    how.flags = kFlags;
    how.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
    fd = RetryOnEintr([&] {
      return static_cast<int>(::syscall(SYS_openat2, fd_.get(), name.c_str(), &how, sizeof(how)));
    });
    // No openat2 (before Linux 5.6, or filtered by seccomp): O_NOFOLLOW only.
    if (fd < 0 && (errno == ENOSYS || errno == EPERM)) fd = -2;
#else
    fd = -2;
#endif
    if (fd == -2) fd = RetryOnEintr([&] { return os::OpenAt(fd_.get(), name.c_str(), kFlags); });
  } else {
    fd = RetryOnEintr([&] { return os::Open(path.c_str(), kFlags); });
  }
  if (fd < 0) {
    if (errno == ELOOP || errno == EXDEV || errno == ENXIO) {
      return absl::DataLossError(absl::StrCat("open ", path, ": ", std::strerror(errno),
                                              " (not a file Monarch wrote)"));
    }
    return ErrnoToStatus(errno, absl::StrCat("open ", path));
  }
  return std::make_shared<ScopedFd>(fd);
}

absl::StatusOr<size_t> PreadFull(int fd, char* buffer, size_t n, uint64_t offset,
                                 absl::string_view path) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = PreadAroundAliasing(fd, buffer + done, n - done, offset + done);
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("read ", path));
    }
    if (r == 0) break;  // End of file.
    done += static_cast<size_t>(r);
  }
  return done;
}

absl::Status PwriteFull(int fd, const char* buffer, size_t n, uint64_t offset,
                        absl::string_view path) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = os::Pwrite(fd, buffer + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("write ", path));
    }
    if (r == 0) return ErrnoToStatus(EIO, absl::StrCat("write ", path));
    done += static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

absl::Status MakeDirectories(const std::string& dir) {
  if (dir.empty()) return absl::OkStatus();
  struct stat st;
  if (os::Stat(dir.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return absl::OkStatus();
    return ErrnoToStatus(ENOTDIR, absl::StrCat("mkdir ", dir));
  }
  size_t slash = dir.find_last_of('/');
  if (slash != std::string::npos && slash > 0) {
    MONARCH_RETURN_IF_ERROR(MakeDirectories(dir.substr(0, slash)));
  }
  if (os::Mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoToStatus(errno, absl::StrCat("mkdir ", dir));
  }
  return absl::OkStatus();
}

absl::Status MakePrivateDirectory(const std::string& dir, absl::string_view what) {
  if (os::Mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    MONARCH_RETURN_IF_ERROR(MakeDirectories(dir));  // A parent was missing.
    os::Chmod(dir.c_str(), 0700);
  }
  struct stat st;
  if (os::Lstat(dir.c_str(), &st) != 0) return ErrnoToStatus(errno, absl::StrCat(what, ": ", dir));
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": '", dir, "' is not a directory (or is a symlink)"));
  }
  if (st.st_uid != ::geteuid()) {
    return absl::PermissionDeniedError(absl::StrCat(what, ": '", dir, "' belongs to uid ",
                                                    st.st_uid, ", not to this user (uid ",
                                                    ::geteuid(), ")"));
  }
  if ((st.st_mode & 077) != 0 && os::Chmod(dir.c_str(), 0700) != 0) {
    return ErrnoToStatus(errno, absl::StrCat(what, ": chmod 0700 ", dir));
  }
  return absl::OkStatus();
}

absl::Status MakeGroupDirectory(const std::string& dir, gid_t gid, mode_t mode,
                                absl::string_view what) {
  int made = os::Mkdir(dir.c_str(), 0700);
  if (made != 0 && errno == ENOENT && dir.rfind('/') > 0) {  // A parent was missing.
    MONARCH_RETURN_IF_ERROR(MakeDirectories(dir.substr(0, dir.rfind('/'))));
    made = os::Mkdir(dir.c_str(), 0700);
  }
  if (made == 0) {
    // Made 0700 first: nobody may enter before the group owns it.
    if (os::Chown(dir.c_str(), static_cast<uid_t>(-1), gid) != 0) {
      const int error = errno;
      os::UnlinkAt(AT_FDCWD, dir.c_str(), AT_REMOVEDIR);
      return ErrnoToStatus(error, absl::StrCat(what, ": give '", dir, "' to group ", gid,
                                               " (is this user a member?)"));
    }
    if (os::Chmod(dir.c_str(), mode) != 0) {
      return ErrnoToStatus(errno, absl::StrCat(what, ": chmod ", dir));
    }
  } else if (errno != EEXIST) {
    return ErrnoToStatus(errno, absl::StrCat(what, ": mkdir ", dir));
  }
  struct stat st;
  if (os::Lstat(dir.c_str(), &st) != 0) return ErrnoToStatus(errno, absl::StrCat(what, ": ", dir));
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": '", dir, "' is not a directory (or is a symlink)"));
  }
  if (st.st_gid != gid || (st.st_mode & 07) != 0 || (st.st_mode & 070) != 070) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "%s: '%s' is group %d with mode %04o; a directory group %d shares must be that group's, "
        "open to it (rwx) and closed to others",
        what, dir, st.st_gid, st.st_mode & 07777, gid));
  }
  return absl::OkStatus();
}

std::string JoinPath(absl::string_view a, absl::string_view b) {
  if (a.empty()) return std::string(b);
  if (b.empty()) return std::string(a);
  if (a.back() == '/') return absl::StrCat(a, b);
  return absl::StrCat(a, "/", b);
}

uint64_t PhysicalMemoryBytes() {
  long pages = ::sysconf(_SC_PHYS_PAGES);
  long page_size = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
}

uint64_t AvailableMemoryBytes() {
  absl::StatusOr<std::string> meminfo = ReadSmallFile("/proc/meminfo");
  uint64_t kib = 0;
  if (meminfo.ok()) {
    for (absl::string_view line : absl::StrSplit(*meminfo, '\n')) {
      if (!absl::ConsumePrefix(&line, "MemAvailable:")) continue;
      line = absl::StripAsciiWhitespace(line);
      absl::ConsumeSuffix(&line, "kB");
      if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &kib)) kib = 0;
      break;
    }
  }
  return kib > 0 ? kib * 1024 : PhysicalMemoryBytes() / 2;
}

}  // namespace monarch
