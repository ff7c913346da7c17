// PurgeCopyTree: removes what Monarch wrote in a file-backed tier's
// directory (posix, pmem), and nothing else: `monarch purge` at the end of a
// job.
//
// What is Monarch's. A tier directory may be shared with the user's own
// files, or be the wrong directory altogether (a tier path mistyped as
// $HOME), so nothing is removed for where it lies. A file is a copy when it
// is a regular file whose trailer (copy_integrity.h) is intact: the
// "MONCOPY1" footer, its own CRC32C, and a file size that matches the size it
// records. Such a trailer does not arise by chance. Besides copies, only
// Monarch's bookkeeping goes: temporaries "<pid>.<seq>" in
// "<root>/.monarch/tmp" whose writer is gone (a live writer's are kept), then
// that directory and ".monarch" if nothing else is left in them.
// Directories are removed only when the purge emptied them: a user's empty
// directory stays.
//
// How it walks. Descriptor-relative (openat/unlinkat from the directory's
// own descriptor, O_NOFOLLOW), so a directory swapped for a symlink during
// the walk is not followed either. Symlinks are never followed nor removed,
// and the walk does not cross into another file system (a mount point under
// the tier). A FIFO or device is never opened.
//
// Never touches the dataset: it reads only the tier directory.
//
// Thread-compatible: no shared state. The caller makes sure no Monarch
// process writes into the tier meanwhile (`monarch purge` holds the node
// service's lock).

#ifndef MONARCH_DRIVERS_COPY_PURGE_H_
#define MONARCH_DRIVERS_COPY_PURGE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace monarch {

struct PurgeOptions {
  // Only lists: visits what would be removed, removes nothing.
  bool dry_run = false;
  // Called with each file removed (or, with dry_run, that would be), its
  // path and size in bytes. May be empty.
  std::function<void(const std::string& path, uint64_t bytes)> on_file;
};

struct PurgeReport {
  uint64_t copies = 0;            // Copies removed (or that would be).
  uint64_t copy_bytes = 0;        // Their sizes, trailers included.
  uint64_t temporaries = 0;       // Dead writers' temporaries removed.
  uint64_t temporary_bytes = 0;
  uint64_t directories = 0;       // Directories the purge emptied and removed.
  uint64_t foreign_files = 0;     // Files without a copy's trailer: kept.
  uint64_t live_temporaries = 0;  // Temporaries of a writer still running: kept.
  uint64_t symlinks = 0;          // Not followed, kept.
  uint64_t mount_points = 0;      // Other file systems under the root: not entered.
  // What could not be read or removed below the root ("unlink <path>:
  // Permission denied"); the rest of the tree was still purged.
  std::vector<std::string> errors;
};

// Purges `root` as above. NotFound / PermissionDenied / FailedPrecondition
// (naming `root`) when the root itself is missing, unreadable, or not a
// directory; then nothing is removed. Otherwise the report, errors below the
// root included in it.
absl::StatusOr<PurgeReport> PurgeCopyTree(const std::string& root, const PurgeOptions& options);

}  // namespace monarch

#endif  // MONARCH_DRIVERS_COPY_PURGE_H_
