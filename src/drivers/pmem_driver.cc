// pmem tier: copies on persistent memory through libpmem.
//
// Each copy is a file on the tier's path (a DAX mount on real hardware; any
// directory, such as /dev/shm, for testing), created and mapped with
// pmem_map_file and filled with libpmem's persistent copies (or memcpy +
// msync when the mapping is not real persistent memory); its checksum
// trailer (copy_integrity.h) follows the bytes. Reads copy straight out of a
// mapping, guarded against the file shrinking under it; mappings are cached
// and bounded like descriptors elsewhere, since mapping every file would
// exhaust vm.max_map_count on large datasets.

#include <fcntl.h>
#include <libpmem.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/guarded_copy.h"
#include "common/os.h"
#include "common/process_mappings.h"
#include "common/status_macros.h"
#include "drivers/copy_tree.h"
#include "drivers/file_tier_driver.h"
#include "drivers/storage_driver.h"

namespace monarch {
namespace {

class Mapping {
 public:
  Mapping(void* address, size_t length) : address_(address), length_(length) {}
  ~Mapping() {
    if (address_ != nullptr) pmem_unmap(address_, length_);
  }
  Mapping(Mapping&& other) noexcept
      : address_(std::exchange(other.address_, nullptr)), length_(other.length_) {}
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  const char* data() const { return static_cast<const char*>(address_); }
  char* mutable_data() { return static_cast<char*>(address_); }
  size_t length() const { return length_; }

 private:
  void* address_;
  size_t length_;
};

absl::Status PmemError(absl::string_view what, const std::string& path) {
  int saved = errno;
  absl::Status status = ErrnoToStatus(saved != 0 ? saved : EIO, absl::StrCat(what, " ", path));
  return absl::Status(status.code(), absl::StrCat(status.message(), " (", pmem_errormsg(), ")"));
}

class PmemDriver final : public FileTierDriver {
 public:
  PmemDriver(const std::string& root, int max_open_files, VerifyPolicy verify)
      : FileTierDriver(root, std::min(max_open_files, MappingBudget()), /*map=*/true, verify,
                       /*check_adopted=*/true) {}

  absl::StatusOr<std::unique_ptr<CopyWriter>> NewWriter(const FileRef& file) override {
    MONARCH_ASSIGN_OR_RETURN(std::string temporary, tree().NewTemporary(file.name));
    void* address = nullptr;
    size_t length = 0;
    int is_pmem = 0;
    if (file.size == 0) {
      // pmem_map_file cannot create an empty mapping; an empty file needs none.
      int fd = os::Open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("create ", temporary));
      os::Close(fd);
    } else {
      errno = 0;
      address = pmem_map_file(temporary.c_str(), file.size, PMEM_FILE_CREATE | PMEM_FILE_EXCL, 0644,
                              &length, &is_pmem);
      if (address == nullptr) {
        absl::Status status = PmemError("create", temporary);
        os::Unlink(temporary.c_str());
        return status;
      }
    }
    return std::unique_ptr<CopyWriter>(
        new Writer(this, file, std::move(temporary), Mapping(address, length), is_pmem != 0));
  }

 private:
  // Copies chunks into a mapping of the temporary file: with the persistent
  // memcpy when the mapping is real persistent memory, else memcpy plus
  // msync at commit.
  class Writer final : public CopyWriter {
   public:
    Writer(PmemDriver* driver, const FileRef& file, std::string temporary, Mapping mapping,
           bool is_pmem)
        : driver_(driver),
          copy_(&driver->tree(), file, std::move(temporary)),
          mapping_(std::move(mapping)),
          is_pmem_(is_pmem) {}

    absl::Status Write(uint64_t offset, const char* data, size_t n) override {
      if (offset + n > mapping_.length())
        return absl::OutOfRangeError("write past the end of the file");
      MONARCH_RETURN_IF_ERROR(copy_.Checksum(offset, data, n));
      // The temporary, and after Commit the published copy, is a file any
      // process of the user may truncate under the mapping: every access
      // is guarded against SIGBUS.
      char* dst = mapping_.mutable_data() + offset;
      if (!GuardedCopy(dst, data, n)) {
        return absl::DataLossError(absl::StrCat(copy_.temporary(), ": truncated while written"));
      }
      if (is_pmem_) pmem_flush(dst, n);  // pmem_drain() at Commit.
      return absl::OkStatus();
    }

    // Readers of a promotion read written chunks back from here, also after
    // Commit published the copy.
    absl::StatusOr<size_t> ReadBack(uint64_t offset, char* dst, size_t n) override {
      if (offset >= copy_.file().size) return 0;
      const size_t count = std::min<uint64_t>(n, copy_.file().size - offset);
      if (!GuardedCopy(dst, mapping_.data() + offset, count)) {
        return absl::DataLossError(
            absl::StrCat(copy_.temporary(), ": the copy shrank while mapped"));
      }
      return count;
    }

    absl::Status Commit(const SourceIdentity& source) override {
      if (mapping_.length() > 0) {
        if (is_pmem_) {
          pmem_drain();
        } else if (pmem_msync(mapping_.mutable_data(), mapping_.length()) != 0) {
          return PmemError("msync", copy_.temporary());
        }
      }
      // The trailer lies past the mapping, which covers the bytes only.
      ScopedFd fd(os::Open(copy_.temporary().c_str(), O_WRONLY | O_CLOEXEC));
      if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("open ", copy_.temporary()));
      MONARCH_RETURN_IF_ERROR(copy_.WriteTrailer(fd.get(), source));
      if (os::Close(fd.release()) != 0)
        return ErrnoToStatus(errno, absl::StrCat("close ", copy_.temporary()));
      MONARCH_RETURN_IF_ERROR(copy_.Publish());
      // Neither a mapping of an older copy nor what was checked of it may be
      // reused.
      driver_->copies().Published(copy_.file(), /*check=*/true);
      return absl::OkStatus();
    }

   private:
    PmemDriver* const driver_;
    PendingCopy copy_;
    Mapping mapping_;
    const bool is_pmem_;
  };
};

}  // namespace

std::unique_ptr<StorageDriver> NewPmemDriver(const std::string& root, int max_open_files,
                                             VerifyPolicy verify) {
  return std::make_unique<PmemDriver>(root, max_open_files, verify);
}

}  // namespace monarch
