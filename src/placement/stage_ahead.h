// StageAhead: with no read order announced, stage what the readers read
// from, ahead of them (prefetch.stage_ahead).
//
// A job that announces nothing (the preload, a custom sampler) reads its
// epoch 1 one miss at a time. When a miss lands in a top-level directory
// of the dataset (`train/`, `val/`, or a class directory of a flat layout;
// the root's own files form one more group), the whole directory is given
// to the prefetch streams (Prefetcher::StageAhead), in the walk's order,
// if it fits beside what was staged before in the cache tiers' room. A
// job reading `val/` never stages `train/`; one reading everything stages
// everything. Each file is still read from the source once, and the first
// order a reader announces replaces the staging.
//
// Thread-safe; OnMiss costs a lock and a hash lookup, on a miss.

#ifndef MONARCH_PLACEMENT_STAGE_AHEAD_H_
#define MONARCH_PLACEMENT_STAGE_AHEAD_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/mutex.h"
#include "metadata/namespace.h"
#include "placement/prefetcher.h"

namespace monarch {

class StageAhead {
 public:
  // `room`: the cache tiers' capacity in force now. All must outlive this.
  StageAhead(Namespace* ns, Prefetcher* prefetcher, std::function<uint64_t()> room)
      : namespace_(ns), prefetcher_(prefetcher), room_(std::move(room)) {}

  // A reader missed entry `id` (a file, or an extent of one).
  void OnMiss(uint32_t id);

  // The top-level directory `name` (dataset-relative) is in: "" for the
  // root's own files.
  static absl::string_view GroupOf(absl::string_view name);

 private:
  struct Group {
    std::vector<uint32_t> ids;  // Its files' entries (extents for those cached so).
    uint64_t bytes = 0;
    bool decided = false;  // Staged, or found not to fit.
  };
  void IndexLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Namespace* const namespace_;
  Prefetcher* const prefetcher_;
  const std::function<uint64_t()> room_;
  Mutex mu_;
  bool indexed_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<std::string, Group> groups_ ABSL_GUARDED_BY(mu_);
  uint64_t staged_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace monarch

#endif  // MONARCH_PLACEMENT_STAGE_AHEAD_H_
