// CopyTree: the on-disk layout shared by the file-backed tiers (posix, pmem).
//
// A copy of dataset file "a/b.rec" lives at "<root>/a/b.rec": its bytes,
// then the trailer of copy_integrity.h (block checksums and the source
// file's identity), and it carries the source file's mtime. Copies are written under a temporary name,
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

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/counters.h"
#include "common/file_util.h"
#include "common/handle_cache.h"
#include "common/mutex.h"
#include "drivers/copy_integrity.h"
#include "drivers/storage_driver.h"

namespace monarch {

// For a temporary's name "<pid>.<seq>" (CopyTree::NewTemporary) its
// writer's pid; 0 if the name is not one.
pid_t TemporaryOwner(absl::string_view name);
// Whether process `pid` exists (perhaps another user's): its temporaries
// may still be written.
bool ProcessAlive(pid_t pid);

class CopyTree {
 public:
  explicit CopyTree(std::string root) : root_(std::move(root)), directory_(root_) {}

  const std::string& root() const { return root_; }
  std::string PathOf(absl::string_view name) const;
  // Opens the complete copy of `file` for reading, only as what Monarch
  // wrote: a regular file reached without a symlink, with an intact trailer
  // for the file's size and mtime (mapped too with `map`). Anything else (a
  // symlink to /dev/zero, a FIFO, which would block the open without
  // O_NONBLOCK, a directory, a copy cut short or of another version) is
  // DataLoss, and the caller serves the source. `states` knows the copies
  // opened before (CheckedCopy::Open).
  absl::StatusOr<std::shared_ptr<CheckedCopy>> OpenCopy(const FileRef& file, bool map,
                                                        CopyStates* states,
                                                        CopyOpenFor opener) const;
  // Opens the copy of `file` read-only, unchecked, without symlinks
  // (DirectoryHandle::OpenBeneath): for a caller that checks what it is.
  absl::StatusOr<std::shared_ptr<ScopedFd>> OpenCopyFile(const FileRef& file) const {
    return directory_.OpenBeneath(file.name);
  }

  // Creates the parent directories of `name`'s copy and returns a fresh
  // temporary path next to it.
  absl::StatusOr<std::string> NewTemporary(absl::string_view name);

  // Gives the complete temporary the source's mtime and renames it over the
  // copy. The caller deletes the temporary if this fails.
  absl::Status Publish(const std::string& temporary, const FileRef& file);

  absl::Status Remove(absl::string_view name);

  // Walks the tree: visits every copy with the identity its trailer records
  // (null without a valid trailer), deletes temporaries whose writer
  // process is gone, leaves live writers' temporaries alone.
  absl::Status Scan(KeptCopies::CopyVisitor visit);

  // Reserved under the root, never a copy.
  static constexpr absl::string_view kReservedDirectory = ".monarch";
  static constexpr absl::string_view kTemporaryDirectory = ".monarch/tmp";
  // Under kReservedDirectory: copies of extents, named as the namespace
  // names them (".monarch/extents/...").
  static constexpr absl::string_view kExtentsDirectory = "extents";

 private:
  void RemoveDeadTemporaries();

  const std::string root_;
  const DirectoryHandle directory_;
  std::atomic<uint64_t> next_sequence_{0};
  std::atomic<bool> temporaries_ready_{false};
};

// A copy being written under a temporary name of a CopyTree: the temporary
// is deleted on destruction unless Publish() renamed it into place. Shared by
// the file-backed tiers' writers, which pass every chunk to Checksum() on
// its way in. Checksum() may be called concurrently for disjoint chunks;
// other calls are serialized by the owner.
class PendingCopy {
 public:
  PendingCopy(CopyTree* tree, const FileRef& file, std::string temporary)
      : tree_(tree), file_(file), temporary_(std::move(temporary)), sums_(file.size) {}
  ~PendingCopy();
  PendingCopy(const PendingCopy&) = delete;
  PendingCopy& operator=(const PendingCopy&) = delete;

  const FileRef& file() const { return file_; }
  const std::string& temporary() const { return temporary_; }
  std::string published_path() const { return tree_->PathOf(file_.name); }

  // Records the checksums of a chunk written at `offset`.
  absl::Status Checksum(uint64_t offset, const char* data, size_t n) {
    return sums_.Add(offset, data, n);
  }

  // Appends the trailer naming `source` through `fd` (the temporary, open
  // for writing), once every chunk is written.
  absl::Status WriteTrailer(int fd, const SourceIdentity& source);

  // CopyTree::Publish(); afterwards the destructor leaves the file alone.
  absl::Status Publish();

 private:
  CopyTree* const tree_;
  const FileRef file_;
  const std::string temporary_;
  BlockSums sums_;
  bool published_ = false;
};

// What a file tier reads its copies through: a bounded cache of open
// copies (placement.max_open_files descriptors, or mappings with `map`)
// over the tier's CopyStates, so that a copy whose handle was evicted is
// opened again without reading its trailer or checking its blocks again,
// as long as it is the same unchanged inode. Thread-safe.
//
// Readying ahead. A copy's first read costs more than the ones after it: it
// opens the copy, reads its trailer, maps it (pmem) and, with first-read,
// checks every block it touches. The tier does that work itself, in one
// background thread, soon after it publishes a copy (Published()) or adopts
// one an earlier run left (ReadyAhead()), so the first epoch that reads the
// copies finds them open and checked, like any later one. The check waits
// until the copy's ctime has settled (CopyState::Settled): a check made
// sooner could not be remembered.
class OpenCopies {
 public:
  OpenCopies(const CopyTree* tree, int max_open, bool map, VerifyPolicy verify)
      : tree_(tree), map_(map), verify_(verify), handles_(max_open) {}
  // Stops the background thread; copies still queued are left to their
  // first read.
  ~OpenCopies();
  OpenCopies(const OpenCopies&) = delete;
  OpenCopies& operator=(const OpenCopies&) = delete;

  // Reads the copy of `file` as CheckedCopy::Read does. A damaged copy
  // (DataLoss) is forgotten here; the caller drops it from the tier.
  absl::StatusOr<size_t> Read(const FileRef& file, uint64_t offset, char* dst, size_t n);

  // The copy of `id` was removed or replaced (a new copy published): its
  // handle and what was known of it go.
  void Forget(uint32_t id) {
    handles_.Erase(id);
    states_.Forget(id);
  }

  // A new copy of `file` was just published: forgets the old one's handle
  // and state (Forget), then ReadyAhead().
  void Published(const FileRef& file, bool check);

  // Queues the copy of `file` to be opened ahead of its first read. With
  // `check`, it is checked whole too (first-read), worth it when its bytes
  // are in memory: a copy written past the page cache, or left on the
  // device by an earlier run, is checked as it is read from there.
  void ReadyAhead(const FileRef& file, bool check);

  // CopyMapping::MarkMapped: the stamp of the copy of `file` if it was
  // checked whole (under verify off: opened), else nullopt, and the copy is
  // queued to be checked (ReadyAhead).
  std::optional<SourceIdentity> MarkMapped(const FileRef& file);

  // Blocks until every copy queued so far was readied (or given up).
  void WaitForReadying();

  // copy_opens, trailer_reads, blocks_verified, verified_state_bytes,
  // copies_readied_ahead.
  void ReportCounters(CounterSink& sink) const;

 private:
  struct Queued {
    uint32_t id = 0;
    std::string name;
    uint64_t size = 0;
    int64_t mtime_ns = 0;
    bool check = false;
  };
  // Queued copies beyond this many are left to their first read: a bound on
  // the queue's memory when copies are published faster than one thread
  // opens them.
  static constexpr size_t kMaxQueued = 1 << 16;

  void ReadyAheadLoop();
  void Ready(const Queued& queued, char* scratch, size_t scratch_bytes);

  const CopyTree* const tree_;
  const bool map_;
  const VerifyPolicy verify_;
  CopyStates states_;  // Before handles_: open copies point to it.
  HandleCache<CheckedCopy> handles_;
  std::atomic<uint64_t> readied_ahead_{0};
  Mutex ahead_mu_;
  CondVar ahead_changed_;
  std::deque<Queued> ahead_ ABSL_GUARDED_BY(ahead_mu_);
  CondVar ahead_idle_;  // Signalled when the queue empties and no copy is being readied.
  bool readying_ ABSL_GUARDED_BY(ahead_mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(ahead_mu_) = false;
  std::thread ahead_thread_ ABSL_GUARDED_BY(ahead_mu_);  // Started by the first ReadyAhead().
};

}  // namespace monarch

#endif  // MONARCH_DRIVERS_COPY_TREE_H_
