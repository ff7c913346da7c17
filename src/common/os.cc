// Direct system calls: see os.h for why Monarch does not use libc's wrappers
// for file calls.

#include "common/os.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

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

int Open(const char* path, int flags, mode_t mode) { return OpenAt(AT_FDCWD, path, flags, mode); }

int OpenAt(int dir_fd, const char* path, int flags, mode_t mode) {
  if (MONARCH_OS_VIA_LIBC) return ::openat(dir_fd, path, flags, mode);
  return static_cast<int>(::syscall(SYS_openat, dir_fd, path, flags, mode));
}

ssize_t Read(int fd, void* buffer, size_t n) {
  if (MONARCH_OS_VIA_LIBC) return ::read(fd, buffer, n);
  return static_cast<ssize_t>(::syscall(SYS_read, fd, buffer, n));
}

ssize_t Pread(int fd, void* buffer, size_t n, off_t offset) {
  if (MONARCH_OS_VIA_LIBC) return ::pread(fd, buffer, n, offset);
  return static_cast<ssize_t>(::syscall(SYS_pread64, fd, buffer, n, offset));
}

ssize_t Write(int fd, const void* buffer, size_t n) {
  if (MONARCH_OS_VIA_LIBC) return ::write(fd, buffer, n);
  return static_cast<ssize_t>(::syscall(SYS_write, fd, buffer, n));
}

off_t Lseek(int fd, off_t offset, int whence) {
  if (MONARCH_OS_VIA_LIBC) return ::lseek(fd, offset, whence);
  return static_cast<off_t>(::syscall(SYS_lseek, fd, offset, whence));
}

int Close(int fd) {
  if (MONARCH_OS_VIA_LIBC) return ::close(fd);
  return static_cast<int>(::syscall(SYS_close, fd));
}

int Dup(int fd) {
  if (MONARCH_OS_VIA_LIBC) return ::dup(fd);
  return static_cast<int>(::syscall(SYS_dup, fd));
}

// newfstatat is the one stat call every 64-bit Linux architecture has.
int Fstat(int fd, struct stat* st) { return FstatAt(fd, "", st, AT_EMPTY_PATH); }
int Stat(const char* path, struct stat* st) { return FstatAt(AT_FDCWD, path, st, 0); }
int Lstat(const char* path, struct stat* st) {
  return FstatAt(AT_FDCWD, path, st, AT_SYMLINK_NOFOLLOW);
}
int FstatAt(int dir_fd, const char* path, struct stat* st, int flags) {
  if (MONARCH_OS_VIA_LIBC) return ::fstatat(dir_fd, path, st, flags);
  return static_cast<int>(::syscall(SYS_newfstatat, dir_fd, path, st, flags));
}

void* Mmap(void* address, size_t length, int protection, int flags, int fd, off_t offset) {
  if (MONARCH_OS_VIA_LIBC) return ::mmap(address, length, protection, flags, fd, offset);
  // The raw call returns -errno in the top page; syscall() turns that into -1
  // and errno, which is MAP_FAILED.
  return reinterpret_cast<void*>(
      ::syscall(SYS_mmap, address, length, protection, flags, fd, offset));
}

int Munmap(void* address, size_t length) {
  if (MONARCH_OS_VIA_LIBC) return ::munmap(address, length);
  return static_cast<int>(::syscall(SYS_munmap, address, length));
}

}  // namespace monarch::os
