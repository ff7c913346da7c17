// Shared memory between the node service and its clients: memfds.
//
// The service creates every shared region as a memfd whose size is sealed
// (F_SEAL_SHRINK | F_SEAL_GROW): no process holding it can truncate it under
// another's mapping, so a mapped reader never takes SIGBUS. Clients get a
// read-only reopening of it (ReopenReadOnly), which the kernel will not map
// writable: a client can read the service's state but never change it.
// The regions only the service writes (the namespace image, the tier slots,
// the RAM tiers' copies) are also sealed against writes
// (CreateWriteSealedRegion), which no reopening through /proc gets around.
//
// Regions are mapped MAP_SHARED; the address differs per process, so shared
// structures hold offsets, never pointers.

#ifndef MONARCH_COMMON_SHARED_MEMORY_H_
#define MONARCH_COMMON_SHARED_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/file_util.h"

namespace monarch {

// A memfd of `bytes` (rounded up to a page), size sealed. Sparse: pages
// cost memory only once written. `name` shows in /proc/<pid>/maps.
absl::StatusOr<ScopedFd> CreateSealedMemfd(const std::string& name, uint64_t bytes);

// A new read-only descriptor for the same memfd (through /proc/self/fd).
absl::StatusOr<ScopedFd> ReopenReadOnly(int fd);

// A mapping of a whole descriptor, unmapped on destruction.
class MappedRegion {
 public:
  MappedRegion() = default;
  ~MappedRegion();
  MappedRegion(MappedRegion&& other) noexcept;
  MappedRegion& operator=(MappedRegion&& other) noexcept;
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;

  // Maps all of `fd` (its size from fstat) shared, writable or read-only.
  // Refuses a memfd whose size is not sealed: a peer could shrink it.
  // `own_file`: also a file of this user, which cannot be sealed (a kept RAM
  // tier's on a tmpfs, which its service only grows: drivers/ram_keep.h).
  static absl::StatusOr<MappedRegion> Map(int fd, bool writable, bool own_file = false);

  char* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  char* data_ = nullptr;
  uint64_t size_ = 0;
};

// A memfd as CreateSealedMemfd makes it, mapped writable here and then
// sealed against every other write (F_SEAL_FUTURE_WRITE): write(), pwrite()
// and new writable mappings fail for every process, this one too, even
// through a descriptor reopened read-write from /proc/<pid>/fd. Only
// `writable` changes the bytes. For the service's state and the RAM tiers'
// copies: a client, or any other process of the same user, can read them
// but never alter them. (Pages freed inside it cannot be given back to the
// kernel: a write-sealed memfd refuses hole punching, fallocate and
// MADV_REMOVE alike, with EPERM.)
//
// Without `seal_writes` the region is sealed against new seals only, so that
// its owner can punch holes in it (fallocate(FALLOC_FL_PUNCH_HOLE)) and give
// freed pages back: for a RAM tier that shrinks under memory pressure
// (memory.watch). Clients still get read-only reopenings, which the kernel
// will not map writable, but a process of the same user could reopen it
// read-write through /proc/<pid>/fd and write.
struct WriteSealedRegion {
  ScopedFd fd;
  MappedRegion writable;
};
absl::StatusOr<WriteSealedRegion> CreateWriteSealedRegion(const std::string& name,
                                                          uint64_t bytes,
                                                          bool seal_writes = true);

}  // namespace monarch

#endif  // MONARCH_COMMON_SHARED_MEMORY_H_
