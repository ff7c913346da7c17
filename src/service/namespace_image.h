// NamespaceImage: the dataset's namespace as one read-only shared region.
//
// The node service writes it once after its walk; every client maps it and
// looks names up in place, so a client costs no walk and no metadata
// operation on the source, and no per-process copy of a million names. The
// layout holds only offsets (each process maps it at its own address):
//
//   Header | Record[entry_count] | uint32 hash table[hash_slots] | names
//
// A Record is a file's name (offset, length into the names), size,
// mtime and the rest of its stat() (FileAttributes); its index is the
// file id. Past the files come the extents of the files cached by extents
// (metadata/namespace.h), each with its name, size and tier slot, so a
// client reads their copies itself as it reads a file's. The hash table
// (files only) is open addressing over
// FNV-1a of the canonical name, holding id + 1 (0 = empty). A client trusts
// nothing in it: every offset is checked before use, so a damaged region
// gives NotFound, never a wild read.
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
#include "metadata/namespace.h"

namespace monarch::service {

// Writes the image of `ns` into a new sealed memfd.
absl::StatusOr<ScopedFd> WriteNamespaceImage(const Namespace& ns);

class NamespaceImage final : public NamespaceView {
 public:
  // Maps `fd` read-only and checks its header.
  static absl::StatusOr<std::unique_ptr<NamespaceImage>> Open(const ScopedFd& fd);

  // NamespaceView. file_name() is any entry's (an extent's too), "" if damaged.
  std::optional<uint32_t> FindId(absl::string_view name) const override;
  uint32_t file_count() const override { return file_count_; }
  absl::string_view file_name(uint32_t id) const override;
  Monarch::FileStat Stat(uint32_t id) const override;
  const std::string& root() const override { return root_; }

  // The entry `id` < entry_count() (a file, or an extent) as drivers know
  // it. An extent's part_offset is set, its part_of is not.
  FileRef ref(uint32_t id) const;
  // For a file `file` < file_count() cached by extents, its first extent's
  // id (the rest follow, one per extent_bytes() of the file); else 0.
  uint32_t first_extent(uint32_t file) const;
  // For an extent `extent` in [file_count(), entry_count()), its file's id
  // (unchecked: compare with file_count()).
  uint32_t file_of(uint32_t extent) const;
  uint32_t entry_count() const { return entry_count_; }
  uint64_t extent_bytes() const { return extent_bytes_; }
  uint64_t total_bytes() const { return total_bytes_; }

 private:
  NamespaceImage() = default;

  MappedRegion region_;
  std::string root_;
  uint32_t file_count_ = 0;
  uint32_t entry_count_ = 0;
  uint64_t extent_bytes_ = 0;
  uint32_t hash_slots_ = 0;
  uint64_t total_bytes_ = 0;
  const char* records_ = nullptr;
  const uint32_t* hash_ = nullptr;
  absl::string_view names_;
};

}  // namespace monarch::service

#endif  // MONARCH_SERVICE_NAMESPACE_IMAGE_H_
