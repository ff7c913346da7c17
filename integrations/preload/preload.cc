// The transparent mode's state: configuration, the connection to the node
// service, the table of dataset descriptors, and the operations the hooks
// (hooks.cc) answer with. See preload.h.

#include "preload.h"

#include "descriptor_table.h"

#include <dirent.h>
#include <dlfcn.h>
#include <linux/kcmp.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>
#include <utility>
#include <vector>


#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/os.h"
#include "common/status_macros.h"
#include "config/valid_config.h"
#include "frontend/dataset_paths.h"
#include "metadata/namespace.h"
#include "monarch/config.h"
#include "service/client.h"

namespace monarch::preload {
namespace {

// Constant-initialized: hooks run before any constructor of ours (other
// libraries' constructors open files too), and no destructor runs at exit.
DescriptorTable g_table;

// ---------------------------------------------------------------------------
// Streams made by OpenStream, for fileno().
class StreamTable {
 public:
  void Add(FILE* stream, int fd) {
    SpinLockHolder hold(lock_);
    if (map_ == nullptr) map_ = new absl::flat_hash_map<FILE*, int>;  // Never freed.
    (*map_)[stream] = fd;
    count_.store(static_cast<int>(map_->size()), std::memory_order_release);
  }
  void Remove(FILE* stream) {
    SpinLockHolder hold(lock_);
    if (map_ == nullptr) return;
    map_->erase(stream);
    count_.store(static_cast<int>(map_->size()), std::memory_order_release);
  }
  int Find(FILE* stream) {
    if (count_.load(std::memory_order_acquire) == 0) return -2;
    SpinLockHolder hold(lock_);
    auto it = map_->find(stream);
    return it == map_->end() ? -2 : it->second;
  }
  SpinLock& lock() { return lock_; }

 private:
  SpinLock lock_;
  absl::flat_hash_map<FILE*, int>* map_ = nullptr;
  std::atomic<int> count_{0};
};

StreamTable g_streams;

// ---------------------------------------------------------------------------
// Configuration, read once by the constructor.
struct Settings {
  explicit Settings(ValidConfig valid) : config(std::move(valid)) {}
  const ValidConfig config;
  std::string config_file;
  std::string root;  // Absolute, clean, no trailing slash.
  std::unique_ptr<frontend::DatasetPaths> paths;  // Over `root`.
  bool strict = false;
};

std::atomic<Settings*> g_settings{nullptr};
// This process's pid, kept by the constructor and the fork handler: a
// vfork() child (Python's subprocess uses one) runs on its parent's memory
// with its own pid, and must leave the parent's table alone between vfork
// and exec, whatever dup2/close it makes.
std::atomic<long> g_pid{0};

std::atomic<bool> g_broken{false};  // A config or service error: plain I/O from then on.
std::atomic<Monarch*> g_monarch{nullptr};
SpinLock g_connect_lock;

__thread int t_inside __attribute__((tls_model("initial-exec"))) = 0;

void WriteStderr(const std::string& line) {
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = os::Write(2, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

// The one line a problem prints; plain I/O afterwards, or the end of the
// program with MONARCH_PRELOAD_STRICT=1.
void GiveUp(absl::string_view problem, bool strict) {
  if (g_broken.exchange(true)) return;  // Said once.
  if (strict) {
    WriteStderr(absl::StrCat("monarch preload: ", problem, " (MONARCH_PRELOAD_STRICT=1: exiting)\n"));
    ::_exit(1);
  }
  WriteStderr(absl::StrCat("monarch preload: ", problem, "; reading without Monarch\n"));
}

Monarch* Service(Settings& settings) {
  if (Monarch* monarch = g_monarch.load(std::memory_order_acquire)) return monarch;
  if (g_broken.load(std::memory_order_relaxed)) return nullptr;
  SpinLockHolder hold(g_connect_lock);
  if (Monarch* monarch = g_monarch.load(std::memory_order_acquire)) return monarch;
  if (g_broken.load(std::memory_order_relaxed)) return nullptr;
  InsideMonarch inside;
  absl::StatusOr<std::unique_ptr<Monarch>> client =
      service::ConnectToNodeService(settings.config, {settings.config_file, ""});
  if (!client.ok()) {
    GiveUp(absl::StrCat("no node service for ", settings.config_file, ": ",
                        client.status().message()),
           settings.strict);
    return nullptr;
  }
  // Never destroyed: reads may run in other threads while the process exits.
  Monarch* monarch = client->release();
  g_monarch.store(monarch, std::memory_order_release);
  return monarch;
}

int NewPlaceholder(bool close_on_exec) {
  return os::Open("/dev/null", O_PATH | (close_on_exec ? O_CLOEXEC : 0));
}

void LockAllForFork() {
  // Descriptors meant to be inherited go to the kernel first, so that parent
  // and child share their offset as the kernel's dups do ({ head; cat; } <
  // file in a shell).
  HandOverDescriptors(/*all=*/false);
  g_streams.lock().Lock();
  g_table.LockAll();
}
void UnlockAllAfterFork() {
  g_table.UnlockAll();
  g_streams.lock().Unlock();
}
void UnlockAllInChild() {
  g_pid.store(::syscall(SYS_getpid), std::memory_order_relaxed);
  UnlockAllAfterFork();
  // Not taken before fork(): the thread that connects may itself fork (to
  // start the service). A child whose parent was connecting connects anew.
  g_connect_lock.Unlock();
}

// The constructor: reads the configuration, nothing more. A program that
// never touches the dataset gets no connection and no thread.
__attribute__((constructor)) void Configure() {
  InsideMonarch inside;
  const char* strict_env = std::getenv("MONARCH_PRELOAD_STRICT");
  const bool strict = strict_env != nullptr && std::strcmp(strict_env, "1") == 0;
  const char* file = std::getenv("MONARCH_CONFIG");
  if (file == nullptr || file[0] == '\0') {
    GiveUp("not configured: set MONARCH_CONFIG to the job's YAML config", strict);
    return;
  }
  // The preload library is always a client of the node service.
  absl::StatusOr<ValidConfig> config =
      ParseValidConfigFile(file, [](Config& parsed) { parsed.node.shared = true; });
  if (!config.ok()) {
    GiveUp(config.status().message(), strict);
    return;
  }
  auto* settings = new Settings(*std::move(config));  // Never freed: hooks may run during exit.
  settings->config_file = file;
  settings->strict = strict;
  std::string root = settings->config->dataset.path;
  if (root.empty() || root[0] != '/') {
    char cwd[PATH_MAX];
    if (::getcwd(cwd, sizeof(cwd)) == nullptr) {
      GiveUp("cannot resolve the relative dataset.path", strict);
      return;
    }
    root = absl::StrCat(cwd, "/", root);
  }
  std::string scratch;
  absl::string_view clean;
  if (!CanonicalDatasetName("/", root, &scratch, &clean)) {
    GiveUp("dataset.path: expected a path without '..'", strict);
    return;
  }
  settings->root = absl::StrCat("/", clean);
  settings->paths = std::make_unique<frontend::DatasetPaths>(settings->root);
  g_pid.store(::syscall(SYS_getpid), std::memory_order_relaxed);
  ::pthread_atfork(LockAllForFork, UnlockAllAfterFork, UnlockAllInChild);
  g_settings.store(settings, std::memory_order_release);
}

}  // namespace

void* NextSymbol(const char* name) {
  void* symbol = ::dlsym(RTLD_NEXT, name);
  if (symbol == nullptr) {
    WriteStderr(absl::StrCat("monarch preload: libc has no ", name, "\n"));
    ::abort();
  }
  return symbol;
}

bool InVforkChild() {
  const long pid = g_pid.load(std::memory_order_relaxed);
  return pid != 0 && ::syscall(SYS_getpid) != pid;
}

InsideMonarch::InsideMonarch() { ++t_inside; }
InsideMonarch::~InsideMonarch() { --t_inside; }

bool Active() {
  return t_inside == 0 && g_settings.load(std::memory_order_acquire) != nullptr &&
         !g_broken.load(std::memory_order_relaxed);
}

bool FindDatasetFile(int dir_fd, const char* path, std::string* name, Monarch::FileStat* stat) {
  if (path == nullptr || path[0] == '\0' || !Active()) return false;
  Settings& settings = *g_settings.load(std::memory_order_acquire);
  std::string joined;
  absl::string_view full = path;
  if (full[0] != '/') {
    // Relative: to the working directory or to `dir_fd`, both as the kernel
    // spells them (symlinks resolved).
    char base[PATH_MAX];
    if (dir_fd == AT_FDCWD) {
      if (::getcwd(base, sizeof(base)) == nullptr) return false;
    } else {
      if (Lookup(dir_fd) != nullptr) return false;  // A file, not a directory: ENOTDIR.
      char link[32];
      std::snprintf(link, sizeof(link), "/proc/self/fd/%d", dir_fd);
      const ssize_t n = ::readlink(link, base, sizeof(base) - 1);
      if (n <= 0 || base[0] != '/') return false;
      base[n] = '\0';
    }
    joined = absl::StrCat(base, "/", full);
    full = joined;
  }
  // Only kernel-made paths may need the root's real spelling: taking it
  // costs metadata operations, which programs giving absolute paths (mostly
  // not the dataset's) must not pay.
  std::string rest;
  const std::string_view spelled(full.data(), full.size());
  const bool inside_root = joined.empty() ? settings.paths->ToDatasetNameAsGiven(spelled, &rest)
                                          : settings.paths->ToDatasetName(spelled, &rest);
  if (!inside_root) return false;
  // "a/./b//c" -> "a/b/c"; ".." anywhere is left to the kernel: "x/link/../y"
  // names what the link's target's parent holds.
  std::string scratch;
  absl::string_view canonical;
  if (!CanonicalDatasetName("", rest, &scratch, &canonical) || canonical.empty()) return false;
  std::string clean(canonical);
  Monarch* monarch = Service(settings);
  if (monarch == nullptr) return false;
  InsideMonarch inside;
  absl::StatusOr<Monarch::FileStat> found = monarch->Stat(clean);
  if (!found.ok()) return false;  // Not a dataset file, or no service session: the real one.
  // A guest of another user's service (node.share_with_group) proves it may
  // read the file; if not, the real open fails as the kernel says.
  if (!service::ProveAccess(*monarch, clean).ok()) return false;
  *name = std::move(clean);
  *stat = *found;
  return true;
}

int OpenDatasetFile(const std::string& name, const Monarch::FileStat& stat, int flags) {
  const int fd = NewPlaceholder((flags & O_CLOEXEC) != 0);
  if (fd < 0) return -1;
  auto file = std::make_shared<OpenFile>();
  file->name = name;
  file->stat = stat;
  file->status_flags.store((flags & ~(O_CLOEXEC | O_CREAT | O_EXCL | O_NOCTTY | O_TRUNC)) |
                           O_LARGEFILE);
  if (!g_table.Set(fd, std::move(file))) {
    os::Close(fd);
    errno = EMFILE;
    return -1;
  }
  return fd;
}

std::shared_ptr<OpenFile> Lookup(int fd) { return g_table.Find(fd); }
void Register(int fd, std::shared_ptr<OpenFile> file) {
  if (InVforkChild()) return;  // PrepareForExec finds it by its description.
  if (!g_table.Set(fd, std::move(file))) os::Close(fd);
}
void Forget(int fd) {
  if (g_table.Find(fd) != nullptr && InVforkChild()) return;
  g_table.Forget(fd);
}
void ForgetRange(unsigned first, unsigned last) {
  if (g_table.Empty() || InVforkChild()) return;
  g_table.ForEach(first, last, [](int fd, const std::shared_ptr<OpenFile>&) { g_table.Forget(fd); });
}

ssize_t ReadAt(const OpenFile& file, void* buffer, size_t n, uint64_t offset) {
  if (n == 0 || offset >= file.stat.size) return 0;
  Monarch* monarch = g_monarch.load(std::memory_order_acquire);
  if (monarch == nullptr) {  // Cannot happen: the file was opened through it.
    errno = EBADF;
    return -1;
  }
  InsideMonarch inside;
  absl::StatusOr<size_t> done = monarch->Read(file.name, buffer, n, offset);
  if (!done.ok()) {
    errno = StatusToErrno(done.status());
    return -1;
  }
  return static_cast<ssize_t>(*done);
}

int64_t MapCopiesInto(const OpenFile& file, void* mapping, uint64_t offset, uint64_t length,
                      int protection, int flags) {
  Monarch* monarch = g_monarch.load(std::memory_order_acquire);
  if (monarch == nullptr) return 0;
  InsideMonarch inside;
  absl::StatusOr<uint64_t> mapped =
      monarch->MapCopies(file.name, mapping, offset, length, protection, flags);
  if (!mapped.ok()) {
    errno = StatusToErrno(mapped.status());
    return -1;
  }
  return static_cast<int64_t>(*mapped);
}

ssize_t ReadAtOffset(OpenFile& file, void* buffer, size_t n) {
  // The kernel serializes reads that share an offset. Here each read claims
  // the range it read with a compare-and-swap, and reads again at the new
  // offset if another read or a seek moved it meanwhile: no lock to be held
  // across a fork() or interrupted by a signal.
  for (;;) {
    uint64_t offset = file.offset.load(std::memory_order_acquire);
    const ssize_t done = ReadAt(file, buffer, n, offset);
    if (done < 0) return done;
    if (file.offset.compare_exchange_strong(offset, offset + static_cast<uint64_t>(done))) {
      return done;
    }
  }
}

off_t Seek(OpenFile& file, off_t offset, int whence) {
  const int64_t size = static_cast<int64_t>(file.stat.size);
  for (;;) {
    uint64_t current = file.offset.load(std::memory_order_acquire);
    int64_t target;
    switch (whence) {
      case SEEK_SET:
        target = offset;
        break;
      case SEEK_CUR:
        target = static_cast<int64_t>(current) + offset;
        break;
      case SEEK_END:
        target = size + offset;
        break;
      case SEEK_DATA:  // No holes: data everywhere before the end.
        if (offset < 0 || offset >= size) {
          errno = offset < 0 ? EINVAL : ENXIO;
          return -1;
        }
        target = offset;
        break;
      case SEEK_HOLE:  // The one hole is the end of the file.
        if (offset < 0 || offset >= size) {
          errno = offset < 0 ? EINVAL : ENXIO;
          return -1;
        }
        target = size;
        break;
      default:
        errno = EINVAL;
        return -1;
    }
    if (target < 0) {
      errno = EINVAL;
      return -1;
    }
    if (file.offset.compare_exchange_strong(current, static_cast<uint64_t>(target))) {
      return static_cast<off_t>(target);
    }
  }
}

namespace {
struct timespec ToTimespec(int64_t ns) {
  struct timespec t;
  t.tv_sec = static_cast<time_t>(ns / 1000000000);
  t.tv_nsec = static_cast<long>(ns % 1000000000);
  if (t.tv_nsec < 0) {
    t.tv_nsec += 1000000000;
    --t.tv_sec;
  }
  return t;
}
}  // namespace

std::string SourcePath(const OpenFile& file) {
  Settings* settings = g_settings.load(std::memory_order_acquire);
  return absl::StrCat(settings == nullptr ? "" : settings->root, "/", file.name);
}

void FillStat(const Monarch::FileStat& in, struct stat* out) {
  std::memset(out, 0, sizeof(*out));
  out->st_dev = static_cast<dev_t>(in.device);
  out->st_ino = static_cast<ino_t>(in.inode);
  out->st_mode = static_cast<mode_t>(in.mode);
  out->st_nlink = static_cast<nlink_t>(in.link_count);
  out->st_uid = static_cast<uid_t>(in.uid);
  out->st_gid = static_cast<gid_t>(in.gid);
  out->st_size = static_cast<off_t>(in.size);
  out->st_blksize = static_cast<blksize_t>(in.block_size);
  out->st_blocks = static_cast<blkcnt_t>(in.blocks);
  out->st_atim = ToTimespec(in.atime_ns);
  out->st_mtim = ToTimespec(in.mtime_ns);
  out->st_ctim = ToTimespec(in.ctime_ns);
}

void FillStatx(const Monarch::FileStat& in, struct statx* out) {
  std::memset(out, 0, sizeof(*out));
  out->stx_mask = STATX_BASIC_STATS;
  out->stx_blksize = in.block_size;
  out->stx_nlink = in.link_count;
  out->stx_uid = in.uid;
  out->stx_gid = in.gid;
  out->stx_mode = static_cast<uint16_t>(in.mode);
  out->stx_ino = in.inode;
  out->stx_size = in.size;
  out->stx_blocks = in.blocks;
  auto put = [](int64_t ns, struct statx_timestamp* t) {
    const struct timespec ts = ToTimespec(ns);
    t->tv_sec = ts.tv_sec;
    t->tv_nsec = static_cast<uint32_t>(ts.tv_nsec);
  };
  put(in.atime_ns, &out->stx_atime);
  put(in.mtime_ns, &out->stx_mtime);
  put(in.ctime_ns, &out->stx_ctime);
  out->stx_dev_major = major(static_cast<dev_t>(in.device));
  out->stx_dev_minor = minor(static_cast<dev_t>(in.device));
}

namespace {

// The open file whose description `fd` shares (a dup made where the table
// could not record it: in a vfork() child), found with kcmp(KCMP_FILE).
std::shared_ptr<OpenFile> FindByDescription(int fd) {
  const long pid = ::syscall(SYS_getpid);
  std::shared_ptr<OpenFile> found;
  g_table.ForEach(0, ~0u, [&](int other, const std::shared_ptr<OpenFile>& file) {
    if (!found && ::syscall(SYS_kcmp, pid, pid, KCMP_FILE, fd, other) == 0) found = file;
  });
  return found;
}

}  // namespace


int DuplicateAsSource(const OpenFile& file, int target, int flags) {
  Settings* settings = g_settings.load(std::memory_order_acquire);
  if (settings == nullptr) {
    errno = EBADF;
    return -1;
  }
  char path[PATH_MAX];
  const int length = std::snprintf(path, sizeof(path), "%s/%s", settings->root.c_str(),
                                   file.name.c_str());
  if (length <= 0 || static_cast<size_t>(length) >= sizeof(path)) {
    errno = ENAMETOOLONG;
    return -1;
  }
  const int real = os::Open(path, O_RDONLY | (file.status_flags.load() & O_NONBLOCK));
  if (real < 0) return -1;
  os::Lseek(real, static_cast<off_t>(file.offset.load()), SEEK_SET);
  if (target < 0 || real == target) return real;  // No target, or it was the lowest free number.
  const long result = ::syscall(SYS_dup3, real, target, flags);
  const int error = errno;
  os::Close(real);
  errno = error;
  return static_cast<int>(result);
}

void HandOverDescriptors(bool all) {
  if (g_table.Empty() || InVforkChild()) return;
  std::vector<std::pair<int, std::shared_ptr<OpenFile>>> entries;
  g_table.ForEach(0, ~0u, [&entries](int fd, const std::shared_ptr<OpenFile>& file) {
    entries.emplace_back(fd, file);
  });
  // One real description per open file, dup'ed onto each of its numbers.
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::shared_ptr<OpenFile> file = entries[i].second;
    if (!file) continue;
    std::vector<std::pair<int, bool>> members;  // fd, close-on-exec.
    bool inherited = all;
    for (size_t j = i; j < entries.size(); ++j) {
      if (entries[j].second != file) continue;
      const long flags = ::syscall(SYS_fcntl, entries[j].first, F_GETFD);
      const bool cloexec = flags >= 0 && (flags & FD_CLOEXEC) != 0;
      inherited = inherited || !cloexec;
      members.emplace_back(entries[j].first, cloexec);
      entries[j].second = nullptr;
    }
    if (!inherited) continue;
    const int real = DuplicateAsSource(*file, -1, 0);
    if (real < 0) continue;  // Left as it is: still served here.
    for (const auto& [fd, cloexec] : members) {
      if (::syscall(SYS_dup3, real, fd, cloexec ? O_CLOEXEC : 0) >= 0) g_table.Forget(fd);
    }
    os::Close(real);
  }
}

void PrepareForExec() {
  Settings* settings = g_settings.load(std::memory_order_acquire);
  if (settings == nullptr || g_table.Empty()) return;
  // Every descriptor that survives exec and is a placeholder, whether the
  // table knows its number or not (see FindByDescription). Direct system
  // calls only, and no allocation.
  const int directory = os::Open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (directory < 0) return;
  alignas(8) char entries[4096];
  for (;;) {
    const long n = ::syscall(SYS_getdents64, directory, entries, sizeof(entries));
    if (n <= 0) break;
    for (long at = 0; at < n;) {
      const auto* entry = reinterpret_cast<const struct dirent64*>(entries + at);
      at += entry->d_reclen;
      char* end = nullptr;
      const long fd = std::strtol(entry->d_name, &end, 10);
      if (end == entry->d_name || *end != '\0' || fd == directory) continue;
      const long fd_flags = ::syscall(SYS_fcntl, fd, F_GETFD);
      const long status_flags = ::syscall(SYS_fcntl, fd, F_GETFL);
      if (fd_flags < 0 || (fd_flags & FD_CLOEXEC) != 0 || status_flags < 0 ||
          (status_flags & O_PATH) == 0) {
        continue;
      }
      std::shared_ptr<OpenFile> file = g_table.Find(static_cast<int>(fd));
      if (!file) file = FindByDescription(static_cast<int>(fd));
      // On failure the new program finds the placeholder: EBADF, never wrong bytes.
      if (file) DuplicateAsSource(*file, static_cast<int>(fd), 0);
    }
  }
  os::Close(directory);
}

namespace {

struct StreamCookie {
  int fd;
  FILE* stream = nullptr;
};

ssize_t StreamRead(void* cookie, char* buffer, size_t n) {
  std::shared_ptr<OpenFile> file = Lookup(static_cast<StreamCookie*>(cookie)->fd);
  if (!file) {
    errno = EBADF;
    return -1;
  }
  return ReadAtOffset(*file, buffer, n);
}

int StreamSeek(void* cookie, off64_t* position, int whence) {
  std::shared_ptr<OpenFile> file = Lookup(static_cast<StreamCookie*>(cookie)->fd);
  if (!file) {
    errno = EBADF;
    return -1;
  }
  const off_t done = Seek(*file, static_cast<off_t>(*position), whence);
  if (done < 0) return -1;
  *position = done;
  return 0;
}

int StreamClose(void* cookie) {
  auto* c = static_cast<StreamCookie*>(cookie);
  g_streams.Remove(c->stream);
  Forget(c->fd);
  const int result = os::Close(c->fd);
  delete c;
  return result;
}

}  // namespace

FILE* OpenStream(int fd, const char* mode) {
  auto* cookie = new StreamCookie{fd};
  FILE* stream = ::fopencookie(cookie, mode, {StreamRead, nullptr, StreamSeek, StreamClose});
  if (stream == nullptr) {
    delete cookie;
    return nullptr;
  }
  cookie->stream = stream;
  g_streams.Add(stream, fd);
  return stream;
}

int StreamDescriptor(FILE* stream) { return g_streams.Find(stream); }

}  // namespace monarch::preload
