// PlacementHandler: promotes files from the source into faster tiers, off
// the reader's critical path.
//
// It sits beside the read path, not in it: Monarch::Read asks it only for
// files that live on the source. The first such read of a file starts (at
// most) one Promotion, keyed by file id in a sharded in-flight table; the
// reader loads the bytes it needs itself and is answered from them, and a
// placement thread writes the copy. Later reads of the file share the
// promotion's chunks until the copy is published, after which they go
// straight to the tier. The policy picks the tier; the handler updates the
// namespace and capacity counters once the copy is complete.
//
// A file that stays on the source (no tier had room, policy "none", a failed
// copy) is read without taking any lock here.
//
// Making room (placement.policy "lru") is the Evictor's (evictor.h), and the
// pins readers hold on the copies they read are ReadPins (read_pins.h). The
// in-flight table's shard mutexes are the files' locks (FileLocks), taken
// after the Evictor's mutex, never before.
//
// Start: the constructor starts the pool. Stop: Drain() and/or Cancel(),
// explicit, bounded and idempotent; the destructor cancels. Thread-safe.

#ifndef MONARCH_PLACEMENT_PLACEMENT_HANDLER_H_
#define MONARCH_PLACEMENT_PLACEMENT_HANDLER_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/counters.h"
#include "common/mutex.h"
#include "common/shutdown.h"
#include "drivers/tier.h"
#include "metadata/namespace.h"
#include "monarch/config.h"
#include "monarch/stats.h"
#include "placement/chunk_pool.h"
#include "placement/evictor.h"
#include "placement/placement_policy.h"
#include "placement/promotion.h"
#include "placement/read_pins.h"
#include "placement/thread_pool.h"

namespace monarch {

class PlacementHandler final : public PromotionHost, public FileLocks {
 public:
  // `tiers` must outlive the handler: the cache tiers, then the read-only
  // ones (the peers, if any, then the source, last). Files no cache tier
  // holds are read from the first read-only tier that has them.
  // `ns` (the files' identities as the walk found them) must outlive it too.
  PlacementHandler(const std::vector<std::unique_ptr<Tier>>* tiers, const Namespace* ns,
                   std::unique_ptr<PlacementPolicy> policy, const PlacementConfig& config);
  ~PlacementHandler() override;

  // Serves a read of `entry`, which the caller saw on the source: from an
  // in-flight promotion (starting one if the policy finds a tier), or from
  // the source. Returns nullopt if the file has meanwhile been published to
  // a tier: the caller reads it there.
  std::optional<absl::StatusOr<size_t>> ReadIfOnSource(FileEntry& entry, uint64_t offset, char* dst,
                                                       size_t n);

  // Prefetch: promotes `entry` in the calling thread, loading every chunk no
  // reader has loaded, and returns once the copy is written (readers that
  // arrive meanwhile share its chunks, as with any promotion).
  enum class PrefetchOutcome {
    kFetched,     // This call promoted the file (or saw it fail).
    kNotNeeded,   // Already in a tier, or a promotion is in flight.
    kNoRoom,      // Not placeable (no tier has room, failed before, shutting
                  // down): left alone, so the source is not read for nothing.
  };
  PrefetchOutcome Prefetch(FileEntry& entry);
  // Lets a file that found no room earlier be placed again: the policy now
  // wants it (a peer's file this node took over).
  void Reconsider(FileEntry& entry) ABSL_LOCKS_EXCLUDED(evictor_.mutex());
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
  // With eviction only: ReadPins::BeginTierRead, EndTierRead, Touch.
  int BeginTierRead(FileEntry& entry) { return pins_.BeginTierRead(entry); }
  void EndTierRead(uint32_t id) { pins_.EndTierRead(id); }
  void Touch(uint32_t id) { pins_.Touch(id); }

  // Shutdown, in two steps, each bounded by a deadline (the instance's
  // placement.shutdown_timeout). Both stop starting promotions, and are
  // idempotent.
  //
  // Drain(): lets the promotions in flight finish (each has a placement
  // task) until `deadline`. True if none is left.
  bool Drain(Deadline deadline);
  // Cancel(): abandons the promotions in flight at their next chunk boundary
  // (a reader inside one reads the source instead), then waits until
  // `deadline` for the threads still working on one. True when none is
  // left. False when a thread is blocked in a read or write that has not
  // returned (a file system that stopped answering): what it is doing is
  // logged, and the handler must then be abandoned (common/shutdown.h), not
  // destroyed, since destroying it joins that thread.
  bool Cancel(Deadline deadline);
  // Returns when no promotion is in flight. Each ends within its chunks'
  // reads and writes (peer fetches time out, see remote.request_timeout),
  // and at once when Cancel() is called.
  void WaitIdle();

  void ReportCounters(CounterSink& sink) const;

  // PromotionHost.
  absl::StatusOr<size_t> ReadOrigin(const FileRef& file, uint64_t offset, char* dst, size_t n,
                                    bool* from_source = nullptr) override;
  absl::StatusOr<SourceIdentity> IdentityToCommit(const FileEntry& entry, bool read_source,
                                                  std::optional<uint32_t> content_crc) override;
  ChunkPool& chunk_pool() override { return chunk_pool_; }
  bool cancelled() const override { return cancel_.load(std::memory_order_relaxed); }
  void ChunkWritten(bool by_reader) override {
    (by_reader ? written_by_readers_ : written_by_placement_)
        .fetch_add(1, std::memory_order_relaxed);
  }
  void CommitLater(std::shared_ptr<Promotion> promotion) override;
  void PromotionDone(Promotion& promotion, const absl::Status& status, bool tier_failed) override;

  // FileLocks: the mutex of the file's shard of the in-flight table.
  Mutex& LockOf(uint32_t id) override { return ShardOf(id).mu; }

 private:
  static constexpr size_t kShards = 64;
  struct alignas(64) Shard {
    Mutex mu;
    absl::flat_hash_map<uint32_t, std::shared_ptr<Promotion>> in_flight ABSL_GUARDED_BY(mu);
  };
  Shard& ShardOf(uint32_t id) { return shards_[id % kShards]; }

  std::shared_ptr<Promotion> StartLocked(FileEntry& entry, Shard& shard)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu);
  // Whether `entry` should make room in a faster tier before the policy
  // picks one (Evictor::WantsFasterTier), with eviction.
  bool WantsFasterTier(const FileEntry& entry) const {
    return evicts_ && evictor_.WantsFasterTier(entry);
  }
  // Every in-flight promotion, for shutdown.
  std::vector<std::shared_ptr<Promotion>> InFlight();
  // As WaitIdle(), giving up at `deadline`; true if idle.
  bool WaitIdleUntil(Deadline deadline);

  const std::vector<std::unique_ptr<Tier>>* const tiers_;
  const Namespace* const namespace_;
  const int source_index_;
  const int first_origin_;  // The first read-only tier.
  const std::unique_ptr<PlacementPolicy> policy_;
  const uint64_t chunk_bytes_;
  const size_t placement_threads_;

  // Staging memory, within placement.max_staging_bytes. Before the shards:
  // promotions return buffers to it.
  ChunkPool chunk_pool_;
  std::array<Shard, kShards> shards_;
  std::atomic<bool> accepting_{true};
  std::atomic<bool> cancel_{false};

  // Promotions Cancel() abandoned; those still referenced are in some
  // thread's hands, for the log of a shutdown that gave up on them.
  Mutex cancelled_mu_;
  std::vector<std::weak_ptr<Promotion>> cancelled_promotions_ ABSL_GUARDED_BY(cancelled_mu_);

  Mutex idle_mu_;  // Taken after a shard's mutex, never before.
  CondVar idle_;   // Signalled when in_flight_count_ drops to 0.
  uint64_t in_flight_count_ ABSL_GUARDED_BY(idle_mu_) = 0;

  std::atomic<uint64_t> started_{0};
  std::atomic<uint64_t> completed_{0};
  std::atomic<uint64_t> failed_{0};
  std::atomic<uint64_t> skipped_{0};
  std::atomic<uint64_t> cancelled_{0};
  std::atomic<uint64_t> source_changed_{0};
  std::atomic<uint64_t> identified_by_content_{0};
  std::atomic<uint64_t> staging_reads_{0};
  std::atomic<uint64_t> staging_bytes_read_{0};
  std::atomic<uint64_t> staging_hits_{0};
  std::atomic<uint64_t> staging_fallbacks_{0};
  std::atomic<uint64_t> written_by_readers_{0};
  std::atomic<uint64_t> written_by_placement_{0};
  std::atomic<int> reader_misses_in_flight_{0};

  // Eviction, and the pins it waits for (slots only with eviction).
  const bool evicts_;
  ReadPins pins_;
  Evictor evictor_;

  // The CRC32C of each file's bytes as its first committed copy had them,
  // with kContentKnown set; 0 until then. With eviction a file is promoted
  // again each time its copy was evicted, and comparing the bytes with
  // these spares the source a metadata operation per promotion (an fstat
  // is a getattr on the PFS's metadata server).
  static constexpr uint64_t kContentKnown = uint64_t{1} << 32;
  std::unique_ptr<std::atomic<uint64_t>[]> content_crcs_;

  // Commits (a stat of the source file each, then the tier's commit): apart
  // from the placement threads, which copy while these wait on the PFS.
  ThreadPool commit_pool_;
  // Last member: its threads stop before the state above goes away, and
  // before the commit pool, which its tasks feed.
  ThreadPool pool_;
};

}  // namespace monarch

#endif  // MONARCH_PLACEMENT_PLACEMENT_HANDLER_H_
