// Home peers by rendezvous (highest-random-weight) hashing.
//
// Each file's home is the rank whose score for the file's dataset-relative
// name is highest. Every peer computes the same homes with no coordination,
// and when the peer list changes only the files of the peers that came or
// went move (a modulo hash would move almost all of them). The hash is our
// own and fixed, so it agrees across processes, builds and machines (Abseil's
// hash is seeded per process).

#ifndef MONARCH_REMOTE_RENDEZVOUS_HASH_H_
#define MONARCH_REMOTE_RENDEZVOUS_HASH_H_

#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"

namespace monarch {

// A stable 64-bit hash of a name (FNV-1a, then a finalizing mix).
uint64_t StableNameHash(absl::string_view name);

// The rank in [0, peers) with the highest score for a name of this hash.
int HomeRank(uint64_t name_hash, int peers);

// All `peers` ranks by descending score for a name of this hash: the home
// first, then the rank that takes its files over when it is gone, and so on
// (ties go to the lower rank, as in HomeRank). Every peer computes the same
// order, so when ranks are lost each file moves to the first rank left.
void RendezvousOrder(uint64_t name_hash, int peers, std::vector<int>* order);

// Whether rank `a` comes before rank `b` in that order (without computing it).
bool ComesBefore(uint64_t name_hash, int a, int b);

}  // namespace monarch

#endif  // MONARCH_REMOTE_RENDEZVOUS_HASH_H_
