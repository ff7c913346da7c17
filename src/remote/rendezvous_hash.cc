#include "remote/rendezvous_hash.h"

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
    const uint64_t score = Mix(name_hash ^ Mix(static_cast<uint64_t>(rank) + 1));
    if (rank == 0 || score > best_score) {
      best = rank;
      best_score = score;
    }
  }
  return best;
}

}  // namespace monarch
