// Monarch's counters: a snapshot of named metrics, as JSON or Prometheus text.
//
// Every component reports its counters through one visitor; a Stats value is
// what it reported, in order: general metrics (promotions, staging, warm
// restart, remote.*) and per-tier metrics, each carrying its tier's name and
// kind. Nothing here is specific to one counter, so a new counter is one line
// in the component that owns it.
//
// A Stats value is a copy; it does not change after Monarch::GetStats()
// returns it and may be used from any thread.

#ifndef MONARCH_STATS_H_
#define MONARCH_STATS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace monarch {

struct Metric {
  enum class Kind {
    kCounter,  // Only grows.
    kGauge,    // A level (bytes held now, a capacity, a flag).
  };
  // Lower-case words joined by '_'; a group prefix ends in '.', as in
  // "remote.peer_reads".
  std::string name;
  Kind kind = Kind::kCounter;
  uint64_t value = 0;
  std::string help;       // One sentence.
  std::string tier;       // The tier's name for a per-tier metric, else empty.
  std::string tier_kind;  // "ram", "pmem", "posix" or "source" for a per-tier metric.
};

class Stats {
 public:
  std::vector<Metric> metrics;

  // The value of the general metric `name`; 0 if there is none.
  uint64_t Get(std::string_view name) const;
  // Per-tier metrics, tiers numbered fastest first; the last one is the
  // source, whose "reads" and "bytes_read" count the operations sent to the
  // PFS, for callers and promotions alike (the MONARCH paper's figure).
  // 0 if there is none.
  uint64_t Tier(size_t index, std::string_view name) const;
  uint64_t Source(std::string_view name) const;
  // The tiers' names, fastest first.
  std::vector<std::string> TierNames() const;

  // {"promotions_started": 12, ..., "remote": {...}, "tiers": [{"name": "ram",
  // "kind": "ram", "reads": 3, ...}, ...]}
  std::string ToJson() const;
  // The Prometheus text exposition format: monarch_<name> with a
  // {tier="...",kind="..."} label set on per-tier metrics ('.' becomes '_').
  std::string ToPrometheus() const;
};

}  // namespace monarch

#endif  // MONARCH_STATS_H_
