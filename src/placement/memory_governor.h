// MemoryGovernor: a RAM tier that yields to memory pressure before the job
// (or Monarch) is OOM-killed (memory.watch).
//
// A MemoryWatcher (common/memory_pressure.h) samples the memory cgroup and
// wakes on the kernel's events; on each sample the governor decides:
// - Pressure (less than memory.headroom left below the limit, or a PSI
//   trigger fired): shrink. The RAM tiers' capacity in force is lowered by
//   what it takes to leave twice the headroom free (for PSI alone, an
//   eighth of what they hold), and their copies are moved down to a file
//   tier with room or dropped (PlacementHandler::ShedTier, which waits for
//   the readers inside a copy: ReadPins), fastest tier first. Then the freed
//   pages are given back to the kernel (MemoryBacking::ReleaseFreeMemory):
//   a copy dropped from a tier whose memory stays allocated frees nothing.
// - No pressure for memory.grow_after: grow back, an eighth of the
//   configured capacity at most once a second, while twice the headroom
//   stays free after the step, up to the configured capacity. Files that
//   found no room while it was shrunk (left on the source for good under
//   first-fit) may be placed again then (PlacementHandler::Reconsider).
// - Keeping (SetKeeping: a node service with no client, holding its copies
//   for the next job): the same, with the headroom counted four times, so
//   that copies nobody reads yield before the memory of any running job,
//   its own Monarch service's tiers included.
// Each shrink and grow is logged once (info) with its figures, and counted
// (ReportCounters).
//
// Threads: all decisions run on the watcher's thread; counters are atomics
// read by GetStats from any thread. Lifetime: the tiers and the placement
// handler must outlive it. Stop() is bounded: it stops the shedding between
// two copies and joins the watcher by a deadline (common/shutdown.h).

#ifndef MONARCH_PLACEMENT_MEMORY_GOVERNOR_H_
#define MONARCH_PLACEMENT_MEMORY_GOVERNOR_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/counters.h"
#include "common/memory_pressure.h"
#include "common/shutdown.h"
#include "drivers/tier.h"
#include "metadata/namespace.h"
#include "monarch/config.h"
#include "placement/placement_handler.h"

namespace monarch {

class MemoryGovernor final {
 public:
  // Whether `config` asks for one: memory.watch and a RAM tier.
  static bool Wanted(const Config& config);

  // Starts watching `cgroup` for the RAM tiers among `tiers`; `placement`
  // must pin readers (PlacementHandler::pins_readers). Without a cgroup
  // (`start_watcher` false: tests), samples come only from OnSample().
  static absl::StatusOr<std::unique_ptr<MemoryGovernor>> Start(
      const MemoryConfig& config, CgroupMemory cgroup,
      std::vector<std::unique_ptr<Tier>>* tiers, Namespace* ns, PlacementHandler* placement,
      bool start_watcher = true);
  ~MemoryGovernor();
  MemoryGovernor(const MemoryGovernor&) = delete;
  MemoryGovernor& operator=(const MemoryGovernor&) = delete;

  // Stops shedding and the watcher by `deadline`; true if its thread ended.
  // Idempotent.
  bool Stop(Deadline deadline);

  // What one sample leads to; public for tests, which feed samples
  // without a watcher. Runs on one thread at a time.
  void OnSample(const MemorySample& sample);

  // Whether the tiers only keep copies for a later reader (no reader
  // attached): they then yield at kKeepingHeadroomFactor times the headroom.
  void SetKeeping(bool keeping) { keeping_.store(keeping, std::memory_order_relaxed); }
  static constexpr uint64_t kKeepingHeadroomFactor = 4;

  // memory_shrinks, memory_grows, memory_shed_bytes, memory_demoted_bytes,
  // memory_dropped_bytes, memory_released_bytes, memory_psi_events,
  // memory_headroom_bytes, memory_limit_bytes.
  void ReportCounters(CounterSink& sink) const;

 private:
  MemoryGovernor(const MemoryConfig& config, std::vector<std::unique_ptr<Tier>>* tiers,
                 Namespace* ns, PlacementHandler* placement);

  // memory.headroom, times kKeepingHeadroomFactor while keeping.
  uint64_t Headroom() const;
  void Shrink(const MemorySample& sample);
  void Grow(const MemorySample& sample);

  const MemoryConfig config_;
  std::vector<std::unique_ptr<Tier>>* const tiers_;
  Namespace* const namespace_;
  PlacementHandler* const placement_;
  std::vector<int> ram_tiers_;  // Indices into tiers_, fastest first.
  std::unique_ptr<MemoryWatcher> watcher_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> keeping_{false};

  // Only on the thread that calls OnSample.
  Clock::time_point last_pressure_;
  Clock::time_point last_grow_;

  std::atomic<uint64_t> shrinks_{0};
  std::atomic<uint64_t> grows_{0};
  std::atomic<uint64_t> shed_bytes_{0};
  std::atomic<uint64_t> demoted_bytes_{0};
  std::atomic<uint64_t> dropped_bytes_{0};
  std::atomic<uint64_t> released_bytes_{0};
  std::atomic<uint64_t> headroom_bytes_{0};
  std::atomic<uint64_t> limit_bytes_{0};
};

}  // namespace monarch

#endif  // MONARCH_PLACEMENT_MEMORY_GOVERNOR_H_
