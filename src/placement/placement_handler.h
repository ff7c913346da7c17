// PlacementHandler: placement's face to the read path and the Prefetcher.
// It promotes files from the source into faster tiers, off the reader's
// critical path, and wires the three parts that do the work:
// - Promoter (promoter.h): the promotions' lifecycle: starts them, keeps
//   the ones in flight, commits and publishes their copies, shuts them down;
// - Evictor (evictor.h): makes room by evicting copies or moving them down
//   a tier (placement.policy "lru", and a node's kept share with peers);
// - ReadPins (read_pins.h): the pins readers hold on the copies they read,
//   which eviction waits for, and the CLOCK's reference bits.
// What is left here is the read-through itself (ReadIfOnSource), Prefetch
// and Reconsider: the decisions that go through more than one part.
//
// It sits beside the read path, not in it: Monarch::Read asks it only for
// files that live on the source. The first such read of a file starts (at
// most) one Promotion; the reader loads the bytes it needs itself and is
// answered from them, and a placement thread writes the copy. Later reads
// of the file share the promotion's chunks until the copy is published,
// after which they go straight to the tier. The policy picks the tier; the
// Promoter updates the namespace and capacity counters once the copy is
// complete.
//
// A file that stays on the source (no tier had room, policy "none", a failed
// copy) is read without taking any lock here.
//
// Locking order (each part's header says more): the Evictor's mutex (the
// "evict_mu_"), then a file's lock (its shard of the Promoter's in-flight
// table), then the Promoter's idle_mu_. Readers of a tier copy take none:
// they pin it.
//
// Start: the constructor starts the Promoter's pools. Stop: Drain() and/or
// Cancel(), explicit, bounded and idempotent; the destructor cancels.
// Thread-safe.

#ifndef MONARCH_PLACEMENT_PLACEMENT_HANDLER_H_
#define MONARCH_PLACEMENT_PLACEMENT_HANDLER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "common/counters.h"
#include "common/mutex.h"
#include "common/shutdown.h"
#include "drivers/tier.h"
#include "metadata/namespace.h"
#include "monarch/config.h"
#include "placement/deferred_copies.h"
#include "placement/evictor.h"
#include "placement/placement_policy.h"
#include "placement/promoter.h"
#include "placement/read_pins.h"

namespace monarch {

class PlacementHandler final {
 public:
  // `tiers` must outlive the handler: the cache tiers, then the read-only
  // ones (the peers, if any, then the source, last). Files no cache tier
  // holds are read from the first read-only tier that has them.
  // `ns` (the files' identities as the walk found them) must outlive it too.
  // With `pin_readers` (a RAM tier that memory pressure may shrink),
  // readers pin the copies they read even when the policy does not evict,
  // so that ShedTier() waits for them. `mappings` (the instance's, if it
  // hands copies out to be mapped) must outlive it too.
  PlacementHandler(const std::vector<std::unique_ptr<Tier>>* tiers, const Namespace* ns,
                   std::unique_ptr<PlacementPolicy> policy, const PlacementConfig& config,
                   bool pin_readers = false, MappingWatch* mappings = nullptr);
  // Cancels (the Promoter's destructor). An owner whose Cancel() gave up
  // must abandon the handler instead of destroying it (see Cancel()).
  ~PlacementHandler() = default;
  PlacementHandler(const PlacementHandler&) = delete;
  PlacementHandler& operator=(const PlacementHandler&) = delete;

  // Serves a read of `entry`, which the caller saw on the source: from an
  // in-flight promotion (starting one if the policy finds a tier), or from
  // the source. Returns nullopt if the file has meanwhile been published to
  // a tier: the caller reads it there. `may_defer`: false while prefetch
  // streams copy an announced order (Prefetcher::copying()); they copy the
  // files it names whatever the source holds in memory, so a reader taking
  // the bytes from there and deferring the copy (placement.cached_source)
  // would read the source a second time.
  std::optional<absl::StatusOr<size_t>> ReadIfOnSource(const FileEntry& entry, uint64_t offset, char* dst,
                                                       size_t n, bool may_defer = true);

  // Prefetch: promotes `entry` in the calling thread, loading every chunk no
  // reader has loaded, and returns once the copy is written (readers that
  // arrive meanwhile share its chunks, as with any promotion).
  enum class PrefetchOutcome {
    kFetched,     // This call promoted the file (or saw it fail).
    kNotNeeded,   // Already in a tier, or a promotion is in flight.
    kNoRoom,      // Not placeable (no tier has room, failed before, shutting
                  // down): left alone, so the source is not read for nothing.
  };
  PrefetchOutcome Prefetch(const FileEntry& entry);
  // A reader reads [offset, offset + n) of `file`, cached by extents. A read
  // that begins the file (a shard's reader starts there and reads on), or
  // goes on where the last one of the file ended after an extent's worth of
  // such reads (a scan), promotes, on the placement threads, the extents
  // that hold the next kReadAheadExtents (scan_rule.h) extents' worth past it (at most a
  // quarter of the largest cache tier), so that the reader finds them
  // loading or loaded, as a whole-file promotion's placement task loads the
  // rest of a file ahead of its reader. Only into room the tiers have:
  // read-ahead never evicts. A random reader that reads the file's first
  // record costs at most that window once.
  void ReadingRange(const FileEntry& file, uint64_t offset, size_t n);
  // The read-ahead of a scan that reached `end` of `file` (cached by
  // extents): what ReadingRange does once it has found a scan. For a node
  // service's client, which finds its scans itself (its hits never reach
  // the service).
  void ReadAheadPast(const FileEntry& file, uint64_t end);
  // Lets a file that found no room earlier be placed again: the policy now
  // wants it (a peer's file this node took over).
  void Reconsider(const FileEntry& entry) ABSL_LOCKS_EXCLUDED(evictor_.mutex());
  // Readers loading bytes from the origin themselves right now (their own
  // misses, not reads sharing a promotion someone else drives). Prefetch
  // gives way to them.
  int reader_misses_in_flight() const {
    return reader_misses_in_flight_.load(std::memory_order_relaxed);
  }

  // Whether copies are evicted to make room (Evictor): then readers bracket
  // tier reads with BeginTierRead and EndTierRead, and the eviction of a
  // copy waits for the readers inside it (ReadPins).
  bool evicts() const { return evicts_; }
  // The future to evict by (Evictor::SetNextUseOracle). Set once, before
  // reads.
  void SetNextUseOracle(const NextUseOracle* oracle) { evictor_.SetNextUseOracle(oracle); }
  // Whether readers bracket tier reads with BeginTierRead and EndTierRead:
  // with eviction, or with `pin_readers`.
  bool pins_readers() const { return pins_.has_slots(); }
  // Evictor::ShedTier: memory pressure moves copies out of a RAM tier.
  Evictor::ShedResult ShedTier(int tier, uint64_t target, const std::atomic<bool>& stop) {
    return evictor_.ShedTier(tier, target, stop);
  }
  // With pins only (pins_readers()): ReadPins::BeginTierRead, EndTierRead, Touch.
  int BeginTierRead(const FileEntry& entry) { return pins_.BeginTierRead(entry); }
  void EndTierRead(uint32_t id) { pins_.EndTierRead(id); }
  void Touch(uint32_t id) { pins_.Touch(id); }

  // Shutdown: Promoter::Drain, Cancel and WaitIdle (bounded; see there).
  // Drain makes the deferred copies first (the readers are gone: the CPU
  // they waited for is free); Cancel drops them.
  bool Drain(Deadline deadline) {
    const bool stopped = deferred_ == nullptr || deferred_->Drain(deadline);
    return promoter_.Drain(deadline) && stopped;
  }
  bool Cancel(Deadline deadline) {
    if (deferred_ != nullptr) deferred_->RequestStop();
    const bool cancelled = promoter_.Cancel(deadline);
    return (deferred_ == nullptr || deferred_->Stop(deadline)) && cancelled;
  }
  // Also waits for the deferred copies (placement.cached_source).
  void WaitIdle() {
    if (deferred_ != nullptr) deferred_->WaitIdle();
    promoter_.WaitIdle();
  }

  void ReportCounters(CounterSink& sink) const;

 private:
  // Promoter::StartOrJoin, making room for `entry` with eviction, at most
  // once: first, in a faster tier, if its next use says it belongs there
  // (WantsFasterTier); else, if the policy finds no tier for it, before one
  // more try. Room is made outside the file's lock.
  Promoter::Admission StartOrJoinMakingRoom(
      const FileEntry& entry, bool pin,
      FileIdentity::Clock::time_point began = FileIdentity::Clock::now());
  // DeferredCopies' work: promotes file `id` if it is still on the source,
  // from bytes the source holds in memory only.
  void CopyFromMemory(uint32_t id);
  // Whether `entry` should make room in a faster tier before the policy
  // picks one (Evictor::WantsFasterTier), with eviction.
  bool WantsFasterTier(const FileEntry& entry) const {
    return evicts_ && evictor_.WantsFasterTier(entry);
  }
  // Whether eviction may make room for a file the policy found no tier for.
  bool MayMakeRoomFor(const FileEntry& entry) const {
    return evicts_ && policy_->MakesRoomFor(entry.ref.id);
  }

  const std::unique_ptr<PlacementPolicy> policy_;
  const bool evicts_;
  std::atomic<int> reader_misses_in_flight_{0};
  // Slots only with eviction. Before the Promoter, whose threads use them.
  ReadPins pins_;
  Promoter promoter_;
  // After the Promoter, whose staging pool and file locks it uses; none of
  // the Promoter's threads use it.
  Evictor evictor_;
  // Per file, when the namespace has extents: where its last read ended,
  // and where the run of reads each beginning at the last one's end began.
  struct ScanState {
    std::atomic<uint64_t> end{0};
    std::atomic<uint64_t> start{0};
  };
  std::unique_ptr<ScanState[]> scans_;
  uint64_t read_ahead_bytes_ = 0;  // The window past a scan's reads.
  std::atomic<uint64_t> read_ahead_started_{0};
  // With placement.cached_source: defer, and a source that is the only
  // origin (no peers). Last: its thread uses everything above.
  Tier* const source_;
  const Namespace* const namespace_;
  std::unique_ptr<DeferredCopies> deferred_;
};

}  // namespace monarch

#endif  // MONARCH_PLACEMENT_PLACEMENT_HANDLER_H_
