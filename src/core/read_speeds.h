// ReadSpeeds: for a hit on a file tier (posix, pmem), which is faster now,
// the copy or the source's bytes in the page cache? Measured as reads go, in
// the manner of NoPFS's performance model, and asked before each such hit.
//
// Tier order says a copy is faster than the source, and for a source on a
// PFS it is. But a copy on a local disk whose pages were never cached (the
// posix tier writes large copies with O_DIRECT once they outgrow memory) is
// read from the device, while the same bytes may sit in the page cache of
// the source, a local file system or a PFS client's cache. Taking them from
// there costs the PFS nothing: the source is asked which pages it holds
// (InMemoryReads::ReadIfInMemory as Asker::kHit: cachestat(2), or
// mincore(2), before the read), which never reads the device or the
// network, and opens no file on a remote source, so every source byte is
// still read from it once.
//
// The model keeps, per file tier, an exponentially weighted mean of its
// hits' nanoseconds per KiB; and for the source's page cache, the same for
// the reads it served, the cost of an attempt that found the bytes not in
// memory, and how often attempts succeed. A hit tries the source first when
//
//   p * source(n) + (1 - p) * (miss + copy(n)) < 0.9 * copy(n)
//
// and, to keep p and source(n) current, one hit in 64 tries it anyway (an
// attempt that succeeds serves the read; one that fails costs a system call
// of about a microsecond). Until kWarmUp attempts have served, source(n) is
// not trusted (one read preempted on a busy machine would decide for
// dozens of hits): every hit tries, and after each miss the wait doubles
// (2, 4, ... 64 hits), so one file whose pages happened to be out of memory
// does not leave a slow copy serving the next 63 hits. A source whose file
// system cannot tell what is in memory (ReadIfInMemory returns the status
// code Unimplemented) turns the model off for good.
//
// Thread-safe: relaxed atomics; a lost update of a mean is harmless.

#ifndef MONARCH_CORE_READ_SPEEDS_H_
#define MONARCH_CORE_READ_SPEEDS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/counters.h"
#include "drivers/storage_driver.h"
#include "monarch/config.h"

namespace monarch {

class ReadSpeeds {
 public:
  struct TierName {
    std::string name;
    TierKind kind = TierKind::kSource;
  };
  // The model for `tiers` (fastest first, the source last) where
  // placement.route_by_speed asks for it and it applies: some tier is a
  // file tier, and the source is the one origin of their copies (with peers
  // a miss asks the home first). Else null.
  static std::unique_ptr<ReadSpeeds> For(bool route_by_speed, std::vector<TierName> tiers);
  // `tier_count`: the tiers of the instance, source included; `names`: theirs.
  explicit ReadSpeeds(int tier_count, std::vector<TierName> names = {});

  // Whether hits on tier `tier` are routed (a posix or pmem tier's).
  bool Routes(int tier) const { return tier >= 0 && tier < tier_count_ && tiers_[tier].routed; }
  // A hit of `n` bytes at `offset` of `file` on tier `tier`'s copy, which
  // `copy` reads: timed for the model, which may send it to the source's
  // page cache first (`source`'s ReadIfInMemory; null: the source cannot
  // tell, and the model stops asking). A read of the whole copy
  // counts in `counted`; one the page cache served counts in the model only
  // (the source's device or network was not read).
  absl::StatusOr<size_t> ReadHit(InMemoryReads* source, StorageDriver& copy, const FileRef& file,
                                 int tier, uint64_t offset, char* dst, size_t n,
                                 TierReads& counted);

  // Whether a hit of `n` bytes on tier `tier` should first try the source's
  // page cache.
  bool TrySourceFirst(int tier, size_t n);
  // A hit of `n` bytes on tier `tier`'s copy took `ns`.
  void CopyRead(int tier, size_t n, uint64_t ns);
  // An attempt at the source's page cache took `ns`: `served` if it had all
  // `n` bytes.
  void SourceAttempt(bool served, size_t n, uint64_t ns);
  // The source cannot tell what is in memory: no more attempts.
  void Disable() { enabled_.store(false, std::memory_order_relaxed); }
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }

  // The model's counters, and each routed tier's mean (speed_ns_per_mib).
  void ReportCounters(CounterSink& sink) const;
  // The model's mean for hits on tier `tier`'s copies; 0 before any.
  uint64_t CopyNsPerMib(int tier) const;

  // One hit in this many tries the source whatever the model says.
  static constexpr uint64_t kExploreEvery = 64;
  // Attempts that must serve before the source's mean decides.
  static constexpr uint64_t kWarmUp = 4;

 private:
  // A mean of samples in fixed point (value * 1024), 0 until the first.
  struct Mean {
    std::atomic<uint64_t> scaled{0};
    std::atomic<uint64_t> samples{0};
    void Add(uint64_t value_scaled);
    uint64_t Get() const { return scaled.load(std::memory_order_relaxed); }
  };
  struct PerTier {
    Mean ns_per_kib;
    std::atomic<uint64_t> hits{0};
    TierName name;
    bool routed = false;
  };

  std::atomic<bool> enabled_{true};
  const int tier_count_;
  std::unique_ptr<PerTier[]> tiers_;
  Mean source_ns_per_kib_;
  Mean miss_ns_;
  Mean source_rate_;  // Of 1024: how many attempts served the read.
  std::atomic<uint64_t> served_{0};
  std::atomic<uint64_t> served_bytes_{0};
  std::atomic<uint64_t> missed_{0};
  std::atomic<uint64_t> chosen_{0};  // Attempts the model asked for, not exploration.
  // While fewer than kWarmUp attempts have served: hits since the last
  // attempt, and how many to wait for before the next.
  std::atomic<uint64_t> unknown_waited_{0};
  std::atomic<uint64_t> unknown_wait_{1};
};

}  // namespace monarch

#endif  // MONARCH_CORE_READ_SPEEDS_H_
