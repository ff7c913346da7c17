// CopyTree: the on-disk layout shared by the file-backed tiers (posix, pmem).
//
// A copy of dataset file "a/b.rec" lives at "<root>/a/b.rec" and carries the
// source file's mtime, so a later run can tell a valid copy from a stale one
// with one stat. Copies are written under a temporary name in the same
// directory, ".b.rec.monarch-tmp.<pid>.<seq>", and renamed into place when
// complete: readers never see a partial copy, and two processes promoting the
// same file at once each rename a complete copy of the same bytes.
//
// Thread-safe: no state besides the root path and an atomic sequence number.

#ifndef MONARCH_DRIVERS_COPY_TREE_H_
#define MONARCH_DRIVERS_COPY_TREE_H_

#include <atomic>
#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "drivers/storage_driver.h"

namespace monarch {

class CopyTree {
 public:
  explicit CopyTree(std::string root) : root_(std::move(root)) {}

  const std::string& root() const { return root_; }
  std::string PathOf(absl::string_view name) const;

  // Stores a copy of `file`: `write` fills a fresh temporary path next to
  // the copy's, which then gets the source's mtime and is renamed over the
  // copy. On any failure the temporary is deleted and nothing changes.
  absl::Status Store(const FileRef& file,
                     absl::FunctionRef<absl::Status(const std::string& temporary)> write);

  absl::Status Remove(absl::string_view name);

  // Walks the tree: visits complete copies, deletes temporaries whose writer
  // process is gone, leaves live writers' temporaries alone.
  absl::Status Scan(StorageDriver::CopyVisitor visit);

 private:
  const std::string root_;
  std::atomic<uint64_t> next_sequence_{0};
};

}  // namespace monarch

#endif  // MONARCH_DRIVERS_COPY_TREE_H_
