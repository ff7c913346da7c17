// MemoryGovernor (memory_governor.h): shrinking and growing the RAM tiers
// with the memory pressure.

#include "placement/memory_governor.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/log.h"

namespace monarch {
namespace {

std::string MiB(uint64_t bytes) { return absl::StrFormat("%.1f MiB", bytes / 1048576.0); }

// Grows happen at most this often, by at most an eighth of the capacity.
constexpr auto kGrowEvery = std::chrono::seconds(1);
constexpr uint64_t kGrowSteps = 8;

}  // namespace

bool MemoryGovernor::Wanted(const Config& config) {
  return config.memory.watch &&
         std::any_of(config.tiers.begin(), config.tiers.end(),
                     [](const TierConfig& tier) { return tier.kind == TierKind::kRam; });
}

MemoryGovernor::MemoryGovernor(const MemoryConfig& config,
                               std::vector<std::unique_ptr<Tier>>* tiers, Namespace* ns,
                               PlacementHandler* placement)
    : config_(config),
      tiers_(tiers),
      namespace_(ns),
      placement_(placement),
      last_pressure_(Clock::now()),
      last_grow_() {
  for (size_t t = 0; t < tiers->size(); ++t) {
    if ((*tiers)[t]->config().kind == TierKind::kRam) ram_tiers_.push_back(static_cast<int>(t));
  }
}

absl::StatusOr<std::unique_ptr<MemoryGovernor>> MemoryGovernor::Start(
    const MemoryConfig& config, CgroupMemory cgroup, std::vector<std::unique_ptr<Tier>>* tiers,
    Namespace* ns, PlacementHandler* placement, bool start_watcher) {
  if (!placement->pins_readers()) {
    return absl::FailedPreconditionError("memory.watch: the read path does not pin its reads");
  }
  std::unique_ptr<MemoryGovernor> governor(new MemoryGovernor(config, tiers, ns, placement));
  if (!start_watcher) return governor;
  MemoryWatcher::Options options;
  options.interval_seconds = config.interval_seconds;
  options.psi_stall_seconds = config.psi_stall_seconds;
  options.headroom_bytes = config.headroom_bytes;
  MemoryGovernor* self = governor.get();
  absl::StatusOr<std::unique_ptr<MemoryWatcher>> watcher = MemoryWatcher::Start(
      std::move(cgroup), options, [self](const MemorySample& sample) { self->OnSample(sample); });
  if (!watcher.ok()) return watcher.status();
  governor->watcher_ = std::move(*watcher);
  MONARCH_LOG(kInfo, "memory.watch: ", governor->watcher_->description());
  return governor;
}

MemoryGovernor::~MemoryGovernor() { Stop(DeadlineIn(kCancelGraceSeconds)); }

bool MemoryGovernor::Stop(Deadline deadline) {
  stop_.store(true, std::memory_order_relaxed);
  return watcher_ == nullptr || watcher_->Stop(deadline);
}

uint64_t MemoryGovernor::Headroom() const {
  return keeping_.load(std::memory_order_relaxed) ? kKeepingHeadroomFactor * config_.headroom_bytes
                                                  : config_.headroom_bytes;
}

void MemoryGovernor::OnSample(const MemorySample& sample) {
  headroom_bytes_.store(sample.headroom_bytes, std::memory_order_relaxed);
  limit_bytes_.store(sample.limit_bytes, std::memory_order_relaxed);
  if (stop_.load(std::memory_order_relaxed)) return;
  // Memory the RAM tiers may take ahead of their copies (back_ahead): what
  // stays free above four times the headroom, so that it never brings a
  // shrink on (one leaves twice the headroom free), shared between them.
  const uint64_t headroom = Headroom();
  const uint64_t keep = 4 * headroom;
  const uint64_t ahead = sample.headroom_bytes > keep ? sample.headroom_bytes - keep : 0;
  for (int t : ram_tiers_) {
    MemoryBacking* memory = (*tiers_)[t]->can().memory;
    if (memory != nullptr) memory->AllowMemoryAhead(ahead / std::max<size_t>(ram_tiers_.size(), 1));
  }
  const Clock::time_point now = Clock::now();
  if (sample.headroom_bytes < headroom || sample.psi_fired) {
    last_pressure_ = now;
    Shrink(sample);
    return;
  }
  const auto quiet = std::chrono::duration<double>(now - last_pressure_).count();
  if (quiet >= config_.grow_after_seconds && now - last_grow_ >= kGrowEvery) Grow(sample);
}

void MemoryGovernor::Shrink(const MemorySample& sample) {
  const Clock::time_point start = Clock::now();
  uint64_t held = 0;
  for (int t : ram_tiers_) held += (*tiers_)[t]->reserved_bytes();
  // Enough to leave twice the headroom: the job that pressed is likely to
  // go on allocating, and one shrink per threshold crossing is cheaper than
  // many small ones.
  uint64_t need = 0;
  const uint64_t headroom = Headroom();
  if (sample.headroom_bytes < headroom) need = 2 * headroom - sample.headroom_bytes;
  // Stalls without the limit near (the system's memory, or a PSI trigger
  // of the cgroup's): give back an eighth at a time.
  if (sample.psi_fired) need = std::max(need, held / kGrowSteps);
  if (need == 0) return;

  uint64_t shed = 0, demoted = 0, dropped = 0, files = 0, released = 0;
  std::vector<std::string> tiers_changed;
  for (int t : ram_tiers_) {
    if (stop_.load(std::memory_order_relaxed)) break;
    Tier& tier = *(*tiers_)[t];
    const uint64_t before_limit = tier.limit();
    const uint64_t reserved = tier.reserved_bytes();
    const uint64_t remaining = need > shed ? need - shed : 0;
    // Even a tier that sheds nothing (every copy pinned, or none) stops
    // growing at what it holds now.
    const uint64_t target = reserved > remaining ? reserved - remaining : 0;
    const Evictor::ShedResult result = placement_->ShedTier(t, target, stop_);
    shed += result.demoted_bytes + result.dropped_bytes;
    demoted += result.demoted_bytes;
    dropped += result.dropped_bytes;
    files += result.files;
    if (tier.can().memory != nullptr) released += tier.can().memory->ReleaseFreeMemory();
    if (tier.limit() != before_limit || result.files > 0) {
      tiers_changed.push_back(absl::StrCat("'", tier.config().name, "' ", MiB(before_limit),
                                           " -> ", MiB(tier.limit())));
    }
    if (shed >= need) break;
  }
  if (tiers_changed.empty()) return;  // Already as small as it gets: nothing to report.
  shrinks_.fetch_add(1, std::memory_order_relaxed);
  shed_bytes_.fetch_add(shed, std::memory_order_relaxed);
  demoted_bytes_.fetch_add(demoted, std::memory_order_relaxed);
  dropped_bytes_.fetch_add(dropped, std::memory_order_relaxed);
  released_bytes_.fetch_add(released, std::memory_order_relaxed);
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  MONARCH_LOG(kInfo, "memory pressure (", MiB(sample.headroom_bytes), " left",
              sample.limit_bytes != 0 ? absl::StrCat(" of a ", MiB(sample.limit_bytes), " limit")
                                      : std::string(),
              sample.psi_fired ? ", PSI trigger fired" : "", "): RAM tier ",
              absl::StrJoin(tiers_changed, ", "), "; shed ", MiB(shed), " in ", files,
              " copies (", MiB(demoted), " moved down, ", MiB(dropped), " dropped), ",
              MiB(released), " given back to the kernel, in ", absl::StrFormat("%.1f", ms),
              " ms");
}

void MemoryGovernor::Grow(const MemorySample& sample) {
  // Room already granted but not yet filled will be taken by copies too.
  uint64_t granted = 0;
  for (int t : ram_tiers_) {
    const Tier& tier = *(*tiers_)[t];
    if (tier.limit() > tier.reserved_bytes()) granted += tier.limit() - tier.reserved_bytes();
  }
  const uint64_t keep = 2 * Headroom() + granted;
  if (sample.headroom_bytes <= keep) return;
  uint64_t allowed = sample.headroom_bytes - keep;
  for (int t : ram_tiers_) {
    Tier& tier = *(*tiers_)[t];
    const uint64_t capacity = tier.config().capacity_bytes;
    const uint64_t before = tier.limit();
    if (before >= capacity) continue;
    const uint64_t step =
        std::min({std::max<uint64_t>(capacity / kGrowSteps, 1), allowed, capacity - before});
    if (step == 0) return;
    tier.SetLimit(before + step);
    last_grow_ = Clock::now();
    grows_.fetch_add(1, std::memory_order_relaxed);
    MONARCH_LOG(kInfo, "memory pressure gone for ", config_.grow_after_seconds, " s (",
                MiB(sample.headroom_bytes), " left): RAM tier '", tier.config().name, "' grows ",
                MiB(before), " -> ", MiB(tier.limit()), " of ", MiB(capacity));
    // Files that found no room while the tier was shrunk were left on the
    // source for good (first-fit stops asking): they may be placed now.
    for (uint32_t id = 0; id < namespace_->entry_count(); ++id) {
      const PlacementState state = namespace_->state(id).load(std::memory_order_relaxed);
      if (state == PlacementState::kStaysOnSource) {
        placement_->Reconsider(namespace_->entry(id));
      }
    }
    return;  // One step per grow.
  }
}

void MemoryGovernor::ReportCounters(CounterSink& sink) const {
  sink.Counter("memory_shrinks", shrinks_.load(std::memory_order_relaxed),
               "Times memory pressure shrank the RAM tiers (memory.watch).");
  sink.Counter("memory_grows", grows_.load(std::memory_order_relaxed),
               "Times a shrunk RAM tier grew back a step once the pressure was gone.");
  sink.Counter("memory_shed_bytes", shed_bytes_.load(std::memory_order_relaxed),
               "Bytes of RAM copies moved out under memory pressure (moved down or dropped).");
  sink.Counter("memory_demoted_bytes", demoted_bytes_.load(std::memory_order_relaxed),
               "Of those, bytes moved down to a file tier.");
  sink.Counter("memory_dropped_bytes", dropped_bytes_.load(std::memory_order_relaxed),
               "Of those, bytes dropped (read from the source again when next read).");
  sink.Counter("memory_released_bytes", released_bytes_.load(std::memory_order_relaxed),
               "Memory the RAM tiers gave back to the kernel when they shrank.");
  sink.Counter("memory_psi_events", watcher_ != nullptr ? watcher_->psi_events() : 0,
               "Times the PSI trigger fired (or sampled PSI went over memory.psi_stall).");
  sink.Gauge("memory_headroom_bytes", headroom_bytes_.load(std::memory_order_relaxed),
             "What could still be allocated at the last sample: the memory cgroup's limit less "
             "its usage (inactive page cache not counted), or the system's available memory if "
             "less.");
  sink.Gauge("memory_limit_bytes", limit_bytes_.load(std::memory_order_relaxed),
             "The memory cgroup's limit at the last sample; 0: none.");
}

}  // namespace monarch
