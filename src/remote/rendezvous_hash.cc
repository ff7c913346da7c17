#include "remote/rendezvous_hash.h"

#include <algorithm>
#include <utility>

namespace monarch {
namespace {

uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

uint64_t Score(uint64_t name_hash, int rank) {
  return Mix(name_hash ^ Mix(static_cast<uint64_t>(rank) + 1));
}

}  // namespace

uint64_t StableNameHash(absl::string_view name) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001B3ull;
  }
  return Mix(h);
}

int HomeRank(uint64_t name_hash, int peers) {
  int best = 0;
  uint64_t best_score = 0;
  for (int rank = 0; rank < peers; ++rank) {
    const uint64_t score = Score(name_hash, rank);
    if (rank == 0 || score > best_score) {
      best = rank;
      best_score = score;
    }
  }
  return best;
}

void RendezvousOrder(uint64_t name_hash, int peers, std::vector<int>* order) {
  std::vector<std::pair<uint64_t, int>> scored(static_cast<size_t>(peers));
  for (int rank = 0; rank < peers; ++rank) scored[rank] = {Score(name_hash, rank), rank};
  std::sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  order->resize(scored.size());
  for (size_t i = 0; i < scored.size(); ++i) (*order)[i] = scored[i].second;
}

bool ComesBefore(uint64_t name_hash, int a, int b) {
  const uint64_t score_a = Score(name_hash, a), score_b = Score(name_hash, b);
  return score_a != score_b ? score_a > score_b : a < b;
}

HolderOrder HolderOrder::OfExtent(uint64_t extent_name_hash, uint64_t file_name_hash,
                                  uint32_t extent_index, int peers) {
  const uint64_t stripe = (static_cast<uint64_t>(HomeRank(file_name_hash, peers)) + extent_index) %
                          static_cast<uint64_t>(peers);
  return HolderOrder{extent_name_hash, static_cast<int>(stripe)};
}

void HolderOrder::Ranks(int peers, std::vector<int>* order) const {
  RendezvousOrder(name_hash, peers, order);
  if (first < 0) return;
  // The striped home to the front; the others keep their order.
  auto at = std::find(order->begin(), order->end(), first);
  std::rotate(order->begin(), at, at + 1);
}

bool HolderOrder::ComesBefore(int a, int b) const {
  if (a == b) return false;
  if (first >= 0 && (a == first || b == first)) return a == first;
  return monarch::ComesBefore(name_hash, a, b);
}

}  // namespace monarch
