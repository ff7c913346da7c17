// ChunkPool: page-aligned buffers for promotion chunks, recycled.
//
// Why: a promotion streams a file through chunk buffers. Fresh memory has to
// be faulted in and zeroed by the kernel, which on a 2-core VM cost more than
// reading the file from a fast disk; a small set of recycled buffers stays
// mapped and, reused last-in first-out, mostly in cache. Buffers are sized in
// powers of two from 4 KiB up to the chunk size, so a small file does not pin
// a whole chunk. The bytes handed out and not yet returned are the staging
// memory the placement handler keeps within its budget.
//
// Thread-safe.

#ifndef MONARCH_PLACEMENT_CHUNK_POOL_H_
#define MONARCH_PLACEMENT_CHUNK_POOL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/mutex.h"

namespace monarch {

class ChunkPool {
 public:
  // `chunk_bytes`: the largest buffer handed out (a multiple of 4096).
  // `max_retained_bytes`: free buffers kept for reuse; the rest are freed.
  ChunkPool(size_t chunk_bytes, size_t max_retained_bytes);
  ~ChunkPool();
  ChunkPool(const ChunkPool&) = delete;
  ChunkPool& operator=(const ChunkPool&) = delete;

  // A buffer of at least `bytes` (at most chunk_bytes) bytes, 4096-aligned,
  // readable and writable up to its capacity rounded to whole pages.
  char* Acquire(size_t bytes);
  // Returns a buffer from Acquire(bytes) with the same `bytes`.
  void Release(char* buffer, size_t bytes);

  // Capacity of the buffers handed out and not yet released, and its
  // highest value so far.
  uint64_t bytes_in_use() const { return in_use_.load(std::memory_order_relaxed); }
  uint64_t peak_bytes_in_use() const { return peak_.load(std::memory_order_relaxed); }

 private:
  size_t CapacityFor(size_t bytes) const;

  const size_t chunk_bytes_;
  const size_t max_retained_bytes_;
  Mutex mu_;
  absl::flat_hash_map<size_t, std::vector<char*>> free_ ABSL_GUARDED_BY(mu_);
  size_t retained_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> in_use_{0};
  std::atomic<uint64_t> peak_{0};
};

}  // namespace monarch

#endif  // MONARCH_PLACEMENT_CHUNK_POOL_H_
