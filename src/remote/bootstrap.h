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

// Publishes `mine` for `rank` in `dir` (created 0700 if missing) and
// returns all `size` addresses indexed by rank, or DeadlineExceeded naming
// the ranks that never arrived within `timeout_seconds`. Rank 0 passes its
// JobSecretFingerprint as `fingerprint` (written into its file); the others
// pass "" and, if `rank0_fingerprint` is not null, get what rank 0's file,
// the one whose address was returned, carries.
absl::StatusOr<std::vector<std::string>> ExchangeThroughDirectory(
    const std::string& dir, int rank, int size, const std::string& mine, double timeout_seconds,
    absl::string_view fingerprint = "", std::string* rank0_fingerprint = nullptr);
// Creates the rendezvous directory 0700 (its parents as MakeDirectories
// does) if missing: it holds the job secret, every peer's address and the
// namespace manifest. Warns once if an existing one is open to others.
absl::Status MakeRendezvousDirectory(const std::string& dir);

// The address `rank` has published in `dir` now (a peer that restarted
// publishes a new one): one look, no waiting.
absl::StatusOr<std::string> ReadPublishedAddress(const std::string& dir, int rank, int size);
// Removes this rank's file (at shutdown: a later job must not find it).
void WithdrawFromDirectory(const std::string& dir, int rank);

// Job identity (DESIGN.md, "Job identity and trust model"): rank 0 makes a
// random secret that every peer request carries, and the others learn it
// from the rendezvous directory (or from MPI).
constexpr size_t kJobSecretBytes = 32;

// kJobSecretBytes from getrandom(2); Unavailable if the kernel has none.
absl::StatusOr<std::string> NewJobSecret();

// 16 hex digits derived from `secret`, safe to publish: 64 bits of a
// 256-bit random secret leave 2^192 secrets that match, so it tells who
// reads it nothing usable, yet two jobs' secrets differ in it.
std::string JobSecretFingerprint(absl::string_view secret);

// Rank 0: writes `secret` to `dir`/job.secret, mode 0600, through a
// temporary name and a rename, creating `dir` 0700 if missing (and warning
// once per process if group or others can use an existing one). Call before
// publishing the address, so that a peer that has rank 0's address file can
// find the secret that goes with it.
absl::Status PublishJobSecret(const std::string& dir, absl::string_view secret);

// Rank 0 at start-up: the secret an earlier rank 0 of this job left in
// `dir` when it was killed (a shutdown removes it), which the other ranks
// still hold: taking it again lets a restarted rank 0 rejoin them. NotFound
// unless `dir`/job.secret is a regular file of this user, not a symbolic
// link, with no permission for group or others, of kJobSecretBytes.
absl::StatusOr<std::string> ReadLeftJobSecret(const std::string& dir);

// Ranks other than 0, after the exchange: the secret in `dir` whose
// fingerprint is `fingerprint` (from rank 0's address file). A secret that
// does not match (left by an earlier job, or not yet visible through a
// file system's cache) is never returned: it is read again until
// `timeout_seconds` pass, then FailedPrecondition says so.
absl::StatusOr<std::string> ReadJobSecret(const std::string& dir, absl::string_view fingerprint,
                                          double timeout_seconds);

// Rank 0 at shutdown, like WithdrawFromDirectory.
void RemoveJobSecret(const std::string& dir);

// MPI: the rank and size of MPI_COMM_WORLD (initializing MPI if the
// application has not), and an allgather of the addresses. Unimplemented in
// builds without MONARCH_WITH_MPI.
absl::StatusOr<std::pair<int, int>> MpiRankAndSize();
absl::StatusOr<std::vector<std::string>> ExchangeThroughMpi(const std::string& mine);
// Every rank passes its buffer; rank 0's `*secret` reaches all of them
// (MPI_Bcast, a collective: all ranks call it at the same point).
absl::Status ShareJobSecretThroughMpi(std::string* secret);

}  // namespace monarch

#endif  // MONARCH_REMOTE_BOOTSTRAP_H_
