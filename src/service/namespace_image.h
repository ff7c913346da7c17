// NamespaceImage: the dataset's namespace as one read-only shared region.
//
// The node service writes it once after its walk; every client maps it and
// looks names up in place, so a client costs no walk and no metadata
// operation on the source, and no per-process copy of a million names. The
// layout holds only offsets (each process maps it at its own address):
//
//   Header | Record[file_count] | uint32 hash table[hash_slots] | names
//
// A Record is a file's name (offset, length into the names), size,
// mtime and the rest of its stat() (FileAttributes); its index is the
// file id. The hash table is open addressing over
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

#include "absl/base/call_once.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/file_util.h"
#include "common/shared_memory.h"
#include "drivers/storage_driver.h"
#include "metadata/namespace.h"

namespace monarch::service {

// Writes the image of `ns` into a new sealed memfd.
absl::StatusOr<ScopedFd> WriteNamespaceImage(const Namespace& ns);

class NamespaceImage {
 public:
  // Maps `fd` read-only and checks its header.
  static absl::StatusOr<std::unique_ptr<NamespaceImage>> Open(const ScopedFd& fd);

  // The file's id, or nullopt if `name` (dataset-relative, or absolute
  // inside the root) is not a dataset file.
  std::optional<uint32_t> Find(absl::string_view name) const;
  // The file `id` < file_count() as drivers know it.
  FileRef ref(uint32_t id) const;
  // What stat() said of file `id` < file_count() at the service's walk.
  Monarch::FileStat Stat(uint32_t id) const;

  uint32_t file_count() const { return file_count_; }
  uint64_t total_bytes() const { return total_bytes_; }
  const std::string& root() const { return root_; }

  bool IsDirectory(absl::string_view name) const;
  absl::StatusOr<std::vector<std::string>> List(absl::string_view dir) const;

 private:
  struct Directories {
    // Directory name -> sorted entries directly inside it.
    absl::flat_hash_map<std::string, std::vector<std::string>> entries;
  };
  NamespaceImage() = default;
  absl::string_view name_of(uint32_t id) const;
  const Directories& directories() const;

  MappedRegion region_;
  std::string root_;
  uint32_t file_count_ = 0;
  uint32_t hash_slots_ = 0;
  uint64_t total_bytes_ = 0;
  const char* records_ = nullptr;
  const uint32_t* hash_ = nullptr;
  absl::string_view names_;

  mutable absl::once_flag directories_once_;
  mutable std::unique_ptr<Directories> directories_;
};

}  // namespace monarch::service

#endif  // MONARCH_SERVICE_NAMESPACE_IMAGE_H_
