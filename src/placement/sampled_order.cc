// SampledOrder: the seeded sampler (specified in
// include/monarch/sampled_order.h) and Monarch::AnnounceSampledOrder, which
// rebuilds it and announces the result as a list. It lives outside the
// Monarch implementations because it is the same for all of them: the
// in-process instance and the node-service client each only see a list.

#include "placement/sampled_order.h"

#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "monarch/monarch.h"

namespace monarch {
namespace {

// `what` names the sample count as the caller knows it ("samples" for the
// free functions, "files" for AnnounceSampledOrder).
absl::Status CheckEpoch(const SampledOrder& how, uint64_t samples, const char* what) {
  if (samples == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampled order: ", what, " must not be empty (0 samples)"));
  }
  if (samples > kMaxSampledSamples) {
    return absl::InvalidArgumentError(absl::StrCat("sampled order: ", what, " has ", samples,
                                                   " samples, more than ", kMaxSampledSamples));
  }
  if (how.world_size == 0) {
    return absl::InvalidArgumentError("sampled order: world_size must be at least 1, not 0");
  }
  if (how.rank >= how.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("sampled order: rank ", how.rank,
                                                   " must be less than world_size ",
                                                   how.world_size));
  }
  return absl::OkStatus();
}

absl::Status CheckEpochs(const SampledOrder& how) {
  if (how.epochs == 0 || how.epochs > kMaxSampledEpochs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampled order: epochs must be 1 to ", kMaxSampledEpochs, ", not ", how.epochs));
  }
  if (how.first_epoch > ~uint64_t{0} - (how.epochs - 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampled order: first_epoch ", how.first_epoch, " plus ", how.epochs,
                     " epochs passes the last epoch number, 2^64 - 1"));
  }
  return absl::OkStatus();
}

// Checked by the callers.
uint64_t EpochLength(const SampledOrder& how, uint64_t samples) {
  // samples <= 2^32 and world_size < 2^32: no overflow.
  return how.drop_last ? samples / how.world_size
                       : (samples + how.world_size - 1) / how.world_size;
}

std::vector<uint64_t> EpochIndices(const SampledOrder& how, uint64_t samples, uint64_t epoch) {
  std::vector<uint64_t> order(samples);
  std::iota(order.begin(), order.end(), uint64_t{0});
  if (how.shuffle) {
    SplitMix64 generator = SplitMix64::ForEpoch(how.seed, epoch);
    for (uint64_t i = samples - 1; i > 0; --i) std::swap(order[i], order[generator.Below(i + 1)]);
  }
  const uint64_t length = EpochLength(how, samples);
  // One rank reading everything: the permutation is the share.
  if (how.world_size == 1) {
    order.resize(length);
    return order;
  }
  std::vector<uint64_t> share(length);
  uint64_t position = how.rank;
  for (uint64_t k = 0; k < length; ++k, position += how.world_size) {
    // Padding repeats from the start: position < samples + world_size.
    share[k] = order[position < samples ? position : position % samples];
  }
  return share;
}

}  // namespace

absl::StatusOr<uint64_t> SampledEpochLength(const SampledOrder& how, uint64_t samples) {
  MONARCH_RETURN_IF_ERROR(CheckEpoch(how, samples, "samples"));
  return EpochLength(how, samples);
}

absl::StatusOr<std::vector<uint64_t>> SampledEpochIndices(const SampledOrder& how,
                                                          uint64_t samples, uint64_t epoch) {
  MONARCH_RETURN_IF_ERROR(CheckEpoch(how, samples, "samples"));
  return EpochIndices(how, samples, epoch);
}

absl::StatusOr<std::vector<uint64_t>> SampledOrderIndices(const SampledOrder& how,
                                                          uint64_t samples) {
  MONARCH_RETURN_IF_ERROR(CheckEpoch(how, samples, "samples"));
  MONARCH_RETURN_IF_ERROR(CheckEpochs(how));
  std::vector<uint64_t> all;
  all.reserve(how.epochs * EpochLength(how, samples));
  for (uint32_t e = 0; e < how.epochs; ++e) {
    const std::vector<uint64_t> epoch = EpochIndices(how, samples, how.first_epoch + e);
    all.insert(all.end(), epoch.begin(), epoch.end());
  }
  return all;
}

absl::Status Monarch::AnnounceRanges(const std::vector<SampleRange>& samples) {
  // What an instance that knows no extents can announce: the files, each
  // once per run of samples in it.
  std::vector<std::string> names;
  for (const SampleRange& sample : samples) {
    if (names.empty() || names.back() != sample.file) names.push_back(sample.file);
  }
  return AnnounceOrder(names);
}

absl::Status Monarch::AnnounceSampledOrder(const std::vector<std::string>& files,
                                           const SampledOrder& how) {
  MONARCH_RETURN_IF_ERROR(CheckEpoch(how, files.size(), "files"));
  MONARCH_RETURN_IF_ERROR(CheckEpochs(how));
  // Names, not ids: AnnounceOrder is what each implementation resolves (the
  // client against the service's namespace image), and it checks them.
  std::vector<std::string> names;
  names.reserve(how.epochs * EpochLength(how, files.size()));
  for (uint32_t e = 0; e < how.epochs; ++e) {
    for (uint64_t index : EpochIndices(how, files.size(), how.first_epoch + e)) {
      names.push_back(files[index]);
    }
  }
  return AnnounceOrder(names);
}

}  // namespace monarch
