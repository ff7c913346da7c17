// pmem tier: copies on persistent memory through libpmem.
//
// Each copy is a file on the tier's path (a DAX mount on real hardware; any
// directory, such as /dev/shm, for testing), created and mapped with
// pmem_map_file and filled with pmem_memcpy_persist (or memcpy + msync when
// the mapping is not real persistent memory). Reads copy straight out of a
// mapping; mappings are cached and bounded like descriptors elsewhere, since
// mapping every file would exhaust vm.max_map_count on large datasets.

#include <fcntl.h>
#include <libpmem.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/handle_cache.h"
#include "common/status_macros.h"
#include "drivers/copy_tree.h"
#include "drivers/storage_driver.h"

namespace monarch {
namespace {

class Mapping {
 public:
  Mapping(void* address, size_t length) : address_(address), length_(length) {}
  ~Mapping() {
    if (address_ != nullptr) pmem_unmap(address_, length_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  const char* data() const { return static_cast<const char*>(address_); }
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

class PmemDriver final : public StorageDriver {
 public:
  PmemDriver(const std::string& root, int max_open_files)
      : tree_(root), mappings_(max_open_files) {}

  absl::StatusOr<size_t> Read(const FileRef& file, uint64_t offset, char* dst,
                              size_t n) override {
    if (file.size == 0) {
      if (::access(tree_.PathOf(file.name).c_str(), F_OK) != 0) {
        return ErrnoToStatus(errno, absl::StrCat("open ", file.name));
      }
      return 0;  // An empty copy cannot be mapped; it has nothing to read.
    }
    MONARCH_ASSIGN_OR_RETURN(std::shared_ptr<Mapping> mapping, mappings_.Get(file.id, [&] {
      return Map(tree_.PathOf(file.name));
    }));
    if (offset >= mapping->length()) return 0;
    size_t count = std::min<uint64_t>(n, mapping->length() - offset);
    std::memcpy(dst, mapping->data() + offset, count);
    return count;
  }

  absl::Status Store(const FileRef& file, std::shared_ptr<const FileImage> image) override {
    absl::Status status =
        tree_.Store(file, [&](const std::string& temporary) { return WriteFile(temporary, *image); });
    mappings_.Erase(file.id);  // A handle on an older copy must not be reused.
    return status;
  }

  absl::Status Remove(const FileRef& file) override {
    mappings_.Erase(file.id);
    return tree_.Remove(file.name);
  }

  absl::Status ScanCopies(CopyVisitor visit) override { return tree_.Scan(visit); }

 private:
  static absl::StatusOr<std::shared_ptr<Mapping>> Map(const std::string& path) {
    size_t length = 0;
    errno = 0;
    void* address = pmem_map_file(path.c_str(), 0, 0, 0, &length, nullptr);
    if (address == nullptr) return PmemError("map", path);
    return std::make_shared<Mapping>(address, length);
  }

  static absl::Status WriteFile(const std::string& path, const FileImage& image) {
    if (image.size() == 0) {
      // pmem_map_file cannot create an empty mapping; an empty file needs none.
      int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("create ", path));
      ::close(fd);
      return absl::OkStatus();
    }
    size_t length = 0;
    int is_pmem = 0;
    errno = 0;
    void* address = pmem_map_file(path.c_str(), image.size(), PMEM_FILE_CREATE | PMEM_FILE_EXCL,
                                  0644, &length, &is_pmem);
    if (address == nullptr) return PmemError("create", path);
    absl::Status status;
    if (is_pmem) {
      pmem_memcpy_persist(address, image.data(), image.size());
    } else {
      std::memcpy(address, image.data(), image.size());
      if (pmem_msync(address, image.size()) != 0) status = PmemError("msync", path);
    }
    pmem_unmap(address, length);
    return status;
  }

  CopyTree tree_;
  HandleCache<Mapping> mappings_;
};

}  // namespace

std::unique_ptr<StorageDriver> NewPmemDriver(const std::string& root, int max_open_files) {
  return std::make_unique<PmemDriver>(root, max_open_files);
}

}  // namespace monarch
