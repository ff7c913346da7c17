// The built-in placement policies.

#include "placement/placement_policy.h"

#include <algorithm>
#include <atomic>

#include "absl/strings/str_cat.h"

namespace monarch {
namespace {

class FirstFitPolicy final : public PlacementPolicy {
 public:
  FirstFitPolicy(KeptShare kept, bool evicts)
      : is_kept_(std::move(kept.is_kept)), kept_pending_(kept.pending_bytes), evicts_(evicts) {}

  bool evicts() const override { return evicts_ || static_cast<bool>(is_kept_); }
  bool MakesRoomFor(uint32_t file_id) const override {
    return evicts_ || (is_kept_ && is_kept_(file_id));
  }
  bool MayEvict(uint32_t file_id) const override { return !is_kept_ || !is_kept_(file_id); }

  std::optional<int> ChooseTier(const FileRef& file,
                                const std::vector<std::unique_ptr<Tier>>& tiers) override {
    const bool kept = is_kept_ && is_kept_(file.id);
    const uint64_t footprint = Tier::MaxFootprint(file.size);
    if (is_kept_ && !kept) {
      uint64_t free = 0;
      for (const auto& tier : tiers) {
        if (tier->is_cache()) free += tier->free_bytes();
      }
      if (free < kept_pending_.load(std::memory_order_relaxed) + footprint) return std::nullopt;
    }
    for (int i = 0; i < static_cast<int>(tiers.size()); ++i) {
      if (!tiers[i]->is_cache() || !tiers[i]->TryReserve(file.size)) continue;
      if (kept) {
        uint64_t pending = kept_pending_.load(std::memory_order_relaxed);
        while (!kept_pending_.compare_exchange_weak(pending, pending - std::min(pending, footprint),
                                                    std::memory_order_relaxed)) {
        }
      }
      return i;
    }
    return std::nullopt;
  }

 private:
  const std::function<bool(uint32_t)> is_kept_;
  std::atomic<uint64_t> kept_pending_;
  const bool evicts_;
};

class NoPlacementPolicy final : public PlacementPolicy {
 public:
  std::optional<int> ChooseTier(const FileRef&,
                                const std::vector<std::unique_ptr<Tier>>&) override {
    return std::nullopt;
  }
};

}  // namespace

std::unique_ptr<PlacementPolicy> NewPlacementPolicy(PlacementPolicyKind kind, KeptShare kept) {
  switch (kind) {
    case PlacementPolicyKind::kFirstFit:
      return std::make_unique<FirstFitPolicy>(std::move(kept), false);
    case PlacementPolicyKind::kLru:
      // Not with peers (ValidateConfig refuses it): they promise their home
      // files to each other, which must not be evicted.
      return std::make_unique<FirstFitPolicy>(std::move(kept), true);
    case PlacementPolicyKind::kNone:
      break;
  }
  return std::make_unique<NoPlacementPolicy>();
}

int FirstReadOnlyTier(const std::vector<std::unique_ptr<Tier>>& tiers) {
  return static_cast<int>(
      std::find_if(tiers.begin(), tiers.end(), [](const auto& t) { return !t->is_cache(); }) -
      tiers.begin());
}

int FastestCacheTierFor(const std::vector<std::unique_ptr<Tier>>& tiers, uint64_t file_bytes) {
  for (int t = 0; t < static_cast<int>(tiers.size()) && tiers[t]->is_cache(); ++t) {
    const Tier& tier = *tiers[t];
    if (tier.config().capacity_bytes >= tier.Footprint(file_bytes)) return t;
  }
  return -1;
}

}  // namespace monarch
