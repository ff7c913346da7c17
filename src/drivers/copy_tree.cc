// CopyTree: layout, temporaries and publication of file-tier copies.

#include "drivers/copy_tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/os.h"
#include "common/status_macros.h"

namespace monarch {

pid_t TemporaryOwner(absl::string_view name) {
  std::vector<absl::string_view> parts = absl::StrSplit(name, '.');
  int pid = 0;
  uint64_t sequence = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &pid) || pid <= 0 ||
      !absl::SimpleAtoi(parts[1], &sequence)) {
    return 0;
  }
  return pid;
}

bool ProcessAlive(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

absl::StatusOr<std::shared_ptr<CheckedCopy>> CopyTree::OpenCopy(const FileRef& file, bool map,
                                                               CopyStates* states,
                                                               CopyOpenFor opener) const {
  MONARCH_ASSIGN_OR_RETURN(std::shared_ptr<ScopedFd> fd, directory_.OpenBeneath(file.name));
  return CheckedCopy::Open(std::move(fd), file, PathOf(file.name), map, states, opener);
}

absl::StatusOr<size_t> OpenCopies::Read(const FileRef& file, uint64_t offset, char* dst,
                                        size_t n) {
  absl::StatusOr<std::shared_ptr<CheckedCopy>> copy = handles_.Get(
      file.id, [&] { return tree_->OpenCopy(file, map_, &states_, CopyOpenFor::kRead); });
  absl::StatusOr<size_t> result =
      copy.ok() ? (*copy)->Read(offset, dst, n, verify_) : copy.status();
  // Damaged, truncated (under a mapping too) or replaced: neither the handle
  // nor what was checked through it is of use any more, and a fresh copy
  // may take the name.
  if (absl::IsDataLoss(result.status())) Forget(file.id);
  return result;
}

std::optional<SourceIdentity> OpenCopies::MarkMapped(const FileRef& file) {
  // Every read checks the bytes it returns: a page fault cannot.
  if (verify_ == VerifyPolicy::kEveryRead) return std::nullopt;
  const std::shared_ptr<CopyState> state = states_.Peek(file.id);
  const uint64_t blocks = (file.size + kChecksumBlockBytes - 1) / kChecksumBlockBytes;
  if (state != nullptr && state->record().sums.size() == blocks &&
      (verify_ == VerifyPolicy::kOff || state->AllVerified())) {
    return state->stamp();
  }
  ReadyAhead(file, /*check=*/true);  // For the next mapping.
  return std::nullopt;
}

OpenCopies::~OpenCopies() {
  std::thread thread;
  {
    MutexLock lock(&ahead_mu_);
    stopping_ = true;
    ahead_changed_.SignalAll();
    ahead_idle_.SignalAll();
    thread = std::move(ahead_thread_);
  }
  if (thread.joinable()) thread.join();
}

void OpenCopies::Published(const FileRef& file, bool check) {
  Forget(file.id);
  ReadyAhead(file, check);
}

void OpenCopies::ReadyAhead(const FileRef& file, bool check) {
  MutexLock lock(&ahead_mu_);
  if (stopping_ || ahead_.size() >= kMaxQueued) return;
  ahead_.push_back(Queued{file.id, std::string(file.name), file.size, file.mtime_ns,
                          check && verify_ == VerifyPolicy::kFirstRead});
  if (!ahead_thread_.joinable()) ahead_thread_ = std::thread([this] { ReadyAheadLoop(); });
  ahead_changed_.Signal();
}

void OpenCopies::ReadyAheadLoop() {
  ::pthread_setname_np(::pthread_self(), "monarch-ready");
  // Only CPU time nobody else wants: in a cold epoch bound by the CPU
  // rather than the source (a page-cached source), checking copies ahead
  // would otherwise take it from the readers. Behind, the queue only waits.
  // (The locks it shares with readers are held for a few instructions,
  // never across I/O, so its low priority cannot hold a reader up.)
  struct sched_param idle = {};
  (void)::pthread_setschedparam(::pthread_self(), SCHED_IDLE, &idle);
  constexpr size_t kScratchBytes = 1 << 20;
  std::unique_ptr<char[]> scratch(new char[kScratchBytes]);
  while (true) {
    Queued queued;
    {
      MutexLock lock(&ahead_mu_);
      readying_ = false;
      if (ahead_.empty()) ahead_idle_.SignalAll();
      while (!stopping_ && ahead_.empty()) ahead_changed_.Wait(&ahead_mu_);
      if (stopping_) return;
      queued = std::move(ahead_.front());
      ahead_.pop_front();
      readying_ = true;
    }
    Ready(queued, scratch.get(), kScratchBytes);
  }
}

// Each copy queued is one open and one read of it (and at most a 100 ms
// wait for its ctime to settle); the queue is bounded (kMaxQueued).
void OpenCopies::WaitForReadying() {
  MutexLock lock(&ahead_mu_);
  while (!stopping_ && (readying_ || !ahead_.empty())) ahead_idle_.Wait(&ahead_mu_);
}

void OpenCopies::Ready(const Queued& queued, char* scratch, size_t scratch_bytes) {
  // A tier holds an extent's copy under a name of its own: the extent's
  // fields (its file's) are for the source only, so none are set here.
  FileRef file;
  file.id = queued.id;
  file.name = queued.name;
  file.size = queued.size;
  file.mtime_ns = queued.mtime_ns;
  absl::StatusOr<std::shared_ptr<CheckedCopy>> copy = handles_.Get(
      file.id, [&] { return tree_->OpenCopy(file, map_, &states_, CopyOpenFor::kReadying); });
  // Gone already (evicted, damaged): its next reader, if any, finds out.
  if (!copy.ok()) return;
  // Removed (evicted, dropped) between the open and the caching: Remove()
  // forgets after it unlinks, so either it dropped this handle or the
  // unlink shows here. A handle left cached would keep the removed copy's
  // blocks allocated on the device, beyond the tier's capacity.
  if ((*copy)->Unlinked()) {
    handles_.Erase(file.id, copy->get());
    return;
  }
  if (!queued.check) {
    readied_ahead_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  // Copies are queued as they are published, so waiting for this one to
  // settle delays the ones behind it by no more than their own wait. A
  // copy whose ctime has whole seconds settles seconds later (see SettleNs):
  // then its first read checks it, as without this thread.
  const int64_t wait_ns = (*copy)->state().NsUntilSettled();
  constexpr int64_t kLongestWaitNs = 100000000;
  if (wait_ns > kLongestWaitNs) return;
  if (wait_ns > 0) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(wait_ns + 1);
    MutexLock lock(&ahead_mu_);
    while (!stopping_ && ahead_changed_.WaitUntil(&ahead_mu_, deadline)) {
    }
    if (stopping_) return;
  }
  // Reads the copy as a reader would, so each block is checked and
  // remembered, and a damaged copy is forgotten, exactly as on that path;
  // but not the pieces readers have checked already.
  const CopyState& state = (*copy)->state();
  for (uint64_t offset = 0; offset < file.size; offset += scratch_bytes) {
    const uint64_t end = std::min<uint64_t>(file.size, offset + scratch_bytes);
    bool checked = true;
    for (uint64_t b = offset / kChecksumBlockBytes; checked && b * kChecksumBlockBytes < end; ++b) {
      checked = state.Verified(b);
    }
    if (!checked && !Read(file, offset, scratch, scratch_bytes).ok()) return;
  }
  readied_ahead_.fetch_add(1, std::memory_order_relaxed);
}

void OpenCopies::ReportCounters(CounterSink& sink) const {
  states_.ReportCounters(sink);
  sink.Counter("copies_readied_ahead", readied_ahead_.load(std::memory_order_relaxed),
               "Copies opened, and with first-read checked whole, by the tier soon after it "
               "wrote them, so that their first read does neither.");
}

std::string CopyTree::PathOf(absl::string_view name) const { return JoinPath(root_, name); }

absl::StatusOr<std::string> CopyTree::NewTemporary(absl::string_view name) {
  const std::string path = PathOf(name);
  const size_t slash = path.find_last_of('/');
  MONARCH_RETURN_IF_ERROR(MakeDirectories(path.substr(0, slash)));
  const std::string temporaries = JoinPath(root_, kTemporaryDirectory);
  if (!temporaries_ready_.load(std::memory_order_acquire)) {
    MONARCH_RETURN_IF_ERROR(MakeDirectories(temporaries));
    temporaries_ready_.store(true, std::memory_order_release);
  }
  return absl::StrCat(temporaries, "/", ::getpid(), ".", next_sequence_.fetch_add(1));
}

absl::Status CopyTree::Publish(const std::string& temporary, const FileRef& file) {
  struct timespec times[2];
  times[0].tv_sec = 0;
  times[0].tv_nsec = UTIME_OMIT;
  times[1].tv_sec = file.mtime_ns / 1000000000;
  times[1].tv_nsec = file.mtime_ns % 1000000000;
  if (os::UtimensAt(AT_FDCWD, temporary.c_str(), times, 0) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("set mtime of ", temporary));
  }
  if (os::Rename(temporary.c_str(), PathOf(file.name).c_str()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("rename ", temporary));
  }
  return absl::OkStatus();
}

PendingCopy::~PendingCopy() {
  if (!published_) os::Unlink(temporary_.c_str());
}

absl::Status PendingCopy::WriteTrailer(int fd, const SourceIdentity& source) {
  if (!sums_.complete()) {
    return absl::InternalError(
        absl::StrCat(temporary_, ": committed before every chunk was written"));
  }
  const std::string trailer = sums_.Trailer(source);
  return PwriteFull(fd, trailer.data(), trailer.size(), file_.size, temporary_);
}

absl::Status PendingCopy::Publish() {
  MONARCH_RETURN_IF_ERROR(tree_->Publish(temporary_, file_));
  published_ = true;
  return absl::OkStatus();
}

absl::Status CopyTree::Remove(absl::string_view name) {
  std::string path = PathOf(name);
  if (os::Unlink(path.c_str()) != 0) return ErrnoToStatus(errno, absl::StrCat("unlink ", path));
  return absl::OkStatus();
}

namespace {

// Whether `copy` (its stat) may be of a source file that changed again
// within the tick its recorded times fell in. A file system that keeps
// whole seconds (MooseFS, and Lustre's clients) gives a change made in the
// same second as the copy the same ctime and mtime, so the identity cannot
// tell them apart, as git's "racily clean" index entries cannot. A copy
// committed (its own ctime: the rename that published it) less than two
// seconds after such a source's last change is not adopted: that file is
// read from the source again. Finer clocks keep their nanoseconds and are
// told apart by them.
bool RacyCopy(const SourceIdentity& source, const struct stat& copy) {
  constexpr int64_t kSecond = 1000000000;
  if (source.ctime_ns % kSecond != 0 || source.mtime_ns % kSecond != 0) return false;
  const int64_t committed = TimespecNanos(copy.st_ctim);
  return committed < std::max(source.ctime_ns, source.mtime_ns) + 2 * kSecond;
}

}  // namespace

absl::Status CopyTree::Scan(KeptCopies::CopyVisitor visit) {
  // Iterative walk; `relative` is the dataset-relative directory ("" = root).
  std::vector<std::string> pending = {""};
  while (!pending.empty()) {
    std::string relative = std::move(pending.back());
    pending.pop_back();
    std::string dir_path = relative.empty() ? root_ : PathOf(relative);
    DIR* dir = os::OpenDir(dir_path.c_str());
    if (dir == nullptr) return ErrnoToStatus(errno, absl::StrCat("opendir ", dir_path));
    int dir_fd = ::dirfd(dir);
    while (struct dirent* entry = os::ReadDir(dir)) {
      absl::string_view base = entry->d_name;
      if (base == "." || base == "..") continue;
      if (relative.empty() && base == kReservedDirectory) {
        // Ours, not copies; but for the extents' copies (metadata/namespace.h).
        const std::string extents = absl::StrCat(kReservedDirectory, "/", kExtentsDirectory);
        struct stat st;
        if (os::FstatAt(dir_fd, extents.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
            S_ISDIR(st.st_mode)) {
          pending.push_back(extents);
        }
        continue;
      }
      std::string name = relative.empty() ? std::string(base) : absl::StrCat(relative, "/", base);
      struct stat st;
      if (os::FstatAt(dir_fd, entry->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
      if (S_ISDIR(st.st_mode)) {
        pending.push_back(std::move(name));
        continue;
      }
      if (!S_ISREG(st.st_mode)) continue;
      // What the copy is a copy of, from its trailer: a copy cut short by a
      // crash, damaged, or not Monarch's has none and is visited as such.
      ScopedFd fd(os::OpenAt(dir_fd, entry->d_name,
                             O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
      struct stat opened;
      absl::StatusOr<CopyRecord> record =
          !fd.valid() || os::Fstat(fd.get(), &opened) != 0 || !S_ISREG(opened.st_mode)
              ? absl::DataLossError("not a regular file")
              : ReadCopyRecord(fd.get(), static_cast<uint64_t>(opened.st_size), PathOf(name));
      const bool racy = record.ok() && RacyCopy(record->source, opened);
      visit(name, record.ok() && !racy ? &record->source : nullptr);
    }
    os::CloseDir(dir);
  }
  RemoveDeadTemporaries();
  return absl::OkStatus();
}

void CopyTree::RemoveDeadTemporaries() {
  const std::string temporaries = JoinPath(root_, kTemporaryDirectory);
  DIR* dir = os::OpenDir(temporaries.c_str());
  if (dir == nullptr) return;  // None yet.
  while (struct dirent* entry = os::ReadDir(dir)) {
    const pid_t owner = TemporaryOwner(entry->d_name);
    // A live owner is another process writing into this tier right now.
    if (owner == 0 || ProcessAlive(owner)) continue;
    MONARCH_LOG(kInfo, "removing leftover temporary ", temporaries, "/", entry->d_name);
    os::UnlinkAt(::dirfd(dir), entry->d_name, 0);
  }
  os::CloseDir(dir);
}

}  // namespace monarch
