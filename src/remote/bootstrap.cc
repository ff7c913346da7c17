#include "remote/bootstrap.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <tuple>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/os.h"
#include "common/status_macros.h"
#include "remote/rendezvous_hash.h"

#ifdef MONARCH_WITH_MPI
#include <mpi.h>
#endif

namespace monarch {
namespace {

// v2: rank 0's file carries the fingerprint of the job secret (line 4).
constexpr absl::string_view kMagic = "monarch-rendezvous-v2";
constexpr absl::string_view kFingerprintTag = "secret-fingerprint ";

std::string RankFile(const std::string& dir, int rank) {
  return absl::StrCat(dir, "/rank-", rank, ".addr");
}

std::string SecretFile(const std::string& dir) { return absl::StrCat(dir, "/job.secret"); }

// Parses one published file into `address` (and the job secret's
// `fingerprint`, "" if it carries none); false if it is not there (yet), or,
// with `problem` set, if it belongs to another job or is not ours.
bool ParseRankFile(const std::string& path, int expected_size, std::string* address,
                   std::string* problem, std::string* fingerprint = nullptr) {
  absl::StatusOr<std::string> text = ReadSmallFile(path);
  if (!text.ok()) return false;
  std::vector<std::string> lines = absl::StrSplit(*text, '\n');
  int size = 0;
  if (lines.size() < 5 || lines[0] != kMagic || !absl::SimpleAtoi(lines[1], &size)) {
    *problem = absl::StrCat(path, " is not a Monarch rendezvous file of this version (",
                            kMagic, ")");
    return false;
  }
  if (size != expected_size) {
    *problem = absl::StrCat(path, " was written by a peer (", lines[2], ") that expects ", size,
                            " peers, not ", expected_size);
    return false;
  }
  if (fingerprint != nullptr) {
    fingerprint->clear();
    if (absl::StartsWith(lines[3], kFingerprintTag))
      *fingerprint = lines[3].substr(kFingerprintTag.size());
  }
  return absl::Base64Unescape(lines[4], address);
}

}  // namespace

// An existing directory that others can use is only warned about: a shared
// scratch directory may be what the site gives, and the secret file itself
// is 0600. Once per process: every rank started here would say the same.
absl::Status MakeRendezvousDirectory(const std::string& dir) {
  struct stat st;
  if (os::Stat(dir.c_str(), &st) != 0) {
    const size_t slash = dir.find_last_of('/');
    if (slash != std::string::npos && slash > 0) {
      MONARCH_RETURN_IF_ERROR(MakeDirectories(dir.substr(0, slash)));
    }
    if ((os::Mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) || os::Stat(dir.c_str(), &st) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("mkdir ", dir));
    }
  }
  if (!S_ISDIR(st.st_mode)) return ErrnoToStatus(ENOTDIR, dir);
  static std::atomic<bool> warned{false};
  if (((st.st_mode & 077) != 0 || st.st_uid != ::geteuid()) && !warned.exchange(true)) {
    MONARCH_LOG(kWarning, "remote.rendezvous_dir '", dir, "' (mode ",
                absl::StrFormat("%04o", st.st_mode & 0777), ", uid ", st.st_uid,
                ") is open to other users: they can see the peers' addresses, and with write "
                "access replace them; a directory of the job's user with mode 0700 is safer");
  }
  return absl::OkStatus();
}

std::vector<const char*> AutoRankVariables() {
  return {"MONARCH_RANK",         "SLURM_PROCID", "FLUX_TASK_RANK",
          "OMPI_COMM_WORLD_RANK", "PMIX_RANK",    "PMI_RANK"};
}
std::vector<const char*> AutoSizeVariables() {
  return {"MONARCH_SIZE", "SLURM_NTASKS", "FLUX_JOB_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"};
}

absl::StatusOr<int> ResolveRankSpec(const std::string& spec, absl::string_view key,
                                    const std::vector<const char*>& auto_vars) {
  int value;
  if (absl::SimpleAtoi(spec, &value)) return value;
  std::vector<const char*> names = auto_vars;
  if (spec.rfind("env:", 0) == 0) names = {spec.c_str() + 4};
  for (const char* name : names) {
    const char* text = std::getenv(name);
    if (text == nullptr) continue;
    if (!absl::SimpleAtoi(text, &value) || value < 0) {
      return absl::InvalidArgumentError(absl::StrCat(key, ": environment variable ", name, "='",
                                                     text, "' is not a non-negative integer"));
    }
    return value;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(key, ": '", spec, "' found none of the environment variables ",
                   absl::StrJoin(names, ", "), "; set one or give an integer"));
}

absl::StatusOr<JobRank> ResolveJobRank(const RemoteConfig& config) {
  JobRank job;
  if (config.bootstrap == BootstrapKind::kMpi) {
    absl::StatusOr<std::pair<int, int>> mpi = MpiRankAndSize();
    if (!mpi.ok()) return mpi.status();
    std::tie(job.rank, job.size) = *mpi;
  } else {
    absl::StatusOr<int> rank = ResolveRankSpec(config.rank, "remote.rank", AutoRankVariables());
    if (!rank.ok()) return rank.status();
    absl::StatusOr<int> size = ResolveRankSpec(config.size, "remote.size", AutoSizeVariables());
    if (!size.ok()) return size.status();
    job.rank = *rank;
    job.size = *size;
  }
  if (job.size < 1 || job.size > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote.size: expected 1 to 65535 peers, got ", job.size));
  }
  if (job.rank < 0 || job.rank >= job.size) {
    return absl::InvalidArgumentError(absl::StrCat("remote.rank: expected 0 to ", job.size - 1,
                                                   " (remote.size is ", job.size, "), got ",
                                                   job.rank));
  }
  return job;
}

absl::StatusOr<std::vector<std::string>> ExchangeThroughDirectory(
    const std::string& dir, int rank, int size, const std::string& mine, double timeout_seconds,
    absl::string_view fingerprint, std::string* rank0_fingerprint) {
  if (absl::Status made = MakeRendezvousDirectory(dir); !made.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("remote.rendezvous_dir: cannot create '", dir, "': ", made.message()));
  }
  char host[256] = "?";
  ::gethostname(host, sizeof(host) - 1);
  const std::string final_path = RankFile(dir, rank);
  const std::string temp_path = absl::StrCat(final_path, ".tmp.", ::getpid());
  const std::string contents = absl::StrCat(
      kMagic, "\n", size, "\n", host, " pid ", ::getpid(), " rank ", rank, "\n",
      fingerprint.empty() ? "" : absl::StrCat(kFingerprintTag, fingerprint), "\n",
      absl::Base64Escape(mine), "\n");
  if (absl::Status written = WriteSmallFile(temp_path, contents); !written.ok()) {
    os::Unlink(temp_path.c_str());  // A partial file, if any: never a peer's to read.
    return absl::FailedPreconditionError(absl::StrCat("remote.rendezvous_dir: cannot write '",
                                                      temp_path, "': ", written.message()));
  }
  if (os::Rename(temp_path.c_str(), final_path.c_str()) != 0) {
    const int error = errno;
    os::Unlink(temp_path.c_str());
    return absl::FailedPreconditionError(absl::StrCat("remote.rendezvous_dir: cannot publish '",
                                                      final_path, "': ", std::strerror(error)));
  }

  std::vector<std::string> addresses(size);
  std::vector<bool> have(size, false);
  addresses[rank] = mine;
  have[rank] = true;
  int missing = size - 1;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  auto pause = std::chrono::milliseconds(2);
  for (;;) {
    for (int r = 0; r < size; ++r) {
      if (have[r]) continue;
      std::string problem;
      // Rank 0's fingerprint from the very read that gave its address.
      if (ParseRankFile(RankFile(dir, r), size, &addresses[r], &problem,
                        r == 0 ? rank0_fingerprint : nullptr)) {
        have[r] = true;
        --missing;
      } else if (!problem.empty()) {
        return absl::FailedPreconditionError(absl::StrCat("remote.rendezvous_dir: ", problem));
      }
    }
    if (missing == 0) return addresses;
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(pause);  // Gentle on a PFS's metadata server.
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
  std::vector<int> absent;
  for (int r = 0; r < size; ++r)
    if (!have[r]) absent.push_back(r);
  return absl::DeadlineExceededError(
      absl::StrCat("remote: waited ", timeout_seconds, " s (remote.rendezvous_timeout) in '", dir,
                   "' for ", size, " peers; rank", absent.size() > 1 ? "s " : " ",
                   absl::StrJoin(absent, ", "), " never arrived"));
}

absl::StatusOr<std::string> ReadPublishedAddress(const std::string& dir, int rank, int size) {
  std::string address, problem;
  const std::string path = RankFile(dir, rank);
  if (!ParseRankFile(path, size, &address, &problem)) {
    return absl::UnavailableError(problem.empty() ? absl::StrCat(path, " is not there") : problem);
  }
  return address;
}

void WithdrawFromDirectory(const std::string& dir, int rank) {
  os::Unlink(RankFile(dir, rank).c_str());
}

absl::StatusOr<std::string> NewJobSecret() {
  std::string secret(kJobSecretBytes, '\0');
  size_t done = 0;
  while (done < secret.size()) {
    const ssize_t n = ::getrandom(secret.data() + done, secret.size() - done, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::UnavailableError(
          absl::StrCat("remote: getrandom for the job secret: ", std::strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
  return secret;
}

std::string JobSecretFingerprint(absl::string_view secret) {
  // Domain-separated, so that the fingerprint is no file name's home hash.
  return absl::StrFormat("%016x", StableNameHash(absl::StrCat("monarch job secret\n", secret)));
}

absl::Status PublishJobSecret(const std::string& dir, absl::string_view secret) {
  if (secret.size() != kJobSecretBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote: a job secret of ", secret.size(), " bytes, not ", kJobSecretBytes));
  }
  if (absl::Status made = MakeRendezvousDirectory(dir); !made.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("remote.rendezvous_dir: cannot create '", dir, "': ", made.message()));
  }
  const std::string final_path = SecretFile(dir);
  const std::string temp_path = absl::StrCat(final_path, ".tmp.", ::getpid());
  os::Unlink(temp_path.c_str());  // Left by a crashed process that had our pid.
  // 0600 from creation (O_EXCL: never an existing file, whoever made it),
  // not chmod'ed afterwards: no moment where others could open it.
  int fd;
  do {
    fd = os::Open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  } while (fd < 0 && errno == EINTR);
  absl::Status written = fd < 0 ? ErrnoToStatus(errno, absl::StrCat("create ", temp_path))
                                : PwriteFull(fd, secret.data(), secret.size(), 0, temp_path);
  if (fd >= 0 && os::Close(fd) != 0 && written.ok()) {
    written = ErrnoToStatus(errno, absl::StrCat("close ", temp_path));
  }
  if (written.ok() && os::Rename(temp_path.c_str(), final_path.c_str()) != 0) {
    written = ErrnoToStatus(errno, absl::StrCat("rename to ", final_path));
  }
  if (!written.ok()) {
    os::Unlink(temp_path.c_str());
    return absl::FailedPreconditionError(
        absl::StrCat("remote.rendezvous_dir: cannot write the job secret: ", written.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadJobSecret(const std::string& dir, absl::string_view fingerprint,
                                          double timeout_seconds) {
  const std::string path = SecretFile(dir);
  if (fingerprint.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("remote.rendezvous_dir: rank 0's file in '", dir,
                     "' carries no job-secret fingerprint"));
  }
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  auto pause = std::chrono::milliseconds(2);
  for (;;) {
    absl::StatusOr<std::string> secret = ReadSmallFile(path, 4096);
    std::string problem;
    if (!secret.ok()) {
      problem = std::string(secret.status().message());
    } else if (secret->size() != kJobSecretBytes) {
      problem = absl::StrCat(path, " holds ", secret->size(), " bytes, not ", kJobSecretBytes);
    } else if (JobSecretFingerprint(*secret) != fingerprint) {
      problem = absl::StrCat(path, " is not the secret of rank 0's address file (fingerprint ",
                             JobSecretFingerprint(*secret), ", not ", fingerprint,
                             "): left by an earlier job in this directory?");
    } else {
      return secret;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::FailedPreconditionError(
          absl::StrCat("remote.rendezvous_dir: no job secret for this job after ", timeout_seconds,
                       " s (remote.rendezvous_timeout): ", problem));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
}

absl::StatusOr<std::string> ReadLeftJobSecret(const std::string& dir) {
  const std::string path = SecretFile(dir);
  int fd;
  do {
    fd = os::Open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  const ScopedFd file(fd);
  struct stat st;
  if (os::Fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid() ||
      (st.st_mode & 077) != 0 || st.st_size != static_cast<off_t>(kJobSecretBytes)) {
    return absl::NotFoundError(absl::StrCat(path, " is no job secret this user left"));
  }
  std::string secret(kJobSecretBytes, '\0');
  MONARCH_ASSIGN_OR_RETURN(size_t got, PreadFull(fd, secret.data(), secret.size(), 0, path));
  if (got != secret.size()) return absl::NotFoundError(absl::StrCat(path, " came back short"));
  return secret;
}

void RemoveJobSecret(const std::string& dir) { os::Unlink(SecretFile(dir).c_str()); }

#ifdef MONARCH_WITH_MPI
namespace {
absl::Status EnsureMpi() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return absl::OkStatus();
  int provided;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
    return absl::UnavailableError("remote.bootstrap: MPI_Init_thread failed");
  // We initialized MPI, so we finalize it (launchers treat a missing
  // MPI_Finalize as a crash); an application that initializes MPI itself
  // finalizes it itself.
  std::atexit([] {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  });
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<std::pair<int, int>> MpiRankAndSize() {
  if (absl::Status s = EnsureMpi(); !s.ok()) return s;
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return std::make_pair(rank, size);
}

absl::StatusOr<std::vector<std::string>> ExchangeThroughMpi(const std::string& mine) {
  if (absl::Status s = EnsureMpi(); !s.ok()) return s;
  int size;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int length = static_cast<int>(mine.size());
  std::vector<int> lengths(size), offsets(size);
  MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, MPI_COMM_WORLD);
  int total = 0;
  for (int r = 0; r < size; ++r) {
    offsets[r] = total;
    total += lengths[r];
  }
  std::string all(total, '\0');
  MPI_Allgatherv(mine.data(), length, MPI_BYTE, all.data(), lengths.data(), offsets.data(),
                 MPI_BYTE, MPI_COMM_WORLD);
  std::vector<std::string> addresses(size);
  for (int r = 0; r < size; ++r) addresses[r] = all.substr(offsets[r], lengths[r]);
  return addresses;
}

absl::Status ShareJobSecretThroughMpi(std::string* secret) {
  if (absl::Status s = EnsureMpi(); !s.ok()) return s;
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // A leading "have one" byte: a rank 0 without a secret still takes part
  // in the broadcast, so no rank waits in it for ever, and all fail.
  std::string buffer(1 + kJobSecretBytes, '\0');
  if (rank == 0 && secret->size() == kJobSecretBytes) {
    buffer[0] = 1;
    buffer.replace(1, kJobSecretBytes, *secret);
  }
  MPI_Bcast(buffer.data(), static_cast<int>(buffer.size()), MPI_BYTE, 0, MPI_COMM_WORLD);
  if (buffer[0] != 1) return absl::UnavailableError("remote: rank 0 has no job secret to share");
  *secret = buffer.substr(1);
  return absl::OkStatus();
}
#else
absl::StatusOr<std::pair<int, int>> MpiRankAndSize() {
  return absl::UnimplementedError(
      "remote.bootstrap: 'mpi' needs a build with -DMONARCH_WITH_MPI=ON (libopenmpi-dev)");
}
absl::StatusOr<std::vector<std::string>> ExchangeThroughMpi(const std::string&) {
  return MpiRankAndSize().status();
}
absl::Status ShareJobSecretThroughMpi(std::string*) { return MpiRankAndSize().status(); }
#endif

}  // namespace monarch
