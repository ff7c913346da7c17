// Promoter: the lifecycle of promotions. It starts them (the policy picks
// the tier), keeps the ones in flight in a sharded table keyed by file id,
// runs their placement tasks and commits on its thread pools, publishes or
// abandons each copy when its Promotion reports done, and shuts them down
// (Drain, Cancel) within deadlines. It is every Promotion's host.
//
// At most one promotion per file is in flight. A file's shard mutex (its
// "lock", FileLocks::LockOf) is held whenever the file's tier or placement
// state changes: here to start a promotion and to publish or abandon its
// copy, in the Evictor to switch a file away from a copy it evicts or moves
// down. So a reader that looks a file up under it (StartOrJoin) sees either
// the promotion or its published copy.
//
// Locking order: the Evictor's mutex, then a file's shard mutex, then
// idle_mu_; cancelled_mu_ is taken alone. Never the other way round.
//
// Start: the constructor starts the thread pools. Stop: Drain() and/or
// Cancel(), explicit, bounded and idempotent; the destructor cancels. The
// tiers, namespace, policy and pins given to the constructor must outlive
// it. Thread-safe.

#ifndef MONARCH_PLACEMENT_PROMOTER_H_
#define MONARCH_PLACEMENT_PROMOTER_H_

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
#include "placement/chunk_pool.h"
#include "placement/evictor.h"
#include "placement/placement_policy.h"
#include "placement/promotion.h"
#include "placement/read_pins.h"
#include "common/thread_pool.h"

namespace monarch {

class Promoter final : public PromotionHost, public FileLocks {
 public:
  // `tiers`: the cache tiers, then the read-only ones (the peers, if any,
  // then the source, last). Files no cache tier holds are read from the
  // first read-only tier that has them. `ns` holds the files' identities
  // as the walk found them. `pins` are used only when the policy evicts:
  // a reader of a promotion is pinned, and a new copy marked referenced.
  Promoter(const std::vector<std::unique_ptr<Tier>>* tiers, const Namespace* ns,
           PlacementPolicy* policy, ReadPins* pins, const PlacementConfig& config);
  // Cancels. An owner whose Cancel() gave up must abandon the promoter
  // instead of destroying it (see Cancel()): the pools' destructors join
  // their threads.
  ~Promoter() override;

  // What StartOrJoin found a file on the source to be.
  enum class Found {
    kPublished,     // Its copy is in a tier now: read it there.
    kInFlight,      // A promotion someone else started is in flight.
    kStarted,       // This call started its promotion.
    kNoTier,        // The policy found no tier with room for it.
    kNotPlaceable,  // Shutting down, or not to be promoted now (it failed,
                    // or found no room for good).
  };
  struct Admission {
    Found found;
    // The promotion in flight (kInFlight) or started (kStarted), else null.
    std::shared_ptr<Promotion> promotion;
  };
  // Looks `entry` up under its lock and, if no promotion is in flight and
  // the file may be placed, starts one (the policy reserves its room). With
  // `pin` (a reader, which then calls ReadThrough), the file is pinned when
  // a promotion is returned and readers pin (ReadPins::has_slots: the policy
  // evicts, or memory pressure may shrink a RAM tier): a reader of a promotion
  // may read chunks back from the copy, which can be committed, published
  // and then evicted while it does, so it is pinned like a reader of the
  // tier, before the promotion can publish. Never waits for I/O.
  // `began`: when the miss began that would start it (Promotion's).
  Admission StartOrJoin(const FileEntry& entry, bool pin,
                        FileIdentity::Clock::time_point began = FileIdentity::Clock::now());
  // Serves a read of [offset, offset + n) of `promotion`'s file, which
  // StartOrJoin returned to a reader (and pinned): from its chunks, loading
  // those nobody has loaded, or from the source if the promotion cannot
  // serve it. Then queues the placement task for the chunks nobody asked
  // for, if nobody has it, and unpins the file.
  absl::StatusOr<size_t> ReadThrough(const std::shared_ptr<Promotion>& promotion, uint64_t offset,
                                     char* dst, size_t n);
  // Queues the placement task of `promotion` (StartOrJoin started it without
  // a reader) on the placement pool, unless someone has it: it then loads
  // and writes every chunk no reader has loaded. For read-ahead.
  void RunInBackground(const std::shared_ptr<Promotion>& promotion) {
    if (promotion->ClaimBackgroundTask()) {
      pool_.detach_task([promotion] { promotion->RunToCompletion(); });
    }
  }
  // Lets `entry`, left on the source because it found no room, be promoted
  // again, if it is still on the source and not in flight. The caller holds
  // the Evictor's mutex: an eviction marks its file as staying on the
  // source until the copy is deleted, and that mark must stay.
  void Reconsider(const FileEntry& entry);

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
  // logged, and the promoter must then be abandoned (common/shutdown.h), not
  // destroyed, since destroying it joins that thread.
  bool Cancel(Deadline deadline);
  // Returns when no promotion is in flight. Each ends within its chunks'
  // reads and writes (peer fetches time out, see remote.request_timeout),
  // and at once when Cancel() is called.
  void WaitIdle();

  // promotions_started alone: the stats list it first, before eviction's.
  void ReportStartedCounter(CounterSink& sink) const;
  // The promotions' other counters and the staging gauges.
  void ReportCounters(CounterSink& sink) const;

  // PromotionHost.
  Origin& origin() override { return origin_; }
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

  std::shared_ptr<Promotion> StartLocked(const FileEntry& entry, Shard& shard,
                                         FileIdentity::Clock::time_point began)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu);
  // Every in-flight promotion, for shutdown.
  std::vector<std::shared_ptr<Promotion>> InFlight();
  // As WaitIdle(), giving up at `deadline`; true if idle.
  bool WaitIdleUntil(Deadline deadline);

  const std::vector<std::unique_ptr<Tier>>* const tiers_;
  PlacementPolicy* const policy_;
  ReadPins* const pins_;
  const uint64_t chunk_bytes_;
  const size_t placement_threads_;
  const bool evicts_;
  Origin origin_;

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
  std::atomic<int> idle_waiters_{0};  // Threads in WaitIdle().

  std::atomic<uint64_t> started_{0};
  std::atomic<uint64_t> completed_{0};
  std::atomic<uint64_t> failed_{0};
  std::atomic<uint64_t> skipped_{0};
  std::atomic<uint64_t> cancelled_{0};
  std::atomic<uint64_t> gave_up_not_in_memory_{0};
  std::atomic<uint64_t> staging_reads_{0};
  std::atomic<uint64_t> staging_bytes_read_{0};
  std::atomic<uint64_t> staging_hits_{0};
  std::atomic<uint64_t> staging_fallbacks_{0};
  std::atomic<uint64_t> written_by_readers_{0};
  std::atomic<uint64_t> written_by_placement_{0};

  // Commits (a stat of the source file each, then the tier's commit): apart
  // from the placement threads, which copy while these wait on the PFS.
  // Those queued or running are counted, and bounded (CommitLater).
  const size_t max_pending_commits_;
  std::atomic<size_t> commits_pending_{0};
  std::atomic<uint64_t> commits_inline_{0};
  ThreadPool commit_pool_;
  // Last member: its threads stop before the state above goes away, and
  // before the commit pool, which its tasks feed.
  ThreadPool pool_;
};

}  // namespace monarch

#endif  // MONARCH_PLACEMENT_PROMOTER_H_
