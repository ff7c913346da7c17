// Shared memory helpers.

#include "common/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/os.h"
#include "common/status_macros.h"

namespace monarch {

// memfd_create and the seals (fcntl) name no file, so they stay outside the
// seam of common/os.h; sizing and mapping go through it.

namespace {
constexpr uint64_t kPage = 4096;
constexpr int kSizeSeals = F_SEAL_SHRINK | F_SEAL_GROW;

// A memfd of `bytes` rounded up to whole pages (one at least), its size
// sealed along with `more_seals`.
absl::StatusOr<ScopedFd> SizeSealedMemfd(const std::string& name, uint64_t bytes,
                                         int more_seals) {
  const uint64_t size = (bytes == 0 ? kPage : bytes + kPage - 1) / kPage * kPage;
  ScopedFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("memfd_create ", name));
  if (os::Ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("size the shared region ", name));
  }
  if (::fcntl(fd.get(), F_ADD_SEALS, kSizeSeals | more_seals) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("seal the shared region ", name));
  }
  return fd;
}

}  // namespace

absl::StatusOr<ScopedFd> CreateSealedMemfd(const std::string& name, uint64_t bytes) {
  return SizeSealedMemfd(name, bytes, F_SEAL_SEAL);
}

absl::StatusOr<WriteSealedRegion> CreateWriteSealedRegion(const std::string& name,
                                                          uint64_t bytes, bool seal_writes) {
  WriteSealedRegion region;
  MONARCH_ASSIGN_OR_RETURN(region.fd, SizeSealedMemfd(name, bytes, /*more_seals=*/0));
  // The one writable mapping, made before the write seal forbids new ones.
  MONARCH_ASSIGN_OR_RETURN(region.writable, MappedRegion::Map(region.fd.get(), /*writable=*/true));
  // Without the write seal, F_SEAL_SEAL alone: nobody may add one later,
  // which would make the region's pages impossible to give back.
  const int seals = seal_writes ? F_SEAL_FUTURE_WRITE | F_SEAL_SEAL : F_SEAL_SEAL;
  if (::fcntl(region.fd.get(), F_ADD_SEALS, seals) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("seal the shared region ", name, " against writes"));
  }
  return region;
}

absl::StatusOr<ScopedFd> ReopenReadOnly(int fd) {
  const std::string path = absl::StrCat("/proc/self/fd/", fd);
  ScopedFd reopened(os::Open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!reopened.valid()) return ErrnoToStatus(errno, absl::StrCat("reopen ", path, " read-only"));
  return reopened;
}

MappedRegion::~MappedRegion() {
  if (data_ != nullptr) os::Munmap(data_, size_);
}

MappedRegion::MappedRegion(MappedRegion&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedRegion& MappedRegion::operator=(MappedRegion&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) os::Munmap(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

absl::StatusOr<MappedRegion> MappedRegion::Map(int fd, bool writable, bool own_file) {
  const int seals = ::fcntl(fd, F_GET_SEALS);
  struct stat st;
  if (os::Fstat(fd, &st) != 0) return ErrnoToStatus(errno, "fstat a shared region");
  if ((seals < 0 || (seals & kSizeSeals) != kSizeSeals) &&
      !(own_file && S_ISREG(st.st_mode) && st.st_uid == ::geteuid())) {
    return absl::FailedPreconditionError("refusing to map a shared region whose size is not sealed");
  }
  if (st.st_size <= 0) return absl::FailedPreconditionError("empty shared region");
  MappedRegion region;
  region.size_ = static_cast<uint64_t>(st.st_size);
  void* data = os::Mmap(nullptr, region.size_, writable ? PROT_READ | PROT_WRITE : PROT_READ,
                      MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (data == MAP_FAILED) {
    region.size_ = 0;
    return ErrnoToStatus(errno, "map a shared region");
  }
  region.data_ = static_cast<char*>(data);
  return region;
}

}  // namespace monarch
