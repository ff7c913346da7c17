#include "service/ram_keeper.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/os.h"
#include "common/status_macros.h"
#include "drivers/ram_keep.h"
#include "service/runtime.h"

namespace monarch::service {
namespace {

constexpr char kDefaultRamDir[] = "/dev/shm";
constexpr char kRecord[] = "ram-keeper";  // <runtime dir>/ram-keeper: the keeper's pid.
// In the keeper's mount namespace its tmpfs lies over /dev/shm, which every
// Linux system has; its root holds this marker, naming the runtime
// directory, so that a pid reused by another process is never taken for it.
constexpr char kMountPoint[] = "/dev/shm";
constexpr char kMarker[] = "monarch-ram-keeper";
constexpr auto kReadyTimeout = std::chrono::seconds(10);
constexpr auto kLookEvery = std::chrono::seconds(2);

std::string KeeperDir(pid_t pid) { return absl::StrCat("/proc/", pid, "/root", kMountPoint); }

pid_t RecordedPid(const std::string& runtime_dir) {
  absl::StatusOr<std::string> record = ReadSmallFile(JoinPath(runtime_dir, kRecord), 64);
  int pid = 0;
  if (!record.ok() || !absl::SimpleAtoi(absl::StripAsciiWhitespace(*record), &pid)) return 0;
  return pid > 0 ? pid : 0;
}

bool IsKeeperOf(pid_t pid, const std::string& runtime_dir) {
  absl::StatusOr<std::string> marker = ReadSmallFile(JoinPath(KeeperDir(pid), kMarker), 4096);
  return marker.ok() && *marker == runtime_dir;
}

// Starts a keeper for `runtime_dir` and waits for it to say it is ready:
// its directory, or why there is none.
absl::StatusOr<std::string> StartKeeper(const std::string& runtime_dir) {
  int ends[2];
  if (::pipe2(ends, O_CLOEXEC) != 0) return ErrnoToStatus(errno, "pipe");
  ScopedFd read_end(ends[0]);
  {
    // Its errors come through the pipe. Its stderr is not the service's:
    // under srun a task's output ends only when every holder closes it, so
    // a keeper holding it would keep `srun monarch serve` from ending.
    ScopedFd write_end(ends[1]);
    ScopedFd null(os::Open("/dev/null", O_WRONLY | O_CLOEXEC));
    if (!null.valid()) return ErrnoToStatus(errno, "open /dev/null");
    MONARCH_RETURN_IF_ERROR(
        SpawnDetached({ServiceBinary(), "ram-keeper", "--runtime-dir", runtime_dir},
                      write_end.get(), null.get()));
  }  // Ours closed: the pipe ends when the keeper closes its own.
  std::string said;
  const auto deadline = std::chrono::steady_clock::now() + kReadyTimeout;
  while (said.find('\n') == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    struct pollfd ready = {read_end.get(), POLLIN, 0};
    const int polled = left.count() > 0 ? ::poll(&ready, 1, static_cast<int>(left.count())) : 0;
    if (polled < 0 && errno == EINTR) continue;
    if (polled <= 0) {
      return absl::DeadlineExceededError("the RAM keeper did not say it was ready in 10 s");
    }
    char buffer[512];
    const ssize_t got = os::Read(read_end.get(), buffer, sizeof(buffer));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      return absl::UnavailableError(absl::StrCat(
          "the RAM keeper (", ServiceBinary(), " ram-keeper) exited without a word"));
    }
    said.append(buffer, static_cast<size_t>(got));
  }
  said.resize(said.find('\n'));
  if (said != "ready") return absl::UnavailableError(said);
  const pid_t pid = RecordedPid(runtime_dir);
  if (pid == 0 || !IsKeeperOf(pid, runtime_dir)) {
    return absl::InternalError("the RAM keeper said it was ready, but cannot be found");
  }
  return KeeperDir(pid);
}

// The cgroup of this process that names its batch job (Slurm's
// .../job_<id>/..., PBS's and LSF's paths carry the id too), or "". The
// batch system then kills every process of the job at its end, a keeper
// included, while files on /dev/shm outlive it. A service outside the job's
// cgroups (started by a prolog, or under a batch system that tracks
// processes otherwise: Slurm's proctrack/linuxproc loses a detached one)
// outlives the job with its keeper.
std::string BatchJobCgroup() {
  const BatchJob job = ThisBatchJob();
  // "123.head" (PBS) is 123 in its paths.
  const std::string id = job.id.substr(0, job.id.find('.'));
  absl::StatusOr<std::string> cgroups = ReadSmallFile("/proc/self/cgroup", 1 << 20);
  if (id.empty() || !cgroups.ok()) return "";
  auto word_char = [](char c) { return absl::ascii_isalnum(static_cast<unsigned char>(c)); };
  for (absl::string_view line : absl::StrSplit(*cgroups, '\n')) {
    for (size_t at = line.find(id); at != absl::string_view::npos; at = line.find(id, at + 1)) {
      const size_t end = at + id.size();
      if ((at == 0 || !word_char(line[at - 1])) && (end == line.size() || !word_char(line[end]))) {
        return std::string(line.substr(line.find(':', line.find(':') + 1) + 1));
      }
    }
  }
  return "";
}

// Writes `text` to /proc/self/<file> in one write, as a new user
// namespace's maps are set.
absl::Status WriteProcSelf(const char* file, const std::string& text) {
  const std::string path = absl::StrCat("/proc/self/", file);
  ScopedFd fd(os::Open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd.valid() ||
      os::Write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    return ErrnoToStatus(errno, absl::StrCat("write '", text, "' to ", path));
  }
  return absl::OkStatus();
}

// The keeper's namespaces and tmpfs; `size` its size in bytes.
absl::Status MakeKeeperTmpfs(const std::string& runtime_dir, uint64_t size) {
  const uid_t uid = ::getuid();
  const gid_t gid = ::getgid();
  // Namespaces and mounts are this process's own state, outside the seam.
  if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) {
    return ErrnoToStatus(errno, "unshare a user and a mount namespace");
  }
  // This user is itself in the new namespace: files keep their owner.
  MONARCH_RETURN_IF_ERROR(WriteProcSelf("setgroups", "deny"));
  MONARCH_RETURN_IF_ERROR(WriteProcSelf("uid_map", absl::StrCat(uid, " ", uid, " 1")));
  MONARCH_RETURN_IF_ERROR(WriteProcSelf("gid_map", absl::StrCat(gid, " ", gid, " 1")));
  // Nothing mounted here reaches the node's namespace.
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    return ErrnoToStatus(errno, "make the keeper's mounts private");
  }
  const std::string options =
      absl::StrCat("huge=within_size,mode=0700", size > 0 ? absl::StrCat(",size=", size) : "");
  if (::mount("monarch-ram", kMountPoint, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              options.c_str()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("mount a tmpfs (", options, ") on ", kMountPoint,
                                             " in the keeper's namespace"));
  }
  return WriteSmallFile(JoinPath(kMountPoint, kMarker), runtime_dir);
}

}  // namespace

std::optional<std::string> LiveRamKeeperDir(const std::string& runtime_dir) {
  const pid_t pid = RecordedPid(runtime_dir);
  if (pid == 0 || !IsKeeperOf(pid, runtime_dir)) return std::nullopt;
  return KeeperDir(pid);
}

void StopRamKeeper(const std::string& runtime_dir) {
  const pid_t pid = RecordedPid(runtime_dir);
  if (pid != 0 && IsKeeperOf(pid, runtime_dir)) ::kill(pid, SIGTERM);
  // A keeper no record names leaves by itself (RunRamKeeper).
  os::Unlink(JoinPath(runtime_dir, kRecord).c_str());
}

std::string KeptRamDir(const Config& config, const std::string& runtime_dir) {
  if (config.node.ram_dir != "auto") return config.node.ram_dir;
  return LiveRamKeeperDir(runtime_dir).value_or(kDefaultRamDir);
}

void DiscardAllKeptRam(const Config& config, const std::string& runtime_dir) {
  const std::string kept = KeptRamDir(config, runtime_dir);
  DiscardKeptRam(kept, runtime_dir);
  if (config.node.ram_dir != "auto") return;
  if (kept != kDefaultRamDir) DiscardKeptRam(kDefaultRamDir, runtime_dir);
  StopRamKeeper(runtime_dir);
}

std::string ResolveRamDir(const Config& config, const std::string& runtime_dir) {
  const NodeConfig& node = config.node;
  if (node.ram_dir != "auto") return node.ram_dir;
  bool has_ram_tier = false;
  for (const TierConfig& tier : config.tiers) has_ram_tier |= tier.kind == TierKind::kRam;
  if (!node.keep_ram || !has_ram_tier) {
    StopRamKeeper(runtime_dir);  // Its copies would never be adopted.
    return kDefaultRamDir;
  }
  if (std::optional<std::string> live = LiveRamKeeperDir(runtime_dir)) return *live;
  std::string why;
  if (TmpfsPageSize(kDefaultRamDir, false) >= (2 << 20)) {
    why = "it has 2 MiB pages";
  } else if (const std::string cgroup = BatchJobCgroup(); !cgroup.empty()) {
    why = absl::StrCat("this service is in its batch job's cgroup (", cgroup,
                       "), whose end may kill every process in it");
  } else if (HoldsKeptRam(kDefaultRamDir, runtime_dir)) {
    why = "it holds the copies an earlier service kept";
  }
  if (!why.empty()) {
    MONARCH_LOG(kInfo, "node.ram_dir auto: ", kDefaultRamDir, ", as ", why);
    return kDefaultRamDir;
  }
  absl::StatusOr<std::string> started = StartKeeper(runtime_dir);
  if (!started.ok()) {
    MONARCH_LOG(kWarning, "node.ram_dir auto: no private tmpfs of 2 MiB pages (",
                started.status().message(), "); the RAM tiers are kept on ", kDefaultRamDir,
                ", whose 4 KiB pages cost each new process a fault per 64 KiB it first reads");
    return kDefaultRamDir;
  }
  return *started;
}

int RunRamKeeper(const std::string& runtime_dir, int ready_fd) {
  auto say = [ready_fd](const std::string& line) {
    const std::string text = line + "\n";
    ssize_t ignored = os::Write(ready_fd, text.data(), text.size());
    (void)ignored;
    os::Close(ready_fd);
  };
  // As large as the node's /dev/shm, which a kept tier would fill otherwise.
  struct statvfs shm;
  const uint64_t size =
      os::Statvfs(kDefaultRamDir, &shm) == 0 ? uint64_t{shm.f_blocks} * shm.f_frsize : 0;
  if (absl::Status made = MakeKeeperTmpfs(runtime_dir, size); !made.ok()) {
    say(absl::StrCat("error: ", made.message()));
    return 1;
  }
  const std::string record = JoinPath(runtime_dir, kRecord);
  const std::string mine = absl::StrCat(::getpid(), "\n");
  const std::string written = absl::StrCat(record, ".", ::getpid());
  if (absl::Status wrote = WriteSmallFile(written, mine);
      !wrote.ok() || os::Rename(written.c_str(), record.c_str()) != 0) {
    say(absl::StrCat("error: cannot name the keeper in ", record, ": ",
                     wrote.ok() ? std::strerror(errno) : wrote.message()));
    return 1;
  }
  say("ready");
  // Signals end it (SIGTERM from StopRamKeeper); so does a runtime
  // directory that no longer names it (removed, purged, or a newer keeper).
  while (true) {
    std::this_thread::sleep_for(kLookEvery);
    absl::StatusOr<std::string> named = ReadSmallFile(record, 64);
    if (!named.ok() || *named != mine) return 0;
  }
}

}  // namespace monarch::service
