// A read order given as a seed plus a sampler description, rebuilt
// identically by every front end (C++, C, Python) and by Monarch itself.
//
// Announcing an order as a list costs the front end a list per epoch and
// tells Monarch only what that list covers. A description is a few numbers:
// the library rebuilds as many epochs of it as it is told (and hands the
// node service the list), so eviction (placement.policy lru) sees several
// epochs ahead. The sampler
// below is torch's DistributedSampler in behaviour (a shuffle per epoch,
// padded or cut to a multiple of the world size, rank r taking every
// world_size-th position from r); its shuffle is specified here exactly so
// that any front end can rebuild it without this library:
//
// All arithmetic is on unsigned 64-bit integers modulo 2^64.
//
//   Mix(z):   z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
//             z = (z ^ (z >> 27)) * 0x94D049BB133111EB
//             return z ^ (z >> 31)
//   Generator of (seed, epoch): state = Mix(Mix(seed) ^ epoch)
//   Next():   state = state + 0x9E3779B97F4A7C15; return Mix(state)
//             (SplitMix64)
//   Below(b), a uniform integer in [0, b) for b >= 1 (Lemire's
//   multiply-and-reject, unbiased):
//             x = Next(); p = x * b as a 128-bit product; lo = p mod 2^64
//             if lo < b:
//               t = (2^64 - b) mod b
//               while lo < t: x = Next(); p = x * b; lo = p mod 2^64
//             return p >> 64   (the high 64 bits)
//
// One epoch `e` of a dataset of N samples, for rank r of W:
//   1. p = [0, 1, ..., N-1]. If shuffle: with the generator of (seed, e),
//      for i = N-1 down to 1: j = Below(i + 1); swap p[i] and p[j]
//      (Fisher-Yates).
//   2. T = W * ceil(N / W), or W * floor(N / W) with drop_last. The padded
//      list is q[k] = p[k mod N] for k in [0, T): repeated from the start
//      when N is not a multiple of W (cut instead with drop_last).
//   3. Rank r reads q[r], q[r + W], q[r + 2W], ...: T / W indices.
//
// E.g. N = 10, W = 3: each rank reads 4 indices, p[0] and p[1] are read
// twice in all; with drop_last each reads 3, and p[9] by nobody.

#ifndef MONARCH_SAMPLED_ORDER_H_
#define MONARCH_SAMPLED_ORDER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace monarch {

// What a rank reads in epochs first_epoch .. first_epoch + epochs - 1.
struct SampledOrder {
  uint64_t seed = 0;
  uint64_t first_epoch = 0;
  uint32_t epochs = 1;       // 1 .. kMaxSampledEpochs.
  bool shuffle = true;       // False: 0, 1, ..., N-1 every epoch.
  uint32_t rank = 0;         // < world_size.
  uint32_t world_size = 1;   // >= 1.
  bool drop_last = false;    // Cut to a multiple of world_size instead of padding.
};

// The most epochs one announcement covers: the node service refuses an
// order longer than 100 times the dataset's files (its
// kMaxAnnouncedEpochs), so a longer description is refused here, before
// the list is built, rather than there, after it was sent.
inline constexpr uint32_t kMaxSampledEpochs = 100;
// The most samples a dataset may have here. A permutation is held in memory
// (8 bytes a sample), so a larger N is nearly always a bug (a negative
// number made unsigned), answered with an error rather than an exhausted
// memory.
inline constexpr uint64_t kMaxSampledSamples = uint64_t{1} << 32;

// How many indices one rank reads per epoch (T / W above). InvalidArgument,
// naming the field, for samples == 0 or > kMaxSampledSamples,
// world_size == 0 or rank >= world_size. `first_epoch` and `epochs` are not
// looked at.
absl::StatusOr<uint64_t> SampledEpochLength(const SampledOrder& how, uint64_t samples);

// The indices (each < samples) rank `how.rank` reads in epoch `epoch`, in
// order. Errors as SampledEpochLength. `first_epoch` and `epochs` are not
// looked at. O(samples) time and memory.
absl::StatusOr<std::vector<uint64_t>> SampledEpochIndices(const SampledOrder& how,
                                                          uint64_t samples, uint64_t epoch);

// Epochs first_epoch .. first_epoch + epochs - 1, concatenated. Also
// InvalidArgument for epochs outside 1 .. kMaxSampledEpochs and for a last
// epoch past 2^64 - 1.
absl::StatusOr<std::vector<uint64_t>> SampledOrderIndices(const SampledOrder& how,
                                                          uint64_t samples);

}  // namespace monarch

#endif  // MONARCH_SAMPLED_ORDER_H_
