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
//   it, then an fstat() after every read: a copy written or truncated in
//   place since it was opened changed its ctime or size (the kernel updates
//   ctime before the bytes). From then on the handle checks every block of
//   every read, this one included, so altered bytes are caught by their
//   checksums. (A ctime change alone is no proof: a copy that another
//   process sharing the tier replaced by its own was unlinked, and that
//   changes the ctime of the intact bytes.)
// - every-read: every block of every read, whatever the timestamps say.
// - off: no checksums at read; the identity is still checked at start-up.
// A mismatch is DataLoss: the read path drops the copy and serves the
// source (src/monarch.cc).
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
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/file_util.h"
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

// An open, complete copy with its checksums: what the file tiers read
// through. Thread-safe.
class CheckedCopy {
 public:
  // Takes `fd`, a copy of `file` opened without following symlinks, and
  // checks it: a regular file whose trailer is intact and matches `file`'s
  // size and mtime. With `map`, the bytes are also mapped (pmem).
  static absl::StatusOr<std::shared_ptr<CheckedCopy>> Open(std::shared_ptr<ScopedFd> fd,
                                                           const FileRef& file, std::string path,
                                                           bool map);
  ~CheckedCopy();
  CheckedCopy(const CheckedCopy&) = delete;
  CheckedCopy& operator=(const CheckedCopy&) = delete;

  // Up to `n` bytes at `offset`, checked as `policy` says. DataLoss when the
  // bytes do not match their checksums or the copy shrank (under its
  // mapping, too).
  absl::StatusOr<size_t> Read(uint64_t offset, char* dst, size_t n, VerifyPolicy policy);

  const SourceIdentity& source() const { return record_.source; }

 private:
  CheckedCopy(std::shared_ptr<ScopedFd> fd, std::string path, uint64_t size);

  // The bytes [offset, offset + n) as stored, unchecked.
  absl::Status Fetch(uint64_t offset, char* dst, size_t n);
  // Checks blocks [first, first + count) held in `data` (starting at block
  // `first`'s offset) against their CRCs and remembers them as verified.
  absl::Status Verify(uint64_t first, uint64_t count, const char* data);
  bool Verified(uint64_t block) const;
  // Whether fstat() still gives the ctime and size seen at Open().
  bool Unchanged() const;

  const std::shared_ptr<ScopedFd> fd_;
  const std::string path_;
  const uint64_t size_;
  CopyRecord record_;
  struct stat opened_ = {};                       // What fstat() said at Open().
  const char* mapping_ = nullptr;                 // With `map`: the bytes.
  std::unique_ptr<std::atomic<uint64_t>[]> verified_;  // One bit per block.
  // The inode changed since Open(): first-read checks every block from now on.
  std::atomic<bool> distrusted_{false};
};

}  // namespace monarch

#endif  // MONARCH_DRIVERS_COPY_INTEGRITY_H_
