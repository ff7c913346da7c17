// Copy checksums: trailer format, writing and checked reads.

#include "drivers/copy_integrity.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/guarded_copy.h"
#include "common/os.h"
#include "common/status_macros.h"
#include "drivers/copy_lease.h"

namespace monarch {
namespace {

// Copies up to this size are asked of the device whole when a reader first
// opens them (CheckedCopy::Open): an ImageNet file, not a shard, of which a
// reader may want one record.
constexpr int64_t kWholeAtOpenBytes = 1 << 20;

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

// How long after a copy's ctime a check of its bytes may be remembered
// (CopyState::Settled). The kernel stamps ctime from the coarse clock, which
// lags the time by up to one of its ticks, so a change that begins more
// than two ticks after `ctime_ns` gets another ctime. A ctime without a
// fraction of a second is likely from a file system that keeps whole
// seconds (or two, FAT): two more seconds then. A nanosecond file system
// stamping exactly on the second only waits longer.
int64_t SettleNs(int64_t ctime_ns) {
  static const int64_t tick_ns = [] {
    struct timespec resolution;
    if (::clock_getres(CLOCK_REALTIME_COARSE, &resolution) != 0) return int64_t{10000000};
    return std::max<int64_t>(TimespecNanos(resolution), 1000000);
  }();
  const int64_t whole_seconds = ctime_ns % 1000000000 == 0 ? 2000000000 : 0;
  return 2 * tick_ns + whole_seconds;
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

CopyState::CopyState(const Stamp& stamp, CopyRecord record)
    : stamp_(stamp),
      record_(std::move(record)),
      settled_after_ns_(stamp.ctime_ns + SettleNs(stamp.ctime_ns)),
      verified_(new std::atomic<uint64_t>[(record_.sums.size() + 63) / 64]()) {}

void CopyState::MarkVerified(uint64_t first, uint64_t count) {
  for (uint64_t block = first; block < first + count; ++block) {
    verified_[block / 64].fetch_or(uint64_t{1} << (block % 64), std::memory_order_acq_rel);
  }
}

bool CopyState::AllVerified() const {
  const uint64_t blocks = record_.sums.size();
  for (uint64_t word = 0; word < blocks / 64; ++word) {
    if (verified_[word].load(std::memory_order_acquire) != ~uint64_t{0}) return false;
  }
  const uint64_t rest = blocks % 64;
  return rest == 0 || (verified_[blocks / 64].load(std::memory_order_acquire) &
                       ((uint64_t{1} << rest) - 1)) == ((uint64_t{1} << rest) - 1);
}

bool CopyState::Settled() {
  if (settled_.load(std::memory_order_acquire)) return true;
  struct timespec now;
  ::clock_gettime(CLOCK_REALTIME, &now);
  if (TimespecNanos(now) <= settled_after_ns_) return false;
  settled_.store(true, std::memory_order_release);
  return true;
}

int64_t CopyState::NsUntilSettled() const {
  struct timespec now;
  ::clock_gettime(CLOCK_REALTIME, &now);
  return std::max<int64_t>(0, settled_after_ns_ - TimespecNanos(now));
}

size_t CopyState::bytes() const {
  // The object, its checksums and bits, and what CopyStates spends on an
  // entry (list node, hash slot, shared_ptr control block), roughly.
  constexpr size_t kEntryOverhead = 96;
  return sizeof(CopyState) + record_.sums.capacity() * sizeof(uint32_t) +
         (record_.sums.size() + 63) / 64 * sizeof(uint64_t) + kEntryOverhead;
}

std::shared_ptr<CopyState> CopyStates::Find(uint32_t id, const CopyState::Stamp& stamp) {
  MutexLock lock(&mu_);
  auto it = index_.find(id);
  if (it == index_.end()) return nullptr;
  if (!(it->second->second->stamp() == stamp)) {
    // The copy changed or was replaced since: what was checked is of
    // another inode, or of other bytes.
    EraseLocked(it);
    return nullptr;
  }
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->second;
}

std::shared_ptr<CopyState> CopyStates::Peek(uint32_t id) const {
  MutexLock lock(&mu_);
  auto it = index_.find(id);
  return it == index_.end() ? nullptr : it->second->second;
}

void CopyStates::Keep(uint32_t id, std::shared_ptr<CopyState> state) {
  std::vector<std::shared_ptr<CopyState>> evicted;  // Freed after unlocking.
  MutexLock lock(&mu_);
  auto it = index_.find(id);
  if (it != index_.end()) {
    evicted.push_back(it->second->second);
    EraseLocked(it);
  }
  bytes_ += state->bytes();
  lru_.emplace_front(id, std::move(state));
  index_[id] = lru_.begin();
  while (bytes_ > budget_ && lru_.size() > 1) {
    evicted.push_back(lru_.back().second);
    EraseLocked(index_.find(lru_.back().first));
  }
}

void CopyStates::Forget(uint32_t id, const CopyState* state) {
  std::shared_ptr<CopyState> forgotten;
  MutexLock lock(&mu_);
  auto it = index_.find(id);
  if (it == index_.end() || (state != nullptr && it->second->second.get() != state)) return;
  forgotten = it->second->second;
  EraseLocked(it);
}

void CopyStates::EraseLocked(absl::flat_hash_map<uint32_t, Lru::iterator>::iterator it) {
  bytes_ -= it->second->second->bytes();
  lru_.erase(it->second);
  index_.erase(it);
}

void CopyStates::ReportCounters(CounterSink& sink) const {
  sink.Counter("copy_opens", opens_.load(std::memory_order_relaxed),
               "Copies opened for reading: a descriptor (and a mapping, pmem) each.");
  sink.Counter("trailer_reads", trailer_reads_.load(std::memory_order_relaxed),
               "Checksum trailers read at an open; a copy reopened unchanged since its trailer "
               "was read reuses it, and the blocks checked then.");
  sink.Counter("copy_leases", leased_.load(std::memory_order_relaxed),
               "Copies read under a read lease, taken at their open or a later read: the kernel "
               "tells this process before anyone writes to them, so their reads ask it nothing "
               "(the others: an fstat after each read under placement.verify first-read).");
  sink.Counter("blocks_verified", blocks_verified_.load(std::memory_order_relaxed),
               "4 KiB blocks of copies checked against their checksums.");
  uint64_t bytes;
  {
    MutexLock lock(&mu_);
    bytes = bytes_;
  }
  sink.Gauge("verified_state_bytes", bytes,
             "Memory keeping copies' checksums and checked blocks across reopens (bounded).");
}

CheckedCopy::CheckedCopy(std::shared_ptr<ScopedFd> fd, std::string path, const FileRef& file,
                         CopyStates* states)
    : fd_(std::move(fd)), path_(std::move(path)), id_(file.id), size_(file.size), states_(states) {}

CheckedCopy::~CheckedCopy() {
  if (mapping_ != nullptr) os::Munmap(const_cast<char*>(mapping_), size_);
}

absl::StatusOr<std::shared_ptr<CheckedCopy>> CheckedCopy::Open(std::shared_ptr<ScopedFd> fd,
                                                               const FileRef& file,
                                                               std::string path, bool map,
                                                               CopyStates* states,
                                                               CopyOpenFor opener) {
  std::shared_ptr<CheckedCopy> copy(
      new CheckedCopy(std::move(fd), std::move(path), file, states));
  states->CountOpen();
  const int descriptor = copy->fd_->get();
  // Before the fstat below: a write before the lease shows in it, and one
  // after breaks the lease (copy_lease.h).
  if (copy_lease::Take(descriptor)) {
    copy->leased_.store(true, std::memory_order_release);
    states->CountLeased();
  }
  struct stat opened;
  if (os::Fstat(descriptor, &opened) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("fstat ", copy->path_));
  }
  if (!S_ISREG(opened.st_mode)) {
    return absl::DataLossError(absl::StrCat(copy->path_, ": not a regular file"));
  }
  const CopyState::Stamp stamp = SourceIdentity::Of(opened);
  // The very inode whose trailer was read before, unchanged since: its size
  // was checked against the trailer then, and it has that size now.
  copy->state_ = states->Find(file.id, stamp);
  const bool found = copy->state_ != nullptr;
  if (!found) {
    states->CountTrailerRead();
    // A reader reads the trailer first, from the copy's end, and then the
    // bytes from its start: two reads from the device where a plain file
    // takes one, when the copy is not in the page cache (fresh DataLoader
    // workers after the cache was dropped: 2.02 device reads per file
    // against the local copy's 1.03, bench/results/posix_device_reads.md).
    // A small copy is asked for whole, in one request, before either read,
    // when its last page is not in the page cache: cachestat(2) tells and
    // reads nothing, one system call where the copy is cached (most opens);
    // a read that may not wait would start a read of that page by itself.
    // Where the kernel cannot tell (before 6.5), it asks anyway. Not when
    // readying: that reads no bytes of a copy it does not check (one
    // written past the page cache, or adopted from an earlier run).
    if (opener == CopyOpenFor::kRead && !map && opened.st_size > 0 &&
        opened.st_size <= kWholeAtOpenBytes) {
      uint64_t cached = 0;
      const uint64_t last = static_cast<uint64_t>(opened.st_size) - 1;
      if (os::Cachestat(descriptor, last, 1, &cached) != 0 || cached == 0) {
        os::Fadvise(descriptor, 0, 0, POSIX_FADV_WILLNEED);
      }
    }
    MONARCH_ASSIGN_OR_RETURN(
        CopyRecord record, ReadCopyRecord(descriptor, static_cast<uint64_t>(opened.st_size),
                                          copy->path_, file.size));
    copy->state_ = std::make_shared<CopyState>(stamp, std::move(record));
  }
  const SourceIdentity& source = copy->state_->record().source;
  if (source.size != file.size || source.mtime_ns != file.mtime_ns) {
    return absl::DataLossError(
        absl::StrCat(copy->path_, ": a copy of another version of the file (", source.size,
                     " bytes, the source file has ", file.size, ")"));
  }
  if (map && file.size > 0) {
    void* address = os::Mmap(nullptr, file.size, PROT_READ, MAP_SHARED, descriptor, 0);
    if (address == MAP_FAILED) return ErrnoToStatus(errno, absl::StrCat("map ", copy->path_));
    copy->mapping_ = static_cast<const char*>(address);
  }
  if (!found) states->Keep(file.id, copy->state_);
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

absl::Status CheckedCopy::Verify(uint64_t first, uint64_t count, const char* data,
                                 bool remember) {
  const std::vector<uint32_t>& sums = state_->record().sums;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t block = first + i;
    const uint64_t begin = block * kChecksumBlockBytes;
    const size_t length = std::min<uint64_t>(kChecksumBlockBytes, size_ - begin);
    if (Crc32c(data + i * kChecksumBlockBytes, length) != sums[block]) {
      states_->CountVerified(i + 1);
      return absl::DataLossError(absl::StrCat(path_, ": bytes ", begin, " to ", begin + length,
                                              " do not match their checksum"));
    }
  }
  states_->CountVerified(count);
  if (remember) state_->MarkVerified(first, count);
  return absl::OkStatus();
}

bool CheckedCopy::Unlinked() const {
  struct stat now;
  return os::Fstat(fd_->get(), &now) == 0 && now.st_nlink == 0;
}

bool CheckedCopy::Unchanged() {
  if (leased_.load(std::memory_order_acquire)) return !copy_lease::Broken(fd_->get());
  // No lease yet: try again at the 1st, 2nd, 4th, ... 1024th read. The
  // fstat below then covers the time before it, and only once it found the
  // copy unchanged do reads trust the lease alone. Another thread may have
  // set leased_ since the load above: TakeAgain keeps the mark of a break
  // of that lease, which its readers must still see.
  const uint32_t reads = reads_without_lease_.fetch_add(1, std::memory_order_relaxed) + 1;
  const bool retaken =
      (reads & (reads - 1)) == 0 && reads <= 1024 && copy_lease::TakeAgain(fd_->get());
  struct stat now;
  if (os::Fstat(fd_->get(), &now) != 0) return false;
  // The copy's state was made for this inode as Open() found it.
  const bool unchanged = static_cast<uint64_t>(now.st_size) == state_->stamp().size &&
                         TimespecNanos(now.st_ctim) == state_->stamp().ctime_ns;
  if (retaken && unchanged) {
    leased_.store(true, std::memory_order_release);
    states_->CountLeased();
  }
  return unchanged;
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
    for (uint64_t b = first; b <= last && !check; ++b) check = !state_->Verified(b);
  }
  // Decided before the bytes are fetched: a check counts for later reads
  // only if it began once the copy's ctime was settled.
  const bool remember = check && policy == VerifyPolicy::kFirstRead && state_->Settled();
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
      MONARCH_RETURN_IF_ERROR(Verify(first, 1, partial, remember));
      std::memcpy(dst, partial + (offset - begin), std::min<uint64_t>(end, begin + length) - offset);
      whole_first = first + 1;
    }
    if (last >= whole_first && end < block_end(last)) {
      const uint64_t begin = last * kChecksumBlockBytes;
      MONARCH_RETURN_IF_ERROR(Fetch(begin, partial, block_end(last) - begin));
      MONARCH_RETURN_IF_ERROR(Verify(last, 1, partial, remember));
      std::memcpy(dst + (begin - offset), partial, end - begin);
      whole_last = last;
    }
    if (whole_last > whole_first) {
      const uint64_t begin = whole_first * kChecksumBlockBytes;
      char* at = dst + (begin - offset);
      MONARCH_RETURN_IF_ERROR(Fetch(begin, at, block_end(whole_last - 1) - begin));
      MONARCH_RETURN_IF_ERROR(Verify(whole_first, whole_last - whole_first, at, remember));
    }
  }
  // Every-read checked the very bytes it returns; first-read trusts blocks
  // checked before only while the copy's inode is unchanged since it was
  // opened. A changed ctime is not proof of damage: another process that
  // shares the tier replacing the copy with its own (a rename over it)
  // unlinks this inode, which changes its ctime and nothing else. So the
  // handle stops trusting earlier checks instead: this read and every
  // later one check every block they return, and only a checksum mismatch
  // is damage. The kept state is of the inode as it was: a reopen would
  // not find it (its stamp no longer matches), so it is let go.
  if (policy == VerifyPolicy::kFirstRead && !Unchanged()) {
    distrusted_.store(true, std::memory_order_release);
    states_->Forget(id_, state_.get());
    return Read(offset, dst, n, VerifyPolicy::kEveryRead);
  }
  return n;
}

}  // namespace monarch
