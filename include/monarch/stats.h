// Monarch's counters: a plain snapshot struct and its JSON form.
//
// A Stats value is a copy; it does not change after Monarch::GetStats()
// returns it and may be used from any thread.

#ifndef MONARCH_STATS_H_
#define MONARCH_STATS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace monarch {

struct TierStats {
  std::string name;
  std::string kind;           // "ram", "pmem", "posix" or "source".
  uint64_t reads = 0;         // Read calls served (fully or partly) from this tier.
  uint64_t bytes_read = 0;    // Bytes served to callers from this tier.
  uint64_t files = 0;         // Complete copies held (source: dataset files).
  uint64_t bytes_used = 0;    // Bytes of those copies (source: dataset size).
  uint64_t capacity = 0;      // Configured capacity (source: 0).
  uint64_t read_errors = 0;   // Failed reads; for a non-source tier they fell back to the source.
  uint64_t write_errors = 0;  // Failed copies (ENOSPC, EIO...). Always 0 for the source.
};

// Peers (remote tier). All zero when remote.enabled is false.
struct RemoteStats {
  bool enabled = false;
  int rank = 0;
  int peers = 0;              // Processes in the job, this one included.
  uint64_t buffer_bytes = 0;  // Each pre-registered receive buffer.
  uint64_t home_files = 0;    // Files whose home is this process.
  uint64_t peer_reads = 0;    // Fetches of files no local tier held, served by their home.
  uint64_t peer_bytes_read = 0;
  uint64_t fallbacks = 0;        // Peer fetches that failed and went to the source instead.
  uint64_t down_skips = 0;       // Fetches sent straight to the source: the home was marked down.
  uint64_t peer_wait_ns = 0;     // Time callers spent waiting on peers.
  uint64_t requests_served = 0;  // Requests this process answered for peers, with data.
  uint64_t bytes_served = 0;
  uint64_t requests_refused = 0;  // Answered with an error (wrong version, shutting down...).
  uint64_t timeouts = 0;
  uint64_t peer_failures = 0;  // Times a peer was marked down.
  uint64_t checksum_failures = 0;
};

struct Stats {
  // Fastest first; the last entry is the source. The source's `reads` and
  // `bytes_read` count the operations sent to the PFS, for callers and for
  // promotions alike: the figure the MONARCH paper reports.
  std::vector<TierStats> tiers;
  uint64_t promotions_started = 0;
  uint64_t promotions_completed = 0;
  uint64_t promotions_failed = 0;   // Source or tier error; the file stays on the source.
  uint64_t promotions_skipped = 0;  // No tier had room, or staging memory was exhausted.
  uint64_t promotions_cancelled = 0;
  // Reads of files being promoted, served from the promotion's chunks (the
  // chunks such a read loads itself also count as source reads above).
  uint64_t staging_reads = 0;
  uint64_t staging_bytes_read = 0;
  uint64_t staging_hits = 0;          // Of those, reads whose bytes others had already loaded.
  uint64_t staging_fallbacks = 0;     // Reads of files being promoted that went to the source.
  // Staging memory: chunks read from the source and not yet written to a
  // tier (bytes now, and the most at any time), and who wrote the chunks:
  // placement threads, or readers when staging was over its budget.
  uint64_t staging_bytes = 0;
  uint64_t staging_peak_bytes = 0;
  uint64_t chunks_written_by_placement = 0;
  uint64_t chunks_written_by_readers = 0;
  uint64_t warm_files_reused = 0;     // Valid copies found at start-up.
  uint64_t warm_files_discarded = 0;  // Stale copies removed at start-up.
  RemoteStats remote;

  const TierStats& source() const { return tiers.back(); }
  std::string ToJson() const;
};

}  // namespace monarch

#endif  // MONARCH_STATS_H_
