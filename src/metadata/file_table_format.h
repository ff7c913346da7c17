// FileTableFormat: the layout of the namespace's table (metadata/
// file_table.h), shared by the code that writes it (FileTableWriter) and
// the code that reads it without trusting it (FileTable).
//
//   Header | records | name bases | inodes | ctimes | atimes | classes of
//   files | classes | files by extents | extents' files | block exceptions |
//   lookup slots | names | root
//
// Every section starts 8-aligned (the lookup slots on a cache line), at the
// offset the header gives, and holds plain integers: no pointer, so any
// process maps the table at any address. What each section holds, and why
// it is shaped so, is in file_table.h.

#ifndef MONARCH_METADATA_FILE_TABLE_FORMAT_H_
#define MONARCH_METADATA_FILE_TABLE_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/strings/string_view.h"

namespace monarch {

struct FileTableFormat {
  static constexpr char kMagic[8] = {'M', 'O', 'N', 'A', 'R', 'F', 'T', '1'};

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

  // Lookup slots come in lines of 8 (64 bytes, one cache line): a name's
  // probes start at the first slot of its line, so at load 3/4 a lookup
  // mostly reads one line of slots (from the middle of a line, a third of
  // lookups would run into the next).
  static constexpr uint32_t kSlotsPerLine = 8;

  // The lookup slots for `files` names: load 3/4, whole lines.
  static uint32_t HashSlots(uint32_t files) {
    const uint64_t slots = uint64_t{files} + files / 3 + 1;
    return static_cast<uint32_t>((slots + kSlotsPerLine - 1) / kSlotsPerLine * kSlotsPerLine);
  }
  // The home slot of a hash among `slots`: the first of a line, the line
  // from the high bits of a multiply, so the table's size need not be a
  // power of two (Lemire's "fastrange").
  static uint32_t SlotOf(uint64_t hash, uint32_t slots) {
    const uint32_t lines = slots / kSlotsPerLine;
    return static_cast<uint32_t>(((hash >> 32) * uint64_t{lines}) >> 32) * kSlotsPerLine;
  }
  // The byte kept beside a slot: bits the slot's position does not use.
  static uint8_t TagOf(uint64_t hash) { return static_cast<uint8_t>(hash); }

  // The hash the lookup slots are keyed by.
  static uint64_t HashName(absl::string_view name) {
    // 8 bytes at a time, then a final mix (a 64-bit variant of the murmur
    // finaliser): a few ns for a 34-byte name, and the same in every process,
    // unlike absl::Hash, which is seeded per process.
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (name.size() * 0xC2B2AE3D27D4EB4Full);
    size_t i = 0;
    for (; i + 8 <= name.size(); i += 8) {
      uint64_t chunk;
      std::memcpy(&chunk, name.data() + i, 8);
      h = (h ^ (chunk * 0xFF51AFD7ED558CCDull)) * 0x9E3779B97F4A7C15ull;
      h ^= h >> 29;
    }
    uint64_t tail = 0;
    // Only when there is a tail: an empty name's data() may be null.
    if (i < name.size()) std::memcpy(&tail, name.data() + i, name.size() - i);
    h = (h ^ (tail * 0xFF51AFD7ED558CCDull)) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
    return h;
  }

  static uint64_t Align8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }
};

}  // namespace monarch

#endif  // MONARCH_METADATA_FILE_TABLE_FORMAT_H_
