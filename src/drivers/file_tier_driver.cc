// FileTierDriver: what the posix and pmem tiers share.

#include "drivers/file_tier_driver.h"

#include <sys/stat.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/os.h"
#include "common/status_macros.h"

namespace monarch {

FileTierDriver::FileTierDriver(std::string root, int max_open, bool map, VerifyPolicy verify,
                               bool check_adopted)
    : tree_(std::move(root)),
      copies_(&tree_, max_open, map, verify),
      check_adopted_(check_adopted) {}

absl::StatusOr<size_t> FileTierDriver::Read(const FileRef& file, uint64_t offset, char* dst,
                                            size_t n) {
  return copies_.Read(file, offset, dst, n);
}

absl::Status FileTierDriver::Remove(const FileRef& file) {
  absl::Status removed = tree_.Remove(file.name);
  copies_.Forget(file.id);
  return removed;
}

absl::Status FileTierDriver::ScanCopies(CopyVisitor visit) { return tree_.Scan(visit); }

void FileTierDriver::ReportTierCounters(CounterSink& sink) const { copies_.ReportCounters(sink); }

void FileTierDriver::CopyAdopted(const FileRef& file) {
  copies_.ReadyAhead(file, check_adopted_);
}

void FileTierDriver::WaitForBackgroundWork() { copies_.WaitForReadying(); }

std::optional<SourceIdentity> FileTierDriver::MarkMapped(const FileRef& file) {
  return copies_.MarkMapped(file);
}

absl::StatusOr<CopyMapping::MappableCopy> FileTierDriver::OpenCheckedCopy(
    const FileRef& file, const SourceIdentity* checked) {
  if (checked == nullptr) {
    return absl::FailedPreconditionError(
        "a file tier's copy is opened once the tier vouched for it");
  }
  MONARCH_ASSIGN_OR_RETURN(std::shared_ptr<ScopedFd> fd, tree_.OpenCopyFile(file));
  struct stat st;
  if (os::Fstat(fd->get(), &st) != 0) {
    return ErrnoToStatus(errno, "fstat " + tree_.PathOf(file.name));
  }
  // A rename over it, a write or a truncation since the check: another
  // inode, or another ctime or size.
  if (!S_ISREG(st.st_mode) || SourceIdentity::Of(st) != *checked) {
    return absl::FailedPreconditionError(
        absl::StrCat("the copy ", tree_.PathOf(file.name), " changed since it was checked"));
  }
  MappableCopy copy;
  copy.fd = fd->get();
  copy.owner = std::move(fd);
  return copy;
}

}  // namespace monarch
