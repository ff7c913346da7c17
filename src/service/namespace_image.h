// NamespaceImage: the dataset's namespace as a client maps it.
//
// The image is the node service's own namespace table (metadata/
// file_table.h): one read-only memfd the service built once after its walk,
// which every client maps and looks names up in place, so a client costs no
// walk, no metadata operation on the source, and no copy of a million names.
// Its index is the file id; past the files come the extents of the files
// cached by extents (metadata/namespace.h), which a client reads as it reads
// files. A client trusts nothing in it: the table checks every offset, so a
// damaged region gives NotFound, never a wild read.
//
// Directory queries build a small per-process index on first use.

#ifndef MONARCH_SERVICE_NAMESPACE_IMAGE_H_
#define MONARCH_SERVICE_NAMESPACE_IMAGE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/file_util.h"
#include "common/shared_memory.h"
#include "drivers/storage_driver.h"
#include "metadata/file_table.h"
#include "metadata/namespace.h"

namespace monarch::service {

// The image of `ns` to send a client: a new descriptor of its table.
absl::StatusOr<ScopedFd> WriteNamespaceImage(const Namespace& ns);

class NamespaceImage final : public NamespaceView {
 public:
  // Maps `fd` read-only and checks its header.
  static absl::StatusOr<std::unique_ptr<NamespaceImage>> Open(const ScopedFd& fd);

  // NamespaceView. file_name() is any entry's (an extent's too), "" if damaged.
  std::optional<uint32_t> FindId(absl::string_view name) const override;
  uint32_t file_count() const override { return table_.file_count(); }
  absl::string_view file_name(uint32_t id) const override;
  Monarch::FileStat Stat(uint32_t id) const override;
  const std::string& root() const override { return root_; }

  // The entry `id` < entry_count() (a file, or an extent) as drivers know
  // it. An extent's part_offset is set, its part_of is not.
  FileRef ref(uint32_t id) const;
  // For a file `file` < file_count() cached by extents, its first extent's
  // id (the rest follow, one per extent_bytes() of the file); else 0.
  uint32_t first_extent(uint32_t file) const;
  // For an extent `extent` in [file_count(), entry_count()), its file's id;
  // FileTable::kNoFile (not below file_count()) if the image is damaged.
  uint32_t file_of(uint32_t extent) const;
  uint32_t entry_count() const { return table_.entry_count(); }
  uint64_t extent_bytes() const { return table_.extent_bytes(); }
  uint64_t total_bytes() const { return table_.total_bytes(); }

 private:
  NamespaceImage() = default;

  MappedRegion region_;
  FileTable table_;  // A view of region_.
  std::string root_;
};

}  // namespace monarch::service

#endif  // MONARCH_SERVICE_NAMESPACE_IMAGE_H_
