// ChunkPool: page-aligned buffers for promotion chunks, recycled, within the
// staging budget.
//
// Why recycled: a promotion streams a file through chunk buffers. Fresh
// memory has to be faulted in and zeroed by the kernel, which on a 2-core VM
// cost more than reading the file from a fast disk; a small set of recycled
// buffers stays mapped and, reused last-in first-out, mostly in cache.
// Buffers are sized in powers of two from 4 KiB up to the chunk size, so a
// small file does not pin a whole chunk.
//
// Why a budget here: the bytes handed out and not yet returned are the
// staging memory, and it must never exceed placement.max_staging_bytes. A
// buffer's capacity is therefore reserved against the budget before the
// buffer is handed out (one compare-and-swap), never checked after the chunk
// is loaded: with the check after the fact, every reader and placement
// thread that loads at the same moment overshoots by a chunk, which is what
// happened when the placement threads were starved of CPU.
//
// The budget is shared out so that nobody waits on a thread that may not
// get CPU time:
// - "Parked" buffers hold chunks a reader loaded and left for a placement
//   thread to write. They may fill at most `max_parked_bytes`: past that, a
//   reader writes its chunks itself (TryPark() fails). So the readers' share
//   always has room beyond the parked chunks, held only by threads that are
//   loading or writing right now and will return it when done.
// - `reserved_bytes` is kept for the placement threads (Acquire(kPlacement)),
//   a chunk each, so a placement thread finds room even while readers fill
//   their share.
// A thread waiting for room (Acquire) must hold no buffer meanwhile. Then
// the room it waits for is held by threads that are loading or writing, not
// waiting for staging memory, and they return it; the parked buffers alone
// always leave a chunk of room in either share.
//
// Thread-safe. The pool's mutex is taken last and nothing is called under
// it, so callers may hold their own locks, except around Acquire(), which
// waits.

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
  // Who asks for a buffer: readers may use the budget less the reserved
  // part, placement threads all of it.
  enum class Share { kReaders, kPlacement };

  // `chunk_bytes`: the largest buffer handed out (a multiple of 4096).
  // `budget_bytes`: the most capacity handed out at once; raised to
  // chunk_bytes if it is less, since a chunk has to fit. Free buffers are
  // also kept for reuse up to this amount; the rest are freed.
  // `reserved_bytes`: kept from the readers for the placement threads; cut
  // down so that the readers' share holds at least one chunk.
  // `max_parked_bytes`: cut down so that the readers' share holds at least
  // one chunk besides the parked ones.
  ChunkPool(size_t chunk_bytes, uint64_t budget_bytes, uint64_t reserved_bytes,
            uint64_t max_parked_bytes);
  ~ChunkPool();
  ChunkPool(const ChunkPool&) = delete;
  ChunkPool& operator=(const ChunkPool&) = delete;

  // A buffer of at least `bytes` (at most chunk_bytes) bytes, 4096-aligned,
  // readable and writable up to its capacity rounded to whole pages, from
  // the readers' share; nullptr at once if that share has no room for it.
  char* TryAcquire(size_t bytes);
  // As TryAcquire() but from `share`, waiting until there is room. The
  // caller must hold no other buffer from this pool, nor any lock a holder
  // of one may need.
  char* Acquire(size_t bytes, Share share);
  // Returns a buffer from TryAcquire/Acquire with the same `bytes`; it must
  // not be parked.
  void Release(char* buffer, size_t bytes);

  // Counts a held buffer of `bytes` as parked if the parked ones stay within
  // their limit; false if they would not (the caller keeps it in hand).
  bool TryPark(size_t bytes);
  // The parked buffer of `bytes` is back in a thread's hands.
  void Unpark(size_t bytes);

  // The budget in force (after raising it to one chunk).
  uint64_t budget_bytes() const { return budget_bytes_; }
  // Capacity of the buffers handed out and not yet released, and its
  // highest value so far; neither ever exceeds budget_bytes().
  uint64_t bytes_in_use() const { return in_use_.load(std::memory_order_relaxed); }
  uint64_t peak_bytes_in_use() const { return peak_.load(std::memory_order_relaxed); }
  // Of bytes_in_use(), the parked buffers.
  uint64_t parked_bytes() const { return parked_.load(std::memory_order_relaxed); }
  // How many times an Acquire() had to wait for room; how many times a
  // waiting one found none (a test waits on it to see a waiter look again).
  uint64_t waits() const { return waits_.load(std::memory_order_relaxed); }
  uint64_t refusals() const { return refusals_.load(std::memory_order_relaxed); }

 private:
  size_t CapacityFor(size_t bytes) const;
  // Adds `capacity` to `counter` if that keeps it within `limit`; `now`
  // (if not null) gets the sum.
  static bool TryAdd(std::atomic<uint64_t>& counter, uint64_t capacity, uint64_t limit,
                     uint64_t* now);
  // TryAdd to the bytes in use, and their peak.
  bool TryReserve(size_t capacity, uint64_t limit);
  // A buffer of `capacity` already reserved: a free one, else a new one.
  char* Take(size_t capacity);

  const size_t chunk_bytes_;
  const uint64_t budget_bytes_;
  const uint64_t readers_limit_;  // budget_bytes_ less the reserved part.
  const uint64_t max_parked_bytes_;
  Mutex mu_;
  CondVar room_;  // Signalled on Release() while an Acquire() waits.
  absl::flat_hash_map<size_t, std::vector<char*>> free_ ABSL_GUARDED_BY(mu_);
  size_t retained_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int waiters_ ABSL_GUARDED_BY(mu_) = 0;  // Threads in Acquire() waiting for room.
  // Changed without mu_ (a reservation is one compare-and-swap). No wake-up
  // is lost all the same: a waiter re-checks under mu_, and Release() takes
  // mu_ to signal after its subtraction.
  std::atomic<uint64_t> in_use_{0};
  std::atomic<uint64_t> peak_{0};
  std::atomic<uint64_t> parked_{0};
  std::atomic<uint64_t> waits_{0};
  std::atomic<uint64_t> refusals_{0};
};

}  // namespace monarch

#endif  // MONARCH_PLACEMENT_CHUNK_POOL_H_
