// FileTable: the dataset's files as one compact, read-only region.
//
// Everything the namespace knows of each file and extent that never changes
// after it is built (names, sizes, mtimes, the rest of stat(), which files
// are cached by extents) lives in one block of memory: a header, sections
// of plain integers, then the names, with no pointer anywhere, so a process
// maps it at any address. The namespace builds it once into a memfd
// (metadata/namespace.h); the node service sends that memfd to its clients
// as the namespace image, so a node holds one copy however many processes
// read it.
//
// What keeps it small (bench/results/namespace_memory.md):
// - A read needs an entry's size, mtime and name: they are one 20-byte
//   record, so a read takes one cache line of the table besides the name.
// - A name is its bytes and a 4-byte offset in its record, relative to a
//   64-bit base per 2,048 entries (so the names may pass 4 GiB).
// - Most of stat() is shared by a dataset's files (device, mode, links,
//   owner, group, block size, and the unit its file system allocates in):
//   each distinct combination is stored once, a class, and a file holds its
//   class's 2-byte index (4 when a dataset has more than 65,536 of them).
//   A file's block count is its size rounded up to its class's unit; the
//   files whose count is not (sparse ones) are listed apart.
// - Only the files cached by extents say where their extents start, in a
//   list searched by halving; every other file pays nothing for extents.
// - Lookups by name go through an open-addressing table at load 3/4, whose
//   8-byte slots hold a file's id, 8 more bits of its name's hash and where
//   its name starts: a probe of another name's slot rarely reads that name,
//   and a hit reads the slot and then, together, the name and the record.
//
// A process that maps another's table trusts nothing in it: Open() checks
// that every section lies inside the region and is as large as the
// header's counts need; every read then checks its index against those
// counts, or its offset against its section, so a damaged table gives
// empty names and NotFound, never a read outside the region.
//
// The layout is in file_table_format.h; FileTableWriter
// (file_table_writer.h) writes it.

#ifndef MONARCH_METADATA_FILE_TABLE_H_
#define MONARCH_METADATA_FILE_TABLE_H_

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "metadata/file_table_format.h"

namespace monarch {

struct FileAttributes;

class FileTable : private FileTableFormat {
 public:
  FileTable() = default;

  // A view of the table in [data, data + size) (which must outlive it).
  // DataLoss if the header or any section does not fit.
  static absl::StatusOr<FileTable> Open(const char* data, uint64_t size);

  uint32_t file_count() const { return header_.file_count; }
  // Files, then the extents of the files cached by extents.
  uint32_t entry_count() const { return header_.entry_count; }
  uint64_t extent_bytes() const { return header_.extent_bytes; }
  uint64_t total_bytes() const { return header_.total_bytes; }
  uint64_t root_device() const { return header_.root_device; }
  absl::string_view root() const { return root_; }
  uint64_t table_bytes() const { return size_; }

  // Entry `id`'s (< entry_count()) name; "" if the table is damaged.
  absl::string_view name(uint32_t id) const {
    if (id >= header_.entry_count) return {};
    const uint64_t start = NameOffset(id);
    const uint64_t end = NameOffset(id + 1);
    if (start > end || end > names_.size()) return {};
    return names_.substr(start, end - start);
  }
  uint64_t size(uint32_t id) const {
    return id < header_.entry_count ? LoadInBounds<uint64_t>(records_, id * kRecordBytes + kSizeAt) : 0;
  }
  // A file's; an extent's is its file's.
  int64_t mtime_ns(uint32_t id) const {
    return id < header_.entry_count ? LoadInBounds<int64_t>(records_, id * kRecordBytes + kMtimeAt)
                                    : 0;
  }
  // What stat() said of entry `id`'s file (an extent's: its file's).
  FileAttributes attributes(uint32_t id) const;

  // A file's (< file_count()) first extent's id, or 0 when it is cached
  // whole; its extents follow, one per extent_bytes() of the file.
  uint32_t first_extent(uint32_t file) const {
    // Asked on every read: nothing to search for a file below the threshold.
    if (header_.extent_bytes == 0 || size(file) <= header_.extent_threshold) return 0;
    return SearchFirstExtent(file);
  }
  uint32_t extent_count(uint32_t file) const;
  // The file an entry's bytes belong to: itself for a file, its file for an
  // extent; kNoFile for an id out of range or a damaged table.
  static constexpr uint32_t kNoFile = UINT32_MAX;
  uint32_t source_file(uint32_t id) const;
  // Where extent `id` starts in its file; 0 for a file.
  uint64_t part_offset(uint32_t id) const;

  // The id of the file named `canonical` (CanonicalDatasetName's form);
  // with `stored`, the table's own view of the name too (what name(id)
  // returns, without computing it again).
  std::optional<uint32_t> FindFile(absl::string_view canonical,
                                   absl::string_view* stored = nullptr) const;

  // The hash the lookup slots are keyed by: the same in every process.
  using FileTableFormat::HashName;

 private:
  // The `T` at byte `at` of `section`; zero if it lies outside it.
  template <typename T>
  T Load(Section section, uint64_t at) const {
    T value{};
    if (at + sizeof(T) <= header_.bytes[section] && at + sizeof(T) > at) {
      std::memcpy(&value, data_ + header_.offset[section] + at, sizeof(T));
    }
    return value;
  }
  // The `T` at byte `at` of a section Open() has checked to hold what the
  // header's counts index (the records and name bases: entry_count + 1
  // entries; the lookup slots), with no check of its own: the caller has
  // checked its index against the count, and the region is sealed, so
  // what Open() checked stays true. On every lookup and read.
  template <typename T>
  static T LoadInBounds(const char* section, uint64_t at) {
    T value;
    std::memcpy(&value, section + at, sizeof(T));
    return value;
  }
  // Where entry `id`'s name starts (id <= entry_count: the last is the
  // names' end), from its base; not yet checked against the names.
  uint64_t NameOffset(uint32_t id) const {
    return LoadInBounds<uint64_t>(name_bases_, uint64_t{id / kNamesPerBase} * sizeof(uint64_t)) +
           LoadInBounds<uint32_t>(records_, uint64_t{id} * kRecordBytes + kNameLowAt);
  }
  uint32_t SearchFirstExtent(uint32_t file) const;

  const char* data_ = nullptr;
  uint64_t size_ = 0;
  const char* records_ = nullptr;     // Sections read on every lookup and read,
  const char* name_bases_ = nullptr;  // their places kept (see LoadInBounds).
  const char* slots_ = nullptr;
  Header header_{};
  absl::string_view names_;
  absl::string_view root_;
};

}  // namespace monarch

#endif  // MONARCH_METADATA_FILE_TABLE_H_
