// The one seam between Monarch and the kernel for file calls.
//
// Every open, read, stat, mmap, close, directory listing, rename, unlink,
// mkdir, chmod, lock and path resolution Monarch makes on a file outside its
// storage drivers' own libraries (libpmem) goes through here, as a direct
// system call rather than through the C library's wrapper. The reason is
// the preload library (integrations/preload): it defines open(), read(),
// stat(), flock(), ... for the whole process, so a libc call made by
// Monarch itself would come back into its own hooks (a read of a dataset
// file through the hooks, from inside the hooks). A direct system call
// reaches the kernel whatever is interposed: ours, Darshan's, or any other
// tool's. (Sanitizer builds use the wrappers after all: see os.cc.
// Directory streams, realpath, statvfs and posix_fallocate always use libc,
// which does more than one system call for each; the preload library
// interposes none of them, and libc's own calls inside them never reach
// an interposer.)
//
// Not here: calls that name no file: sockets, eventfds, epoll, memfds
// (anonymous memory, sized with Ftruncate here but created and sealed with
// memfd_create and fcntl), madvise, and the dup2 and close_range by which a
// forked child sets up its descriptors before exec.
//
// Same contracts as the POSIX calls they stand for: -1 (or MAP_FAILED, or a
// null DIR*) and errno on failure, EINTR not retried (callers do that).
//
// The seam is injectable, LevelDB-style: the free functions below dispatch
// to an Env. Normally none is installed and each function makes its system
// call directly, after one atomic pointer load (no virtual call on the hot
// path). A test installs its own Env with ScopedEnvForTesting to fail chosen
// calls with chosen errnos (ENOENT, EIO, EACCES, ENOSPC) or to shorten
// reads, anywhere Monarch touches a file: the namespace walk, tier scans,
// temporaries and renames of copies, the rendezvous directory
// (tests/fault_env.h). The base class's methods are the direct calls, so a
// test Env overrides only what it injects into and calls Env::Method() to
// pass the rest through.
//
// Installing is race-free as a pointer swap, but an Env must outlive every
// call dispatched to it: install it before creating the instance (or
// calling the code) under test, and remove it after that instance is
// destroyed and its threads have joined. Never swap Envs while Monarch's
// threads run.

#ifndef MONARCH_COMMON_OS_H_
#define MONARCH_COMMON_OS_H_

#include <dirent.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <time.h>

#include <cstddef>
#include <cstdint>

namespace monarch::os {

// Each method is one system call (or libc call: directory streams,
// PosixFallocate, Statvfs, RealPath) with its POSIX contract. The free
// functions that are only a different spelling of one call reach the Env
// through that call: Open() is OpenAt(AT_FDCWD), Stat/Lstat/Fstat are
// FstatAt, so a test overriding OpenAt or FstatAt sees every open or stat.
class Env {
 public:
  Env() = default;
  virtual ~Env() = default;
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;

  // The direct system calls; what runs when no test Env is installed.
  static Env* Default();

  virtual int OpenAt(int dir_fd, const char* path, int flags, mode_t mode);
  virtual ssize_t Read(int fd, void* buffer, size_t n);
  virtual ssize_t Pread(int fd, void* buffer, size_t n, off_t offset);
  // preadv2 with RWF_NOWAIT: only bytes already in memory (the page cache);
  // -1 with EAGAIN when a read would wait for I/O, EOPNOTSUPP where the file
  // system cannot tell.
  virtual ssize_t PreadNoWait(int fd, void* buffer, size_t n, off_t offset);
  virtual ssize_t Write(int fd, const void* buffer, size_t n);
  virtual ssize_t Pwrite(int fd, const void* buffer, size_t n, off_t offset);
  virtual off_t Lseek(int fd, off_t offset, int whence);
  virtual int Close(int fd);
  virtual int Dup(int fd);
  virtual int FstatAt(int dir_fd, const char* path, struct stat* st, int flags);
  // statx(2), for its AT_STATX_DONT_SYNC: the attributes the kernel holds,
  // without a round trip to a network file system's server. ENOSYS on
  // kernels before 4.11.
  virtual int Statx(int dir_fd, const char* path, int flags, unsigned int mask,
                    struct statx* st);
  virtual void* Mmap(void* address, size_t length, int protection, int flags, int fd,
                     off_t offset);
  virtual int Munmap(void* address, size_t length);
  virtual void* Mremap(void* address, size_t length, size_t new_length, int flags,
                       void* new_address);
  virtual int Ftruncate(int fd, off_t length);
  virtual int Fallocate(int fd, int mode, off_t offset, off_t length);
  // posix_fallocate's contract: returns 0 or an error number, errno unset;
  // libc falls back to writing the blocks where the file system cannot
  // allocate them.
  virtual int PosixFallocate(int fd, off_t offset, off_t length);
  virtual int Flock(int fd, int operation);
  // posix_fadvise(2) as a system call (the preload library interposes
  // libc's): 0, or -1 and errno. Advice only: callers go on when it fails.
  virtual int Fadvise(int fd, off_t offset, off_t length, int advice);
  // fcntl(F_SETSIG, signal) then fcntl(F_SETLEASE, type): a lease (F_RDLCK)
  // whose break is announced with `signal`, or its release (F_UNLCK).
  virtual int SetLease(int fd, int signal, int type);

  // Directory streams. ReadDir returns null at the end, or on an error with
  // errno set (callers here treat both as the end, as readdir's do).
  virtual DIR* OpenDir(const char* path);
  virtual struct dirent* ReadDir(DIR* dir);
  virtual int CloseDir(DIR* dir);

  // Namespace changes.
  virtual int Rename(const char* from, const char* to);
  virtual int UnlinkAt(int dir_fd, const char* path, int flags);
  virtual int Mkdir(const char* path, mode_t mode);
  virtual int UtimensAt(int dir_fd, const char* path, const struct timespec times[2], int flags);
  virtual int Chmod(const char* path, mode_t mode);
  virtual int Chown(const char* path, uid_t owner, gid_t group);  // -1: unchanged.

  // Lookups by path.
  virtual int Access(const char* path, int mode);
  virtual int Statvfs(const char* path, struct statvfs* fs);
  // fstatfs(2), for the file system's type (f_type).
  virtual int Fstatfs(int fd, struct statfs* fs);
  // mincore(2) on a mapping of a file: which of its pages are in the page
  // cache (a test Env says they left it).
  virtual int Mincore(void* address, size_t length, unsigned char* vector);
  // cachestat(2) (Linux 6.5): how many pages of [offset, offset + length)
  // of a file are in the page cache, asked with no mapping; -1 and ENOSYS
  // on an older kernel.
  virtual int Cachestat(int fd, uint64_t offset, uint64_t length, uint64_t* cached_pages);
  // realpath's contract: `resolved` is PATH_MAX bytes, or null for a
  // malloc'ed result the caller frees; null and errno on failure.
  virtual char* RealPath(const char* path, char* resolved);
};

// Installs `env` process-wide (null: the direct calls again) and returns the
// one it replaces. See the top of this file for when this may be called.
Env* SetEnvForTesting(Env* env);

// Installs an Env for a scope and restores the previous one on exit.
class ScopedEnvForTesting {
 public:
  explicit ScopedEnvForTesting(Env* env) : previous_(SetEnvForTesting(env)) {}
  ~ScopedEnvForTesting() { SetEnvForTesting(previous_); }
  ScopedEnvForTesting(const ScopedEnvForTesting&) = delete;
  ScopedEnvForTesting& operator=(const ScopedEnvForTesting&) = delete;

 private:
  Env* const previous_;
};

int Open(const char* path, int flags, mode_t mode = 0);
int OpenAt(int dir_fd, const char* path, int flags, mode_t mode = 0);
ssize_t Read(int fd, void* buffer, size_t n);
ssize_t Pread(int fd, void* buffer, size_t n, off_t offset);
ssize_t PreadNoWait(int fd, void* buffer, size_t n, off_t offset);
ssize_t Write(int fd, const void* buffer, size_t n);
ssize_t Pwrite(int fd, const void* buffer, size_t n, off_t offset);
off_t Lseek(int fd, off_t offset, int whence);
int Close(int fd);
int Dup(int fd);
int Fstat(int fd, struct stat* st);
int Stat(const char* path, struct stat* st);   // Follows symlinks.
int Lstat(const char* path, struct stat* st);  // Does not.
int FstatAt(int dir_fd, const char* path, struct stat* st, int flags);
int Statx(int dir_fd, const char* path, int flags, unsigned int mask, struct statx* st);
void* Mmap(void* address, size_t length, int protection, int flags, int fd, off_t offset);
int Munmap(void* address, size_t length);
// mremap(2) with a new address (flags MREMAP_MAYMOVE | MREMAP_FIXED), or none.
void* Mremap(void* address, size_t length, size_t new_length, int flags, void* new_address);
int Ftruncate(int fd, off_t length);
int Fallocate(int fd, int mode, off_t offset, off_t length);
int PosixFallocate(int fd, off_t offset, off_t length);  // 0 or an error number.
int Flock(int fd, int operation);
int Fadvise(int fd, off_t offset, off_t length, int advice);
int SetLease(int fd, int signal, int type);
DIR* OpenDir(const char* path);
struct dirent* ReadDir(DIR* dir);
int CloseDir(DIR* dir);
int Rename(const char* from, const char* to);
int Unlink(const char* path);  // UnlinkAt(AT_FDCWD, path, 0).
int UnlinkAt(int dir_fd, const char* path, int flags);
int Mkdir(const char* path, mode_t mode);
int UtimensAt(int dir_fd, const char* path, const struct timespec times[2], int flags);
int Chmod(const char* path, mode_t mode);
int Chown(const char* path, uid_t owner, gid_t group);
int Access(const char* path, int mode);
int Statvfs(const char* path, struct statvfs* fs);
int Fstatfs(int fd, struct statfs* fs);
int Mincore(void* address, size_t length, unsigned char* vector);
int Cachestat(int fd, uint64_t offset, uint64_t length, uint64_t* cached_pages);
char* RealPath(const char* path, char* resolved);

}  // namespace monarch::os

#endif  // MONARCH_COMMON_OS_H_
