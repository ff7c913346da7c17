// Copy checksums: trailer format, writing and checked reads.

#include "drivers/copy_integrity.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/guarded_copy.h"
#include "common/os.h"
#include "common/status_macros.h"

namespace monarch {
namespace {

// The footer, in host byte order: copies never leave the node.
constexpr char kMagic[8] = {'M', 'O', 'N', 'C', 'O', 'P', 'Y', '1'};
struct Footer {
  char magic[8];
  uint32_t block_bytes;
  uint32_t reserved;
  uint64_t device;
  uint64_t inode;
  uint64_t size;
  int64_t mtime_ns;
  int64_t ctime_ns;
  uint32_t sums_crc;    // Of the block CRCs before the footer.
  uint32_t footer_crc;  // Of the footer's bytes before this field.
};
static_assert(sizeof(Footer) == 64, "the footer's layout is part of the copy format");

uint64_t BlockCount(uint64_t size) { return (size + kChecksumBlockBytes - 1) / kChecksumBlockBytes; }

bool SameTime(const struct timespec& a, const struct timespec& b) {
  return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

}  // namespace

uint64_t CopyTrailerBytes(uint64_t size) { return BlockCount(size) * sizeof(uint32_t) + sizeof(Footer); }

BlockSums::BlockSums(uint64_t size) : size_(size), sums_(BlockCount(size)) {}

absl::Status BlockSums::Add(uint64_t offset, const char* data, size_t n) {
  if (offset % kChecksumBlockBytes != 0 || offset + n > size_ ||
      (n % kChecksumBlockBytes != 0 && offset + n != size_)) {
    return absl::InternalError(
        absl::StrCat("copy write of ", n, " bytes at ", offset, " is not block-aligned"));
  }
  const uint64_t first = offset / kChecksumBlockBytes;
  const uint64_t count = BlockCount(n);
  for (uint64_t b = 0; b < count; ++b) {
    const size_t length = std::min<uint64_t>(kChecksumBlockBytes, n - b * kChecksumBlockBytes);
    sums_[first + b] = Crc32c(data + b * kChecksumBlockBytes, length);
  }
  added_.fetch_add(count, std::memory_order_acq_rel);
  return absl::OkStatus();
}

std::string BlockSums::Trailer(const SourceIdentity& source) const {
  const size_t sums_bytes = sums_.size() * sizeof(uint32_t);
  std::string trailer(sums_bytes + sizeof(Footer), '\0');
  if (sums_bytes > 0) std::memcpy(trailer.data(), sums_.data(), sums_bytes);
  Footer footer = {};
  std::memcpy(footer.magic, kMagic, sizeof(kMagic));
  footer.block_bytes = kChecksumBlockBytes;
  footer.device = source.device;
  footer.inode = source.inode;
  footer.size = source.size;
  footer.mtime_ns = source.mtime_ns;
  footer.ctime_ns = source.ctime_ns;
  footer.sums_crc = Crc32c(trailer.data(), sums_bytes);
  footer.footer_crc = Crc32c(&footer, offsetof(Footer, footer_crc));
  std::memcpy(trailer.data() + sums_bytes, &footer, sizeof(footer));
  return trailer;
}

absl::StatusOr<CopyRecord> ReadCopyRecord(int fd, uint64_t disk_size, absl::string_view path,
                                          std::optional<uint64_t> size) {
  auto damaged = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(path, ": ", why));
  };
  if (disk_size < sizeof(Footer)) return damaged("no checksum record (too short)");
  // With the file's size known, the whole trailer comes in one read: a copy
  // opened for reading costs one system call more than a plain file, not two.
  const uint64_t bytes_size = size.value_or(disk_size - sizeof(Footer));
  if (size.has_value() && disk_size != *size + CopyTrailerBytes(*size)) {
    return damaged(absl::StrCat(disk_size, " bytes on disk, a copy of ", *size, " bytes has ",
                                *size + CopyTrailerBytes(*size)));
  }
  std::string trailer(size.has_value() ? CopyTrailerBytes(*size) : sizeof(Footer), '\0');
  MONARCH_ASSIGN_OR_RETURN(size_t got, PreadFull(fd, trailer.data(), trailer.size(),
                                                 disk_size - trailer.size(), path));
  if (got != trailer.size()) return damaged("checksum record cut short");
  Footer footer;
  std::memcpy(&footer, trailer.data() + trailer.size() - sizeof(Footer), sizeof(Footer));
  if (std::memcmp(footer.magic, kMagic, sizeof(kMagic)) != 0) return damaged("no checksum record");
  if (footer.footer_crc != Crc32c(&footer, offsetof(Footer, footer_crc))) {
    return damaged("checksum record damaged");
  }
  if (footer.block_bytes != kChecksumBlockBytes) return damaged("unknown checksum block size");
  if (footer.size != bytes_size && size.has_value()) {
    return damaged(absl::StrCat("a copy of a ", footer.size, "-byte file, not ", *size));
  }
  if (disk_size != footer.size + CopyTrailerBytes(footer.size)) {
    return damaged(absl::StrCat(disk_size, " bytes on disk, the record implies ",
                                footer.size + CopyTrailerBytes(footer.size)));
  }
  CopyRecord record;
  record.source.device = footer.device;
  record.source.inode = footer.inode;
  record.source.size = footer.size;
  record.source.mtime_ns = footer.mtime_ns;
  record.source.ctime_ns = footer.ctime_ns;
  record.sums.resize(BlockCount(footer.size));
  const size_t sums_bytes = record.sums.size() * sizeof(uint32_t);
  if (size.has_value()) {
    if (sums_bytes > 0) std::memcpy(record.sums.data(), trailer.data(), sums_bytes);
  } else if (sums_bytes > 0) {
    MONARCH_ASSIGN_OR_RETURN(got, PreadFull(fd, reinterpret_cast<char*>(record.sums.data()),
                                            sums_bytes, footer.size, path));
    if (got != sums_bytes) return damaged("checksum record cut short");
  }
  if (Crc32c(record.sums.data(), sums_bytes) != footer.sums_crc) {
    return damaged("block checksums damaged");
  }
  return record;
}

CheckedCopy::CheckedCopy(std::shared_ptr<ScopedFd> fd, std::string path, uint64_t size)
    : fd_(std::move(fd)), path_(std::move(path)), size_(size) {}

CheckedCopy::~CheckedCopy() {
  if (mapping_ != nullptr) os::Munmap(const_cast<char*>(mapping_), size_);
}

absl::StatusOr<std::shared_ptr<CheckedCopy>> CheckedCopy::Open(std::shared_ptr<ScopedFd> fd,
                                                               const FileRef& file,
                                                               std::string path, bool map) {
  std::shared_ptr<CheckedCopy> copy(new CheckedCopy(std::move(fd), std::move(path), file.size));
  const int descriptor = copy->fd_->get();
  if (os::Fstat(descriptor, &copy->opened_) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("fstat ", copy->path_));
  }
  if (!S_ISREG(copy->opened_.st_mode)) {
    return absl::DataLossError(absl::StrCat(copy->path_, ": not a regular file"));
  }
  MONARCH_ASSIGN_OR_RETURN(copy->record_,
                           ReadCopyRecord(descriptor, static_cast<uint64_t>(copy->opened_.st_size),
                                          copy->path_, file.size));
  if (copy->record_.source.size != file.size || copy->record_.source.mtime_ns != file.mtime_ns) {
    return absl::DataLossError(
        absl::StrCat(copy->path_, ": a copy of another version of the file (", 
                     copy->record_.source.size, " bytes, the source file has ", file.size, ")"));
  }
  copy->verified_.reset(new std::atomic<uint64_t>[(copy->record_.sums.size() + 63) / 64]());
  if (map && file.size > 0) {
    void* address = os::Mmap(nullptr, file.size, PROT_READ, MAP_SHARED, descriptor, 0);
    if (address == MAP_FAILED) return ErrnoToStatus(errno, absl::StrCat("map ", copy->path_));
    copy->mapping_ = static_cast<const char*>(address);
  }
  return copy;
}

absl::Status CheckedCopy::Fetch(uint64_t offset, char* dst, size_t n) {
  if (mapping_ != nullptr) {
    if (!GuardedCopy(dst, mapping_ + offset, n)) {
      return absl::DataLossError(absl::StrCat(path_, ": the copy shrank while mapped"));
    }
    return absl::OkStatus();
  }
  MONARCH_ASSIGN_OR_RETURN(size_t got, PreadFull(fd_->get(), dst, n, offset, path_));
  if (got != n) {
    return absl::DataLossError(absl::StrCat(path_, ": only ", got, " of ", n, " bytes at ",
                                            offset, ": the copy shrank"));
  }
  return absl::OkStatus();
}

bool CheckedCopy::Verified(uint64_t block) const {
  return (verified_[block / 64].load(std::memory_order_acquire) >> (block % 64)) & 1;
}

absl::Status CheckedCopy::Verify(uint64_t first, uint64_t count, const char* data) {
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t block = first + i;
    const uint64_t begin = block * kChecksumBlockBytes;
    const size_t length = std::min<uint64_t>(kChecksumBlockBytes, size_ - begin);
    if (Crc32c(data + i * kChecksumBlockBytes, length) != record_.sums[block]) {
      return absl::DataLossError(absl::StrCat(path_, ": bytes ", begin, " to ", begin + length,
                                              " do not match their checksum"));
    }
    verified_[block / 64].fetch_or(uint64_t{1} << (block % 64), std::memory_order_acq_rel);
  }
  return absl::OkStatus();
}

bool CheckedCopy::Unchanged() const {
  struct stat now;
  if (os::Fstat(fd_->get(), &now) != 0) return false;
  return now.st_size == opened_.st_size && SameTime(now.st_ctim, opened_.st_ctim);
}

absl::StatusOr<size_t> CheckedCopy::Read(uint64_t offset, char* dst, size_t n,
                                         VerifyPolicy policy) {
  if (offset >= size_ || n == 0) return 0;
  n = static_cast<size_t>(std::min<uint64_t>(n, size_ - offset));
  const uint64_t first = offset / kChecksumBlockBytes;
  const uint64_t last = (offset + n - 1) / kChecksumBlockBytes;
  if (policy == VerifyPolicy::kFirstRead && distrusted_.load(std::memory_order_acquire)) {
    policy = VerifyPolicy::kEveryRead;
  }
  bool check = policy == VerifyPolicy::kEveryRead;
  if (policy == VerifyPolicy::kFirstRead) {
    for (uint64_t b = first; b <= last && !check; ++b) check = !Verified(b);
  }
  if (!check) {
    MONARCH_RETURN_IF_ERROR(Fetch(offset, dst, n));
  } else {
    // Blocks the read covers wholly are fetched into `dst` and checked
    // there; a block it covers in part (at most one at each end) goes
    // through a block-sized buffer, so only whole blocks are ever checked.
    const uint64_t end = offset + n;
    auto block_end = [&](uint64_t b) {
      return std::min<uint64_t>(size_, (b + 1) * kChecksumBlockBytes);
    };
    uint64_t whole_first = first;
    uint64_t whole_last = last + 1;  // Exclusive.
    alignas(64) char partial[kChecksumBlockBytes];
    if (offset % kChecksumBlockBytes != 0 || end < block_end(first)) {
      const uint64_t begin = first * kChecksumBlockBytes;
      const size_t length = block_end(first) - begin;
      MONARCH_RETURN_IF_ERROR(Fetch(begin, partial, length));
      MONARCH_RETURN_IF_ERROR(Verify(first, 1, partial));
      std::memcpy(dst, partial + (offset - begin), std::min<uint64_t>(end, begin + length) - offset);
      whole_first = first + 1;
    }
    if (last >= whole_first && end < block_end(last)) {
      const uint64_t begin = last * kChecksumBlockBytes;
      MONARCH_RETURN_IF_ERROR(Fetch(begin, partial, block_end(last) - begin));
      MONARCH_RETURN_IF_ERROR(Verify(last, 1, partial));
      std::memcpy(dst + (begin - offset), partial, end - begin);
      whole_last = last;
    }
    if (whole_last > whole_first) {
      const uint64_t begin = whole_first * kChecksumBlockBytes;
      char* at = dst + (begin - offset);
      MONARCH_RETURN_IF_ERROR(Fetch(begin, at, block_end(whole_last - 1) - begin));
      MONARCH_RETURN_IF_ERROR(Verify(whole_first, whole_last - whole_first, at));
    }
  }
  // Every-read checked the very bytes it returns; first-read trusts blocks
  // checked before only while the copy's inode is unchanged since it was
  // opened. A changed ctime is not proof of damage: another process that
  // shares the tier replacing the copy with its own (a rename over it)
  // unlinks this inode, which changes its ctime and nothing else. So the
  // handle stops trusting its earlier checks instead: this read and every
  // later one check every block they return, and only a checksum mismatch
  // is damage.
  if (policy == VerifyPolicy::kFirstRead && !Unchanged()) {
    distrusted_.store(true, std::memory_order_release);
    return Read(offset, dst, n, VerifyPolicy::kEveryRead);
  }
  return n;
}

}  // namespace monarch
