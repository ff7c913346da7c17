// FileImage and StoreCopy.

#include <cstdlib>
#include <new>

#include "common/status_macros.h"
#include "drivers/storage_driver.h"

namespace monarch {

FileImage::FileImage(size_t size) : size_(size) {
  constexpr size_t kPage = 4096;
  const size_t capacity = size == 0 ? kPage : (size + kPage - 1) / kPage * kPage;
  data_ = static_cast<char*>(std::aligned_alloc(kPage, capacity));
  if (data_ == nullptr) throw std::bad_alloc();
}

FileImage::~FileImage() { std::free(data_); }

absl::Status StoreCopy(StorageDriver& driver, const FileRef& file, const char* data, size_t n) {
  MONARCH_ASSIGN_OR_RETURN(std::unique_ptr<CopyWriter> writer, driver.NewWriter(file));
  if (n > 0) MONARCH_RETURN_IF_ERROR(writer->Write(0, data, n));
  return writer->Commit();
}

}  // namespace monarch
