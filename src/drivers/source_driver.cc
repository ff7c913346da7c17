// source tier: the dataset on the parallel file system. Read-only.
//
// Monarch never writes, creates or deletes anything here; NewWriter and Remove
// refuse. Descriptors are cached (bounded), so a shard read in many calls
// costs one open on the PFS.

#include <sys/stat.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/os.h"
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

  // The descriptor reads use, so the answer is about the bytes they got
  // (a file replaced by rename keeps being read, and identified, as the old
  // one until its descriptor leaves the cache).
  absl::StatusOr<SourceIdentity> Identify(const FileRef& file) override {
    absl::StatusOr<std::shared_ptr<ScopedFd>> fd =
        descriptors_.Get(file.id, [&] { return root_.OpenShared(file.name); });
    if (!fd.ok()) return fd.status();
    struct stat st;
    if (os::Fstat((*fd)->get(), &st) != 0) return ErrnoToStatus(errno, absl::StrCat("fstat ", file.name));
    SourceIdentity identity;
    identity.device = st.st_dev;
    identity.inode = st.st_ino;
    identity.size = static_cast<uint64_t>(st.st_size);
    identity.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    identity.ctime_ns = static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
    return identity;
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
