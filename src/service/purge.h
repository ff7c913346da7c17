// Purging a config's tiers at the end of a job (`monarch purge`).
//
// Removes every copy Monarch made for the config, from each of its tiers,
// and nothing else (drivers/copy_purge.h says how a copy is told from a
// user's file). The dataset is never read, let alone written.
//
// Never under a running service: the purge takes the node service's own
// lock (runtime.h, TakeServiceLock) for its whole length, before it touches
// anything. A service running or starting holds it, so the purge refuses
// (FailedPrecondition); a dead service's lock is free (the kernel drops a
// flock with its holder), so a stale runtime directory does not block it;
// and a service started during the purge finds the lock taken and exits,
// instead of adopting copies that are being removed under it.
//
// Tiers:
// - posix, pmem: their directories, purged by PurgeCopyTree.
// - ram: with node.keep_ram (the default), a stopped or killed service
//   left its copies in files on /dev/shm for the next one
//   (drivers/ram_keep.h): removed, and their bytes reported. Without it
//   they live in memfds ("monarch-ram:<tier>"), which the kernel frees when
//   the last process holding them exits. Either way, reported: the
//   processes of this user that still map the tier (a memfd names no job,
//   so they may be another job's tier of the same name); memory they map
//   goes back when they exit.
// - source: never touched.
// A posix or pmem directory that is missing or unreadable is that tier's
// error; the other tiers are still purged.
//
// Runtime directory: a dead service's socket is removed (the lock says no
// service owns it). Its log and lock file stay: the log is the job's
// record, and a lock file removed while a service may open it would let two
// services lock two different files.
//
// Not thread-safe with itself; one call per process at a time.

#ifndef MONARCH_SERVICE_PURGE_H_
#define MONARCH_SERVICE_PURGE_H_

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "drivers/copy_purge.h"
#include "monarch/config.h"
#include "service/runtime.h"

namespace monarch::service {

struct TierPurge {
  std::string name;
  TierKind kind = TierKind::kRam;
  std::string path;  // posix/pmem.
  // This tier's failure (its directory missing or unreadable), naming it.
  absl::Status status;
  PurgeReport report;          // posix/pmem.
  std::vector<pid_t> holders;  // ram: processes still mapping its memory.
  std::string kept_path;       // ram: where a stopped service kept its copies,
  uint64_t kept_bytes = 0;     // and the memory they took there (0: none kept).
};

struct ConfigPurge {
  ServicePaths paths;
  std::string dataset;
  std::vector<TierPurge> tiers;  // Every tier of the config, in its order.
  bool removed_socket = false;   // A dead service's socket was removed.

  // OK, or the first tier's failure (the others are in `tiers`): its
  // directory's error, or Internal naming the first path below it that
  // could not be read or removed.
  absl::Status Overall() const;
};

// Purges the tiers of the config in `config_file` (see above). With
// options.dry_run, reports what would go and removes nothing (it still takes
// the lock: a dry run under a running service would list copies the service
// is about to change). Errors before any tier is touched: the config's own
// (a tier directory that does not exist is not one of them, but that tier's
// failure), and FailedPrecondition while a service runs.
absl::StatusOr<ConfigPurge> PurgeConfigFile(const std::string& config_file,
                                            const PurgeOptions& options);

// Processes of this user, other than this one, that map a RAM tier named
// `tier` (its memfds, or its files kept for `runtime_dir` on any tmpfs: a
// keeper's shows in another process's maps by its path in the keeper's
// namespace), in pid order.
std::vector<pid_t> RamTierHolders(const std::string& tier, const std::string& runtime_dir);

}  // namespace monarch::service

#endif  // MONARCH_SERVICE_PURGE_H_
