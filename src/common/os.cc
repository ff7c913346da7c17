// Direct system calls: see os.h for why Monarch does not use libc's wrappers
// for file calls, and how a test Env is injected.

#include "common/os.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>   // rename
#include <cstdlib>  // realpath

#include "absl/base/optimization.h"

// Sanitizer builds go through libc: ASan and TSan keep their shadow memory
// and descriptor bookkeeping in libc's wrappers (mmap, munmap, close, read)
// and must see every call. The preload library is never built with them.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MONARCH_OS_VIA_LIBC 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define MONARCH_OS_VIA_LIBC 1
#endif
#endif
#ifndef MONARCH_OS_VIA_LIBC
#define MONARCH_OS_VIA_LIBC 0
#endif

namespace monarch::os {
namespace {

// The installed test Env; null (the common case) means the direct calls.
// Acquire/release so that a test Env's state written before installing it
// is visible to the threads that then call into it.
std::atomic<Env*> installed{nullptr};

Env* Installed() { return installed.load(std::memory_order_acquire); }

// The direct calls. Each free function below is "an Env is installed ?
// env->Call() : RawCall()", so the normal path costs one load and a
// predictable branch, no virtual call.

int RawOpenAt(int dir_fd, const char* path, int flags, mode_t mode) {
  if (MONARCH_OS_VIA_LIBC) return ::openat(dir_fd, path, flags, mode);
  return static_cast<int>(::syscall(SYS_openat, dir_fd, path, flags, mode));
}

ssize_t RawRead(int fd, void* buffer, size_t n) {
  if (MONARCH_OS_VIA_LIBC) return ::read(fd, buffer, n);
  return static_cast<ssize_t>(::syscall(SYS_read, fd, buffer, n));
}

ssize_t RawPread(int fd, void* buffer, size_t n, off_t offset) {
  if (MONARCH_OS_VIA_LIBC) return ::pread(fd, buffer, n, offset);
  return static_cast<ssize_t>(::syscall(SYS_pread64, fd, buffer, n, offset));
}

// The preload library interposes preadv2, so not libc's. RWF_NOWAIT needs
// Linux 4.14; older kernels refuse the flag (EOPNOTSUPP), as do file systems
// that cannot tell (FUSE, most network file systems). A refused read still
// starts read-ahead of what it refused (Linux, at least to 6.18), so the
// source driver asks with it only for a miss, whose copy reads those bytes
// next; everyone else asks cachestat(2) or mincore(2), which read nothing.
ssize_t RawPreadNoWait(int fd, void* buffer, size_t n, off_t offset) {
#ifndef RWF_NOWAIT
  constexpr int RWF_NOWAIT = 0x00000008;
#endif
  struct iovec vector = {buffer, n};
  if (MONARCH_OS_VIA_LIBC) return ::preadv2(fd, &vector, 1, offset, RWF_NOWAIT);
  // The kernel takes the offset as two halves (low, high), whatever the ABI.
  return ::syscall(SYS_preadv2, fd, &vector, 1, static_cast<unsigned long>(offset),
                   static_cast<unsigned long>(static_cast<uint64_t>(offset) >> 32), RWF_NOWAIT);
}

// The kernel's struct cachestat_range and struct cachestat (linux/mman.h
// from 6.5; the build's headers may be older). The syscall's number is the
// same on every architecture.
int RawCachestat(int fd, uint64_t offset, uint64_t length, uint64_t* cached_pages) {
  struct Range {
    uint64_t offset;
    uint64_t length;
  } range = {offset, length};
  struct Counts {
    uint64_t cache, dirty, writeback, evicted, recently_evicted;
  } counts = {};
  constexpr long kCachestat = 451;
  const int result = static_cast<int>(::syscall(kCachestat, fd, &range, &counts, 0));
  if (result == 0) *cached_pages = counts.cache;
  return result;
}

int RawFstatfs(int fd, struct statfs* fs) {
  if (MONARCH_OS_VIA_LIBC) return ::fstatfs(fd, fs);
  return static_cast<int>(::syscall(SYS_fstatfs, fd, fs));
}

ssize_t RawWrite(int fd, const void* buffer, size_t n) {
  if (MONARCH_OS_VIA_LIBC) return ::write(fd, buffer, n);
  return static_cast<ssize_t>(::syscall(SYS_write, fd, buffer, n));
}

ssize_t RawPwrite(int fd, const void* buffer, size_t n, off_t offset) {
  if (MONARCH_OS_VIA_LIBC) return ::pwrite(fd, buffer, n, offset);
  return static_cast<ssize_t>(::syscall(SYS_pwrite64, fd, buffer, n, offset));
}

off_t RawLseek(int fd, off_t offset, int whence) {
  if (MONARCH_OS_VIA_LIBC) return ::lseek(fd, offset, whence);
  return static_cast<off_t>(::syscall(SYS_lseek, fd, offset, whence));
}

int RawClose(int fd) {
  if (MONARCH_OS_VIA_LIBC) return ::close(fd);
  return static_cast<int>(::syscall(SYS_close, fd));
}

int RawDup(int fd) {
  if (MONARCH_OS_VIA_LIBC) return ::dup(fd);
  return static_cast<int>(::syscall(SYS_dup, fd));
}

// newfstatat is the one stat call every 64-bit Linux architecture has.
int RawFstatAt(int dir_fd, const char* path, struct stat* st, int flags) {
  if (MONARCH_OS_VIA_LIBC) return ::fstatat(dir_fd, path, st, flags);
  return static_cast<int>(::syscall(SYS_newfstatat, dir_fd, path, st, flags));
}

int RawStatx(int dir_fd, const char* path, int flags, unsigned int mask, struct statx* st) {
  if (MONARCH_OS_VIA_LIBC) return ::statx(dir_fd, path, flags, mask, st);
  return static_cast<int>(::syscall(SYS_statx, dir_fd, path, flags, mask, st));
}

void* RawMmap(void* address, size_t length, int protection, int flags, int fd, off_t offset) {
  if (MONARCH_OS_VIA_LIBC) return ::mmap(address, length, protection, flags, fd, offset);
  // The raw call returns -errno in the top page; syscall() turns that into -1
  // and errno, which is MAP_FAILED.
  return reinterpret_cast<void*>(
      ::syscall(SYS_mmap, address, length, protection, flags, fd, offset));
}

int RawMunmap(void* address, size_t length) {
  if (MONARCH_OS_VIA_LIBC) return ::munmap(address, length);
  return static_cast<int>(::syscall(SYS_munmap, address, length));
}

void* RawMremap(void* address, size_t length, size_t new_length, int flags, void* new_address) {
  if (MONARCH_OS_VIA_LIBC) return ::mremap(address, length, new_length, flags, new_address);
  return reinterpret_cast<void*>(
      ::syscall(SYS_mremap, address, length, new_length, flags, new_address));
}

int RawFtruncate(int fd, off_t length) {
  if (MONARCH_OS_VIA_LIBC) return ::ftruncate(fd, length);
  return static_cast<int>(::syscall(SYS_ftruncate, fd, length));
}

int RawFallocate(int fd, int mode, off_t offset, off_t length) {
  if (MONARCH_OS_VIA_LIBC) return ::fallocate(fd, mode, offset, length);
  return static_cast<int>(::syscall(SYS_fallocate, fd, mode, offset, length));
}

int RawFlock(int fd, int operation) {
  if (MONARCH_OS_VIA_LIBC) return ::flock(fd, operation);
  return static_cast<int>(::syscall(SYS_flock, fd, operation));
}

// The preload library interposes posix_fadvise, so not libc's.
int RawFadvise(int fd, off_t offset, off_t length, int advice) {
  if (MONARCH_OS_VIA_LIBC) {
    const int error = ::posix_fadvise(fd, offset, length, advice);
    if (error == 0) return 0;
    errno = error;
    return -1;
  }
  return static_cast<int>(::syscall(SYS_fadvise64, fd, offset, length, advice));
}

// Two fcntl calls; the preload library interposes fcntl, so not libc's.
int RawSetLease(int fd, int signal, int type) {
  if (MONARCH_OS_VIA_LIBC) {
    if (::fcntl(fd, F_SETSIG, signal) != 0) return -1;
    return ::fcntl(fd, F_SETLEASE, type);
  }
  if (::syscall(SYS_fcntl, fd, F_SETSIG, signal) != 0) return -1;
  return static_cast<int>(::syscall(SYS_fcntl, fd, F_SETLEASE, type));
}

// The *at forms: the only ones every Linux architecture has (aarch64 has no
// rename, unlink, mkdir, chmod or access).
int RawRename(const char* from, const char* to) {
  if (MONARCH_OS_VIA_LIBC) return ::rename(from, to);
#ifdef SYS_renameat
  return static_cast<int>(::syscall(SYS_renameat, AT_FDCWD, from, AT_FDCWD, to));
#else
  return static_cast<int>(::syscall(SYS_renameat2, AT_FDCWD, from, AT_FDCWD, to, 0));
#endif
}

int RawUnlinkAt(int dir_fd, const char* path, int flags) {
  if (MONARCH_OS_VIA_LIBC) return ::unlinkat(dir_fd, path, flags);
  return static_cast<int>(::syscall(SYS_unlinkat, dir_fd, path, flags));
}

int RawMkdir(const char* path, mode_t mode) {
  if (MONARCH_OS_VIA_LIBC) return ::mkdir(path, mode);
  return static_cast<int>(::syscall(SYS_mkdirat, AT_FDCWD, path, mode));
}

int RawUtimensAt(int dir_fd, const char* path, const struct timespec times[2], int flags) {
  if (MONARCH_OS_VIA_LIBC) return ::utimensat(dir_fd, path, times, flags);
  return static_cast<int>(::syscall(SYS_utimensat, dir_fd, path, times, flags));
}

int RawChmod(const char* path, mode_t mode) {
  if (MONARCH_OS_VIA_LIBC) return ::chmod(path, mode);
  return static_cast<int>(::syscall(SYS_fchmodat, AT_FDCWD, path, mode));
}

int RawChown(const char* path, uid_t owner, gid_t group) {
  if (MONARCH_OS_VIA_LIBC) return ::chown(path, owner, group);
  return static_cast<int>(::syscall(SYS_fchownat, AT_FDCWD, path, owner, group, 0));
}

int RawAccess(const char* path, int mode) {
  if (MONARCH_OS_VIA_LIBC) return ::access(path, mode);
  return static_cast<int>(::syscall(SYS_faccessat, AT_FDCWD, path, mode));
}

}  // namespace

Env* Env::Default() {
  static Env* const env = new Env();  // Never destroyed: calls may come during exit.
  return env;
}

int Env::OpenAt(int dir_fd, const char* path, int flags, mode_t mode) {
  return RawOpenAt(dir_fd, path, flags, mode);
}
ssize_t Env::Read(int fd, void* buffer, size_t n) { return RawRead(fd, buffer, n); }
ssize_t Env::Pread(int fd, void* buffer, size_t n, off_t offset) {
  return RawPread(fd, buffer, n, offset);
}
ssize_t Env::PreadNoWait(int fd, void* buffer, size_t n, off_t offset) {
  return RawPreadNoWait(fd, buffer, n, offset);
}
ssize_t Env::Write(int fd, const void* buffer, size_t n) { return RawWrite(fd, buffer, n); }
ssize_t Env::Pwrite(int fd, const void* buffer, size_t n, off_t offset) {
  return RawPwrite(fd, buffer, n, offset);
}
off_t Env::Lseek(int fd, off_t offset, int whence) { return RawLseek(fd, offset, whence); }
int Env::Close(int fd) { return RawClose(fd); }
int Env::Dup(int fd) { return RawDup(fd); }
int Env::FstatAt(int dir_fd, const char* path, struct stat* st, int flags) {
  return RawFstatAt(dir_fd, path, st, flags);
}
int Env::Statx(int dir_fd, const char* path, int flags, unsigned int mask, struct statx* st) {
  return RawStatx(dir_fd, path, flags, mask, st);
}
void* Env::Mmap(void* address, size_t length, int protection, int flags, int fd, off_t offset) {
  return RawMmap(address, length, protection, flags, fd, offset);
}
int Env::Munmap(void* address, size_t length) { return RawMunmap(address, length); }
void* Env::Mremap(void* address, size_t length, size_t new_length, int flags, void* new_address) {
  return RawMremap(address, length, new_length, flags, new_address);
}
int Env::Ftruncate(int fd, off_t length) { return RawFtruncate(fd, length); }
int Env::Fallocate(int fd, int mode, off_t offset, off_t length) {
  return RawFallocate(fd, mode, offset, length);
}
// libc in every build, as are Statvfs and RealPath below: each is several
// system calls and some logic (posix_fallocate writes the blocks itself where
// the file system cannot allocate), and the preload library interposes none.
int Env::PosixFallocate(int fd, off_t offset, off_t length) {
  return ::posix_fallocate(fd, offset, length);
}
int Env::Flock(int fd, int operation) { return RawFlock(fd, operation); }
int Env::Fadvise(int fd, off_t offset, off_t length, int advice) {
  return RawFadvise(fd, offset, length, advice);
}
int Env::SetLease(int fd, int signal, int type) { return RawSetLease(fd, signal, type); }
// libc's directory streams in every build: getdents64 needs a buffer and
// entry parsing that opendir already does, and the preload library does not
// interpose them (integrations/preload/README.md).
DIR* Env::OpenDir(const char* path) { return ::opendir(path); }
struct dirent* Env::ReadDir(DIR* dir) { return ::readdir(dir); }
int Env::CloseDir(DIR* dir) { return ::closedir(dir); }
int Env::Rename(const char* from, const char* to) { return RawRename(from, to); }
int Env::UnlinkAt(int dir_fd, const char* path, int flags) {
  return RawUnlinkAt(dir_fd, path, flags);
}
int Env::Mkdir(const char* path, mode_t mode) { return RawMkdir(path, mode); }
int Env::UtimensAt(int dir_fd, const char* path, const struct timespec times[2], int flags) {
  return RawUtimensAt(dir_fd, path, times, flags);
}
int Env::Chmod(const char* path, mode_t mode) { return RawChmod(path, mode); }
int Env::Chown(const char* path, uid_t owner, gid_t group) { return RawChown(path, owner, group); }
int Env::Access(const char* path, int mode) { return RawAccess(path, mode); }
int Env::Statvfs(const char* path, struct statvfs* fs) { return ::statvfs(path, fs); }
int Env::Fstatfs(int fd, struct statfs* fs) { return RawFstatfs(fd, fs); }
int Env::Mincore(void* address, size_t length, unsigned char* vector) {
  return ::mincore(address, length, vector);
}
int Env::Cachestat(int fd, uint64_t offset, uint64_t length, uint64_t* cached_pages) {
  return RawCachestat(fd, offset, length, cached_pages);
}
char* Env::RealPath(const char* path, char* resolved) { return ::realpath(path, resolved); }

Env* SetEnvForTesting(Env* env) {
  Env* previous = installed.exchange(env, std::memory_order_acq_rel);
  return previous;
}

// The dispatch: the installed Env if any, else the direct call.
#define MONARCH_OS_DISPATCH(call, raw, ...)                         \
  do {                                                              \
    if (Env* env = Installed(); ABSL_PREDICT_FALSE(env != nullptr)) \
      return env->call(__VA_ARGS__);                                \
    return raw(__VA_ARGS__);                                        \
  } while (0)

int Open(const char* path, int flags, mode_t mode) { return OpenAt(AT_FDCWD, path, flags, mode); }
int OpenAt(int dir_fd, const char* path, int flags, mode_t mode) {
  MONARCH_OS_DISPATCH(OpenAt, RawOpenAt, dir_fd, path, flags, mode);
}
ssize_t Read(int fd, void* buffer, size_t n) { MONARCH_OS_DISPATCH(Read, RawRead, fd, buffer, n); }
ssize_t Pread(int fd, void* buffer, size_t n, off_t offset) {
  MONARCH_OS_DISPATCH(Pread, RawPread, fd, buffer, n, offset);
}
ssize_t PreadNoWait(int fd, void* buffer, size_t n, off_t offset) {
  MONARCH_OS_DISPATCH(PreadNoWait, RawPreadNoWait, fd, buffer, n, offset);
}
ssize_t Write(int fd, const void* buffer, size_t n) {
  MONARCH_OS_DISPATCH(Write, RawWrite, fd, buffer, n);
}
ssize_t Pwrite(int fd, const void* buffer, size_t n, off_t offset) {
  MONARCH_OS_DISPATCH(Pwrite, RawPwrite, fd, buffer, n, offset);
}
off_t Lseek(int fd, off_t offset, int whence) {
  MONARCH_OS_DISPATCH(Lseek, RawLseek, fd, offset, whence);
}
int Close(int fd) { MONARCH_OS_DISPATCH(Close, RawClose, fd); }
int Dup(int fd) { MONARCH_OS_DISPATCH(Dup, RawDup, fd); }
int Fstat(int fd, struct stat* st) { return FstatAt(fd, "", st, AT_EMPTY_PATH); }
int Stat(const char* path, struct stat* st) { return FstatAt(AT_FDCWD, path, st, 0); }
int Lstat(const char* path, struct stat* st) {
  return FstatAt(AT_FDCWD, path, st, AT_SYMLINK_NOFOLLOW);
}
int FstatAt(int dir_fd, const char* path, struct stat* st, int flags) {
  MONARCH_OS_DISPATCH(FstatAt, RawFstatAt, dir_fd, path, st, flags);
}
int Statx(int dir_fd, const char* path, int flags, unsigned int mask, struct statx* st) {
  MONARCH_OS_DISPATCH(Statx, RawStatx, dir_fd, path, flags, mask, st);
}
void* Mmap(void* address, size_t length, int protection, int flags, int fd, off_t offset) {
  MONARCH_OS_DISPATCH(Mmap, RawMmap, address, length, protection, flags, fd, offset);
}
int Munmap(void* address, size_t length) {
  MONARCH_OS_DISPATCH(Munmap, RawMunmap, address, length);
}
void* Mremap(void* address, size_t length, size_t new_length, int flags, void* new_address) {
  MONARCH_OS_DISPATCH(Mremap, RawMremap, address, length, new_length, flags, new_address);
}
int Ftruncate(int fd, off_t length) { MONARCH_OS_DISPATCH(Ftruncate, RawFtruncate, fd, length); }
int Fallocate(int fd, int mode, off_t offset, off_t length) {
  MONARCH_OS_DISPATCH(Fallocate, RawFallocate, fd, mode, offset, length);
}
int PosixFallocate(int fd, off_t offset, off_t length) {
  MONARCH_OS_DISPATCH(PosixFallocate, ::posix_fallocate, fd, offset, length);
}
int Flock(int fd, int operation) { MONARCH_OS_DISPATCH(Flock, RawFlock, fd, operation); }
int Fadvise(int fd, off_t offset, off_t length, int advice) {
  MONARCH_OS_DISPATCH(Fadvise, RawFadvise, fd, offset, length, advice);
}
int SetLease(int fd, int signal, int type) {
  MONARCH_OS_DISPATCH(SetLease, RawSetLease, fd, signal, type);
}
DIR* OpenDir(const char* path) { MONARCH_OS_DISPATCH(OpenDir, ::opendir, path); }
struct dirent* ReadDir(DIR* dir) { MONARCH_OS_DISPATCH(ReadDir, ::readdir, dir); }
int CloseDir(DIR* dir) { MONARCH_OS_DISPATCH(CloseDir, ::closedir, dir); }
int Rename(const char* from, const char* to) { MONARCH_OS_DISPATCH(Rename, RawRename, from, to); }
int Unlink(const char* path) { return UnlinkAt(AT_FDCWD, path, 0); }
int UnlinkAt(int dir_fd, const char* path, int flags) {
  MONARCH_OS_DISPATCH(UnlinkAt, RawUnlinkAt, dir_fd, path, flags);
}
int Mkdir(const char* path, mode_t mode) { MONARCH_OS_DISPATCH(Mkdir, RawMkdir, path, mode); }
int UtimensAt(int dir_fd, const char* path, const struct timespec times[2], int flags) {
  MONARCH_OS_DISPATCH(UtimensAt, RawUtimensAt, dir_fd, path, times, flags);
}
int Chmod(const char* path, mode_t mode) { MONARCH_OS_DISPATCH(Chmod, RawChmod, path, mode); }
int Chown(const char* path, uid_t owner, gid_t group) {
  MONARCH_OS_DISPATCH(Chown, RawChown, path, owner, group);
}
int Access(const char* path, int mode) { MONARCH_OS_DISPATCH(Access, RawAccess, path, mode); }
int Statvfs(const char* path, struct statvfs* fs) {
  MONARCH_OS_DISPATCH(Statvfs, ::statvfs, path, fs);
}
int Fstatfs(int fd, struct statfs* fs) { MONARCH_OS_DISPATCH(Fstatfs, RawFstatfs, fd, fs); }
int Mincore(void* address, size_t length, unsigned char* vector) {
  MONARCH_OS_DISPATCH(Mincore, ::mincore, address, length, vector);
}
int Cachestat(int fd, uint64_t offset, uint64_t length, uint64_t* cached_pages) {
  MONARCH_OS_DISPATCH(Cachestat, RawCachestat, fd, offset, length, cached_pages);
}
char* RealPath(const char* path, char* resolved) {
  MONARCH_OS_DISPATCH(RealPath, ::realpath, path, resolved);
}

#undef MONARCH_OS_DISPATCH

}  // namespace monarch::os
