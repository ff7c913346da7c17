// Purging a config's tiers: the lock, the config, each tier.

#include "service/purge.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/os.h"
#include "common/status_macros.h"
#include "drivers/ram_keep.h"
#include "service/ram_keeper.h"
#include "config/valid_config.h"

namespace monarch::service {
namespace {

std::string TierLabel(const TierConfig& tier) {
  return absl::StrCat("tier '", tier.name, "' (", TierKindName(tier.kind), ")");
}

bool HasDirectory(const TierConfig& tier) {
  return tier.kind == TierKind::kPosix || tier.kind == TierKind::kPmem;
}

// The memory the regular files under `dir` take (tmpfs: their pages), 0
// if there is no such directory.
uint64_t BytesUnder(const std::string& dir) {
  uint64_t bytes = 0;
  DIR* d = os::OpenDir(dir.c_str());
  if (d == nullptr) return 0;
  while (struct dirent* entry = os::ReadDir(d)) {
    const std::string name = entry->d_name;
    if (name == "." || name == "..") continue;
    struct stat st;
    if (os::Lstat(JoinPath(dir, name).c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      bytes += static_cast<uint64_t>(st.st_blocks) * 512;
    }
  }
  os::CloseDir(d);
  return bytes;
}

}  // namespace

absl::Status ConfigPurge::Overall() const {
  for (const TierPurge& tier : tiers) {
    if (!tier.status.ok()) return tier.status;
    if (!tier.report.errors.empty()) {
      return absl::InternalError(absl::StrCat("tier '", tier.name, "': ",
                                              tier.report.errors.size(),
                                              " paths could not be purged, the first: ",
                                              tier.report.errors.front()));
    }
  }
  return absl::OkStatus();
}

std::vector<pid_t> RamTierHolders(const std::string& tier, const std::string& runtime_dir) {
  // memfd_create's name shows in /proc/<pid>/maps as "/memfd:<name>
  // (deleted)" (shared_memory.h; the names are ram_driver.cc's); a kept
  // tier's files by their path (ram_keep.h).
  const std::string arena = absl::StrCat("/memfd:monarch-ram:", tier, " (deleted)");
  const std::string slots = absl::StrCat("/memfd:monarch-ram-slots:", tier, " (deleted)");
  const std::string kept = absl::StrCat(KeptRamPath("", runtime_dir), "/", tier, "/");
  std::vector<pid_t> holders;
  DIR* proc = os::OpenDir("/proc");
  if (proc == nullptr) return holders;
  while (struct dirent* entry = os::ReadDir(proc)) {
    int pid = 0;
    if (!absl::SimpleAtoi(entry->d_name, &pid) || pid <= 0 || pid == ::getpid()) continue;
    // Another user's maps are unreadable, and are not this job's anyway.
    absl::StatusOr<std::string> maps = ReadSmallFile(absl::StrCat("/proc/", pid, "/maps"));
    if (!maps.ok()) continue;
    for (absl::string_view line : absl::StrSplit(*maps, '\n')) {
      if (absl::EndsWith(line, arena) || absl::EndsWith(line, slots) ||
          absl::StrContains(line, kept)) {
        holders.push_back(pid);
        break;
      }
    }
  }
  os::CloseDir(proc);
  std::sort(holders.begin(), holders.end());
  return holders;
}

absl::StatusOr<ConfigPurge> PurgeConfigFile(const std::string& config_file,
                                            const PurgeOptions& options) {
  // A posix or pmem directory that is gone would fail the whole config
  // (ValidateConfig: "is not an existing directory"); for a purge it is that
  // tier's error only. Such tiers are set aside before validation, which
  // still checks everything else, the overlaps of the remaining tiers with
  // the dataset included: a tier inside the dataset is never purged.
  std::vector<TierConfig> tiers;
  std::vector<absl::Status> missing;  // Per tier of `tiers`.
  auto set_aside = [&](Config& config) {
    tiers = config.tiers;
    missing.assign(tiers.size(), absl::OkStatus());
    std::vector<TierConfig> kept;
    for (size_t i = 0; i < tiers.size(); ++i) {
      const TierConfig& tier = tiers[i];
      struct stat st;
      if (HasDirectory(tier) && !tier.path.empty() && tier.path[0] == '/') {
        if (os::Stat(tier.path.c_str(), &st) != 0) {
          missing[i] = ErrnoToStatus(errno, absl::StrCat(TierLabel(tier), ": directory '",
                                                         tier.path, "'"));
          continue;
        }
        if (!S_ISDIR(st.st_mode)) {
          missing[i] = absl::FailedPreconditionError(absl::StrCat(
              TierLabel(tier), ": '", tier.path, "' is not a directory"));
          continue;
        }
      }
      kept.push_back(tier);
    }
    config.tiers = std::move(kept);
  };
  MONARCH_ASSIGN_OR_RETURN(ValidConfig config, ParseValidConfigFile(config_file, set_aside));

  ConfigPurge purge;
  purge.dataset = config->dataset.path;
  MONARCH_ASSIGN_OR_RETURN(purge.paths, ServicePathsFor(*config));
  // The service's own lock, held to the end (see purge.h). The directory
  // is created if no service ever ran: the lock must exist for a service
  // starting now to find it taken.
  MONARCH_RETURN_IF_ERROR(PrepareRuntimeDirectory(purge.paths));
  absl::StatusOr<ScopedFd> lock = TakeServiceLock(purge.paths);
  if (!lock.ok()) {
    if (!absl::IsFailedPrecondition(lock.status())) return lock.status();
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to purge while the node service of ", config_file,
        " runs (", lock.status().message(), "): stop it first with `monarch stop --config ",
        config_file, "`; nothing was removed"));
  }

  const std::string ram_dir = KeptRamDir(*config, purge.paths.dir);
  for (size_t i = 0; i < tiers.size(); ++i) {
    const TierConfig& tier = tiers[i];
    TierPurge result;
    result.name = tier.name;
    result.kind = tier.kind;
    result.path = tier.path;
    result.status = missing[i];
    if (tier.kind == TierKind::kRam) {
      result.holders = RamTierHolders(tier.name, purge.paths.dir);
      result.kept_path = JoinPath(KeptRamPath(ram_dir, purge.paths.dir), tier.name);
      result.kept_bytes = BytesUnder(result.kept_path);
    } else if (HasDirectory(tier) && result.status.ok()) {
      absl::StatusOr<PurgeReport> report = PurgeCopyTree(tier.path, options);
      if (report.ok()) {
        result.report = *std::move(report);
      } else {
        result.status = absl::Status(report.status().code(),
                                     absl::StrCat(TierLabel(tier), ": ", report.status().message()));
      }
    }
    purge.tiers.push_back(std::move(result));
  }
  // What a stopped service kept (node.keep_ram), every RAM tier's at once.
  if (!options.dry_run) DiscardAllKeptRam(*config, purge.paths.dir);

  // A socket left by a service that died: no service holds the lock, and
  // we do, so it is nobody's.
  struct stat st;
  if (os::Lstat(purge.paths.socket.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
    purge.removed_socket = options.dry_run || os::Unlink(purge.paths.socket.c_str()) == 0;
  }
  return purge;
}

}  // namespace monarch::service
