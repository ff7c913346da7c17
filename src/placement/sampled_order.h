// The generator behind SampledOrder (include/monarch/sampled_order.h, which
// specifies it): exposed here so that tests can pin it to SplitMix64's
// published outputs and to golden permutations, and so that nothing else
// grows a second copy of it.

#ifndef MONARCH_PLACEMENT_SAMPLED_ORDER_H_
#define MONARCH_PLACEMENT_SAMPLED_ORDER_H_

#include <cstdint>

#include "monarch/sampled_order.h"

namespace monarch {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}

  // The generator of one epoch of a seeded order: Mix(Mix(seed) ^ epoch).
  // Mixing the seed first keeps (seed, epoch) pairs apart that a sum would
  // merge (seed 1 epoch 0 and seed 0 epoch 1 in torch's seed + epoch).
  static SplitMix64 ForEpoch(uint64_t seed, uint64_t epoch) {
    return SplitMix64(Mix(Mix(seed) ^ epoch));
  }

  // SplitMix64's output function (a bijection of 64-bit integers).
  static uint64_t Mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    return z ^ (z >> 31);
  }

  uint64_t Next() {
    state_ += 0x9E3779B97F4A7C15u;
    return Mix(state_);
  }

  // Uniform in [0, bound), bound >= 1, without modulo bias (Lemire 2019:
  // the high half of a 64x64-bit product, rejecting the few low halves that
  // would favour some results). A division only when a rejection is
  // possible, i.e. almost never for bounds far below 2^64.
  uint64_t Below(uint64_t bound) {
    unsigned __int128 product = static_cast<unsigned __int128>(Next()) * bound;
    uint64_t low = static_cast<uint64_t>(product);
    if (low < bound) {
      const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound.
      while (low < threshold) {
        product = static_cast<unsigned __int128>(Next()) * bound;
        low = static_cast<uint64_t>(product);
      }
    }
    return static_cast<uint64_t>(product >> 64);
  }

 private:
  uint64_t state_;
};

}  // namespace monarch

#endif  // MONARCH_PLACEMENT_SAMPLED_ORDER_H_
