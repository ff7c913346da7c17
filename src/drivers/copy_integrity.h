// Integrity of the file tiers' copies (posix, pmem): checksums written with
// each copy, checked when it is read, so that a copy damaged or altered
// behind Monarch's back is never served.
//
// Layout. A copy of an N-byte file is the N bytes, then a trailer: one
// CRC32C per 4 KiB block of the bytes, then a 64-byte footer holding the
// source's identity (device, inode, size, mtime, ctime) and a CRC of the
// trailer itself. In the copy's own file rather than a sidecar: it is
// renamed into place with the bytes in one step, costs no extra inode or
// open per file, and has no size limit (an extended attribute would).
// 0.1% of the bytes plus 64.
//
// Writing. The writer computes each block's CRC as the chunk passes through
// memory on its way into the copy (BlockSums), and Commit appends the
// trailer before the rename.
//
// Reading (CheckedCopy). Opening a copy checks what it is (a regular file
// reached without symlinks, of the size the trailer implies) and loads the
// trailer. A read then checks the blocks it touches against their CRCs, as
// the policy says:
// - first-read (the default): each block the first time this process reads
//   it (the tier that wrote a copy reads it once ahead of its readers, in
//   the background: OpenCopies in copy_tree.h), then, after every read, a
//   look at whether the copy was written or truncated in place since it was
//   opened: under a read lease, a mark the kernel's notice left before the
//   writer could go on (copy_lease.h; no system call), else an fstat(),
//   whose ctime or size changed (the kernel updates ctime before the
//   bytes). From
//   then on the handle checks every block of every read, this one
//   included, so altered bytes are caught by their checksums. (A ctime change alone is no proof: a copy that another
//   process sharing the tier replaced by its own was unlinked, and that
//   changes the ctime of the intact bytes.)
// - every-read: every block of every read, whatever the timestamps say.
// - off: no checksums at read; the identity is still checked at start-up.
// A mismatch is DataLoss: the read path drops the copy and serves the
// source (src/core/monarch_core.cc).
//
// What was checked outlives the descriptor (CopyState, CopyStates). A tier
// keeps a bounded number of copies open, and with many small files nearly
// every read would otherwise open its copy again, read its trailer again
// and check its blocks again. So the checksums and the set of blocks
// checked are kept per file, apart from the handle, with the copy's inode
// as fstat() saw it when its trailer was read (device, inode, size, mtime,
// ctime). A reopen whose fstat() gives the same five reuses them: no
// trailer read, no block checked twice. Whatever alters a copy changes one
// of them: writing or truncating it changes its ctime (restoring the mtime
// with utimensat, as `touch -r` does, changes the ctime too), and a file
// put in its place (a rename over it, a symlink, a FIFO) is another inode,
// or not a regular file, or not reachable without a symlink. Inode numbers
// are reused, but a new inode's ctime is its creation time, after the
// checks (see next).
//
// Timestamps are coarse: the kernel stamps ctime from a clock that ticks
// every few milliseconds, so a change made in the same tick as the copy's
// last one leaves its ctime as it was. A check is therefore remembered only
// if it began more than two ticks after the copy's ctime
// (CopyState::Settled); a change after such a check gets a later ctime.
// Until then first-read checks every block it reads, as every-read does.
// Beyond first-read: a process writing through a shared writable mapping
// of a copy, whose stores after the first one to a page leave the ctime
// alone until the page is written back; every-read checks the very bytes
// it returns.
//
// Start-up. A copy left by an earlier run is reused only when its trailer is
// intact and names the source file as the namespace walk found it (all of
// device, inode, size, mtime, ctime); its blocks are then checked as they
// are read, like any copy's.

#ifndef MONARCH_DRIVERS_COPY_INTEGRITY_H_
#define MONARCH_DRIVERS_COPY_INTEGRITY_H_

#include <sys/stat.h>

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/counters.h"
#include "common/file_util.h"
#include "common/mutex.h"
#include "drivers/storage_driver.h"

namespace monarch {

constexpr uint64_t kChecksumBlockBytes = 4096;

// Bytes the trailer adds to a copy of a `size`-byte file.
uint64_t CopyTrailerBytes(uint64_t size);

// The block checksums of a copy being written. Add() may be called
// concurrently for disjoint block ranges; sums() once they all returned.
class BlockSums {
 public:
  explicit BlockSums(uint64_t size);
  // `offset` is a multiple of kChecksumBlockBytes; `n` is too, unless the
  // range ends at the end of the file.
  absl::Status Add(uint64_t offset, const char* data, size_t n);
  // Every block had its Add().
  bool complete() const { return added_.load(std::memory_order_acquire) == sums_.size(); }
  // The sums, block by block, once complete(); leaves this object empty.
  std::vector<uint32_t> Take() { return std::move(sums_); }
  // The trailer for these sums, naming `source`.
  std::string Trailer(const SourceIdentity& source) const;

 private:
  const uint64_t size_;
  std::vector<uint32_t> sums_;
  std::atomic<uint64_t> added_{0};
};

// What a copy's trailer says.
struct CopyRecord {
  SourceIdentity source;
  std::vector<uint32_t> sums;
};

// Reads and checks the trailer of the open copy `fd` whose file is
// `disk_size` bytes, of a `size`-byte file if known. DataLoss if it is
// missing, cut short, damaged, or of another size.
absl::StatusOr<CopyRecord> ReadCopyRecord(int fd, uint64_t disk_size, absl::string_view path,
                                          std::optional<uint64_t> size = std::nullopt);

// What is known of one copy, shared by every handle opened on the same
// inode: its checksums, the blocks checked so far, and the inode as fstat()
// saw it when the trailer was read. Thread-safe.
class CopyState {
 public:
  // The copy's inode (not the source's), in the five fields a source's
  // identity has: what a reopen must find unchanged to reuse this state.
  using Stamp = SourceIdentity;

  CopyState(const Stamp& stamp, CopyRecord record);
  CopyState(const CopyState&) = delete;
  CopyState& operator=(const CopyState&) = delete;

  const Stamp& stamp() const { return stamp_; }
  const CopyRecord& record() const { return record_; }
  bool Verified(uint64_t block) const {
    return (verified_[block / 64].load(std::memory_order_acquire) >> (block % 64)) & 1;
  }
  void MarkVerified(uint64_t first, uint64_t count);
  // Every block of the copy was checked (and remembered: Settled()).
  bool AllVerified() const;
  // Whether a check that begins now may be remembered: the copy's ctime lies
  // far enough in the past that any change from now on gets another one
  // (see "Timestamps are coarse" above).
  bool Settled();
  // Nanoseconds until Settled() becomes true (0 once it is).
  int64_t NsUntilSettled() const;
  // Memory this state holds, for the budget of CopyStates.
  size_t bytes() const;

 private:
  const Stamp stamp_;
  const CopyRecord record_;
  const int64_t settled_after_ns_;  // Wall-clock time after which checks count.
  std::atomic<bool> settled_{false};
  std::unique_ptr<std::atomic<uint64_t>[]> verified_;  // One bit per block.
};

// The CopyStates of a file tier, by file id, and its checking counters.
// Thread-safe; looked up only when a copy is opened, not per read.
//
// Bounded. A state is a fixed part (about 230 bytes with its entry here)
// plus 4 bytes of checksum and one bit per 4 KiB block of its copy, about
// 0.1% of the copy's bytes: 344 bytes for a 110 KiB image, 66 KiB for a
// 64 MiB shard. The states kept here total at most `budget_bytes`, the
// least recently opened dropped first (a dropped state costs a trailer read
// and a check of each block again at its copy's next open, no more). An
// open handle holds its copy's state too, and open handles are bounded by
// placement.max_open_files. A copy found damaged, removed or replaced by a
// new one forgets its state, so a tier never keeps more than one per file.
class CopyStates {
 public:
  // 64 MiB: the states of about 60 GiB of large copies, or of 190,000 small
  // files of 110 KiB. Tiers holding more are mostly read from their device,
  // not the page cache, where reading a block costs more than checking it.
  static constexpr uint64_t kDefaultBudgetBytes = 64 << 20;

  explicit CopyStates(uint64_t budget_bytes = kDefaultBudgetBytes) : budget_(budget_bytes) {}

  // The state kept for `id` if it was made for an inode stamped `stamp`,
  // else null.
  std::shared_ptr<CopyState> Find(uint32_t id, const CopyState::Stamp& stamp);
  // The state kept for `id`, whatever inode it was made for; null if none.
  // Does not count as an open (the least recently opened go first still).
  std::shared_ptr<CopyState> Peek(uint32_t id) const;
  // Keeps `state` for `id`, replacing any other.
  void Keep(uint32_t id, std::shared_ptr<CopyState> state);
  // Forgets the state kept for `id` (only if it is `state`, when given).
  void Forget(uint32_t id, const CopyState* state = nullptr);

  void CountOpen() { opens_.fetch_add(1, std::memory_order_relaxed); }
  void CountTrailerRead() { trailer_reads_.fetch_add(1, std::memory_order_relaxed); }
  void CountLeased() { leased_.fetch_add(1, std::memory_order_relaxed); }
  void CountVerified(uint64_t blocks) {
    blocks_verified_.fetch_add(blocks, std::memory_order_relaxed);
  }
  // copy_opens, trailer_reads, blocks_verified, verified_state_bytes.
  void ReportCounters(CounterSink& sink) const;

 private:
  using Lru = std::list<std::pair<uint32_t, std::shared_ptr<CopyState>>>;
  void EraseLocked(absl::flat_hash_map<uint32_t, Lru::iterator>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t budget_;
  mutable Mutex mu_;
  Lru lru_ ABSL_GUARDED_BY(mu_);  // Most recently opened first.
  absl::flat_hash_map<uint32_t, Lru::iterator> index_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  alignas(64) std::atomic<uint64_t> opens_{0};
  std::atomic<uint64_t> trailer_reads_{0};
  std::atomic<uint64_t> leased_{0};
  alignas(64) std::atomic<uint64_t> blocks_verified_{0};
};

// Who opens a copy: a reader, who reads its bytes next, or the tier
// readying it ahead of any reader (OpenCopies::ReadyAhead), which reads no
// more of it than its trailer unless it checks it whole.
enum class CopyOpenFor { kRead, kReadying };

// An open, complete copy with its checksums: what the file tiers read
// through. Thread-safe.
class CheckedCopy {
 public:
  // Takes `fd`, a copy of `file` opened without following symlinks, and
  // checks it: a regular file whose trailer is intact and matches `file`'s
  // size and mtime. The trailer is read only when `states` keeps no state
  // for this very inode (CopyState::Stamp); the new state is kept there.
  // For a reader, a small copy whose trailer is read is asked of the device
  // whole first, so that its trailer and bytes come in one request. With
  // `map`, the bytes are also mapped (pmem). `states` must outlive the copy.
  static absl::StatusOr<std::shared_ptr<CheckedCopy>> Open(std::shared_ptr<ScopedFd> fd,
                                                           const FileRef& file, std::string path,
                                                           bool map, CopyStates* states,
                                                           CopyOpenFor opener);
  ~CheckedCopy();
  CheckedCopy(const CheckedCopy&) = delete;
  CheckedCopy& operator=(const CheckedCopy&) = delete;

  // Up to `n` bytes at `offset`, checked as `policy` says. DataLoss when the
  // bytes do not match their checksums or the copy shrank (under its
  // mapping, too).
  absl::StatusOr<size_t> Read(uint64_t offset, char* dst, size_t n, VerifyPolicy policy);

  const SourceIdentity& source() const { return state_->record().source; }
  // Whether the copy's file has no name left (removed while open).
  bool Unlinked() const;
  const CopyState& state() const { return *state_; }

 private:
  CheckedCopy(std::shared_ptr<ScopedFd> fd, std::string path, const FileRef& file,
              CopyStates* states);

  // The bytes [offset, offset + n) as stored, unchecked.
  absl::Status Fetch(uint64_t offset, char* dst, size_t n);
  // Checks blocks [first, first + count) held in `data` (starting at block
  // `first`'s offset) against their CRCs; with `remember`, marks them as
  // verified in the copy's state.
  absl::Status Verify(uint64_t first, uint64_t count, const char* data, bool remember);
  // Whether the copy is as Open() found it: its read lease unbroken, or
  // without one, fstat() giving the ctime and size of the state's stamp.
  bool Unchanged();

  const std::shared_ptr<ScopedFd> fd_;
  const std::string path_;
  const uint32_t id_;
  const uint64_t size_;
  CopyStates* const states_;
  std::shared_ptr<CopyState> state_;
  const char* mapping_ = nullptr;  // With `map`: the bytes.
  // Under a read lease (copy_lease.h): taken at Open(), or at a later read
  // if the kernel refused it then (the copy was still open for writing: a
  // pmem writer keeps its mapping for the promotion's readers).
  std::atomic<bool> leased_{false};
  std::atomic<uint32_t> reads_without_lease_{0};
  // The inode changed since Open(): first-read checks every block from now on.
  std::atomic<bool> distrusted_{false};
};

}  // namespace monarch

#endif  // MONARCH_DRIVERS_COPY_INTEGRITY_H_
