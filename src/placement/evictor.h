// Evictor: makes room in the cache tiers by evicting copies, or by moving
// them down a tier (placement.policy "lru", and a node's kept share with
// peers).
//
// Without a known future it evicts in CLOCK order (an approximation of
// least recently used: a copy read since the hand last passed gets a second
// chance), from the fastest tier large enough for the file. With one (the
// read orders announced to the Prefetcher, through NextUseOracle) it goes by
// next use instead (Belady's choice, over a sample of candidates): the copy
// read again last is evicted, and a file read again later than every
// candidate is not admitted (it is read from the source this time). With
// several cache tiers, files read sooner take the faster ones: a file read
// sooner than the last-read copy of a full faster tier takes its place,
// even when a slower tier has room, and the copy it displaces moves down a
// tier (its bytes copied tier to tier, not read from the source again)
// where it is read sooner than that tier's last-read copy, and is evicted
// otherwise.
//
// A copy with a reader inside it is never evicted: readers pin it
// (ReadPins), and an eviction first points the file at the source, under
// the file's lock (FileLocks), then waits for the pins already taken to go
// before it deletes the copy. Readers in other processes (the node
// service's clients) read RAM copies under a seqlock and posix copies
// through descriptors they hold, so an eviction under them costs a miss,
// never a wrong byte.
//
// Locking order: mu_ (the "evict_mu_") is taken before a file's lock, never
// after; readers do not take it. Only one thread makes room at a time, but
// for the copying of a demotion, which runs with mu_ released.
//
// Used only when the policy evicts (PlacementPolicy::evicts(): the pins
// have their slots then). Lifetime: the tiers, namespace, policy, pins, file
// locks and staging pool given to the constructor must outlive it. No
// threads of its own: it runs in the threads that need room (readers,
// prefetch streams). Thread-safe.

#ifndef MONARCH_PLACEMENT_EVICTOR_H_
#define MONARCH_PLACEMENT_EVICTOR_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/counters.h"
#include "common/mutex.h"
#include "common/process_mappings.h"
#include "drivers/tier.h"
#include "metadata/namespace.h"
#include "placement/chunk_pool.h"
#include "placement/placement_policy.h"
#include "placement/read_pins.h"

namespace monarch {

// What eviction may know of the future (the Prefetcher, from announced read
// orders): how soon a file is next read.
class NextUseOracle {
 public:
  virtual ~NextUseOracle() = default;
  // Whether an order is known at all; without one, eviction goes by recency.
  virtual bool known() const = 0;
  // How soon `id` is read again, in a unit of the oracle's own that orders
  // files by it (the Prefetcher's: microseconds); ~0 if not in the known
  // order.
  virtual uint64_t NextUse(uint32_t id) const = 0;
};

// What eviction needs of the promotions: the lock under which a file's tier
// and placement state change (promotion publishes a copy under it, eviction
// and demotion switch a file away from its copy under it, and a promotion
// starts under it). Taken after the Evictor's mutex, never before.
class FileLocks {
 public:
  virtual ~FileLocks() = default;
  // `id`'s lock. The same Mutex for the life of the object.
  virtual Mutex& LockOf(uint32_t id) = 0;
};

class Evictor final {
 public:
  // `tiers`: the cache tiers, then the read-only ones (the peers, if any,
  // then the source, last). `staging` lends the buffer a demotion copies
  // through, `chunk_bytes` at a time. `mappings` (null: none are handed
  // out) finds the copies held for mappings that nobody maps any more.
  Evictor(const std::vector<std::unique_ptr<Tier>>* tiers, const Namespace* ns,
          const PlacementPolicy* policy, ReadPins* pins, FileLocks* locks, ChunkPool* staging,
          uint64_t chunk_bytes, MappingWatch* mappings);
  Evictor(const Evictor&) = delete;
  Evictor& operator=(const Evictor&) = delete;

  // The future to evict by; null (the default) evicts in CLOCK order. Set
  // once, before reads.
  void SetNextUseOracle(const NextUseOracle* oracle) {
    oracle_.store(oracle, std::memory_order_release);
  }

  // Evicts (or moves down) copies until a cache tier has room for file
  // `id`, of `file_bytes`; false if none could be made (every candidate in
  // use or just read, or, by next use, read sooner than `id`).
  bool MakeRoom(uint32_t id, uint64_t file_bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // What ShedTier() moved out of a tier.
  struct ShedResult {
    uint64_t files = 0;
    uint64_t demoted_bytes = 0;  // Moved down to a file tier.
    uint64_t dropped_bytes = 0;  // Evicted: read from the source again when next read.
  };
  // Memory pressure (MemoryGovernor): lowers cache tier `tier`'s capacity
  // in force to `target` bytes (if it is higher) and moves copies out of it
  // until what it holds, complete copies and reservations, is no more than
  // that, in CLOCK order (the first turn of the hand gives copies read since
  // it last passed a second chance, the second does not). Each goes down to
  // the fastest slower `pmem`/`posix` tier with room, or is evicted. A copy
  // a reader is inside is left (ReadPins): the next call may take it. Memory
  // wins over the policy here: copies a node keeps for its peers go too
  // (they are read from the source again, or moved down). Stops early once
  // `stop` is set. Needs the pins' slots (ReadPins::has_slots).
  ShedResult ShedTier(int tier, uint64_t target, const std::atomic<bool>& stop)
      ABSL_LOCKS_EXCLUDED(mu_);

  // With a known order and several cache tiers, whether `entry` (on the
  // source, placeable) should make room in a faster tier before the policy
  // picks one (which would pick the first tier with room).
  bool WantsFasterTier(const FileEntry& entry) const;

  // Held, no eviction is under way: a file switched to the source for its
  // copy's deletion is not mistaken for one that found no room.
  Mutex& mutex() ABSL_LOCK_RETURNED(mu_) { return mu_; }

  // evictions, evicted_bytes, eviction_failures, demotions, demoted_bytes,
  // admissions_declined.
  void ReportCounters(CounterSink& sink) const;

 private:
  // Next-use placement: makes `need` bytes of room in cache tier `tier` for
  // a file read again `next_use` reads from now, moving down (or out) the
  // copies there read again later than that. False if every sampled copy is
  // read sooner, or too many are in use.
  bool MakeRoomByNextUseLocked(int tier, uint64_t need, uint64_t next_use,
                               const NextUseOracle& future) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves `entry`'s copy out of tier `tier` to the fastest slower cache tier
  // that takes it by next use; evicts it if none does.
  void MoveDownLocked(const FileEntry& entry, int tier, uint64_t next_use, const NextUseOracle& future)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies `entry`'s copy from tier `from` into tier `to` (which has room),
  // points the file at it and removes the old one; false (nothing changed)
  // if the copy is no longer in `from` or cannot be copied. Releases mu_
  // while it copies (CopyDown), so that other threads make room meanwhile:
  // on a disk tier, creating a file alone can take a millisecond.
  bool DemoteLocked(const FileEntry& entry, int from, int to) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // DemoteLocked's work once room is reserved in `to` and the copy pinned.
  bool CopyDown(const FileEntry& entry, int from, int to) ABSL_LOCKS_EXCLUDED(mu_);
  // Evicts `entry`'s copy from tier `tier`; false if it is no longer there.
  bool EvictLocked(const FileEntry& entry, int tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees the copies tier `tier` holds for mappings that nobody maps any
  // more (a walk of the node's processes: outside mu_).
  void ReleaseUnmapped(int tier) ABSL_LOCKS_EXCLUDED(mu_);

  const std::vector<std::unique_ptr<Tier>>* const tiers_;
  const Namespace* const namespace_;
  const PlacementPolicy* const policy_;
  ReadPins* const pins_;
  FileLocks* const locks_;
  ChunkPool* const staging_;
  const uint64_t chunk_bytes_;
  MappingWatch* const mappings_;
  const int source_index_;
  const int first_origin_;  // The first read-only tier.
  const int cache_tiers_;

  Mutex mu_;  // Taken before a file's lock (FileLocks), never after.
  uint32_t hand_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<const NextUseOracle*> oracle_{nullptr};

  std::atomic<uint64_t> evictions_{0};
  std::atomic<uint64_t> evicted_bytes_{0};
  std::atomic<uint64_t> eviction_failures_{0};
  std::atomic<uint64_t> admissions_declined_{0};
  std::atomic<uint64_t> demotions_{0};
  std::atomic<uint64_t> demoted_bytes_{0};
};

}  // namespace monarch

#endif  // MONARCH_PLACEMENT_EVICTOR_H_
