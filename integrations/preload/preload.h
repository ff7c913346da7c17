// The transparent mode's machinery, shared by the interposed libc functions
// in hooks.cc. See README.md for what is interposed and why.
//
// A dataset file opened by the program gets a real descriptor number from
// the kernel: an O_PATH descriptor of /dev/null (the placeholder). Reads,
// seeks and stats on it are answered here, through the node service's
// client (shared memory for hits, the service for misses). Anything the
// kernel is asked to do with the placeholder directly fails with EBADF
// rather than returning wrong bytes.
//
// Async-signal safety: a call on a descriptor or path that is not the
// dataset's costs a few atomic loads and no lock, so it is as safe in a
// signal handler as the libc call itself.

#ifndef MONARCH_INTEGRATIONS_PRELOAD_PRELOAD_H_
#define MONARCH_INTEGRATIONS_PRELOAD_PRELOAD_H_

#include <sys/stat.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "monarch/monarch.h"

struct statx;

namespace monarch::preload {

// Resolves libc's definition of `name`: the next one after this library.
void* NextSymbol(const char* name);
#define MONARCH_NEXT(fn)                                                                 \
  ([]() {                                                                                \
    static auto* const next = reinterpret_cast<decltype(&fn)>(::monarch::preload::NextSymbol(#fn)); \
    return next;                                                                         \
  }())

// One open file description: shared by the descriptors dup() makes of it,
// as the kernel's is (offset and status flags included).
struct OpenFile {
  std::string name;            // Dataset-relative.
  Monarch::FileStat stat;      // As the node service's namespace has it.
  std::atomic<int> status_flags;  // What F_GETFL says.
  std::atomic<uint64_t> offset{0};
};

// True once the library is configured and enabled in this process; false in
// programs without a config, after a config error, or inside Monarch.
bool Active();

// The dataset name `path` (relative to `dir_fd`, as openat takes it) stands
// for, if it is a dataset file: false for everything else, including paths
// with "..", directories and files the namespace does not have. Connects to
// the node service on the first dataset path; `stat` receives the file's.
bool FindDatasetFile(int dir_fd, const char* path, std::string* name, Monarch::FileStat* stat);

// Opens `name` for reading: a new placeholder descriptor registered in the
// table. -1 with errno on failure (the caller then tries the real open).
int OpenDatasetFile(const std::string& name, const Monarch::FileStat& stat, int flags);

// The open file behind `fd`, or null when `fd` is not a dataset descriptor.
std::shared_ptr<OpenFile> Lookup(int fd);
// Registers `fd` (a new placeholder) as another descriptor of `file`.
void Register(int fd, std::shared_ptr<OpenFile> file);
// Forgets `fd` (closed, or reused for something else). Cheap when unknown.
void Forget(int fd);
// Forgets every descriptor in [first, last].
void ForgetRange(unsigned first, unsigned last);

// pread on an open dataset file: bytes read, or -1 with errno.
ssize_t ReadAt(const OpenFile& file, void* buffer, size_t n, uint64_t offset);
// read: at the file's offset, which it advances atomically.
ssize_t ReadAtOffset(OpenFile& file, void* buffer, size_t n);
// Monarch::MapCopies on the lazy mapping of the source at `mapping`: the
// bytes mapped from tier copies, or -1 with errno (the caller then unmaps
// all of it).
int64_t MapCopiesInto(const OpenFile& file, void* mapping, uint64_t offset, uint64_t length,
                      int protection, int flags);
// lseek; -1 with errno.
off_t Seek(OpenFile& file, off_t offset, int whence);

// The file's path on the source (for calls the kernel must answer there).
std::string SourcePath(const OpenFile& file);

void FillStat(const Monarch::FileStat& in, struct stat* out);
void FillStatx(const Monarch::FileStat& in, struct statx* out);

// Before exec: descriptors that survive it (no FD_CLOEXEC) become real
// descriptors of the source file at the same offset, since the new program
// has no table to find them in. Leaves this process's table alone (a
// vfork() child shares its memory with the parent).
void PrepareForExec();

// True in a vfork() child: it shares its parent's memory, so it must not
// change the table (Python's subprocess dup2()s a dataset descriptor onto
// stdin there, then closes the rest and execs).
bool InVforkChild();

// Hands dataset descriptors over to the kernel: each becomes a real
// descriptor of the source file at the same offset (dups stay dups) and
// leaves the table. `all` = false: only files with a descriptor that
// survives exec (fork() does this first, so that parent and children share
// the offset as they would with the kernel's descriptor); true: every one
// (before posix_spawn, whose file actions may dup2 any of them).
void HandOverDescriptors(bool all);
// Puts a real descriptor of `file`'s source, at its offset, at number
// `target` (dup3 with `flags`; target -1: any number): what a descriptor
// that outlives exec must be. The new descriptor, or -1 with errno.
int DuplicateAsSource(const OpenFile& file, int target, int flags);

// A FILE* made for a dataset descriptor (fopen, fdopen): stdio's own reads
// cannot be interposed, so the stream reads through us.
FILE* OpenStream(int fd, const char* mode);
// The descriptor of a stream OpenStream made, or -2 if it is not one.
int StreamDescriptor(FILE* stream);

// Marks the calling thread as inside Monarch: every hook it reaches passes
// straight to libc. Monarch's own file I/O uses direct system calls
// (src/common/os.h); this covers the libraries it calls.
class InsideMonarch {
 public:
  InsideMonarch();
  ~InsideMonarch();
  InsideMonarch(const InsideMonarch&) = delete;
  InsideMonarch& operator=(const InsideMonarch&) = delete;
};

}  // namespace monarch::preload

#endif  // MONARCH_INTEGRATIONS_PRELOAD_PRELOAD_H_
