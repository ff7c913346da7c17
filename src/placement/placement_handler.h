// PlacementHandler: promotes files from the source into faster tiers in the
// background, off the reader's critical path.
//
// It sits beside the read path, not in it: Monarch::Read asks it only for
// files that live on the source. The first such read of a file starts (at
// most) one Promotion, keyed by file id; later reads of the file share the
// promotion's staged bytes until the copy is published, after which they go
// straight to the tier. The policy picks the tier; the handler updates the
// namespace and capacity counters only once the copy is complete.
//
// Start: the constructor starts the pool. Stop: Shutdown(), explicit and
// idempotent; the destructor cancels. Thread-safe.

#ifndef MONARCH_PLACEMENT_PLACEMENT_HANDLER_H_
#define MONARCH_PLACEMENT_PLACEMENT_HANDLER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "drivers/tier.h"
#include "metadata/namespace.h"
#include "monarch/config.h"
#include "monarch/stats.h"
#include "placement/chunk_pool.h"
#include "placement/fetch_source.h"
#include "placement/placement_policy.h"
#include "placement/promotion.h"
#include "placement/thread_pool.h"

namespace monarch {

class PlacementHandler {
 public:
  // `tiers` and `fetch` must outlive the handler; the last tier is the
  // source. Files no local tier holds are read through `fetch`.
  PlacementHandler(const std::vector<std::unique_ptr<Tier>>* tiers, FetchSource* fetch,
                   std::unique_ptr<PlacementPolicy> policy, const PlacementConfig& config);
  ~PlacementHandler();

  // Serves a read of `entry`, which the caller saw on the source: from an
  // in-flight promotion's staged bytes (starting one if the policy finds a
  // tier), or from the source. Returns nullopt if the file has meanwhile
  // been published to a tier: the caller reads it there.
  std::optional<absl::StatusOr<size_t>> ReadIfOnSource(FileEntry& entry, uint64_t offset, char* dst,
                                                       size_t n);

  // Stops starting promotions; kDrain finishes the queued and running ones,
  // kCancel abandons them at the next chunk boundary. Returns when the pool
  // is idle. Idempotent.
  void Shutdown(bool drain);
  // Returns when no promotion is queued or running.
  void WaitIdle() { pool_.wait(); }

  void AddStats(Stats* stats) const;

 private:
  std::shared_ptr<Promotion> StartLocked(FileEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run(const std::shared_ptr<Promotion>& promotion);
  const std::vector<std::unique_ptr<Tier>>* const tiers_;
  FetchSource* const fetch_;
  const int source_index_;
  const std::unique_ptr<PlacementPolicy> policy_;
  const uint64_t chunk_bytes_;
  const uint64_t max_staging_bytes_;
  const bool idle_priority_;

  ChunkPool chunk_pool_;  // Before in_flight_: promotions return buffers to it.

  Mutex mu_;
  absl::flat_hash_map<uint32_t, std::shared_ptr<Promotion>> in_flight_ ABSL_GUARDED_BY(mu_);
  uint64_t staging_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool accepting_ ABSL_GUARDED_BY(mu_) = true;
  int unqueued_starts_ ABSL_GUARDED_BY(mu_) = 0;  // Started, task not yet queued.
  CondVar starts_queued_;
  std::atomic<bool> cancel_{false};

  std::atomic<uint64_t> started_{0};
  std::atomic<uint64_t> completed_{0};
  std::atomic<uint64_t> failed_{0};
  std::atomic<uint64_t> skipped_{0};
  std::atomic<uint64_t> cancelled_{0};
  std::atomic<uint64_t> staging_reads_{0};
  std::atomic<uint64_t> staging_bytes_read_{0};
  std::atomic<uint64_t> staging_hits_{0};
  std::atomic<uint64_t> staging_fallbacks_{0};

  ThreadPool pool_;  // Last member: its threads stop before the state above goes away.
};

}  // namespace monarch

#endif  // MONARCH_PLACEMENT_PLACEMENT_HANDLER_H_
