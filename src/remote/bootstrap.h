// Bootstrap: how peers learn their rank, the job size and each other's UCX
// worker addresses, using only what HPC jobs already have.
//
// The default meets through a directory on the shared file system: each
// process publishes its address as `rank-<r>.addr` (written to a temporary
// name, then renamed, so a reader never sees half a file) and waits until
// all `size` files are there. That works under Slurm, Flux, mpirun or by
// hand. Builds with MONARCH_WITH_MPI can exchange through an MPI allgather
// instead.

#ifndef MONARCH_REMOTE_BOOTSTRAP_H_
#define MONARCH_REMOTE_BOOTSTRAP_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "monarch/config.h"

namespace monarch {

// Resolves a rank/size spec ("auto", "env:NAME" or an integer) from config
// key `key`. "auto" tries the launchers' variables in turn (`auto_vars`).
absl::StatusOr<int> ResolveRankSpec(const std::string& spec, absl::string_view key,
                                    const std::vector<const char*>& auto_vars);
std::vector<const char*> AutoRankVariables();
std::vector<const char*> AutoSizeVariables();

// This process's place in the job: from the config's rank and size specs,
// or from MPI with bootstrap "mpi". Errors name the key.
struct JobRank {
  int rank = 0;
  int size = 1;
};
absl::StatusOr<JobRank> ResolveJobRank(const RemoteConfig& config);

// Expands $NAME and ${NAME} from the environment; an unset variable is an
// error naming `key`.
absl::StatusOr<std::string> ExpandEnvironment(const std::string& text, absl::string_view key);

// Publishes `mine` for `rank` in `dir` (created if missing) and returns all
// `size` addresses indexed by rank, or DeadlineExceeded naming the ranks
// that never arrived within `timeout_seconds`.
absl::StatusOr<std::vector<std::string>> ExchangeThroughDirectory(const std::string& dir, int rank,
                                                                  int size, const std::string& mine,
                                                                  double timeout_seconds);
// Removes this rank's file (at shutdown: a later job must not find it).
void WithdrawFromDirectory(const std::string& dir, int rank);

// MPI: the rank and size of MPI_COMM_WORLD (initializing MPI if the
// application has not), and an allgather of the addresses. Unimplemented in
// builds without MONARCH_WITH_MPI.
absl::StatusOr<std::pair<int, int>> MpiRankAndSize();
absl::StatusOr<std::vector<std::string>> ExchangeThroughMpi(const std::string& mine);

}  // namespace monarch

#endif  // MONARCH_REMOTE_BOOTSTRAP_H_
