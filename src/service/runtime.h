// Where a node's service lives, and starting one on demand.
//
// The runtime directory (node.runtime_dir) holds the service's socket, its
// lock and its log. It is created 0700 and must belong to the user: the
// socket's own 0600 mode and the uid check on every connection are then a
// second and third fence. With node.share_with_group the three fences are
// the group's: the directory 02770 of the group, the socket 0660, and the
// service's check that a connecting process is in the group.
//
// One service per directory: `monarch serve` holds an exclusive flock on
// monarch.lock for its whole life, taken before anything else, so of two
// services started at once one runs and the other exits. A client that
// finds no service starts one (node.autostart) and waits while the lock is
// held by a service still starting (its namespace walk may take a while).

#ifndef MONARCH_SERVICE_RUNTIME_H_
#define MONARCH_SERVICE_RUNTIME_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/file_util.h"
#include "monarch/config.h"

namespace monarch::service {

struct ServicePaths {
  // The per-user directory holding the default runtime directories (one
  // per dataset and cache shape), checked like `dir` itself; empty when
  // node.runtime_dir names `dir`.
  std::string base;
  std::string dir;
  std::string socket;  // dir/monarch.sock
  std::string lock;    // dir/monarch.lock
  std::string log;     // dir/monarch.log: an auto-started service's output.
  // node.share_with_group's: the group whose members share the service;
  // nullopt, this user alone.
  std::optional<gid_t> group;
};

// The paths of `config`'s service (NodeRuntimeDirectory); does not touch
// the file system.
absl::StatusOr<ServicePaths> ServicePathsFor(const Config& config);
// The paths in runtime directory `dir`.
ServicePaths ServicePathsIn(const std::string& dir);
// Creates the directory (0700) if needed and checks that it is a real
// directory owned by this user and closed to others; with `group`, 02770
// and the group's (MakeGroupDirectory), its base 03770.
absl::Status PrepareRuntimeDirectory(const ServicePaths& paths);
// The mode of the files a service makes in its directory (lock, log,
// socket): 0600, or 0660 with `group`.
mode_t RuntimeFileMode(const ServicePaths& paths);

// The service's lock, held for its life; FailedPrecondition (naming the
// holder's pid when known) if another service holds it.
absl::StatusOr<ScopedFd> TakeServiceLock(const ServicePaths& paths);
// True if some process holds the lock now (a service running or starting).
bool ServiceLockHeld(const ServicePaths& paths);

// `ld_preload` (an LD_PRELOAD value) without libmonarch_preload.so: the
// service never runs under the transparent mode, or its own reads of the
// dataset would come back to it as a client's.
std::string WithoutPreloadLibrary(absl::string_view ld_preload);

// The `monarch` binary: $MONARCH_BINARY, else the one built beside this
// library, else the installed one, else `monarch` on PATH.
std::string ServiceBinary();
// Runs `args` (args[0] the binary) detached: its own session, nobody's
// child, stdin /dev/null, stdout and stderr onto the descriptors given, no
// other descriptor, and LD_PRELOAD without libmonarch_preload.so.
absl::Status SpawnDetached(const std::vector<std::string>& args, int stdout_fd, int stderr_fd);
// Starts `monarch serve --config <config_file>` detached, its output
// appended to the log.
absl::Status StartServiceDetached(const ServicePaths& paths, const std::string& config_file);

// The job this process belongs to, as the service counts it: $MONARCH_JOB,
// else BatchJobTag() (slurm-<id>, ...), else "pgid-<process group>" (a
// shell runs each command line in a group of its own, and a DataLoader's
// workers stay in their parent's), made a SafeJobName.
std::string ThisJobName();
// `name` cut to 200 characters, each one but letters, digits, '.' and '-'
// made '_': what a job's name may be in a log, a table or JSON.
std::string SafeJobName(absl::string_view name);

// Other services running for `config`'s dataset with another cache shape
// (default runtime directories only): their directories, for the message
// that tells a job why it did not join them.
std::vector<std::string> OtherShapesRunning(const Config& config, const ServicePaths& paths);

// The last lines of the service log, for an error message.
std::string LogTail(const ServicePaths& paths, int lines = 5);

}  // namespace monarch::service

#endif  // MONARCH_SERVICE_RUNTIME_H_
