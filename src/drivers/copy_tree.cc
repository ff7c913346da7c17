// CopyTree: layout, temporaries and publication of file-tier copies.

#include "drivers/copy_tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
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
namespace {

// For a temporary "<pid>.<seq>" returns <pid>; 0 if the name is not one.
pid_t TemporaryOwner(absl::string_view base) {
  std::vector<absl::string_view> parts = absl::StrSplit(base, '.');
  int pid = 0;
  uint64_t sequence = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &pid) || pid <= 0 ||
      !absl::SimpleAtoi(parts[1], &sequence)) {
    return 0;
  }
  return pid;
}

bool ProcessAlive(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

}  // namespace

absl::StatusOr<std::shared_ptr<CheckedCopy>> CopyTree::OpenCopy(const FileRef& file, bool map,
                                                               CopyStates* states) const {
  MONARCH_ASSIGN_OR_RETURN(std::shared_ptr<ScopedFd> fd, directory_.OpenBeneath(file.name));
  return CheckedCopy::Open(std::move(fd), file, PathOf(file.name), map, states);
}

absl::StatusOr<size_t> OpenCopies::Read(const FileRef& file, uint64_t offset, char* dst,
                                        size_t n) {
  absl::StatusOr<std::shared_ptr<CheckedCopy>> copy =
      handles_.Get(file.id, [&] { return tree_->OpenCopy(file, map_, &states_); });
  absl::StatusOr<size_t> result =
      copy.ok() ? (*copy)->Read(offset, dst, n, verify_) : copy.status();
  // Damaged, truncated (under a mapping too) or replaced: neither the handle
  // nor what was checked through it is of use any more, and a fresh copy
  // may take the name.
  if (absl::IsDataLoss(result.status())) Forget(file.id);
  return result;
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

absl::Status CopyTree::Scan(StorageDriver::CopyVisitor visit) {
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
      if (relative.empty() && base == kReservedDirectory) continue;  // Ours, not copies.
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
      visit(name, record.ok() ? &record->source : nullptr);
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
