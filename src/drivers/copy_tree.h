// CopyTree: the on-disk layout shared by the file-backed tiers (posix, pmem).
//
// A copy of dataset file "a/b.rec" lives at "<root>/a/b.rec" and carries the
// source file's mtime, so a later run can tell a valid copy from a stale one
// with one stat. Copies are written under a temporary name,
// "<root>/.monarch/tmp/<pid>.<seq>", and renamed into place when complete:
// readers never see a partial copy, and two processes promoting the same file
// at once each rename a complete copy of the same bytes. The reserved
// directory keeps temporaries apart from copies, so no dataset file name can
// be taken for one (the namespace walk skips a ".monarch" at the dataset's
// root for the same reason).
//
// Thread-safe: no state besides the root path and an atomic sequence number.

#ifndef MONARCH_DRIVERS_COPY_TREE_H_
#define MONARCH_DRIVERS_COPY_TREE_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/file_util.h"
#include "drivers/storage_driver.h"

namespace monarch {

class CopyTree {
 public:
  explicit CopyTree(std::string root) : root_(std::move(root)), directory_(root_) {}

  const std::string& root() const { return root_; }
  std::string PathOf(absl::string_view name) const;
  // Opens the complete copy of `file` for reading, only as what Monarch
  // wrote: a regular file of the file's size reached without a symlink.
  // Anything else (a symlink to /dev/zero, a FIFO, which would block the
  // open without O_NONBLOCK, a directory, a copy of another size) is
  // DataLoss, and the caller serves the source.
  absl::StatusOr<std::shared_ptr<ScopedFd>> OpenCopy(const FileRef& file) const;

  // Creates the parent directories of `name`'s copy and returns a fresh
  // temporary path next to it.
  absl::StatusOr<std::string> NewTemporary(absl::string_view name);

  // Gives the complete temporary the source's mtime and renames it over the
  // copy. The caller deletes the temporary if this fails.
  absl::Status Publish(const std::string& temporary, const FileRef& file);

  absl::Status Remove(absl::string_view name);

  // Walks the tree: visits complete copies, deletes temporaries whose writer
  // process is gone, leaves live writers' temporaries alone.
  absl::Status Scan(StorageDriver::CopyVisitor visit);

  // Reserved under the root, never a copy.
  static constexpr absl::string_view kReservedDirectory = ".monarch";
  static constexpr absl::string_view kTemporaryDirectory = ".monarch/tmp";

 private:
  void RemoveDeadTemporaries();

  const std::string root_;
  const DirectoryHandle directory_;
  std::atomic<uint64_t> next_sequence_{0};
  std::atomic<bool> temporaries_ready_{false};
};

// A copy being written under a temporary name of a CopyTree: the temporary
// is deleted on destruction unless Publish() renamed it into place. Shared by
// the file-backed tiers' writers. Not thread-safe; the owner serializes calls.
class PendingCopy {
 public:
  PendingCopy(CopyTree* tree, const FileRef& file, std::string temporary)
      : tree_(tree), file_(file), temporary_(std::move(temporary)) {}
  ~PendingCopy();
  PendingCopy(const PendingCopy&) = delete;
  PendingCopy& operator=(const PendingCopy&) = delete;

  const FileRef& file() const { return file_; }
  const std::string& temporary() const { return temporary_; }
  std::string published_path() const { return tree_->PathOf(file_.name); }

  // CopyTree::Publish(); afterwards the destructor leaves the file alone.
  absl::Status Publish();

 private:
  CopyTree* const tree_;
  const FileRef file_;
  const std::string temporary_;
  bool published_ = false;
};

}  // namespace monarch

#endif  // MONARCH_DRIVERS_COPY_TREE_H_
