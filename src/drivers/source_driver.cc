// source tier: the dataset on the parallel file system. Read-only.
//
// Monarch never writes, creates or deletes anything here; NewWriter and Remove
// refuse. Descriptors are cached (bounded), so a shard read in many calls
// costs one open on the PFS.

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/handle_cache.h"
#include "common/status_macros.h"
#include "drivers/storage_driver.h"

namespace monarch {
namespace {

class SourceDriver final : public StorageDriver {
 public:
  SourceDriver(std::string root, int max_open_files)
      : root_(std::move(root)), descriptors_(max_open_files) {}

  absl::StatusOr<size_t> Read(const FileRef& file, uint64_t offset, char* dst, size_t n) override {
    absl::StatusOr<std::shared_ptr<ScopedFd>> fd =
        descriptors_.Get(file.id, [&] { return root_.OpenShared(file.name); });
    if (!fd.ok()) return fd.status();
    return PreadFull((*fd)->get(), dst, n, offset, file.name);
  }

  absl::StatusOr<std::unique_ptr<CopyWriter>> NewWriter(const FileRef& file) override {
    return absl::PermissionDeniedError(
        absl::StrCat("the source is read-only; refusing to write ", file.name));
  }

  absl::Status Remove(const FileRef& file) override {
    return absl::PermissionDeniedError(
        absl::StrCat("the source is read-only; refusing to delete ", file.name));
  }

 private:
  const DirectoryHandle root_;
  HandleCache<ScopedFd> descriptors_;
};

}  // namespace

std::unique_ptr<StorageDriver> NewSourceDriver(const std::string& root, int max_open_files) {
  return std::make_unique<SourceDriver>(root, max_open_files);
}

}  // namespace monarch
