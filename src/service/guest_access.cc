// Guests' proofs of access (guest_access.h).

#include "service/guest_access.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/os.h"

namespace monarch::service {

absl::Status GuestAccess::Refuse(absl::string_view why) {
  refusals_.fetch_add(1, std::memory_order_relaxed);
  return absl::PermissionDeniedError(why);
}

absl::Status GuestAccess::Prove(pid_t pid, uint32_t file_id, int fd) {
  if (file_id >= name_space_.file_count()) {
    return absl::InvalidArgumentError(absl::StrCat("prove access: file id ", file_id,
                                                   " out of range (", name_space_.file_count(),
                                                   " files)"));
  }
  const std::string path = JoinPath(name_space_.root(), name_space_.file_name(file_id));
  // An O_PATH descriptor opens without read permission; a write-only one
  // proves nothing about reading.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || (flags & O_PATH) != 0 || (flags & O_ACCMODE) == O_WRONLY) {
    return Refuse(absl::StrCat("prove access: the descriptor given for ", path,
                               " is not open for reading"));
  }
  struct stat given;
  struct stat source;
  if (os::Fstat(fd, &given) != 0 || !S_ISREG(given.st_mode)) {
    return Refuse(absl::StrCat("prove access: the descriptor given for ", path,
                               " is not a regular file"));
  }
  if (os::Stat(path.c_str(), &source) != 0) {
    return Refuse(absl::StrCat("prove access: stat ", path, ": ", std::strerror(errno)));
  }
  if (given.st_dev != source.st_dev || given.st_ino != source.st_ino) {
    return Refuse(absl::StrCat("prove access: the descriptor given for ", path,
                               " is another file"));
  }
  MutexLock lock(&mu_);
  granted_[pid].insert(file_id);
  return absl::OkStatus();
}

bool GuestAccess::Granted(pid_t pid, uint32_t entry_id) {
  if (entry_id >= name_space_.entry_count()) return false;
  const uint32_t file = name_space_.entry(entry_id).ref.source_file().id;
  {
    MutexLock lock(&mu_);
    auto it = granted_.find(pid);
    if (it != granted_.end() && it->second.contains(file)) return true;
  }
  refusals_.fetch_add(1, std::memory_order_relaxed);
  return false;
}

void GuestAccess::Forget(pid_t pid) {
  MutexLock lock(&mu_);
  granted_.erase(pid);
}

}  // namespace monarch::service
