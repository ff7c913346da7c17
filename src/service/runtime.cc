// Runtime directory, service lock and auto-start.

#include "service/runtime.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/os.h"
#include "common/status_macros.h"

namespace monarch::service {

absl::StatusOr<ServicePaths> ServicePathsFor(const Config& config) {
  MONARCH_ASSIGN_OR_RETURN(std::string dir, NodeRuntimeDirectory(config));
  ServicePaths paths = ServicePathsIn(dir);
  // The default's parent is this user's too (or the group's, with
  // node.share_with_group), and must stay so: whoever can write it could
  // swap the service's directory for their own.
  if (config.node.runtime_dir.empty()) paths.base = dir.substr(0, dir.rfind('/'));
  MONARCH_ASSIGN_OR_RETURN(paths.group, NodeShareGroup(config.node));
  return paths;
}

ServicePaths ServicePathsIn(const std::string& dir) {
  return ServicePaths{"", dir, JoinPath(dir, "monarch.sock"), JoinPath(dir, "monarch.lock"),
                      JoinPath(dir, "monarch.log"), std::nullopt};
}

absl::Status PrepareRuntimeDirectory(const ServicePaths& paths) {
  if (paths.group) {
    // The base sticky: members cannot remove each other's directories.
    if (!paths.base.empty()) {
      MONARCH_RETURN_IF_ERROR(
          MakeGroupDirectory(paths.base, *paths.group, 03770, "node.share_with_group"));
    }
    return MakeGroupDirectory(paths.dir, *paths.group, 02770, "node.share_with_group");
  }
  if (!paths.base.empty()) {
    MONARCH_RETURN_IF_ERROR(MakePrivateDirectory(paths.base, "node.runtime_dir"));
  }
  return MakePrivateDirectory(paths.dir, "node.runtime_dir");
}

mode_t RuntimeFileMode(const ServicePaths& paths) { return paths.group ? 0660 : 0600; }

namespace {

// Opens (creating) a file of the runtime directory, with its mode
// RuntimeFileMode's whatever the umask: a member of the group may be the
// next to write it.
ScopedFd OpenRuntimeFile(const ServicePaths& paths, const std::string& path, int flags) {
  ScopedFd fd(os::Open(path.c_str(), flags | O_CREAT | O_CLOEXEC | O_NOFOLLOW,
                       RuntimeFileMode(paths)));
  if (fd.valid() && paths.group) {
    struct stat st;
    if (os::Fstat(fd.get(), &st) == 0 && st.st_uid == ::geteuid() &&
        (st.st_mode & 0777) != RuntimeFileMode(paths)) {
      os::Chmod(path.c_str(), RuntimeFileMode(paths));  // Our own file; the directory gave the group.
    }
  }
  return fd;
}

}  // namespace

absl::StatusOr<ScopedFd> TakeServiceLock(const ServicePaths& paths) {
  ScopedFd fd = OpenRuntimeFile(paths, paths.lock, O_RDWR);
  if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("open ", paths.lock));
  if (os::Flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) return ErrnoToStatus(errno, absl::StrCat("flock ", paths.lock));
    char pid[32] = {};
    ssize_t n = os::Pread(fd.get(), pid, sizeof(pid) - 1, 0);
    std::string holder = n > 0 ? absl::StrCat(" (pid ", std::string(pid, strcspn(pid, "\n")), ")")
                               : "";
    return absl::FailedPreconditionError(absl::StrCat(
        "a Monarch service is already running for ", paths.dir, holder));
  }
  // The holder's pid, for the message above and for `monarch status`.
  const std::string pid = absl::StrCat(::getpid(), "\n");
  if (os::Ftruncate(fd.get(), 0) != 0 ||
      os::Pwrite(fd.get(), pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    return ErrnoToStatus(errno, absl::StrCat("write ", paths.lock));
  }
  return fd;
}

bool ServiceLockHeld(const ServicePaths& paths) {
  ScopedFd fd(os::Open(paths.lock.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return false;
  if (os::Flock(fd.get(), LOCK_SH | LOCK_NB) == 0) {
    os::Flock(fd.get(), LOCK_UN);
    return false;
  }
  return errno == EWOULDBLOCK;
}

std::string ServiceBinary() {
  if (const char* env = std::getenv("MONARCH_BINARY"); env != nullptr && env[0] != '\0') {
    return env;
  }
  for (const char* candidate : {MONARCH_BUILD_BINARY, MONARCH_INSTALLED_BINARY}) {
    if (os::Access(candidate, X_OK) == 0) return candidate;
  }
  return "monarch";  // execvp searches PATH.
}

std::string WithoutPreloadLibrary(absl::string_view ld_preload) {
  std::vector<absl::string_view> kept;
  for (absl::string_view entry : absl::StrSplit(ld_preload, absl::ByAnyChar(": "), absl::SkipEmpty())) {
    if (!absl::StrContains(entry, "libmonarch_preload")) kept.push_back(entry);
  }
  return absl::StrJoin(kept, ":");
}

absl::Status SpawnDetached(const std::vector<std::string>& args, int stdout_fd,
                           int stderr_fd) {
  // Everything the child needs is built before fork(): between fork and
  // exec a child of a threaded process may only make async-signal-safe calls.
  std::vector<std::string> arguments = args;
  std::vector<char*> argv;
  for (std::string& arg : arguments) argv.push_back(arg.data());
  argv.push_back(nullptr);
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    absl::string_view variable = *entry;
    if (absl::ConsumePrefix(&variable, "LD_PRELOAD=")) {
      const std::string kept = WithoutPreloadLibrary(variable);
      if (!kept.empty()) environment.push_back(absl::StrCat("LD_PRELOAD=", kept));
    } else {
      environment.emplace_back(*entry);
    }
  }
  std::vector<char*> envp;
  for (std::string& variable : environment) envp.push_back(variable.data());
  envp.push_back(nullptr);
  const pid_t child = ::fork();
  if (child < 0) return ErrnoToStatus(errno, absl::StrCat("fork to start ", args[0]));
  if (child == 0) {
    // A new session, then a grandchild: it is nobody's child in the job
    // (no zombie, no SIGHUP from the client's terminal).
    ::setsid();
    if (::fork() != 0) ::_exit(0);
    // No signal blocked: the forking thread's mask (a service's threads
    // block SIGTERM) would outlive exec.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    // dup2 and close_range only arrange descriptors: outside the seam.
    const int null = os::Open("/dev/null", O_RDONLY);
    if (null >= 0) ::dup2(null, 0);
    ::dup2(stdout_fd, 1);
    ::dup2(stderr_fd, 2);
    ::close_range(3, ~0U, 0);
    ::execvpe(argv[0], argv.data(), envp.data());
    const char message[] = "monarch: cannot execute the monarch binary\n";
    ssize_t ignored = os::Write(2, message, sizeof(message) - 1);
    (void)ignored;
    ::_exit(127);
  }
  // The child only forks the grandchild and exits.
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  return absl::OkStatus();
}

absl::Status StartServiceDetached(const ServicePaths& paths, const std::string& config_file) {
  ScopedFd log = OpenRuntimeFile(paths, paths.log, O_WRONLY | O_APPEND);
  if (!log.valid()) return ErrnoToStatus(errno, absl::StrCat("open ", paths.log));
  return SpawnDetached({ServiceBinary(), "serve", "--config", config_file, "--autostarted"},
                       log.get(), log.get());
}

std::string SafeJobName(absl::string_view name) {
  std::string job(name.substr(0, 200));
  for (char& c : job) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-') c = '_';
  }
  return job;
}

std::string ThisJobName() {
  const char* named = std::getenv("MONARCH_JOB");
  std::string job = named != nullptr && named[0] != '\0' ? named : BatchJobTag();
  if (job.empty()) job = absl::StrCat("pgid-", ::getpgrp());
  return SafeJobName(job);
}

std::vector<std::string> OtherShapesRunning(const Config& config, const ServicePaths& paths) {
  std::vector<std::string> others;
  if (paths.base.empty()) return others;  // node.runtime_dir names the directory.
  const std::string prefix = absl::StrCat(DatasetKey(config.dataset), "-");
  DIR* dir = os::OpenDir(paths.base.c_str());
  if (dir == nullptr) return others;
  while (const struct dirent* entry = os::ReadDir(dir)) {
    const std::string path = JoinPath(paths.base, entry->d_name);
    if (absl::StartsWith(entry->d_name, prefix) && path != paths.dir &&
        ServiceLockHeld(ServicePathsIn(path))) {
      others.push_back(path);
    }
  }
  os::CloseDir(dir);
  std::sort(others.begin(), others.end());
  return others;
}

std::string LogTail(const ServicePaths& paths, int lines) {
  std::deque<std::string> tail;
  absl::StatusOr<std::string> log = ReadSmallFile(paths.log);
  if (!log.ok()) return "";
  for (absl::string_view line : absl::StrSplit(*log, '\n', absl::SkipEmpty())) {
    tail.emplace_back(line);
    if (static_cast<int>(tail.size()) > lines) tail.pop_front();
  }
  return absl::StrJoin(tail, " | ");
}

}  // namespace monarch::service
