// FindPrivateMappings: a walk of /proc/<pid>/maps; MappingWatch.

#include "common/process_mappings.h"

#include <dirent.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/os.h"

namespace monarch {
namespace {

bool ParseHex(absl::string_view text, uint64_t* value) {
  return !text.empty() && absl::SimpleHexAtoi(text, value);
}

// When a process started (CLOCK_BOOTTIME nanoseconds), from field 22 of
// its stat (clock ticks since boot); nullopt if it is gone.
std::optional<int64_t> StartTimeNanos(const std::string& stat_path) {
  absl::StatusOr<std::string> stat = ReadSmallFile(stat_path, 1 << 20);
  if (!stat.ok()) return std::nullopt;
  // The command name, field 2, is in parentheses and may hold anything.
  const size_t close = stat->rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::vector<absl::string_view> fields = absl::StrSplit(
      absl::string_view(*stat).substr(close + 1), ' ', absl::SkipEmpty());
  uint64_t ticks = 0;
  // Fields 3 onwards: the state is fields[0], so start time (22) is fields[19].
  if (fields.size() < 20 || !absl::SimpleAtoi(fields[19], &ticks)) return std::nullopt;
  const int64_t per_second = ::sysconf(_SC_CLK_TCK);
  return static_cast<int64_t>(ticks) * (1000000000 / (per_second > 0 ? per_second : 100));
}

// Whether a process's uids (the "Uid:" line of its status: real,
// effective, saved, filesystem) include this process's effective one;
// false if it is gone.
bool RunsAsThisUser(const std::string& status_path) {
  absl::StatusOr<std::string> status = ReadSmallFile(status_path, 1 << 20);
  if (!status.ok()) return false;
  const std::string me = absl::StrCat(::geteuid());
  for (absl::string_view line : absl::StrSplit(*status, '\n')) {
    if (!absl::ConsumePrefix(&line, "Uid:")) continue;
    for (absl::string_view uid : absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty())) {
      if (uid == me) return true;
    }
    return false;
  }
  return false;
}

}  // namespace

bool ParsePrivateMapping(absl::string_view line, const std::vector<MappedFileKey>& files,
                         MappedFileRange* range) {
  // "begin-end perms offset major:minor inode   path", all numbers hex but the inode.
  std::vector<absl::string_view> fields =
      absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
  if (fields.size() < 5 || fields[1].size() != 4 || fields[1][3] != 'p') return false;
  uint64_t inode = 0;
  if (!absl::SimpleAtoi(fields[4], &inode) || inode == 0) return false;
  const size_t colon = fields[3].find(':');
  uint64_t major_number = 0, minor_number = 0;
  if (colon == absl::string_view::npos || !ParseHex(fields[3].substr(0, colon), &major_number) ||
      !ParseHex(fields[3].substr(colon + 1), &minor_number)) {
    return false;
  }
  const MappedFileKey key{
      static_cast<uint64_t>(makedev(static_cast<unsigned>(major_number),
                                    static_cast<unsigned>(minor_number))),
      inode};
  if (std::find(files.begin(), files.end(), key) == files.end()) return false;
  const size_t dash = fields[0].find('-');
  uint64_t begin = 0, end = 0, offset = 0;
  if (dash == absl::string_view::npos || !ParseHex(fields[0].substr(0, dash), &begin) ||
      !ParseHex(fields[0].substr(dash + 1), &end) || end < begin ||
      !ParseHex(fields[2], &offset)) {
    return false;
  }
  *range = MappedFileRange{key, offset, offset + (end - begin)};
  return true;
}

int MappingBudget() {
  static const int budget = [] {
    long count = 65530;
    if (absl::StatusOr<std::string> text = ReadSmallFile("/proc/sys/vm/max_map_count"); text.ok()) {
      long value = 0;
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &value) && value > 0) count = value;
    }
    return static_cast<int>(std::clamp<long>(count / 4, 4, 1 << 30));
  }();
  return budget;
}

int64_t BootTimeNanos() {
  struct timespec now;
  ::clock_gettime(CLOCK_BOOTTIME, &now);
  return TimespecNanos(now);
}

absl::StatusOr<std::vector<MappedFileRange>> FindPrivateMappings(
    const std::vector<MappedFileKey>& files, int64_t since, const std::string& proc) {
  std::vector<MappedFileRange> found;
  DIR* dir = os::OpenDir(proc.c_str());
  if (dir == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("cannot list ", proc));
  }
  std::vector<std::string> pids;
  while (struct dirent* entry = os::ReadDir(dir)) {
    const absl::string_view name(entry->d_name);
    if (!name.empty() && std::all_of(name.begin(), name.end(), ::isdigit)) {
      pids.emplace_back(name);
    }
  }
  os::CloseDir(dir);
  for (const std::string& pid : pids) {
    const std::string base = absl::StrCat(proc, "/", pid);
    absl::StatusOr<std::string> maps = ReadSmallFile(base + "/maps", size_t{1} << 30);
    if (!maps.ok()) {
      // Gone since the listing, another user's, or one this process may not
      // inspect. Only one of this user's started since `since` could have
      // been handed our memory to map (a clock tick's rounding allowed).
      const std::optional<int64_t> started = StartTimeNanos(base + "/stat");
      const int64_t tick = 1000000000 / std::max<int64_t>(::sysconf(_SC_CLK_TCK), 1);
      if (started && *started + tick >= since && RunsAsThisUser(base + "/status")) {
        return absl::FailedPreconditionError(
            absl::StrCat("cannot read ", base, "/maps (", maps.status().message(),
                         "): a process of this user that is not dumpable"));
      }
      continue;
    }
    for (absl::string_view line : absl::StrSplit(*maps, '\n')) {
      MappedFileRange range;
      if (ParsePrivateMapping(line, files, &range)) found.push_back(range);
    }
  }
  return found;
}

uint64_t MappingWatch::ReleaseUnmapped(int tier,
                                       absl::FunctionRef<uint64_t(MappingWalk walk)> release) {
  PerTier& state = tiers_[tier];
  MutexLock lock(&state.mu);
  const auto now = std::chrono::steady_clock::now();
  if (state.last_walk && now - *state.last_walk < std::chrono::seconds(1)) return 0;
  std::optional<absl::Status> walked;
  const uint64_t released = release([&](const std::vector<MappedFileKey>& files, int64_t since) {
    absl::StatusOr<std::vector<MappedFileRange>> mapped = FindPrivateMappings(files, since);
    walked = mapped.status();
    return mapped;
  });
  if (walked) state.last_walk = now;
  if (walked && !walked->ok() && !state.warned) {
    state.warned = true;
    MONARCH_LOG(kWarning, "RAM tier: removed copies that a process may map stay held: ",
                walked->message());
  }
  return released;
}

}  // namespace monarch
