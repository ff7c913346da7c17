// FileTierDriver: what the posix and pmem tiers share.

#include "drivers/file_tier_driver.h"

#include <utility>

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

}  // namespace monarch
