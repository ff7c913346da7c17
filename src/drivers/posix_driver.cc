// posix tier: copies in a local directory (NVMe/SSD), read with pread.
//
// Descriptors are cached (bounded) so a file read in many calls, such as a
// TFRecord shard, is opened once, and the total number of open descriptors
// stays bounded whatever the number of files.

#include <fcntl.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/handle_cache.h"
#include "common/status_macros.h"
#include "drivers/copy_tree.h"
#include "drivers/storage_driver.h"

namespace monarch {
namespace {

// How much of an image one pwrite call sends: large enough to stream, small
// enough that a cancelled shutdown is not stuck behind one call for long.
constexpr size_t kWriteChunk = 8 << 20;

class PosixDriver final : public StorageDriver {
 public:
  PosixDriver(const std::string& root, int max_open_files)
      : tree_(root), descriptors_(max_open_files) {}

  absl::StatusOr<size_t> Read(const FileRef& file, uint64_t offset, char* dst,
                              size_t n) override {
    absl::StatusOr<std::shared_ptr<ScopedFd>> fd = descriptors_.Get(file.id, [&] {
      return OpenShared(tree_.PathOf(file.name));
    });
    if (!fd.ok()) return fd.status();
    return PreadFull((*fd)->get(), dst, n, offset, file.name);
  }

  absl::Status Store(const FileRef& file, std::shared_ptr<const FileImage> image) override {
    MONARCH_ASSIGN_OR_RETURN(std::string temporary, tree_.PrepareTemporary(file.name));
    absl::Status status = WriteFile(temporary, *image);
    if (status.ok()) status = tree_.Publish(temporary, file);
    if (!status.ok()) ::unlink(temporary.c_str());
    descriptors_.Erase(file.id);  // A descriptor of an older copy must not be reused.
    return status;
  }

  absl::Status Remove(const FileRef& file) override {
    descriptors_.Erase(file.id);
    return tree_.Remove(file.name);
  }

  absl::Status ScanCopies(CopyVisitor visit) override { return tree_.Scan(visit); }

 private:
  static absl::Status WriteFile(const std::string& path, const FileImage& image) {
    ScopedFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("create ", path));
    for (size_t done = 0; done < image.size(); done += kWriteChunk) {
      size_t n = std::min(kWriteChunk, image.size() - done);
      MONARCH_RETURN_IF_ERROR(PwriteFull(fd.get(), image.data() + done, n, done, path));
    }
    // close() reports deferred write errors on some file systems (NFS).
    if (::close(fd.release()) != 0) return ErrnoToStatus(errno, absl::StrCat("close ", path));
    return absl::OkStatus();
  }

  CopyTree tree_;
  HandleCache<ScopedFd> descriptors_;
};

}  // namespace

std::unique_ptr<StorageDriver> NewPosixDriver(const std::string& root, int max_open_files) {
  return std::make_unique<PosixDriver>(root, max_open_files);
}

}  // namespace monarch
