// StoreCopy: the one helper shared by every driver's users.

#include "drivers/storage_driver.h"

#include "common/status_macros.h"

namespace monarch {

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
