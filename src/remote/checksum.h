// Checksum: a cheap 64-bit checksum over bytes received from a peer.
//
// Every transfer is checked with it before its bytes are served or stored.
// It guards against the failures a transfer can actually have (a truncated
// or misplaced piece, a buffer overwritten by a late message, a peer serving
// a different file), not against an adversary. It is a Fletcher-style sum
// over 64-bit words in four lanes: the second-order sums weigh each word by
// its position, so swapped or shifted data changes the result, and the four
// independent lanes keep it near memory speed (a CRC would be the cost of a
// second copy). Not a stable on-disk format: peers of one build compare it.

#ifndef MONARCH_REMOTE_CHECKSUM_H_
#define MONARCH_REMOTE_CHECKSUM_H_

#include <cstddef>
#include <cstdint>

namespace monarch {

uint64_t Checksum(const char* data, size_t n);

// Copies `n` bytes from `src` to `dst` and returns Checksum() of the bytes as
// written to `dst`, in one pass over cache-sized blocks.
uint64_t CopyWithChecksum(char* dst, const char* src, size_t n);

}  // namespace monarch

#endif  // MONARCH_REMOTE_CHECKSUM_H_
