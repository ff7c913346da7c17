// 2 MiB pages for a node service's kept RAM tier on a node whose
// administrator mounted none: a private tmpfs, held by a keeper process.
//
// A process new to the RAM tier (the next job, each fresh DataLoader
// worker) pays a page fault per 64 KiB it first reads when the tier's
// files have 4 KiB pages, as on a default /dev/shm: about twice a hot
// epoch's time (bench/results/ram_pages/README.md). A tmpfs mounted
// huge=within_size gives them 2 MiB pages, but mounting one in the node's
// own mount namespace takes root.
//
// Any user may mount one in a mount namespace of their own, made in a user
// namespace of their own. The keeper (`monarch ram-keeper`, started
// detached by the service) does that, mounted over /dev/shm in its
// namespace, 0700 and as large as the node's /dev/shm, and then only
// waits. Its files are reached from outside the namespace through
// /proc/<keeper>/root/dev/shm, which only this user (and root) may follow.
// The kept arena lives there as it would on /dev/shm (drivers/ram_keep.h):
// a service killed or stopped leaves its copies to the next one, which finds
// the keeper through <runtime dir>/ram-keeper.
//
// The price: the tmpfs dies with the keeper. A batch system that tracks a
// job's processes by cgroup kills them all at the job's end, the service
// and a keeper too, while files on /dev/shm survive for the next job. So
// node.ram_dir `auto` (the default) takes /dev/shm when the service is in a
// cgroup of its batch job (Slurm's job_<id>), and when /dev/shm holds this
// runtime directory's kept copies (they are adopted rather than read
// again), and a keeper otherwise: a service that outlives its job (started
// outside its cgroups) keeps the keeper alive as long. Where user
// namespaces are refused, /dev/shm, logged.
//
// The keeper exits when the service's idle exit or `monarch purge` stops
// it, or within 2 s of its runtime directory no longer naming it.

#ifndef MONARCH_SERVICE_RAM_KEEPER_H_
#define MONARCH_SERVICE_RAM_KEEPER_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "monarch/config.h"

namespace monarch::service {

// The directory a node service of runtime directory `runtime_dir` keeps its
// RAM tiers in: node.ram_dir itself unless it is `auto`, else as above,
// starting a keeper if one is needed and none lives.
std::string ResolveRamDir(const Config& config, const std::string& runtime_dir);

// The directory of the keeper that `runtime_dir` names, if it lives.
std::optional<std::string> LiveRamKeeperDir(const std::string& runtime_dir);

// Stops the keeper `runtime_dir` names, if one lives; its tmpfs goes with
// it once no process holds a file of it.
void StopRamKeeper(const std::string& runtime_dir);

// Where the last service of `runtime_dir` kept its RAM tiers: node.ram_dir,
// or for `auto` its keeper's tmpfs while that lives, else /dev/shm. Starts
// nothing (`monarch purge`).
std::string KeptRamDir(const Config& config, const std::string& runtime_dir);
// Frees every RAM copy services of `runtime_dir` kept (an idle exit,
// `monarch purge`): in KeptRamDir's directory and, for `auto`, on /dev/shm
// too, and stops the keeper.
void DiscardAllKeptRam(const Config& config, const std::string& runtime_dir);

// The keeper itself (`monarch ram-keeper --runtime-dir DIR`): makes the
// namespaces and the tmpfs, names itself in DIR/ram-keeper, writes "ready"
// (or "error: ...") and a newline to `ready_fd`, then waits. Returns the
// process's exit code.
int RunRamKeeper(const std::string& runtime_dir, int ready_fd);

}  // namespace monarch::service

#endif  // MONARCH_SERVICE_RAM_KEEPER_H_
