// ReadSpeeds implementation.

#include "core/read_speeds.h"

#include <algorithm>
#include <chrono>

namespace monarch {
namespace {

constexpr uint64_t kScale = 1024;

// Nanoseconds per KiB of an `n`-byte read that took `ns`, scaled.
uint64_t ScaledNsPerKib(uint64_t ns, size_t n) {
  return n == 0 ? 0 : (ns * 1024 * kScale) / n;
}

// The nanoseconds an `n`-byte read takes at `scaled_ns_per_kib`.
double Nanoseconds(uint64_t scaled_ns_per_kib, size_t n) {
  return static_cast<double>(scaled_ns_per_kib) * static_cast<double>(n) / (1024.0 * kScale);
}

}  // namespace

void ReadSpeeds::Mean::Add(uint64_t value_scaled) {
  // A weight of 1/8: a few dozen reads follow a change, a single slow one
  // (a page fault, a preemption) moves the mean little. The first 8 samples
  // are averaged plainly, so the first one is not worth the next seven.
  const uint64_t weight =
      std::min<uint64_t>(samples.fetch_add(1, std::memory_order_relaxed) + 1, 8);
  const uint64_t old = scaled.load(std::memory_order_relaxed);
  const int64_t next = static_cast<int64_t>(old) +
                       (static_cast<int64_t>(value_scaled) - static_cast<int64_t>(old)) /
                           static_cast<int64_t>(weight);
  // Never 0 once measured: 0 means "no sample yet".
  scaled.store(next > 0 ? static_cast<uint64_t>(next) : 1, std::memory_order_relaxed);
}

std::unique_ptr<ReadSpeeds> ReadSpeeds::For(bool route_by_speed, std::vector<TierName> tiers) {
  bool file_tiers = false;
  for (const TierName& tier : tiers) {
    if (tier.kind == TierKind::kPeers) return nullptr;
    file_tiers |= tier.kind == TierKind::kPosix || tier.kind == TierKind::kPmem;
  }
  if (!route_by_speed || !file_tiers) return nullptr;
  const int count = static_cast<int>(tiers.size());
  return std::make_unique<ReadSpeeds>(count, std::move(tiers));
}

ReadSpeeds::ReadSpeeds(int tier_count, std::vector<TierName> names)
    : tier_count_(tier_count), tiers_(new PerTier[static_cast<size_t>(tier_count)]) {
  for (size_t t = 0; t < names.size() && t < static_cast<size_t>(tier_count); ++t) {
    tiers_[t].routed = names[t].kind == TierKind::kPosix || names[t].kind == TierKind::kPmem;
    tiers_[t].name = std::move(names[t]);
  }
}

absl::StatusOr<size_t> ReadSpeeds::ReadHit(InMemoryReads* source, StorageDriver& copy,
                                           const FileRef& file, int tier, uint64_t offset,
                                           char* dst, size_t n, TierReads& counted) {
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point start) {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
  };
  if (source == nullptr && enabled()) Disable();  // The source cannot tell: nothing to route to.
  if (source != nullptr && TrySourceFirst(tier, n)) {
    const Clock::time_point start = Clock::now();
    // A hit never opens the file on the source to ask: that would cost a
    // PFS a metadata operation for bytes the copy holds.
    absl::StatusOr<size_t> got =
        source->ReadIfInMemory(file, offset, dst, n, InMemoryReads::Asker::kHit);
    const uint64_t ns = since(start);
    if (absl::IsUnimplemented(got.status())) {
      Disable();
    } else {
      // Not all in memory (Unavailable), or any failure: the copy has the
      // bytes, and whatever the attempt left in `dst` is overwritten.
      const bool served = got.ok() && *got == n;
      SourceAttempt(served, n, ns);
      if (served) return got;
    }
  }
  const Clock::time_point start = Clock::now();
  absl::StatusOr<size_t> got = copy.Read(file, offset, dst, n);
  if (got.ok() && *got == n) {
    CopyRead(tier, n, since(start));
    counted.Count(n);
  }
  return got;
}

bool ReadSpeeds::TrySourceFirst(int tier, size_t n) {
  if (!enabled() || tier < 0 || tier >= tier_count_ || n == 0) return false;
  PerTier& t = tiers_[tier];
  const uint64_t copy = t.ns_per_kib.Get();
  if (copy == 0) return false;  // The copy's own speed first.
  const bool explore =
      t.hits.fetch_add(1, std::memory_order_relaxed) % kExploreEvery == kExploreEvery - 1;
  if (served_.load(std::memory_order_relaxed) < kWarmUp) {
    // The source's speed is not known well enough yet: ask on the backoff's
    // schedule (every hit until a miss; it ends at 64).
    if (unknown_waited_.fetch_add(1, std::memory_order_relaxed) + 1 <
        unknown_wait_.load(std::memory_order_relaxed)) {
      return false;
    }
    unknown_waited_.store(0, std::memory_order_relaxed);
    return true;
  }
  if (explore) return true;
  const uint64_t source = source_ns_per_kib_.Get();
  const double p = static_cast<double>(source_rate_.Get()) / kScale;
  const double copy_ns = Nanoseconds(copy, n);
  const double first = p * Nanoseconds(source, n) +
                       (1 - p) * (static_cast<double>(miss_ns_.Get()) / kScale + copy_ns);
  if (first >= 0.9 * copy_ns) return false;
  chosen_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void ReadSpeeds::CopyRead(int tier, size_t n, uint64_t ns) {
  if (tier < 0 || tier >= tier_count_ || n == 0) return;
  tiers_[tier].ns_per_kib.Add(ScaledNsPerKib(ns, n));
}

void ReadSpeeds::SourceAttempt(bool served, size_t n, uint64_t ns) {
  const bool warming_up = served_.load(std::memory_order_relaxed) < kWarmUp;
  if (served) {
    served_.fetch_add(1, std::memory_order_relaxed);
    served_bytes_.fetch_add(n, std::memory_order_relaxed);
    source_ns_per_kib_.Add(ScaledNsPerKib(ns, n));
    if (warming_up) unknown_wait_.store(1, std::memory_order_relaxed);  // Its pages are in.
  } else {
    missed_.fetch_add(1, std::memory_order_relaxed);
    miss_ns_.Add(ns * kScale);
    if (warming_up) {
      const uint64_t wait = unknown_wait_.load(std::memory_order_relaxed);
      unknown_wait_.store(std::min(2 * wait, kExploreEvery), std::memory_order_relaxed);
    }
  }
  // A rate of 0 is a measurement too: stored as the smallest non-zero.
  source_rate_.Add(served ? kScale : 0);
}

void ReadSpeeds::ReportCounters(CounterSink& sink) const {
  sink.Counter("speed_source_cache_reads", served_.load(std::memory_order_relaxed),
               "Hits on a file tier served from the source's page cache instead, as the speed "
               "model chose or to keep it measured (placement.route_by_speed). Not counted as "
               "the source's reads, nor the tier's: the source's device or network was not "
               "read.");
  sink.Counter("speed_source_cache_bytes", served_bytes_.load(std::memory_order_relaxed),
               "Bytes of speed_source_cache_reads.");
  sink.Counter("speed_source_cache_misses", missed_.load(std::memory_order_relaxed),
               "Attempts at the source's page cache that found the bytes not in memory; the read "
               "went to the copy.");
  sink.Counter("speed_source_first_chosen", chosen_.load(std::memory_order_relaxed),
               "Hits for which the model expected the source's page cache to be faster than the "
               "copy (the rest of the attempts keep the model measured).");
  sink.Gauge("speed_source_cache_ns_per_mib", source_ns_per_kib_.Get() * 1024 / kScale,
             "The speed model's mean for reads served by the source's page cache.");
  sink.Gauge("speed_source_cache_hit_permille", source_rate_.Get() * 1000 / kScale,
             "The speed model's mean rate of attempts at the source's page cache that served "
             "the read, per thousand.");
  for (int t = 0; t < tier_count_; ++t) {
    if (!tiers_[t].routed) continue;
    sink.ForTier(tiers_[t].name.name, TierKindName(tiers_[t].name.kind))
        .Gauge("speed_ns_per_mib", CopyNsPerMib(t),
               "The speed model's mean for hits on this tier's copies "
               "(placement.route_by_speed).");
  }
}

uint64_t ReadSpeeds::CopyNsPerMib(int tier) const {
  return tier < 0 || tier >= tier_count_ ? 0 : tiers_[tier].ns_per_kib.Get() * 1024 / kScale;
}

}  // namespace monarch
