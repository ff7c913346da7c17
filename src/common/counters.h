// CounterSink: the one way components report their counters.
//
// A component with counters has `void ReportCounters(CounterSink& sink) const`
// and calls sink.Counter() / sink.Gauge() once per metric; per-tier metrics
// go through sink.ForTier(). Monarch::GetStats() visits every component with
// one sink, and the resulting Stats feeds the JSON and Prometheus outputs, so
// adding a counter is one line where it is counted.
//
// Not thread-safe: one sink per snapshot.

#ifndef MONARCH_COMMON_COUNTERS_H_
#define MONARCH_COMMON_COUNTERS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "monarch/stats.h"

namespace monarch {

// The reads one tier served, counted where they are served: by an
// in-process instance's Tier, and by each node-service client in the page
// it shares with the service, which sums them by tier index. Lock-free
// atomics only, so that it can live in shared memory; each on its own cache
// line, as reader threads bump both on every hit.
struct TierReads {
  alignas(64) std::atomic<uint64_t> reads{0};
  alignas(64) std::atomic<uint64_t> bytes{0};

  void Count(uint64_t n) {
    reads.fetch_add(1, std::memory_order_relaxed);
    bytes.fetch_add(n, std::memory_order_relaxed);
  }
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "TierReads lives in shared memory");

// Reads served elsewhere (node-service clients), to add to a tier's own.
struct TierReadTotals {
  uint64_t reads = 0;
  uint64_t bytes = 0;
};

// A counter of source bytes that someone pays for, shared with whoever
// charges it for longer than the payer may live (an announced order's
// prefetch).
using SourcePayer = std::shared_ptr<std::atomic<uint64_t>>;

// Who pays for the source reads a thread's misses make. The node service
// charges each client's misses to that client's job (`monarch status`):
// while a ChargeSourceReads lives, placement adds to its counter the bytes
// a miss on this thread makes the source read, the whole file (or extent)
// for a miss that starts a promotion, and a miss that joins a promotion in
// flight pays nothing, so what readers of one file pay adds up to one read.
// Misses on other threads (prefetch streams, in-process readers) charge
// nobody.
class ChargeSourceReads {
 public:
  explicit ChargeSourceReads(std::atomic<uint64_t>* counter) { payer_ = counter; }
  ~ChargeSourceReads() { payer_ = nullptr; }
  ChargeSourceReads(const ChargeSourceReads&) = delete;
  ChargeSourceReads& operator=(const ChargeSourceReads&) = delete;

  // Called where the source is read for a miss.
  static void Add(uint64_t bytes) {
    if (payer_ != nullptr) payer_->fetch_add(bytes, std::memory_order_relaxed);
  }

 private:
  static inline thread_local std::atomic<uint64_t>* payer_ = nullptr;
};

class CounterSink {
 public:
  explicit CounterSink(Stats* out) : out_(out) {}

  // Something that only grows (reads, bytes, events).
  void Counter(std::string_view name, uint64_t value, std::string_view help) {
    Add(name, Metric::Kind::kCounter, value, help);
  }
  // A level (bytes held now, a capacity, 0/1 for a flag).
  void Gauge(std::string_view name, uint64_t value, std::string_view help) {
    Add(name, Metric::Kind::kGauge, value, help);
  }
  // A sink whose metrics belong to tier `tier` of kind `kind`.
  CounterSink ForTier(std::string_view tier, std::string_view kind) const {
    CounterSink sink(out_);
    sink.tier_ = tier;
    sink.tier_kind_ = kind;
    return sink;
  }

 private:
  void Add(std::string_view name, Metric::Kind kind, uint64_t value, std::string_view help) {
    Metric m;
    m.name = name;
    m.kind = kind;
    m.value = value;
    m.help = help;
    m.tier = tier_;
    m.tier_kind = tier_kind_;
    out_->metrics.push_back(std::move(m));
  }

  Stats* out_;
  std::string tier_;
  std::string tier_kind_;
};

}  // namespace monarch

#endif  // MONARCH_COMMON_COUNTERS_H_
