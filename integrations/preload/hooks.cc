// The C library functions libmonarch_preload.so interposes. Each one asks
// the table (or the path resolver) whether the call is about a dataset file
// and otherwise hands it to libc unchanged. See README.md for the list and
// the reasons behind it.
//
// Signatures and exception specifications match glibc's declarations
// exactly (C++ rejects a definition that differs from its declaration).

#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstring>
#include <memory>
#include <vector>

#include "common/os.h"
#include "preload.h"

using monarch::Monarch;
using monarch::preload::FindDatasetFile;
using monarch::preload::Forget;
using monarch::preload::Lookup;
using monarch::preload::OpenFile;
using monarch::preload::ReadAt;
using monarch::preload::ReadAtOffset;
using monarch::preload::Register;

namespace {

// Only plain read-only opens of existing files are served; writing,
// creating, O_PATH and directory opens keep the file system's semantics.
bool ServableOpen(int flags) {
  return (flags & O_ACCMODE) == O_RDONLY &&
         (flags & (O_CREAT | O_TRUNC | O_PATH | O_DIRECTORY | O_TMPFILE)) == 0;
}

bool TakesMode(int flags) { return (flags & O_CREAT) != 0 || (flags & O_TMPFILE) == O_TMPFILE; }

template <typename Real>
int OpenHook(int dir_fd, const char* path, int flags, Real real) {
  if (ServableOpen(flags)) {
    std::string name;
    Monarch::FileStat stat;
    // O_NOFOLLOW on a name that is a symlink fails with ELOOP: the real call says so.
    if (FindDatasetFile(dir_fd, path, &name, &stat) && !((flags & O_NOFOLLOW) && stat.via_symlink)) {
      const int fd = monarch::preload::OpenDatasetFile(name, stat, flags);
      if (fd >= 0) return fd;
    }
  }
  const int fd = real();
  if (fd >= 0) Forget(fd);  // A stale entry, if the number was ours once.
  return fd;
}

template <typename Real>
FILE* FopenHook(const char* path, const char* mode, Real real) {
  if (mode != nullptr && mode[0] == 'r' && std::strchr(mode, '+') == nullptr) {
    std::string name;
    Monarch::FileStat stat;
    if (FindDatasetFile(AT_FDCWD, path, &name, &stat)) {
      const int flags = O_RDONLY | (std::strchr(mode, 'e') != nullptr ? O_CLOEXEC : 0);
      const int fd = monarch::preload::OpenDatasetFile(name, stat, flags);
      if (fd >= 0) {
        if (FILE* stream = monarch::preload::OpenStream(fd, mode)) return stream;
        Forget(fd);
        monarch::os::Close(fd);
      }
    }
  }
  FILE* stream = real();
  if (stream != nullptr) Forget(MONARCH_NEXT(fileno)(stream));
  return stream;
}

template <typename Stat, typename Real>
int StatHook(int dir_fd, const char* path, Stat* out, bool follow, Real real) {
  std::string name;
  Monarch::FileStat stat;
  if (FindDatasetFile(dir_fd, path, &name, &stat) && (follow || !stat.via_symlink)) {
    monarch::preload::FillStat(stat, reinterpret_cast<struct stat*>(out));
    return 0;
  }
  return real();
}

template <typename Stat, typename Real>
int FstatHook(int fd, Stat* out, Real real) {
  if (std::shared_ptr<OpenFile> file = Lookup(fd)) {
    monarch::preload::FillStat(file->stat, reinterpret_cast<struct stat*>(out));
    return 0;
  }
  return real();
}

template <typename Stat, typename Real>
int FstatatHook(int dir_fd, const char* path, Stat* out, int flags, Real real) {
  if ((flags & AT_EMPTY_PATH) && (path == nullptr || path[0] == '\0')) {
    return FstatHook(dir_fd, out, real);
  }
  return StatHook(dir_fd, path, out, (flags & AT_SYMLINK_NOFOLLOW) == 0, real);
}

ssize_t ReadVector(const OpenFile& file, const struct iovec* iov, int count, uint64_t offset) {
  if (count < 0 || count > IOV_MAX) {
    errno = EINVAL;
    return -1;
  }
  ssize_t total = 0;
  for (int i = 0; i < count; ++i) {
    if (iov[i].iov_len == 0) continue;
    const ssize_t done = ReadAt(file, iov[i].iov_base, iov[i].iov_len, offset + total);
    if (done < 0) return total > 0 ? total : done;
    total += done;
    if (static_cast<size_t>(done) < iov[i].iov_len) break;  // End of file.
  }
  return total;
}

ssize_t ReadVectorAtOffset(OpenFile& file, const struct iovec* iov, int count) {
  for (;;) {
    uint64_t offset = file.offset.load(std::memory_order_acquire);
    const ssize_t done = ReadVector(file, iov, count, offset);
    if (done < 0) return done;
    if (file.offset.compare_exchange_strong(offset, offset + static_cast<uint64_t>(done))) {
      return done;
    }
  }
}

// copy_file_range, sendfile and splice from a dataset descriptor: the
// kernel cannot read the placeholder, so the bytes go through a buffer.
// One piece per call, as the real calls may return short.
ssize_t CopyOut(OpenFile& file, off64_t* in_offset, int out_fd, off64_t* out_offset, size_t n) {
  constexpr size_t kPiece = 1 << 20;
  n = std::min(n, kPiece);
  if (n == 0) return 0;
  std::unique_ptr<char[]> buffer(new (std::nothrow) char[n]);
  if (!buffer) {
    errno = ENOMEM;
    return -1;
  }
  const uint64_t from =
      in_offset != nullptr ? static_cast<uint64_t>(*in_offset) : file.offset.load();
  const ssize_t got = ReadAt(file, buffer.get(), n, from);
  if (got <= 0) return got;
  const ssize_t put = out_offset != nullptr ? ::pwrite(out_fd, buffer.get(), got, *out_offset)
                                            : ::write(out_fd, buffer.get(), got);
  if (put < 0) return -1;
  if (in_offset != nullptr) {
    *in_offset += put;
  } else {
    file.offset.store(from + static_cast<uint64_t>(put));
  }
  if (out_offset != nullptr) *out_offset += put;
  return put;
}

// Mappings of at most this many of the file's bytes are filled at once
// through Monarch, as a read would be: the bytes come from a tier copy, and
// a first mapping promotes the file like a first read. Larger ones map the
// source file itself (MapSourceLazily), then whatever a tier holds copies
// of that may be mapped from those copies (Monarch::MapCopies), so they
// cost nothing until a page is touched. 8 MiB: below it a fill from the RAM
// tier costs at most a few milliseconds and that much private memory per
// mapping; far above it, filling costs the whole range in time and memory
// before the first byte is read (bench/results/preload_mmap.md). The mapping of a file between is
// served either way; the limit is a bound on that cost, not a tuned point.
constexpr uint64_t kFilledMappingBytes = 8 << 20;

// The source file mapped in place of the placeholder: pages are read when
// touched, through the kernel's page cache, so every process of the node
// that maps the file shares them (a private mapping shares the cached pages
// until it writes one), and a fork()ed child inherits a mapping that goes on
// working without us. Null (errno kept) when that cannot be
// done exactly: the source is gone or no longer the file the namespace
// walked (another size or mtime), or its file system cannot map; the caller
// then fills the mapping through Monarch instead.
void* MapSourceLazily(const OpenFile& file, void* address, size_t length, int protection,
                      int flags, off_t offset) {
  const std::string path = monarch::preload::SourcePath(file);
  const int fd = monarch::os::Open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return nullptr;
  struct stat st;
  void* mapped = nullptr;
  if (monarch::os::Fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
      static_cast<uint64_t>(st.st_size) == file.stat.size &&
      static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec ==
          file.stat.mtime_ns) {
    // Private even when the caller asked for shared: the two read the same
    // bytes of a file nobody writes, and a FUSE file opened with direct_io
    // (the PFS emulator's, some PFS clients') can be mapped only privately.
    // Shared writable mappings were refused before.
    const int private_flags = (flags & ~MAP_TYPE) | MAP_PRIVATE;
    mapped = MONARCH_NEXT(mmap)(address, length, protection, private_flags, fd, offset);
    if (mapped == MAP_FAILED) mapped = nullptr;
  }
  const int error = errno;
  monarch::os::Close(fd);  // The mapping holds the file.
  errno = error;
  return mapped;
}

// A mapping filled with the file's bytes read through Monarch: a private
// copy, since the dataset never changes under a training job, so a shared
// mapping of it reads the same as a private one.
void* MapFilled(const OpenFile& file, void* address, size_t length, int protection, int flags,
                uint64_t start, uint64_t want) {
  const int keep = MAP_FIXED | MAP_FIXED_NOREPLACE | MAP_NORESERVE | MAP_LOCKED | MAP_32BIT;
  void* mapped = MONARCH_NEXT(mmap)(address, length, PROT_READ | PROT_WRITE,
                                    MAP_PRIVATE | MAP_ANONYMOUS | (flags & keep), -1, 0);
  if (mapped == MAP_FAILED) return mapped;
  uint64_t done = 0;
  while (done < want) {
    const ssize_t n = ReadAt(file, static_cast<char*>(mapped) + done, want - done, start + done);
    if (n < 0) {
      const int error = errno;
      ::munmap(mapped, length);
      errno = error;
      return MAP_FAILED;
    }
    if (n == 0) break;
    done += static_cast<uint64_t>(n);
  }
  if (protection != (PROT_READ | PROT_WRITE)) ::mprotect(mapped, length, protection);
  return mapped;
}

void* MapDatasetFile(const OpenFile& file, void* address, size_t length, int protection,
                     int flags, off_t offset) {
  const long page = ::sysconf(_SC_PAGESIZE);
  if (length == 0 || offset < 0 || offset % page != 0) {
    errno = EINVAL;
    return MAP_FAILED;
  }
  const int type = flags & MAP_TYPE;
  if ((type == MAP_SHARED || type == MAP_SHARED_VALIDATE) && (protection & PROT_WRITE)) {
    errno = EACCES;  // The descriptor is read-only.
    return MAP_FAILED;
  }
  const uint64_t start = static_cast<uint64_t>(offset);
  const uint64_t want = start < file.stat.size ? std::min<uint64_t>(length, file.stat.size - start)
                                                : 0;
  if (want > kFilledMappingBytes) {
    if (void* mapped = MapSourceLazily(file, address, length, protection, flags, offset)) {
      // The pages a file tier holds a checked copy of are mapped from that
      // copy instead, before anyone can touch them (Monarch::MapCopies).
      if (monarch::preload::MapCopiesInto(file, mapped, start, length, protection, flags) >= 0) {
        return mapped;
      }
      // Remapped in part, perhaps with a hole: the source alone, again.
      ::munmap(mapped, length);
      if (void* again = MapSourceLazily(file, address, length, protection, flags, offset)) {
        return again;
      }
    }
  }
  return MapFilled(file, address, length, protection, flags, start, want);
}

template <typename Real>
void* MmapHook(void* address, size_t length, int protection, int flags, int fd, off_t offset,
               Real real) {
  if (fd >= 0 && (flags & MAP_ANONYMOUS) == 0) {
    if (std::shared_ptr<OpenFile> file = Lookup(fd)) {
      return MapDatasetFile(*file, address, length, protection, flags, offset);
    }
  }
  return real();
}

// fcntl's third argument, whatever its type (glibc reads it the same way).
void* ThirdArgument(va_list args) { return va_arg(args, void*); }

template <typename Real>
int FcntlHook(int fd, int command, void* argument, Real real) {
  std::shared_ptr<OpenFile> file = Lookup(fd);
  if (!file) {
    const int result = real();
    if (result >= 0 && (command == F_DUPFD || command == F_DUPFD_CLOEXEC)) Forget(result);
    return result;
  }
  switch (command) {
    case F_DUPFD:
    case F_DUPFD_CLOEXEC: {
      const int copy = real();
      if (copy >= 0) Register(copy, file);
      return copy;
    }
    case F_GETFL:
      return file->status_flags.load();
    case F_SETFL: {
      constexpr int kSettable = O_APPEND | O_NONBLOCK | O_ASYNC | O_DIRECT | O_NOATIME;
      const int requested = static_cast<int>(reinterpret_cast<intptr_t>(argument));
      int current = file->status_flags.load();
      while (!file->status_flags.compare_exchange_weak(
          current, (current & ~kSettable) | (requested & kSettable))) {
      }
      return 0;
    }
    case F_GETLK:
    case F_OFD_GETLK:  // Nobody else's lock can conflict with a reader's view.
      static_cast<struct flock*>(argument)->l_type = F_UNLCK;
      return 0;
    case F_SETLK:
    case F_SETLKW:
    case F_OFD_SETLK:
    case F_OFD_SETLKW:
      if (static_cast<struct flock*>(argument)->l_type == F_WRLCK) {
        errno = EBADF;  // As for any descriptor opened read-only.
        return -1;
      }
      return 0;
    default:  // F_GETFD and F_SETFD act on the placeholder itself, as they should.
      return real();
  }
}

void ForgetAfterDup(int old_fd, int new_fd) {
  if (new_fd < 0 || new_fd == old_fd) return;
  if (std::shared_ptr<OpenFile> file = Lookup(old_fd)) {
    Register(new_fd, std::move(file));
  } else {
    Forget(new_fd);
  }
}

// execl's arguments up to the terminating null; `args` then points past it
// (at execle's environment).
std::vector<char*> CollectArguments(const char* first, va_list* args) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(first));
  while (argv.back() != nullptr) argv.push_back(va_arg(*args, char*));
  return argv;
}

}  // namespace

extern "C" {

// --- Opening ----------------------------------------------------------------

int open(const char* path, int flags, ...) {
  mode_t mode = 0;
  if (TakesMode(flags)) {
    va_list args;
    va_start(args, flags);
    mode = static_cast<mode_t>(va_arg(args, int));
    va_end(args);
  }
  return OpenHook(AT_FDCWD, path, flags, [&] { return MONARCH_NEXT(open)(path, flags, mode); });
}

int open64(const char* path, int flags, ...) {
  mode_t mode = 0;
  if (TakesMode(flags)) {
    va_list args;
    va_start(args, flags);
    mode = static_cast<mode_t>(va_arg(args, int));
    va_end(args);
  }
  return OpenHook(AT_FDCWD, path, flags, [&] { return MONARCH_NEXT(open64)(path, flags, mode); });
}

int openat(int dir_fd, const char* path, int flags, ...) {
  mode_t mode = 0;
  if (TakesMode(flags)) {
    va_list args;
    va_start(args, flags);
    mode = static_cast<mode_t>(va_arg(args, int));
    va_end(args);
  }
  return OpenHook(dir_fd, path, flags,
                  [&] { return MONARCH_NEXT(openat)(dir_fd, path, flags, mode); });
}

int openat64(int dir_fd, const char* path, int flags, ...) {
  mode_t mode = 0;
  if (TakesMode(flags)) {
    va_list args;
    va_start(args, flags);
    mode = static_cast<mode_t>(va_arg(args, int));
    va_end(args);
  }
  return OpenHook(dir_fd, path, flags,
                  [&] { return MONARCH_NEXT(openat64)(dir_fd, path, flags, mode); });
}

// The _FORTIFY_SOURCE entry points, which take no mode.
int __open_2(const char* path, int flags) {
  return OpenHook(AT_FDCWD, path, flags, [&] { return MONARCH_NEXT(__open_2)(path, flags); });
}
int __open64_2(const char* path, int flags) {
  return OpenHook(AT_FDCWD, path, flags, [&] { return MONARCH_NEXT(__open64_2)(path, flags); });
}
int __openat_2(int dir_fd, const char* path, int flags) {
  return OpenHook(dir_fd, path, flags,
                  [&] { return MONARCH_NEXT(__openat_2)(dir_fd, path, flags); });
}
int __openat64_2(int dir_fd, const char* path, int flags) {
  return OpenHook(dir_fd, path, flags,
                  [&] { return MONARCH_NEXT(__openat64_2)(dir_fd, path, flags); });
}

FILE* fopen(const char* path, const char* mode) {
  return FopenHook(path, mode, [&] { return MONARCH_NEXT(fopen)(path, mode); });
}
FILE* fopen64(const char* path, const char* mode) {
  return FopenHook(path, mode, [&] { return MONARCH_NEXT(fopen64)(path, mode); });
}

FILE* fdopen(int fd, const char* mode) noexcept {
  if (Lookup(fd) != nullptr) return monarch::preload::OpenStream(fd, mode);
  return MONARCH_NEXT(fdopen)(fd, mode);
}

int fileno(FILE* stream) noexcept {
  const int fd = monarch::preload::StreamDescriptor(stream);
  return fd != -2 ? fd : MONARCH_NEXT(fileno)(stream);
}

// --- Reading ----------------------------------------------------------------

ssize_t read(int fd, void* buffer, size_t n) {
  if (std::shared_ptr<OpenFile> file = Lookup(fd)) return ReadAtOffset(*file, buffer, n);
  return MONARCH_NEXT(read)(fd, buffer, n);
}

ssize_t pread(int fd, void* buffer, size_t n, off_t offset) {
  if (std::shared_ptr<OpenFile> file = Lookup(fd)) {
    if (offset < 0) {
      errno = EINVAL;
      return -1;
    }
    return ReadAt(*file, buffer, n, static_cast<uint64_t>(offset));
  }
  return MONARCH_NEXT(pread)(fd, buffer, n, offset);
}

ssize_t pread64(int fd, void* buffer, size_t n, off64_t offset) {
  if (std::shared_ptr<OpenFile> file = Lookup(fd)) {
    if (offset < 0) {
      errno = EINVAL;
      return -1;
    }
    return ReadAt(*file, buffer, n, static_cast<uint64_t>(offset));
  }
  return MONARCH_NEXT(pread64)(fd, buffer, n, offset);
}

ssize_t readv(int fd, const struct iovec* iov, int count) {
  if (std::shared_ptr<OpenFile> file = Lookup(fd)) return ReadVectorAtOffset(*file, iov, count);
  return MONARCH_NEXT(readv)(fd, iov, count);
}

ssize_t preadv(int fd, const struct iovec* iov, int count, off_t offset) {
  if (std::shared_ptr<OpenFile> file = Lookup(fd)) {
    if (offset < 0) {
      errno = EINVAL;
      return -1;
    }
    return ReadVector(*file, iov, count, static_cast<uint64_t>(offset));
  }
  return MONARCH_NEXT(preadv)(fd, iov, count, offset);
}

ssize_t preadv64(int fd, const struct iovec* iov, int count, off64_t offset) {
  if (std::shared_ptr<OpenFile> file = Lookup(fd)) {
    if (offset < 0) {
      errno = EINVAL;
      return -1;
    }
    return ReadVector(*file, iov, count, static_cast<uint64_t>(offset));
  }
  return MONARCH_NEXT(preadv64)(fd, iov, count, offset);
}

// preadv2's offset -1 means "at the file offset"; the flags (RWF_*) only
// tune how the kernel waits, which a shared-memory read never does.
ssize_t preadv2(int fd, const struct iovec* iov, int count, off_t offset, int flags) {
  if (std::shared_ptr<OpenFile> file = Lookup(fd)) {
    if (offset == -1) return ReadVectorAtOffset(*file, iov, count);
    if (offset < 0) {
      errno = EINVAL;
      return -1;
    }
    return ReadVector(*file, iov, count, static_cast<uint64_t>(offset));
  }
  return MONARCH_NEXT(preadv2)(fd, iov, count, offset, flags);
}

ssize_t preadv64v2(int fd, const struct iovec* iov, int count, off64_t offset, int flags) {
  if (std::shared_ptr<OpenFile> file = Lookup(fd)) {
    if (offset == -1) return ReadVectorAtOffset(*file, iov, count);
    if (offset < 0) {
      errno = EINVAL;
      return -1;
    }
    return ReadVector(*file, iov, count, static_cast<uint64_t>(offset));
  }
  return MONARCH_NEXT(preadv64v2)(fd, iov, count, offset, flags);
}

off_t lseek(int fd, off_t offset, int whence) noexcept {
  if (std::shared_ptr<OpenFile> file = Lookup(fd)) {
    return monarch::preload::Seek(*file, offset, whence);
  }
  return MONARCH_NEXT(lseek)(fd, offset, whence);
}

off64_t lseek64(int fd, off64_t offset, int whence) noexcept {
  if (std::shared_ptr<OpenFile> file = Lookup(fd)) {
    return monarch::preload::Seek(*file, offset, whence);
  }
  return MONARCH_NEXT(lseek64)(fd, offset, whence);
}

ssize_t copy_file_range(int in_fd, off64_t* in_offset, int out_fd, off64_t* out_offset,
                        size_t n, unsigned int flags) {
  std::shared_ptr<OpenFile> in = Lookup(in_fd);
  if (in == nullptr && Lookup(out_fd) == nullptr) {
    return MONARCH_NEXT(copy_file_range)(in_fd, in_offset, out_fd, out_offset, n, flags);
  }
  if (in == nullptr || Lookup(out_fd) != nullptr) {
    errno = EBADF;  // A dataset descriptor is never open for writing.
    return -1;
  }
  return CopyOut(*in, in_offset, out_fd, out_offset, n);
}

ssize_t sendfile(int out_fd, int in_fd, off_t* offset, size_t n) noexcept {
  std::shared_ptr<OpenFile> in = Lookup(in_fd);
  if (in == nullptr && Lookup(out_fd) == nullptr) {
    return MONARCH_NEXT(sendfile)(out_fd, in_fd, offset, n);
  }
  if (in == nullptr || Lookup(out_fd) != nullptr) {
    errno = EBADF;
    return -1;
  }
  return CopyOut(*in, reinterpret_cast<off64_t*>(offset), out_fd, nullptr, n);
}

ssize_t sendfile64(int out_fd, int in_fd, off64_t* offset, size_t n) noexcept {
  std::shared_ptr<OpenFile> in = Lookup(in_fd);
  if (in == nullptr && Lookup(out_fd) == nullptr) {
    return MONARCH_NEXT(sendfile64)(out_fd, in_fd, offset, n);
  }
  if (in == nullptr || Lookup(out_fd) != nullptr) {
    errno = EBADF;
    return -1;
  }
  return CopyOut(*in, offset, out_fd, nullptr, n);
}

ssize_t splice(int in_fd, off64_t* in_offset, int out_fd, off64_t* out_offset, size_t n,
               unsigned int flags) {
  std::shared_ptr<OpenFile> in = Lookup(in_fd);
  if (in == nullptr && Lookup(out_fd) == nullptr) {
    return MONARCH_NEXT(splice)(in_fd, in_offset, out_fd, out_offset, n, flags);
  }
  if (in == nullptr || Lookup(out_fd) != nullptr) {
    errno = EBADF;
    return -1;
  }
  return CopyOut(*in, in_offset, out_fd, out_offset, n);
}

void* mmap(void* address, size_t length, int protection, int flags, int fd,
           off_t offset) noexcept {
  return MmapHook(address, length, protection, flags, fd, offset, [&] {
    return MONARCH_NEXT(mmap)(address, length, protection, flags, fd, offset);
  });
}

void* mmap64(void* address, size_t length, int protection, int flags, int fd,
             off64_t offset) noexcept {
  return MmapHook(address, length, protection, flags, fd, offset, [&] {
    return MONARCH_NEXT(mmap64)(address, length, protection, flags, fd, offset);
  });
}

// Hints and advisory locks on a file nobody writes: accepted and moot.
int posix_fadvise(int fd, off_t offset, off_t length, int advice) noexcept {
  if (Lookup(fd) != nullptr) return 0;
  return MONARCH_NEXT(posix_fadvise)(fd, offset, length, advice);
}
int posix_fadvise64(int fd, off64_t offset, off64_t length, int advice) noexcept {
  if (Lookup(fd) != nullptr) return 0;
  return MONARCH_NEXT(posix_fadvise64)(fd, offset, length, advice);
}
ssize_t readahead(int fd, off64_t offset, size_t n) noexcept {
  if (Lookup(fd) != nullptr) return 0;
  return MONARCH_NEXT(readahead)(fd, offset, n);
}
int flock(int fd, int operation) noexcept {
  if (Lookup(fd) != nullptr) return 0;
  return MONARCH_NEXT(flock)(fd, operation);
}

// No ioctl means anything for a dataset file here (FICLONE, FIEMAP, ...):
// callers fall back to reading, which is what we serve.
int ioctl(int fd, unsigned long request, ...) noexcept {
  va_list args;
  va_start(args, request);
  void* argument = va_arg(args, void*);
  va_end(args);
  if (Lookup(fd) != nullptr) {
    errno = ENOTTY;
    return -1;
  }
  return MONARCH_NEXT(ioctl)(fd, request, argument);
}

// --- Metadata ---------------------------------------------------------------

// Extended attributes (ACLs: cp -a, tar --xattrs) of a dataset descriptor:
// the source file's, by its path.
ssize_t fgetxattr(int fd, const char* name, void* value, size_t size) noexcept {
  if (std::shared_ptr<OpenFile> file = Lookup(fd)) {
    const std::string path = monarch::preload::SourcePath(*file);
    return MONARCH_NEXT(getxattr)(path.c_str(), name, value, size);
  }
  return MONARCH_NEXT(fgetxattr)(fd, name, value, size);
}
ssize_t flistxattr(int fd, char* list, size_t size) noexcept {
  if (std::shared_ptr<OpenFile> file = Lookup(fd)) {
    const std::string path = monarch::preload::SourcePath(*file);
    return MONARCH_NEXT(listxattr)(path.c_str(), list, size);
  }
  return MONARCH_NEXT(flistxattr)(fd, list, size);
}

int stat(const char* path, struct stat* out) noexcept {
  return StatHook(AT_FDCWD, path, out, true, [&] { return MONARCH_NEXT(stat)(path, out); });
}
int stat64(const char* path, struct stat64* out) noexcept {
  return StatHook(AT_FDCWD, path, out, true, [&] { return MONARCH_NEXT(stat64)(path, out); });
}
int lstat(const char* path, struct stat* out) noexcept {
  return StatHook(AT_FDCWD, path, out, false, [&] { return MONARCH_NEXT(lstat)(path, out); });
}
int lstat64(const char* path, struct stat64* out) noexcept {
  return StatHook(AT_FDCWD, path, out, false, [&] { return MONARCH_NEXT(lstat64)(path, out); });
}
int fstat(int fd, struct stat* out) noexcept {
  return FstatHook(fd, out, [&] { return MONARCH_NEXT(fstat)(fd, out); });
}
int fstat64(int fd, struct stat64* out) noexcept {
  return FstatHook(fd, out, [&] { return MONARCH_NEXT(fstat64)(fd, out); });
}
int fstatat(int dir_fd, const char* path, struct stat* out, int flags) noexcept {
  return FstatatHook(dir_fd, path, out, flags,
                     [&] { return MONARCH_NEXT(fstatat)(dir_fd, path, out, flags); });
}
int fstatat64(int dir_fd, const char* path, struct stat64* out, int flags) noexcept {
  return FstatatHook(dir_fd, path, out, flags,
                     [&] { return MONARCH_NEXT(fstatat64)(dir_fd, path, out, flags); });
}

int statx(int dir_fd, const char* path, int flags, unsigned int mask,
          struct statx* out) noexcept {
  std::string name;
  Monarch::FileStat stat;
  if ((flags & AT_EMPTY_PATH) && path[0] == '\0') {  // glibc declares path nonnull.
    if (std::shared_ptr<OpenFile> file = Lookup(dir_fd)) {
      monarch::preload::FillStatx(file->stat, out);
      return 0;
    }
  } else if (FindDatasetFile(dir_fd, path, &name, &stat) &&
             ((flags & AT_SYMLINK_NOFOLLOW) == 0 || !stat.via_symlink)) {
    monarch::preload::FillStatx(stat, out);
    return 0;
  }
  return MONARCH_NEXT(statx)(dir_fd, path, flags, mask, out);
}

// The pre-2.33 glibc entry points, which programs built against an older
// glibc still call. glibc keeps them only as compatibility symbols, so the
// fall-through is the kernel call they wrap (x86_64's struct stat is the
// kernel's).
int __xstat(int, const char* path, struct stat* out) {
  return StatHook(AT_FDCWD, path, out, true, [&] { return monarch::os::Stat(path, out); });
}
int __xstat64(int, const char* path, struct stat64* out) {
  return StatHook(AT_FDCWD, path, out, true,
                  [&] { return monarch::os::Stat(path, reinterpret_cast<struct stat*>(out)); });
}
int __lxstat(int, const char* path, struct stat* out) {
  return StatHook(AT_FDCWD, path, out, false, [&] { return monarch::os::Lstat(path, out); });
}
int __lxstat64(int, const char* path, struct stat64* out) {
  return StatHook(AT_FDCWD, path, out, false,
                  [&] { return monarch::os::Lstat(path, reinterpret_cast<struct stat*>(out)); });
}
int __fxstat(int, int fd, struct stat* out) {
  return FstatHook(fd, out, [&] { return monarch::os::Fstat(fd, out); });
}
int __fxstat64(int, int fd, struct stat64* out) {
  return FstatHook(fd, out,
                   [&] { return monarch::os::Fstat(fd, reinterpret_cast<struct stat*>(out)); });
}
int __fxstatat(int, int dir_fd, const char* path, struct stat* out, int flags) {
  return FstatatHook(dir_fd, path, out, flags,
                     [&] { return monarch::os::FstatAt(dir_fd, path, out, flags); });
}
int __fxstatat64(int, int dir_fd, const char* path, struct stat64* out, int flags) {
  return FstatatHook(dir_fd, path, out, flags, [&] {
    return monarch::os::FstatAt(dir_fd, path, reinterpret_cast<struct stat*>(out), flags);
  });
}

// --- Descriptors ------------------------------------------------------------

int close(int fd) {
  Forget(fd);
  return MONARCH_NEXT(close)(fd);
}

int close_range(unsigned int first, unsigned int last, int flags) noexcept {
  const int result = MONARCH_NEXT(close_range)(first, last, flags);
  if (result == 0 && (flags & CLOSE_RANGE_CLOEXEC) == 0) {
    monarch::preload::ForgetRange(first, last);
  }
  return result;
}

void closefrom(int lowest) noexcept {
  MONARCH_NEXT(closefrom)(lowest);
  monarch::preload::ForgetRange(static_cast<unsigned>(std::max(lowest, 0)), ~0u);
}

int dup(int fd) noexcept {
  const int copy = MONARCH_NEXT(dup)(fd);
  ForgetAfterDup(fd, copy);
  return copy;
}

int dup2(int fd, int target) noexcept {
  if (fd != target && monarch::preload::InVforkChild()) {
    if (std::shared_ptr<OpenFile> file = Lookup(fd)) {
      return monarch::preload::DuplicateAsSource(*file, target, 0);
    }
  }
  const int result = MONARCH_NEXT(dup2)(fd, target);
  ForgetAfterDup(fd, result);
  return result;
}

int dup3(int fd, int target, int flags) noexcept {
  if (fd != target && monarch::preload::InVforkChild()) {
    if (std::shared_ptr<OpenFile> file = Lookup(fd)) {
      return monarch::preload::DuplicateAsSource(*file, target, flags);
    }
  }
  const int result = MONARCH_NEXT(dup3)(fd, target, flags);
  ForgetAfterDup(fd, result);
  return result;
}

int fcntl(int fd, int command, ...) {
  va_list args;
  va_start(args, command);
  void* argument = ThirdArgument(args);
  va_end(args);
  return FcntlHook(fd, command, argument,
                   [&] { return MONARCH_NEXT(fcntl)(fd, command, argument); });
}

int fcntl64(int fd, int command, ...) {
  va_list args;
  va_start(args, command);
  void* argument = ThirdArgument(args);
  va_end(args);
  return FcntlHook(fd, command, argument,
                   [&] { return MONARCH_NEXT(fcntl64)(fd, command, argument); });
}

// --- exec: dataset descriptors that outlive it become real ones -----------

int execve(const char* path, char* const argv[], char* const envp[]) noexcept {
  monarch::preload::PrepareForExec();
  return MONARCH_NEXT(execve)(path, argv, envp);
}
int execv(const char* path, char* const argv[]) noexcept {
  monarch::preload::PrepareForExec();
  return MONARCH_NEXT(execv)(path, argv);
}
int execvp(const char* file, char* const argv[]) noexcept {
  monarch::preload::PrepareForExec();
  return MONARCH_NEXT(execvp)(file, argv);
}
int execvpe(const char* file, char* const argv[], char* const envp[]) noexcept {
  monarch::preload::PrepareForExec();
  return MONARCH_NEXT(execvpe)(file, argv, envp);
}
int fexecve(int fd, char* const argv[], char* const envp[]) noexcept {
  monarch::preload::PrepareForExec();
  return MONARCH_NEXT(fexecve)(fd, argv, envp);
}
int execl(const char* path, const char* arg, ...) noexcept {
  va_list args;
  va_start(args, arg);
  std::vector<char*> argv = CollectArguments(arg, &args);
  va_end(args);
  monarch::preload::PrepareForExec();
  return MONARCH_NEXT(execv)(path, argv.data());
}
int execlp(const char* file, const char* arg, ...) noexcept {
  va_list args;
  va_start(args, arg);
  std::vector<char*> argv = CollectArguments(arg, &args);
  va_end(args);
  monarch::preload::PrepareForExec();
  return MONARCH_NEXT(execvp)(file, argv.data());
}
int execle(const char* path, const char* arg, ...) noexcept {
  va_list args;
  va_start(args, arg);
  std::vector<char*> argv = CollectArguments(arg, &args);
  char* const* envp = va_arg(args, char* const*);
  va_end(args);
  monarch::preload::PrepareForExec();
  return MONARCH_NEXT(execve)(path, argv.data(), envp);
}
// vfork(): the child runs on the parent's memory and stack until it execs,
// and may dup2 any dataset descriptor onto its stdin first (dash, Python's
// subprocess). Every dataset descriptor goes to the kernel beforehand, so
// parent and child share real descriptions, offsets included. A C wrapper
// cannot call vfork() (the child would return through the wrapper's frame
// and wreck the parent's stack), so vfork here is a few instructions of
// assembly: call the hand-over, then jump to libc's vfork, which returns
// straight to our caller.
void monarch_preload_before_vfork() __attribute__((visibility("hidden")));
void* monarch_preload_libc_vfork __attribute__((visibility("hidden"))) = nullptr;

void monarch_preload_before_vfork() {
  if (monarch_preload_libc_vfork == nullptr) {
    monarch_preload_libc_vfork = monarch::preload::NextSymbol("vfork");
  }
  monarch::preload::HandOverDescriptors(/*all=*/true);
}

#if defined(__x86_64__)
asm(R"(
    .text
    .globl vfork
    .type vfork, @function
vfork:
    .cfi_startproc
    subq $8, %rsp
    .cfi_adjust_cfa_offset 8
    call monarch_preload_before_vfork
    addq $8, %rsp
    .cfi_adjust_cfa_offset -8
    jmp *monarch_preload_libc_vfork(%rip)
    .cfi_endproc
    .size vfork, .-vfork
)");
#endif

int posix_spawn(pid_t* pid, const char* path, const posix_spawn_file_actions_t* actions,
                const posix_spawnattr_t* attributes, char* const argv[], char* const envp[]) {
  monarch::preload::HandOverDescriptors(/*all=*/true);
  return MONARCH_NEXT(posix_spawn)(pid, path, actions, attributes, argv, envp);
}
int posix_spawnp(pid_t* pid, const char* file, const posix_spawn_file_actions_t* actions,
                 const posix_spawnattr_t* attributes, char* const argv[], char* const envp[]) {
  monarch::preload::HandOverDescriptors(/*all=*/true);
  return MONARCH_NEXT(posix_spawnp)(pid, file, actions, attributes, argv, envp);
}

}  // extern "C"
