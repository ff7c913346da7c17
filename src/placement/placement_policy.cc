// The built-in placement policies.

#include "placement/placement_policy.h"

#include "absl/strings/str_cat.h"

namespace monarch {
namespace {

class FirstFitPolicy final : public PlacementPolicy {
 public:
  std::optional<int> ChooseTier(const FileRef& file,
                                const std::vector<std::unique_ptr<Tier>>& tiers) override {
    for (int i = 0; i + 1 < static_cast<int>(tiers.size()); ++i) {
      if (tiers[i]->TryReserve(file.size)) return i;
    }
    return std::nullopt;
  }
};

class NoPlacementPolicy final : public PlacementPolicy {
 public:
  std::optional<int> ChooseTier(const FileRef&,
                                const std::vector<std::unique_ptr<Tier>>&) override {
    return std::nullopt;
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<PlacementPolicy>> NewPlacementPolicy(const std::string& name) {
  if (name == "first-fit") return std::make_unique<FirstFitPolicy>();
  if (name == "none") return std::make_unique<NoPlacementPolicy>();
  return absl::InvalidArgumentError(
      absl::StrCat("placement.policy: expected 'first-fit' or 'none', got '", name, "'"));
}

}  // namespace monarch
