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
//   Header | records | name bases | inodes | ctimes | atimes | classes of
//   files | classes | files by extents | extents' files | block exceptions |
//   lookup slots | names | root
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
// that every section lies inside the region, and every read checks its
// offsets, so a damaged table gives empty names and NotFound, never a read
// outside the region.

#ifndef MONARCH_METADATA_FILE_TABLE_H_
#define MONARCH_METADATA_FILE_TABLE_H_

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/shared_memory.h"

namespace monarch {

struct NamespaceListing;
struct ExtentLayout;
struct FileAttributes;

class FileTable {
 public:
  FileTable() = default;

  // Writes the table of `listing`'s files (ids in its order), then one
  // entry per extent of each file `extents` splits, named
  // ".monarch/extents/<extent bytes>/<file's name>/<index>", into a new
  // memfd sealed against writes. InvalidArgument if two files have the same
  // name, or the ids do not fit 32 bits.
  static absl::StatusOr<WriteSealedRegion> Write(const std::string& root,
                                                 const NamespaceListing& listing,
                                                 const ExtentLayout& extents);

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
    return id < header_.entry_count ? Checked<uint64_t>(records_, id * kRecordBytes + kSizeAt) : 0;
  }
  // A file's; an extent's is its file's.
  int64_t mtime_ns(uint32_t id) const {
    return id < header_.entry_count ? Checked<int64_t>(records_, id * kRecordBytes + kMtimeAt)
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

  // The id of the file named `canonical` (CanonicalDatasetName's form).
  std::optional<uint32_t> FindFile(absl::string_view canonical) const;

  // The hash the lookup slots are keyed by: the same in every process.
  static uint64_t HashName(absl::string_view name);

 private:
  enum Section : uint32_t {
    kRecords,          // Record[entry_count + 1] (the last: the names' end).
    kNameBase,         // uint64[(entry_count + 1 + kNamesPerBase - 1) / kNamesPerBase].
    kInodes,           // uint64[file_count].
    kCtimes,           // int64[file_count].
    kAtimes,           // int64[file_count].
    kClassOf,          // uint16 or uint32 [file_count] (class_index_bytes).
    kClasses,          // Class[class_count].
    kSplit,            // Split[split_count], by file id.
    kExtentFile,       // uint32[entry_count - file_count].
    kBlockExceptions,  // BlockException[exception_count], by file id.
    kHash,             // HashSlot[hash_slots].
    kNames,            // The names, back to back.
    kRoot,             // The dataset root.
    kSectionCount,
  };
  // A record, 20 bytes, unaligned: the name's offset from its base
  // (uint32), size (uint64) and mtime (int64). The offset first: a lookup
  // reads it, and the line it fetches then holds the rest too, most often.
  static constexpr uint64_t kRecordBytes = 20;
  static constexpr uint64_t kNameLowAt = 0;
  static constexpr uint64_t kSizeAt = 4;
  static constexpr uint64_t kMtimeAt = 12;

  struct Header {
    char magic[8];
    uint32_t file_count;
    uint32_t entry_count;
    uint64_t extent_bytes;
    uint64_t extent_threshold;
    uint64_t total_bytes;
    uint64_t root_device;
    uint32_t hash_slots;
    uint32_t class_count;
    uint32_t class_index_bytes;  // 2 or 4.
    uint32_t split_count;
    uint32_t exception_count;
    uint32_t reserved;
    uint64_t offset[kSectionCount];  // From the region's start, 8-aligned.
    uint64_t bytes[kSectionCount];
  };
  // The attributes most files of a dataset share. A file's block count is
  // its size rounded up to 2^block_unit_log2 bytes, in 512-byte blocks,
  // unless it is among the exceptions (block_unit_log2 = kListedBlocks).
  struct Class {
    uint64_t device;
    uint32_t mode;
    uint32_t link_count;
    uint32_t uid;
    uint32_t gid;
    uint32_t block_size;
    uint32_t via_symlink;
    uint32_t block_unit_log2;
    uint32_t reserved;
  };
  static constexpr uint32_t kListedBlocks = 0;
  struct Split {
    uint32_t file;
    uint32_t first_extent;
  };
  struct BlockException {
    uint32_t file;
    uint32_t reserved;
    uint64_t blocks;
  };
  // A slot of the lookup table: which file, and where its name starts,
  // so that a lookup reads the slot, then the name, with nothing between.
  struct HashSlot {
    uint32_t id_plus_one;   // 0: empty.
    uint32_t tag_and_name;  // 8 more bits of the name's hash, then the name's offset.
  };
  // Names per base: few enough that a base's names stay below 2^24 bytes
  // (2,048 names of at most PATH_MAX bytes and an extent's prefix), so a
  // slot holds a name's offset in 24 bits beside its tag.
  static constexpr uint32_t kNamesPerBase = 2048;
  static constexpr uint32_t kNameLowBits = 24;

  // The `T` at byte `at` of `section`; zero if it lies outside it.
  template <typename T>
  T Load(Section section, uint64_t at) const {
    T value{};
    if (at + sizeof(T) <= header_.bytes[section] && at + sizeof(T) > at) {
      std::memcpy(&value, data_ + header_.offset[section] + at, sizeof(T));
    }
    return value;
  }
  // A read of a section Open() has checked to hold what the header's
  // counts index: the records and name bases (entry_count + 1 entries) and
  // the lookup slots. The caller checks its index against the count; the
  // region is sealed, so what Open() checked stays true.
  template <typename T>
  static T Checked(const char* section, uint64_t at) {
    T value;
    std::memcpy(&value, section + at, sizeof(T));
    return value;
  }
  // Where entry `id`'s name starts (id <= entry_count: the last is the
  // names' end), from its base; not yet checked against the names.
  uint64_t NameOffset(uint32_t id) const {
    return Checked<uint64_t>(name_bases_, uint64_t{id / kNamesPerBase} * sizeof(uint64_t)) +
           Checked<uint32_t>(records_, uint64_t{id} * kRecordBytes + kNameLowAt);
  }
  uint32_t SearchFirstExtent(uint32_t file) const;

  const char* data_ = nullptr;
  uint64_t size_ = 0;
  const char* records_ = nullptr;     // Sections read on every lookup and read,
  const char* name_bases_ = nullptr;  // their places kept (see Checked).
  const char* slots_ = nullptr;
  Header header_{};
  absl::string_view names_;
  absl::string_view root_;
};

}  // namespace monarch

#endif  // MONARCH_METADATA_FILE_TABLE_H_
