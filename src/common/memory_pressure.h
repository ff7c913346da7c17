// Memory pressure: how close this process's memory cgroup is to its limit,
// and whether the kernel reports tasks stalling on memory.
//
// CgroupMemory finds the memory cgroup this process is in (v1: the `memory`
// controller's hierarchy; v2: the unified one, where it has the memory
// controller) from /proc/self/cgroup and /proc/self/mountinfo, and reads its
// limit and usage. MemoryWatcher runs one thread that wakes on an event (a
// v1 usage threshold on `cgroup.event_control`, a v2 `memory.events`
// change, a PSI trigger on /proc/pressure/memory or the cgroup's
// `memory.pressure`) or every interval, samples, and hands the sample to a
// callback. Files are read through the OS seam (common/os.h); eventfds and
// poll() name no file and are called directly.
//
// Why both: a PSI trigger says tasks already stall (reclaim is under way,
// the last warning before the OOM killer in a cgroup without swap); the
// usage threshold says the limit is near before anything stalls, which is
// when shrinking a cache still helps.
//
// Lifetime and threads: MemoryWatcher::Start() starts the thread; Stop()
// wakes it through an eventfd and joins it by a deadline (common/shutdown.h):
// the thread's only blocking call is poll(), and the callback is bounded by
// its own work. CgroupMemory is immutable after Discover(): thread-safe.

#ifndef MONARCH_COMMON_MEMORY_PRESSURE_H_
#define MONARCH_COMMON_MEMORY_PRESSURE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/file_util.h"
#include "common/shutdown.h"

namespace monarch {

// What the watcher saw at one wake-up.
struct MemorySample {
  uint64_t limit_bytes = 0;      // The cgroup's limit in force; 0: no cgroup limit.
  uint64_t usage_bytes = 0;      // Charged to the cgroup, less inactive page cache.
  uint64_t available_bytes = 0;  // MemAvailable: what the whole system has left.
  // What may still be allocated: the least of the cgroup's limit less its
  // usage, and the system's available memory.
  uint64_t headroom_bytes = 0;
  // A PSI trigger fired (or avg10 was over it) since the last sample, on a
  // PSI source that speaks for this cgroup: its own (v2 memory.pressure),
  // or the system's when no cgroup limit holds and the system has less than
  // four times the headroom available. Otherwise the system's stalls may be
  // another cgroup's, reclaiming at its own limit: the headroom decides.
  bool psi_fired = false;
};

class CgroupMemory {
 public:
  enum class Version { kNone, kV1, kV2 };

  // This process's memory cgroup, from `proc`/self/cgroup and
  // `proc`/self/mountinfo; Version::kNone (only the system's memory is
  // watched) when there is none with a memory controller.
  static CgroupMemory Discover(const std::string& proc = "/proc");
  // A cgroup directory of either version, for tests.
  static CgroupMemory At(Version version, std::string directory);

  // The directory of the cgroup `cgroup_text` (the contents of
  // /proc/<pid>/cgroup) puts a process in, under the mount of that
  // hierarchy `mountinfo_text` lists; empty if none. Exposed for tests.
  static std::string FindDirectory(absl::string_view cgroup_text,
                                   absl::string_view mountinfo_text, Version version);

  Version version() const { return version_; }
  const std::string& directory() const { return directory_; }
  // "cgroup v1 <dir>", "cgroup v2 <dir>" or "no memory cgroup".
  std::string Describe() const;

  // Reads limit and usage (and the system's available memory) into a
  // sample. An unreadable cgroup file is an error naming it.
  absl::StatusOr<MemorySample> Read() const;

 private:
  CgroupMemory(Version version, std::string directory)
      : version_(version), directory_(std::move(directory)) {}

  Version version_;
  std::string directory_;
};

class MemoryWatcher {
 public:
  struct Options {
    double interval_seconds = 0.1;   // Between samples when nothing wakes the thread.
    double psi_stall_seconds = 0.15;  // Per 1 s window; 0: PSI not watched.
    // Wake at once when less than this is left below the cgroup's limit
    // (v1's usage threshold; v2 wakes on memory.events instead).
    uint64_t headroom_bytes = 256ull << 20;
  };
  using Callback = std::function<void(const MemorySample&)>;

  // Starts watching `cgroup`; `callback` runs on the watcher's thread after
  // every sample. The event sources that cannot be set up (no PSI, a
  // cgroup without thresholds) are left out, and sampling covers for them.
  static absl::StatusOr<std::unique_ptr<MemoryWatcher>> Start(CgroupMemory cgroup,
                                                              Options options, Callback callback);
  // Stops (Stop(DeadlineIn(kCancelGraceSeconds))); an owner whose Stop()
  // gave up must abandon the watcher instead (common/shutdown.h).
  ~MemoryWatcher();
  MemoryWatcher(const MemoryWatcher&) = delete;
  MemoryWatcher& operator=(const MemoryWatcher&) = delete;

  // Wakes the thread and joins it by `deadline`; true if it ended.
  // Idempotent.
  bool Stop(Deadline deadline);

  // What is watched, for the log: the cgroup, the PSI trigger (or
  // sampling), the threshold event.
  const std::string& description() const { return description_; }
  // How many times a PSI trigger fired (or sampled avg10 went over it).
  uint64_t psi_events() const { return psi_events_.load(std::memory_order_relaxed); }

 private:
  MemoryWatcher(CgroupMemory cgroup, Options options, Callback callback)
      : cgroup_(std::move(cgroup)), options_(options), callback_(std::move(callback)) {}

  // Sets up the event sources; what it could not set up is said in
  // description_.
  absl::Status Arm();
  void Run();
  // Whether sampled PSI (where no trigger could be set) is over the stall.
  bool SampledPsiOver() const;

  const CgroupMemory cgroup_;
  const Options options_;
  const Callback callback_;
  std::string description_;
  ScopedFd stop_fd_;       // eventfd: Stop() writes it.
  ScopedFd psi_fd_;        // A PSI trigger (POLLPRI), or invalid.
  std::string psi_path_;   // Sampled instead when no trigger could be set.
  bool psi_is_cgroups_ = false;  // psi_path_ is the cgroup's own memory.pressure.
  ScopedFd event_fd_;      // v1 threshold eventfd (POLLIN), or invalid.
  ScopedFd usage_fd_;      // v1: memory.usage_in_bytes, held for the threshold.
  ScopedFd events_fd_;     // v2: memory.events (POLLPRI on change), or invalid.
  std::atomic<uint64_t> psi_events_{0};
  ThreadGroup thread_;
  std::atomic<bool> stopped_{false};
};

}  // namespace monarch

#endif  // MONARCH_COMMON_MEMORY_PRESSURE_H_
