// posix tier: copies in a local directory (NVMe/SSD), read with pread.
//
// Descriptors are cached (bounded) so a file read in many calls, such as a
// TFRecord shard, is opened once, and the total number of open descriptors
// stays bounded whatever the number of files.

#include <fcntl.h>
#include <cerrno>
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
constexpr size_t kPage = 4096;

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
    absl::Status status =
        tree_.Store(file, [&](const std::string& temporary) { return WriteFile(temporary, *image); });
    descriptors_.Erase(file.id);  // A handle on an older copy must not be reused.
    return status;
  }

  absl::Status Remove(const FileRef& file) override {
    descriptors_.Erase(file.id);
    return tree_.Remove(file.name);
  }

  absl::Status ScanCopies(CopyVisitor visit) override { return tree_.Scan(visit); }

 private:
  // Writes with O_DIRECT where the file system allows it: the copy goes
  // from the image to the device without a second copy into the page cache,
  // which on a small node costs as much CPU as the reads the job is waiting
  // for. The image is page-aligned and padded, so whole pages are written and
  // the file is then cut to its real size. File systems without O_DIRECT
  // (tmpfs) get ordinary buffered writes.
  static absl::Status WriteFile(const std::string& path, const FileImage& image) {
    const int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC;
    ScopedFd fd(::open(path.c_str(), flags | O_DIRECT, 0644));
    bool direct = fd.valid();
    if (!direct && errno == EINVAL) fd = ScopedFd(::open(path.c_str(), flags, 0644));
    if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("create ", path));
    const size_t padded = direct ? (image.size() + kPage - 1) / kPage * kPage : image.size();
    for (size_t done = 0; done < padded; done += kWriteChunk) {
      size_t n = std::min(kWriteChunk, padded - done);
      absl::Status written = PwriteFull(fd.get(), image.data() + done, n, done, path);
      if (!written.ok() && direct && done == 0 && absl::IsInvalidArgument(written)) {
        // The device refused the alignment: fall back to buffered writes.
        direct = false;
        int buffered = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
        if (buffered < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
        fd = ScopedFd(buffered);
        return WriteBuffered(fd, path, image);
      }
      MONARCH_RETURN_IF_ERROR(written);
    }
    if (direct && padded != image.size() && ::ftruncate(fd.get(), static_cast<off_t>(image.size())) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("truncate ", path));
    }
    // close() reports deferred write errors on some file systems (NFS).
    if (::close(fd.release()) != 0) return ErrnoToStatus(errno, absl::StrCat("close ", path));
    return absl::OkStatus();
  }

  static absl::Status WriteBuffered(ScopedFd& fd, const std::string& path, const FileImage& image) {
    for (size_t done = 0; done < image.size(); done += kWriteChunk) {
      size_t n = std::min(kWriteChunk, image.size() - done);
      MONARCH_RETURN_IF_ERROR(PwriteFull(fd.get(), image.data() + done, n, done, path));
    }
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
