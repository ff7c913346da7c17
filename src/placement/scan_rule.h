// The rule that tells a scan from a random reader, for the read-ahead of
// files cached by extents: applied by the placement handler to this
// process's reads, and by a node service's client to its own (whose hits
// never reach the service).

#ifndef MONARCH_PLACEMENT_SCAN_RULE_H_
#define MONARCH_PLACEMENT_SCAN_RULE_H_

#include <cstdint>

namespace monarch {

// How many extents' worth past a scan's end is read ahead.
constexpr uint64_t kReadAheadExtents = 4;

// A read of [offset, end) of a file whose last read ended at `last_end`. A
// scan begins the file, or goes on where the last read ended and has read
// an extent's worth so far: two records that happen to follow each other
// are no scan. `*start` is where the reads in a row began; updated.
inline bool ContinuesScan(uint64_t last_end, uint64_t offset, uint64_t end,
                          uint64_t extent_bytes, uint64_t* start) {
  if (last_end != offset || offset == 0) *start = offset;
  return offset == 0 || end - *start >= extent_bytes;
}

}  // namespace monarch

#endif  // MONARCH_PLACEMENT_SCAN_RULE_H_
