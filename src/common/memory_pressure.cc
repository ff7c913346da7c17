// CgroupMemory and MemoryWatcher (memory_pressure.h).

#include "common/memory_pressure.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/mount_table.h"
#include "common/os.h"
#include "common/status_macros.h"

namespace monarch {
namespace {

// A limit this large is no limit (v1 writes PAGE_COUNTER_MAX pages as
// 0x7ffffffffffff000; v2 writes "max").
constexpr uint64_t kNoLimit = uint64_t{1} << 60;

absl::StatusOr<uint64_t> ReadNumber(const std::string& path) {
  MONARCH_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, 4096));
  absl::string_view value = absl::StripAsciiWhitespace(text);
  if (value == "max") return std::numeric_limits<uint64_t>::max();
  uint64_t number;
  if (!absl::SimpleAtoi(value, &number)) {
    return absl::DataLossError(absl::StrCat(path, ": expected a number, got '", value, "'"));
  }
  return number;
}

// `key`'s value in a "key value" per line file (memory.stat); 0 if absent.
uint64_t StatValue(absl::string_view text, absl::string_view key) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, key) || !absl::ConsumePrefix(&line, " ")) continue;
    uint64_t value;
    return absl::SimpleAtoi(line, &value) ? value : 0;
  }
  return 0;
}

// Writes `text` with its terminating NUL, as the kernel's PSI parser wants.
bool WriteTrigger(int fd, const std::string& text) {
  return os::Write(fd, text.c_str(), text.size() + 1) == static_cast<ssize_t>(text.size() + 1);
}

}  // namespace

std::string CgroupMemory::FindDirectory(absl::string_view cgroup_text,
                                        absl::string_view mountinfo_text, Version version) {
  // /proc/self/cgroup: "4:memory:/job/42" (v1), "0::/job/42" (v2).
  std::optional<std::string> relative;
  for (absl::string_view line : absl::StrSplit(cgroup_text, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> fields = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3) continue;
    const bool v1_memory =
        version == Version::kV1 &&
        absl::c_linear_search(std::vector<absl::string_view>(absl::StrSplit(fields[1], ',')),
                              "memory");
    const bool v2 = version == Version::kV2 && fields[0] == "0" && fields[1].empty();
    if (v1_memory || v2) {
      relative = std::string(fields[2]);
      break;
    }
  }
  if (!relative) return "";
  for (const MountEntry& mount : ParseMountinfo(mountinfo_text)) {
    if (version == Version::kV1) {
      if (mount.fs_type != "cgroup") continue;
      if (!absl::c_linear_search(mount.super_options, "memory")) continue;
    } else if (mount.fs_type != "cgroup2") {
      continue;
    }
    // The mount shows the hierarchy from `root` down (a container sees its
    // own cgroup as "/"): the process's path is relative to it.
    absl::string_view path = *relative;
    if (mount.root != "/") {
      if (!absl::ConsumePrefix(&path, mount.root)) continue;
    }
    std::string directory = mount.mount_point;
    if (!path.empty() && path != "/") directory = JoinPath(directory, absl::StripPrefix(path, "/"));
    return directory;
  }
  return "";
}

CgroupMemory CgroupMemory::Discover(const std::string& proc) {
  absl::StatusOr<std::string> cgroup = ReadSmallFile(proc + "/self/cgroup", 1 << 20);
  absl::StatusOr<std::string> mountinfo = ReadSmallFile(proc + "/self/mountinfo", 4 << 20);
  if (!cgroup.ok() || !mountinfo.ok()) return CgroupMemory(Version::kNone, "");
  // v1 first: where both are mounted (a hybrid layout, as on this project's
  // test machines), the memory controller is v1's.
  std::string v1 = FindDirectory(*cgroup, *mountinfo, Version::kV1);
  if (!v1.empty() && os::Access(JoinPath(v1, "memory.limit_in_bytes").c_str(), R_OK) == 0) {
    return CgroupMemory(Version::kV1, std::move(v1));
  }
  std::string v2 = FindDirectory(*cgroup, *mountinfo, Version::kV2);
  // The root cgroup has no memory.max; a child has it only with the memory
  // controller enabled by its parent.
  if (!v2.empty() && os::Access(JoinPath(v2, "memory.current").c_str(), R_OK) == 0) {
    return CgroupMemory(Version::kV2, std::move(v2));
  }
  return CgroupMemory(Version::kNone, "");
}

CgroupMemory CgroupMemory::At(Version version, std::string directory) {
  return CgroupMemory(version, std::move(directory));
}

std::string CgroupMemory::Describe() const {
  if (version_ == Version::kNone) return "no memory cgroup";
  return absl::StrCat("cgroup v", version_ == Version::kV1 ? 1 : 2, " ", directory_);
}

absl::StatusOr<MemorySample> CgroupMemory::Read() const {
  MemorySample sample;
  sample.available_bytes = AvailableMemoryBytes();
  uint64_t limit = std::numeric_limits<uint64_t>::max();
  if (version_ == Version::kV1) {
    MONARCH_ASSIGN_OR_RETURN(limit, ReadNumber(JoinPath(directory_, "memory.limit_in_bytes")));
    MONARCH_ASSIGN_OR_RETURN(uint64_t usage,
                             ReadNumber(JoinPath(directory_, "memory.usage_in_bytes")));
    MONARCH_ASSIGN_OR_RETURN(std::string stat,
                             ReadSmallFile(JoinPath(directory_, "memory.stat"), 1 << 20));
    // A parent's lower limit holds too.
    const uint64_t hierarchical = StatValue(stat, "hierarchical_memory_limit");
    if (hierarchical != 0) limit = std::min(limit, hierarchical);
    // Inactive page cache is reclaimed before anything is killed: it is
    // not pressure (what the kernel's own OOM decisions and `docker stats`
    // subtract too).
    const uint64_t inactive_file = StatValue(stat, "total_inactive_file");
    sample.usage_bytes = usage > inactive_file ? usage - inactive_file : 0;
  } else if (version_ == Version::kV2) {
    MONARCH_ASSIGN_OR_RETURN(limit, ReadNumber(JoinPath(directory_, "memory.max")));
    // memory.high throttles and reclaims hard past it: the limit in effect.
    absl::StatusOr<uint64_t> high = ReadNumber(JoinPath(directory_, "memory.high"));
    if (high.ok()) limit = std::min(limit, *high);
    MONARCH_ASSIGN_OR_RETURN(uint64_t usage, ReadNumber(JoinPath(directory_, "memory.current")));
    MONARCH_ASSIGN_OR_RETURN(std::string stat,
                             ReadSmallFile(JoinPath(directory_, "memory.stat"), 1 << 20));
    const uint64_t inactive_file = StatValue(stat, "inactive_file");
    sample.usage_bytes = usage > inactive_file ? usage - inactive_file : 0;
  }
  sample.limit_bytes = limit >= kNoLimit ? 0 : limit;
  sample.headroom_bytes = sample.available_bytes;
  if (sample.limit_bytes != 0) {
    const uint64_t left =
        sample.limit_bytes > sample.usage_bytes ? sample.limit_bytes - sample.usage_bytes : 0;
    sample.headroom_bytes = std::min(sample.headroom_bytes, left);
  }
  return sample;
}

absl::StatusOr<std::unique_ptr<MemoryWatcher>> MemoryWatcher::Start(CgroupMemory cgroup,
                                                                    Options options,
                                                                    Callback callback) {
  std::unique_ptr<MemoryWatcher> watcher(
      new MemoryWatcher(std::move(cgroup), options, std::move(callback)));
  MONARCH_RETURN_IF_ERROR(watcher->Arm());
  MemoryWatcher* self = watcher.get();
  watcher->thread_.Start([self] { self->Run(); });
  return watcher;
}

absl::Status MemoryWatcher::Arm() {
  stop_fd_ = ScopedFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!stop_fd_.valid()) return ErrnoToStatus(errno, "eventfd for the memory watcher");
  std::vector<std::string> parts{cgroup_.Describe()};
  if (options_.psi_stall_seconds > 0) {
    // The cgroup's own pressure where v2 has it; else the system's.
    psi_path_ = "/proc/pressure/memory";
    if (cgroup_.version() == CgroupMemory::Version::kV2 &&
        os::Access(JoinPath(cgroup_.directory(), "memory.pressure").c_str(), W_OK) == 0) {
      psi_path_ = JoinPath(cgroup_.directory(), "memory.pressure");
      psi_is_cgroups_ = true;
    }
    const uint64_t stall_us = static_cast<uint64_t>(std::llround(options_.psi_stall_seconds * 1e6));
    // A 1 s window; without CAP_SYS_RESOURCE the kernel takes only
    // multiples of 2 s (EINVAL otherwise), so that is tried next, with the
    // stall scaled to the same share of the window.
    for (uint64_t window_us : {uint64_t{1000000}, uint64_t{2000000}}) {
      ScopedFd fd(os::Open(psi_path_.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC));
      if (!fd.valid()) break;
      const std::string trigger =
          absl::StrCat("some ", stall_us * (window_us / 1000000), " ", window_us);
      if (WriteTrigger(fd.get(), trigger)) {
        psi_fd_ = std::move(fd);
        parts.push_back(absl::StrCat("PSI trigger '", trigger, "' on ", psi_path_));
        break;
      }
    }
    if (!psi_fd_.valid()) {
      if (os::Access(psi_path_.c_str(), R_OK) == 0) {
        parts.push_back(absl::StrCat("PSI sampled from ", psi_path_, " (no trigger allowed)"));
      } else {
        parts.push_back("no PSI (the kernel has none)");
        psi_path_.clear();
      }
    }
  }
  if (cgroup_.version() == CgroupMemory::Version::kV1) {
    // A usage threshold: the kernel signals the eventfd when usage (page
    // cache included, so it may fire early; a sample then decides) crosses
    // it, either way.
    absl::StatusOr<MemorySample> now = cgroup_.Read();
    if (now.ok() && now->limit_bytes > options_.headroom_bytes) {
      event_fd_ = ScopedFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
      usage_fd_ = ScopedFd(
          os::Open(JoinPath(cgroup_.directory(), "memory.usage_in_bytes").c_str(),
                   O_RDONLY | O_CLOEXEC));
      ScopedFd control(os::Open(JoinPath(cgroup_.directory(), "cgroup.event_control").c_str(),
                                O_WRONLY | O_CLOEXEC));
      const uint64_t threshold = now->limit_bytes - options_.headroom_bytes;
      const std::string line =
          absl::StrCat(event_fd_.get(), " ", usage_fd_.get(), " ", threshold);
      if (event_fd_.valid() && usage_fd_.valid() && control.valid() &&
          os::Write(control.get(), line.data(), line.size()) ==
              static_cast<ssize_t>(line.size())) {
        parts.push_back(absl::StrCat("usage threshold at ", threshold, " bytes"));
      } else {
        event_fd_ = ScopedFd();
        usage_fd_ = ScopedFd();
      }
    }
  } else if (cgroup_.version() == CgroupMemory::Version::kV2) {
    // kernfs notifies a change of memory.events (high, max, oom) as POLLPRI.
    events_fd_ = ScopedFd(os::Open(JoinPath(cgroup_.directory(), "memory.events").c_str(),
                                   O_RDONLY | O_CLOEXEC));
    if (events_fd_.valid()) parts.push_back("memory.events");
  }
  parts.push_back(absl::StrCat("sampled every ", options_.interval_seconds, " s"));
  description_ = absl::StrJoin(parts, ", ");
  return absl::OkStatus();
}

bool MemoryWatcher::SampledPsiOver() const {
  if (psi_path_.empty() || psi_fd_.valid()) return false;
  absl::StatusOr<std::string> text = ReadSmallFile(psi_path_, 4096);
  if (!text.ok()) return false;
  // "some avg10=1.23 avg60=... total=...": avg10 is the percentage of the
  // last 10 s that some task stalled.
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    if (!absl::ConsumePrefix(&line, "some avg10=")) continue;
    double percent;
    if (!absl::SimpleAtod(line.substr(0, line.find(' ')), &percent)) return false;
    return percent / 100 >= options_.psi_stall_seconds;
  }
  return false;
}

void MemoryWatcher::Run() {
  const int timeout_ms =
      std::max(1, static_cast<int>(std::lround(options_.interval_seconds * 1000)));
  for (;;) {
    std::vector<pollfd> fds;
    fds.push_back({stop_fd_.get(), POLLIN, 0});
    const size_t psi = fds.size();
    if (psi_fd_.valid()) fds.push_back({psi_fd_.get(), POLLPRI, 0});
    const size_t threshold = fds.size();
    if (event_fd_.valid()) fds.push_back({event_fd_.get(), POLLIN, 0});
    const size_t events = fds.size();
    if (events_fd_.valid()) fds.push_back({events_fd_.get(), POLLPRI, 0});
    const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
    if (stopped_.load(std::memory_order_acquire) || (fds[0].revents & POLLIN) != 0) return;
    if (ready < 0 && errno != EINTR) {
      // Not expected of poll() on descriptors we own; sample on a timer.
      ::usleep(static_cast<useconds_t>(timeout_ms) * 1000);
    }
    MemorySample sample;
    bool fired = false;
    if (psi_fd_.valid() && psi < fds.size() && (fds[psi].revents & POLLPRI) != 0) fired = true;
    if (event_fd_.valid() && threshold < fds.size() && (fds[threshold].revents & POLLIN) != 0) {
      uint64_t count;
      (void)::read(event_fd_.get(), &count, sizeof(count));  // Re-arms the eventfd.
    }
    if (events_fd_.valid() && events < fds.size() && (fds[events].revents & POLLPRI) != 0) {
      char buffer[512];
      (void)os::Pread(events_fd_.get(), buffer, sizeof(buffer), 0);  // Re-arms kernfs' notification.
    }
    if (!fired) fired = SampledPsiOver();
    if (fired) psi_events_.fetch_add(1, std::memory_order_relaxed);
    absl::StatusOr<MemorySample> read = cgroup_.Read();
    if (read.ok()) {
      sample = *read;
    } else {
      // The cgroup went away (or became unreadable): the system's memory
      // still tells something.
      sample.available_bytes = AvailableMemoryBytes();
      sample.headroom_bytes = sample.available_bytes;
    }
    // The system's stalls with memory to spare are someone else's (another
    // cgroup reclaiming at its limit): they count only when this process's
    // own headroom is getting short too.
    sample.psi_fired =
        fired && (psi_is_cgroups_ || (sample.limit_bytes == 0 &&
                                      sample.headroom_bytes < 4 * options_.headroom_bytes));
    callback_(sample);
  }
}

bool MemoryWatcher::Stop(Deadline deadline) {
  if (!stopped_.exchange(true, std::memory_order_acq_rel)) {
    const uint64_t one = 1;
    (void)::write(stop_fd_.get(), &one, sizeof(one));
  }
  return thread_.JoinUntil(deadline);
}

MemoryWatcher::~MemoryWatcher() { Stop(DeadlineIn(kCancelGraceSeconds)); }

}  // namespace monarch
