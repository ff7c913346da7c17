// StoreCopy: the one helper shared by every driver's users; SourceIdentity::Of;
// the capabilities a driver's class inherits.

#include "drivers/storage_driver.h"

#include <sys/sysmacros.h>

#include "common/status_macros.h"

namespace monarch {

SourceIdentity SourceIdentity::Of(const struct stat& st) {
  SourceIdentity identity;
  identity.device = st.st_dev;
  identity.inode = st.st_ino;
  identity.size = static_cast<uint64_t>(st.st_size);
  identity.mtime_ns = TimespecNanos(st.st_mtim);
  identity.ctime_ns = TimespecNanos(st.st_ctim);
  return identity;
}

SourceIdentity SourceIdentity::Of(const struct statx& st) {
  SourceIdentity identity;
  identity.device = makedev(st.stx_dev_major, st.stx_dev_minor);
  identity.inode = st.stx_ino;
  identity.size = st.stx_size;
  identity.mtime_ns = st.stx_mtime.tv_sec * int64_t{1000000000} + st.stx_mtime.tv_nsec;
  identity.ctime_ns = st.stx_ctime.tv_sec * int64_t{1000000000} + st.stx_ctime.tv_nsec;
  return identity;
}

DriverCapabilities StorageDriver::capabilities() {
  return DriverCapabilities{dynamic_cast<CopyMapping*>(this),  dynamic_cast<InMemoryReads*>(this),
                            dynamic_cast<MemoryBacking*>(this), dynamic_cast<FileIdentity*>(this),
                            dynamic_cast<KeptCopies*>(this),    dynamic_cast<SharedCopies*>(this)};
}

absl::Status StoreCopy(StorageDriver& driver, const FileRef& file, const char* data, size_t n,
                       const SourceIdentity& source) {
  MONARCH_ASSIGN_OR_RETURN(std::unique_ptr<CopyWriter> writer, driver.NewWriter(file));
  if (n > 0) MONARCH_RETURN_IF_ERROR(writer->Write(0, data, n));
  return writer->Commit(source);
}

absl::Status StoreCopy(StorageDriver& driver, const FileRef& file, const char* data, size_t n) {
  return StoreCopy(driver, file, data, n, SourceIdentity::Of(file));
}

}  // namespace monarch
