// NamespaceImage implementation.

#include "service/namespace_image.h"

#include <fcntl.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace monarch::service {

absl::StatusOr<ScopedFd> WriteNamespaceImage(const Namespace& ns) {
  // The table's memfd, sealed against writes when it was built: a client
  // can map it, never change it. A duplicate, no file: outside the seam of
  // common/os.h.
  ScopedFd image(::fcntl(ns.table_fd().get(), F_DUPFD_CLOEXEC, 0));
  if (!image.valid()) return ErrnoToStatus(errno, "duplicate the namespace table's descriptor");
  return image;
}

absl::StatusOr<std::unique_ptr<NamespaceImage>> NamespaceImage::Open(const ScopedFd& fd) {
  std::unique_ptr<NamespaceImage> image(new NamespaceImage());
  MONARCH_ASSIGN_OR_RETURN(image->region_, MappedRegion::Map(fd.get(), /*writable=*/false));
  MONARCH_ASSIGN_OR_RETURN(image->table_,
                           FileTable::Open(image->region_.data(), image->region_.size()));
  image->root_ = std::string(image->table_.root());
  return image;
}

absl::string_view NamespaceImage::file_name(uint32_t id) const { return table_.name(id); }

FileRef NamespaceImage::ref(uint32_t id) const {
  FileRef ref;
  ref.id = id;
  ref.name = table_.name(id);
  ref.size = table_.size(id);
  ref.mtime_ns = table_.mtime_ns(id);
  // An extent: where it starts in its file (part_of stays null: the source
  // reads the file).
  ref.part_offset = table_.part_offset(id);
  return ref;
}

uint32_t NamespaceImage::first_extent(uint32_t file) const { return table_.first_extent(file); }

uint32_t NamespaceImage::file_of(uint32_t extent) const { return table_.source_file(extent); }

Monarch::FileStat NamespaceImage::Stat(uint32_t id) const {
  return MakeFileStat(ref(id), table_.attributes(id));
}

std::optional<uint32_t> NamespaceImage::FindId(absl::string_view name) const {
  return FindDatasetFile(table_, root_, name);
}

}  // namespace monarch::service
