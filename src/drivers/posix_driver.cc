// posix tier: copies in a local directory (NVMe/SSD), read with pread.
//
// Descriptors are cached (bounded) so a file read in many calls, such as a
// TFRecord shard, is opened once, and the total number of open descriptors
// stays bounded whatever the number of files. A copy opened again after its
// descriptor left the cache reuses its checksums and checked blocks
// (OpenCopies, copy_tree.h).
//
// Copies are written through the page cache by default, so the next epoch
// reads a copy just written from memory: as fast as the page-cached source it
// came from. Copies written with O_DIRECT go straight to the device and the
// epoch after reads them from there (measured: epoch 2 of 16 MiB files from
// direct-written copies took 5.8x plain reads of a page-cached source). Direct
// writes are for data that cannot stay cached anyway: in "auto" mode, files
// of 1 MiB and more once the buffered budget is used up.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/mutex.h"
#include "common/os.h"
#include "common/status_macros.h"
#include "drivers/copy_tree.h"
#include "drivers/file_tier_driver.h"
#include "drivers/storage_driver.h"

namespace monarch {
namespace {

constexpr size_t kPage = 4096;
// Files from this size on may be written with O_DIRECT. Below it the per-call
// cost of direct I/O (pinning pages, a synchronous device write, padding the
// tail) outweighs the page-cache copy it saves: measured on 110 KiB files,
// direct writes took more system time than buffered ones, while for 64 MiB
// shards they took less.
constexpr uint64_t kDirectMinBytes = 1 << 20;

class PosixDriver final : public FileTierDriver {
 public:
  // Adopted copies are opened ahead but not checked: after a restart their
  // bytes may be on the device only, and checking them ahead would read
  // them from there once more than their readers do.
  PosixDriver(const std::string& root, int max_open_files, const PosixWriteOptions& options)
      : FileTierDriver(root, max_open_files, /*map=*/false, options.verify,
                       /*check_adopted=*/false),
        options_(options) {}

  absl::StatusOr<std::unique_ptr<CopyWriter>> NewWriter(const FileRef& file) override {
    MONARCH_ASSIGN_OR_RETURN(std::string temporary, tree().NewTemporary(file.name));
    const int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC;
    int fd = -1;
    if (WantDirect(file.size)) {
      fd = os::Open(temporary.c_str(), flags | O_DIRECT, 0644);
      if (fd < 0 && errno != EINVAL)
        return ErrnoToStatus(errno, absl::StrCat("create ", temporary));
    }
    const bool direct = fd >= 0;
    if (!direct) fd = os::Open(temporary.c_str(), flags, 0644);
    if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("create ", temporary));
    if (direct) {
      // Direct writes bypass delayed allocation, so two files written at once
      // would interleave their blocks and read back slower. Allocating the
      // whole file first keeps it contiguous, and a full device fails here,
      // before any byte is copied.
      int error = os::PosixFallocate(fd, 0, static_cast<off_t>(file.size));
      if (error != 0 && error != EOPNOTSUPP && error != EINVAL) {
        os::Close(fd);
        os::Unlink(temporary.c_str());
        return ErrnoToStatus(error, absl::StrCat("allocate ", temporary));
      }
    } else {
      buffered_bytes_.fetch_add(file.size, std::memory_order_relaxed);
    }
    return std::unique_ptr<CopyWriter>(
        new Writer(this, file, std::move(temporary), ScopedFd(fd), direct));
  }

 private:
  bool WantDirect(uint64_t size) const {
    if (size < kDirectMinBytes) return false;
    switch (options_.mode) {
      case PosixWriteOptions::Mode::kBuffered:
        return false;
      case PosixWriteOptions::Mode::kDirect:
        return true;
      case PosixWriteOptions::Mode::kAuto:
        return buffered_bytes_.load(std::memory_order_relaxed) + size >
               options_.buffered_budget_bytes;
    }
    return false;
  }

  // A direct writer writes whole pages (chunks are page-aligned and padded)
  // and cuts the file to its real size on Commit(). If the device refuses the
  // alignment it goes on with a buffered descriptor. Small files, file systems
  // without O_DIRECT (tmpfs) and buffered copies use buffered writes.
  class Writer final : public CopyWriter {
   public:
    Writer(PosixDriver* driver, const FileRef& file, std::string temporary, ScopedFd fd,
           bool direct)
        : driver_(driver),
          copy_(&driver->tree(), file, std::move(temporary)),
          fd_(std::move(fd)),
          direct_(direct) {}

    absl::Status Write(uint64_t offset, const char* data, size_t n) override {
      MONARCH_RETURN_IF_ERROR(copy_.Checksum(offset, data, n));
      if (direct_ && !fell_back_.load(std::memory_order_acquire)) {
        const size_t padded = (n + kPage - 1) / kPage * kPage;
        absl::Status written = PwriteFull(fd_.get(), data, padded, offset, copy_.temporary());
        if (!absl::IsInvalidArgument(written)) {
          if (padded != n) padded_.store(true, std::memory_order_relaxed);
          return written;
        }
        MONARCH_RETURN_IF_ERROR(FallBackToBuffered());
      }
      return PwriteFull(buffered_fd(), data, n, offset, copy_.temporary());
    }

    absl::StatusOr<size_t> ReadBack(uint64_t offset, char* dst, size_t n) override {
      // Its own buffered descriptor: O_DIRECT reads would need aligned buffers.
      std::call_once(reader_once_, [&] {
        reader_ = OpenForRead(copy_.temporary());
        // While a reader holds this writer the temporary is only ever gone
        // because Commit() renamed it: the published copy is the same file.
        if (!reader_.ok()) reader_ = OpenForRead(copy_.published_path());
      });
      if (!reader_.ok()) return reader_.status();
      const uint64_t end = std::min<uint64_t>(offset + n, copy_.file().size);
      if (offset >= end) return 0;
      return PreadFull(reader_->get(), dst, end - offset, offset, copy_.temporary());
    }

    absl::Status Commit(const SourceIdentity& source) override {
      if (padded_.load(std::memory_order_relaxed) &&
          os::Ftruncate(fd_.get(), static_cast<off_t>(copy_.file().size)) != 0) {
        return ErrnoToStatus(errno, absl::StrCat("truncate ", copy_.temporary()));
      }
      // The trailer goes through a buffered descriptor: it is neither
      // aligned nor a whole page.
      if (direct_) MONARCH_RETURN_IF_ERROR(FallBackToBuffered());
      MONARCH_RETURN_IF_ERROR(copy_.WriteTrailer(buffered_fd(), source));
      // close() reports deferred write errors on some file systems (NFS).
      if (os::Close(fd_.release()) != 0)
        return ErrnoToStatus(errno, absl::StrCat("close ", copy_.temporary()));
      if (buffered_.valid() && os::Close(buffered_.release()) != 0)
        return ErrnoToStatus(errno, absl::StrCat("close ", copy_.temporary()));
      MONARCH_RETURN_IF_ERROR(copy_.Publish());
      // Neither a handle on an older copy nor what was checked of it may be
      // reused. A direct-written copy is not in the page cache: checking it
      // ahead would read it from the device once more than its readers do.
      driver_->copies().Published(copy_.file(), /*check=*/!direct_);
      return absl::OkStatus();
    }

   private:
    // The descriptor for buffered writes: the creating one, unless that one
    // is direct and the device refused an aligned write.
    int buffered_fd() const {
      return fell_back_.load(std::memory_order_acquire) ? buffered_.get() : fd_.get();
    }

    absl::Status FallBackToBuffered() {
      MutexLock lock(&fallback_mu_);
      if (fell_back_.load(std::memory_order_relaxed)) return absl::OkStatus();
      int fd = os::Open(copy_.temporary().c_str(), O_WRONLY | O_CLOEXEC);
      if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", copy_.temporary()));
      buffered_ = ScopedFd(fd);
      fell_back_.store(true, std::memory_order_release);
      return absl::OkStatus();
    }

    PosixDriver* const driver_;
    PendingCopy copy_;
    ScopedFd fd_;
    const bool direct_;
    Mutex fallback_mu_;
    ScopedFd buffered_;  // Set once, under fallback_mu_, before fell_back_.
    std::atomic<bool> fell_back_{false};
    std::atomic<bool> padded_{false};
    std::once_flag reader_once_;
    absl::StatusOr<ScopedFd> reader_ = absl::UnknownError("not opened");
  };

  const PosixWriteOptions options_;
  std::atomic<uint64_t> buffered_bytes_{0};  // Of copies started with buffered writes.
};

}  // namespace

std::unique_ptr<StorageDriver> NewPosixDriver(const std::string& root, int max_open_files,
                                              const PosixWriteOptions& options) {
  return std::make_unique<PosixDriver>(root, max_open_files, options);
}

}  // namespace monarch
