// FileTierDriver: the base of the file-backed tiers (posix, pmem).
//
// Both keep their copies in a CopyTree (copy_tree.h: layout, temporaries,
// publication, the warm-start scan) and read them through OpenCopies (a
// bounded cache of open, checked copies, readied ahead in one background
// thread). This base does all that follows from that: reads, removal, the
// scan, the counters, adoption and waiting for the background work. A tier
// adds only how a copy is written (NewWriter): with pwrite, buffered or
// O_DIRECT, for posix; into a libpmem mapping for pmem. Its writers write a
// PendingCopy of tree() and, once it is published, tell copies().
//
// Lives as long as the tier; its writers must not outlive it. Thread-safety
// is StorageDriver's: CopyTree and OpenCopies are thread-safe.

#ifndef MONARCH_DRIVERS_FILE_TIER_DRIVER_H_
#define MONARCH_DRIVERS_FILE_TIER_DRIVER_H_

#include <string>

#include "drivers/copy_tree.h"
#include "drivers/storage_driver.h"

namespace monarch {

class FileTierDriver : public StorageDriver, public CopyMapping, public KeptCopies {
 public:
  // A damaged copy (DataLoss), or one truncated under its mapping, is
  // forgotten here; the caller drops it from the tier, and a fresh copy may
  // take its name.
  absl::StatusOr<size_t> Read(const FileRef& file, uint64_t offset, char* dst,
                              size_t n) final;
  // Unlinks the copy, then forgets its handle (OpenCopies::Ready relies on
  // that order).
  absl::Status Remove(const FileRef& file) final;
  absl::Status ScanCopies(CopyVisitor visit) final;
  // OpenCopies' counters: copy_opens, trailer_reads, blocks_verified, ...
  void ReportTierCounters(CounterSink& sink) const final;
  // Readies the adopted copy ahead of its first read, checked whole or not
  // as the tier said at construction.
  void CopyAdopted(const FileRef& file) final;
  void WaitForBackgroundWork() final;
  std::optional<SourceIdentity> MarkMapped(const FileRef& file) final;
  absl::StatusOr<MappableCopy> OpenCheckedCopy(const FileRef& file,
                                               const SourceIdentity* checked) final;
  bool StillCopyOf(const FileRef&, const MappableCopy&) final { return true; }

 protected:
  // Copies under `root`; at most `max_open` of them kept open between reads
  // (descriptors, or mappings with `map`). `check_adopted`: whether copies
  // an earlier run left are checked whole when readied ahead, or only opened.
  FileTierDriver(std::string root, int max_open, bool map, VerifyPolicy verify,
                 bool check_adopted);

  CopyTree& tree() { return tree_; }
  OpenCopies& copies() { return copies_; }

 private:
  CopyTree tree_;
  OpenCopies copies_;  // Reads tree_.
  const bool check_adopted_;
};

}  // namespace monarch

#endif  // MONARCH_DRIVERS_FILE_TIER_DRIVER_H_
