// PlacementPolicy: decides which tier, if any, receives a file's copy.
//
// Kept behind this small interface so that other policies (eviction,
// prefetch-driven) can be added without touching the read path.
// Implementations must be thread-safe: promotions are decided concurrently.

#ifndef MONARCH_PLACEMENT_PLACEMENT_POLICY_H_
#define MONARCH_PLACEMENT_PLACEMENT_POLICY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "drivers/tier.h"
#include "monarch/config.h"

namespace monarch {

class PlacementPolicy {
 public:
  virtual ~PlacementPolicy() = default;

  // Picks the tier to receive a complete copy of `file` and reserves its
  // bytes there (Tier::TryReserve); nullopt leaves the file on the source.
  // `tiers` is fastest first and ends with the read-only ones (the peers,
  // the source), which are never picked.
  virtual std::optional<int> ChooseTier(const FileRef& file,
                                        const std::vector<std::unique_ptr<Tier>>& tiers) = 0;
  // Whether copies may ever be evicted to make room when ChooseTier finds
  // none (the Evictor does the evicting: it knows who reads what, through
  // the pins on the copies being read).
  virtual bool evicts() const { return false; }
  // Whether copies are evicted to make room for `file_id`, and whether the
  // copy of `file_id` may go to make room for another.
  virtual bool MakesRoomFor(uint32_t /*file_id*/) const { return evicts(); }
  virtual bool MayEvict(uint32_t /*file_id*/) const { return true; }
};

// Files this node has promised to keep (with peers: the files it holds for
// the others, which can change when a peer is lost). They get room before
// the others: a file outside the share is admitted only while the cache
// tiers keep room for every kept file not yet placed, and a kept file that
// finds no room evicts copies of files outside the share (never kept ones).
// Otherwise copies of other files would fill the tiers first and the
// promised files would stay on the source.
struct KeptShare {
  std::function<bool(uint32_t file_id)> is_kept;  // Empty: no share.
  // Room the kept files not in a tier yet will take: the sum of
  // Tier::MaxFootprint over them, so that checksum trailers are budgeted too.
  uint64_t pending_bytes = 0;
};

// kFirstFit: the MONARCH paper's policy. Top-down, the first tier with room
// for the whole file; no eviction (but for a kept share, above), so when
// every tier is full files stay on the source. kLru: first-fit, and when no
// tier has room, copies are evicted in least-recently-used order
// (Evictor::MakeRoom); never with a kept share (ValidateConfig refuses lru
// with peers). kNone: never promote (a pass-through baseline).
std::unique_ptr<PlacementPolicy> NewPlacementPolicy(PlacementPolicyKind kind, KeptShare kept = {});

// Where things are in `tiers` (fastest first: the cache tiers, then the
// read-only ones, the source last).
// The index of the first read-only tier (the peers, if any, else the source).
int FirstReadOnlyTier(const std::vector<std::unique_ptr<Tier>>& tiers);
// The fastest cache tier large enough to hold a `file_bytes` file at all
// (when empty), or -1: where eviction makes room for it.
int FastestCacheTierFor(const std::vector<std::unique_ptr<Tier>>& tiers, uint64_t file_bytes);

}  // namespace monarch

#endif  // MONARCH_PLACEMENT_PLACEMENT_POLICY_H_
