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

// The order in which the ranks hold one namespace entry: its home first,
// then who takes it over. A file's is the rendezvous order of its name.
//
// An extent's begins with a striped home: extent k of a file goes to rank
// (home of the file's name + k) mod peers, so a file's extents go round
// the peers and a few big files load each one within an extent of even.
// Hashing every extent on its own would leave them lumpy: 2 files of 64
// extents over 4 peers gave one of them 1.19x the mean. After the striped
// home come the other ranks in the rendezvous order of the extent's own
// name, so a lost peer's extents spread over all the others, and only its
// own move.
struct HolderOrder {
  uint64_t name_hash = 0;  // Of the entry's own name.
  int first = -1;          // The striped home of an extent; -1 for a file.

  static HolderOrder OfFile(uint64_t name_hash) { return HolderOrder{name_hash, -1}; }
  static HolderOrder OfExtent(uint64_t extent_name_hash, uint64_t file_name_hash,
                              uint32_t extent_index, int peers);

  int Home(int peers) const { return first >= 0 ? first : HomeRank(name_hash, peers); }
  void Ranks(int peers, std::vector<int>* order) const;
  bool ComesBefore(int a, int b) const;
};

}  // namespace monarch

#endif  // MONARCH_REMOTE_RENDEZVOUS_HASH_H_
