// The seeded sampler (include/monarch/sampled_order.h): a permutation per
// epoch, the same for the same inputs, shared among ranks like torch's
// DistributedSampler, and pinned to golden values so that the algorithm,
// which other front ends rebuild from its specification, cannot drift.

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "monarch/sampled_order.h"
#include "placement/sampled_order.h"

namespace monarch {
namespace {

SampledOrder Ranks(uint32_t rank, uint32_t world_size, uint64_t seed = 42) {
  SampledOrder how;
  how.seed = seed;
  how.rank = rank;
  how.world_size = world_size;
  return how;
}

std::vector<uint64_t> Epoch(const SampledOrder& how, uint64_t samples, uint64_t epoch) {
  absl::StatusOr<std::vector<uint64_t>> indices = SampledEpochIndices(how, samples, epoch);
  REQUIRE(indices.ok());
  return *indices;
}

bool IsPermutation(std::vector<uint64_t> v) {
  std::sort(v.begin(), v.end());
  for (uint64_t i = 0; i < v.size(); ++i) {
    if (v[i] != i) return false;
  }
  return true;
}

TEST_CASE("sampled order: the generator is SplitMix64 (its published outputs)") {
  SplitMix64 zero(0);
  CHECK(zero.Next() == 0xE220A8397B1DCDAFu);
  CHECK(zero.Next() == 0x6E789E6AA1B965F4u);
  CHECK(zero.Next() == 0x06C45D188009454Fu);
  SplitMix64 other(1234567);
  CHECK(other.Next() == 6457827717110365317u);
  CHECK(other.Next() == 3203168211198807973u);
  CHECK(other.Next() == 9817491932198370423u);
}

TEST_CASE("sampled order: bounded draws are Lemire's, rejections included (golden)") {
  // A bound just above 2^63 rejects about half the draws: 8 results take 20.
  SplitMix64 g(99);
  const uint64_t bound = (uint64_t{1} << 63) + 1;
  const std::vector<uint64_t> want = {2412192838258505201u, 943729858380535403u,
                                      2164399061527425849u, 4820169792980186143u,
                                      5093004042090514826u, 6896427214207389439u,
                                      2350577710944196420u, 1536013771446202289u};
  for (uint64_t w : want) CHECK(g.Below(bound) == w);
  SplitMix64 skip(99);
  for (int i = 0; i < 20; ++i) skip.Next();
  CHECK(g.Next() == skip.Next());
  SplitMix64 small(5);
  std::vector<uint64_t> dice;
  for (int i = 0; i < 10; ++i) dice.push_back(small.Below(6));
  CHECK(dice == std::vector<uint64_t>{2, 4, 1, 0, 1, 2, 5, 3, 2, 3});
  SplitMix64 one(7);
  CHECK(one.Below(1) == 0);
}

TEST_CASE("sampled order: golden epochs of a small case") {
  // Computed by an independent implementation of the header's specification
  // (python/tests/test_sampled_order.py holds one).
  CHECK(Epoch(Ranks(0, 1), 10, 0) == std::vector<uint64_t>{0, 3, 5, 7, 9, 8, 2, 1, 4, 6});
  CHECK(Epoch(Ranks(0, 1), 10, 1) == std::vector<uint64_t>{6, 5, 1, 4, 7, 3, 2, 9, 8, 0});
  CHECK(Epoch(Ranks(0, 1, 43), 10, 0) == std::vector<uint64_t>{2, 5, 1, 3, 9, 7, 6, 8, 0, 4});
  CHECK(Epoch(Ranks(0, 3), 10, 0) == std::vector<uint64_t>{0, 7, 2, 6});
  CHECK(Epoch(Ranks(1, 3), 10, 0) == std::vector<uint64_t>{3, 9, 1, 0});
  CHECK(Epoch(Ranks(2, 3), 10, 0) == std::vector<uint64_t>{5, 8, 4, 3});
  SampledOrder cut = Ranks(2, 3);
  cut.drop_last = true;
  CHECK(Epoch(cut, 10, 0) == std::vector<uint64_t>{5, 8, 4});
  CHECK(Epoch(Ranks(0, 1, 7), 20, 3) == std::vector<uint64_t>{13, 12, 8, 19, 10, 15, 14, 7, 17, 9,
                                                               2, 4, 3, 11, 0, 1, 16, 6, 18, 5});
}

TEST_CASE("sampled order: each epoch is a permutation, the same for the same inputs") {
  for (uint64_t n : {1, 2, 3, 7, 64, 1000, 4097}) {
    CAPTURE(n);
    for (uint64_t epoch : {0, 1, 5}) {
      const std::vector<uint64_t> a = Epoch(Ranks(0, 1), n, epoch);
      CHECK(a.size() == n);
      CHECK(IsPermutation(a));
      CHECK(Epoch(Ranks(0, 1), n, epoch) == a);
    }
  }
}

TEST_CASE("sampled order: epochs and seeds give different orders") {
  const uint64_t n = 1000;
  std::vector<std::vector<uint64_t>> seen;
  for (uint64_t seed : {0, 1, 2, 42}) {
    for (uint64_t epoch : {0, 1, 2, 3}) seen.push_back(Epoch(Ranks(0, 1, seed), n, epoch));
  }
  for (size_t i = 0; i < seen.size(); ++i) {
    for (size_t j = i + 1; j < seen.size(); ++j) CHECK(seen[i] != seen[j]);
  }
  // Unlike torch's seed + epoch, seed 1 epoch 0 is not seed 0 epoch 1.
  CHECK(Epoch(Ranks(0, 1, 1), n, 0) != Epoch(Ranks(0, 1, 0), n, 1));
  // Not the identity either (a shuffle that forgot to shuffle).
  std::vector<uint64_t> identity(n);
  std::iota(identity.begin(), identity.end(), uint64_t{0});
  CHECK(Epoch(Ranks(0, 1), n, 0) != identity);
}

TEST_CASE("sampled order: the ranks' shares interleave into the padded permutation") {
  for (uint64_t n : {1, 2, 5, 10, 11, 12, 97}) {
    for (uint32_t world : {1u, 2u, 3u, 4u, 8u}) {
      CAPTURE(n);
      CAPTURE(world);
      const std::vector<uint64_t> whole = Epoch(Ranks(0, 1), n, 3);
      const uint64_t per_rank = (n + world - 1) / world;
      std::vector<std::vector<uint64_t>> shares;
      for (uint32_t r = 0; r < world; ++r) {
        shares.push_back(Epoch(Ranks(r, world), n, 3));
        CHECK(shares.back().size() == per_rank);
        CHECK(*SampledEpochLength(Ranks(r, world), n) == per_rank);
      }
      // Position k of the padded list is rank k % W's (k / W)-th index.
      for (uint64_t k = 0; k < per_rank * world; ++k) {
        CHECK(shares[k % world][k / world] == whole[k % n]);
      }
    }
  }
}

TEST_CASE("sampled order: drop_last cuts to a multiple of the world size") {
  for (uint64_t n : {1, 2, 10, 11, 12, 97}) {
    for (uint32_t world : {1u, 3u, 4u}) {
      CAPTURE(n);
      CAPTURE(world);
      const std::vector<uint64_t> whole = Epoch(Ranks(0, 1), n, 2);
      std::vector<uint64_t> all;
      for (uint32_t r = 0; r < world; ++r) {
        SampledOrder how = Ranks(r, world);
        how.drop_last = true;
        const std::vector<uint64_t> share = Epoch(how, n, 2);
        CHECK(share.size() == n / world);
        CHECK(*SampledEpochLength(how, n) == n / world);
        for (uint64_t k = 0; k < share.size(); ++k) CHECK(share[k] == whole[r + k * world]);
        all.insert(all.end(), share.begin(), share.end());
      }
      // Each index at most once: nothing repeated, the tail cut.
      std::sort(all.begin(), all.end());
      CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());
      CHECK(all.size() == n - n % world);
    }
  }
}

TEST_CASE("sampled order: without shuffle every epoch is 0..N-1, shared and padded") {
  SampledOrder how = Ranks(1, 4);
  how.shuffle = false;
  CHECK(Epoch(how, 10, 0) == std::vector<uint64_t>{1, 5, 9});
  CHECK(Epoch(how, 10, 7) == std::vector<uint64_t>{1, 5, 9});
  how.rank = 3;
  CHECK(Epoch(how, 10, 0) == std::vector<uint64_t>{3, 7, 1});  // Padded: 10 -> 0, 11 -> 1.
  how.drop_last = true;
  CHECK(Epoch(how, 10, 0) == std::vector<uint64_t>{3, 7});
  SampledOrder one;
  one.shuffle = false;
  CHECK(Epoch(one, 4, 9) == std::vector<uint64_t>{0, 1, 2, 3});
}

TEST_CASE("sampled order: several epochs are the single epochs concatenated") {
  SampledOrder how = Ranks(1, 2);
  how.first_epoch = 5;
  how.epochs = 3;
  absl::StatusOr<std::vector<uint64_t>> all = SampledOrderIndices(how, 9);
  REQUIRE(all.ok());
  std::vector<uint64_t> want;
  for (uint64_t e = 5; e < 8; ++e) {
    const std::vector<uint64_t> epoch = Epoch(how, 9, e);
    want.insert(want.end(), epoch.begin(), epoch.end());
  }
  CHECK(*all == want);
  CHECK(all->size() == 15);
}

TEST_CASE("sampled order: bad descriptions are InvalidArgument naming the field") {
  auto invalid = [](const absl::Status& status, const char* field) {
    CHECK(absl::IsInvalidArgument(status));
    CHECK_MESSAGE(absl::StrContains(status.message(), field), status.message());
  };
  invalid(SampledEpochIndices(Ranks(0, 1), 0, 0).status(), "samples");
  invalid(SampledEpochIndices(Ranks(0, 1), kMaxSampledSamples + 1, 0).status(), "samples");
  invalid(SampledEpochIndices(Ranks(0, 0), 10, 0).status(), "world_size");
  invalid(SampledEpochIndices(Ranks(2, 2), 10, 0).status(), "rank");
  invalid(SampledEpochLength(Ranks(5, 3), 10).status(), "rank");
  SampledOrder how;
  how.epochs = 0;
  invalid(SampledOrderIndices(how, 10).status(), "epochs");
  how.epochs = kMaxSampledEpochs + 1;
  invalid(SampledOrderIndices(how, 10).status(), "epochs");
  how.epochs = 2;
  how.first_epoch = ~uint64_t{0};
  invalid(SampledOrderIndices(how, 10).status(), "first_epoch");
  how.epochs = 1;  // The last epoch number itself is fine.
  CHECK(SampledOrderIndices(how, 10).ok());
  how.epochs = kMaxSampledEpochs;
  how.first_epoch = 0;
  CHECK(SampledOrderIndices(how, 3).ok());
  // With drop_last, fewer samples than ranks is an empty share, not an error.
  SampledOrder cut = Ranks(1, 4);
  cut.drop_last = true;
  CHECK(Epoch(cut, 3, 0).empty());
}

// Sizes a real dataset has (speed is the benchmarks' business, not a test's).
TEST_CASE("sampled order: a million samples, one rank's share and a whole permutation") {
  const std::vector<uint64_t> a = Epoch(Ranks(3, 8), 1000000, 1);
  CHECK(a.size() == 125000);
  CHECK(IsPermutation(Epoch(Ranks(0, 1), 1000000, 1)));
}

}  // namespace
}  // namespace monarch
