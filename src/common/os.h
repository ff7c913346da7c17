// The one seam between Monarch and the kernel for file calls.
//
// Every open, read, stat, mmap and close Monarch makes on a file goes
// through here, as a direct system call rather than through the C library's
// wrapper. The reason is the preload library (integrations/preload): it
// defines open(), read(), stat(), ... for the whole process, so a libc call
// made by Monarch itself would come back into its own hooks (a read of a
// dataset file through the hooks, from inside the hooks). A direct system
// call reaches the kernel whatever is interposed: ours, Darshan's, or any
// other tool's.
//
// (Sanitizer builds use the wrappers after all: see os.cc.)
//
// Same contracts as the POSIX calls they stand for: -1 (or MAP_FAILED) and
// errno on failure, EINTR not retried (callers do that, as before).

#ifndef MONARCH_COMMON_OS_H_
#define MONARCH_COMMON_OS_H_

#include <sys/stat.h>
#include <sys/types.h>

#include <cstddef>

namespace monarch::os {

int Open(const char* path, int flags, mode_t mode = 0);
int OpenAt(int dir_fd, const char* path, int flags, mode_t mode = 0);
ssize_t Read(int fd, void* buffer, size_t n);
ssize_t Pread(int fd, void* buffer, size_t n, off_t offset);
ssize_t Write(int fd, const void* buffer, size_t n);
off_t Lseek(int fd, off_t offset, int whence);
int Close(int fd);
int Dup(int fd);
int Fstat(int fd, struct stat* st);
int Stat(const char* path, struct stat* st);   // Follows symlinks.
int Lstat(const char* path, struct stat* st);  // Does not.
int FstatAt(int dir_fd, const char* path, struct stat* st, int flags);
void* Mmap(void* address, size_t length, int protection, int flags, int fd, off_t offset);
int Munmap(void* address, size_t length);

}  // namespace monarch::os

#endif  // MONARCH_COMMON_OS_H_
