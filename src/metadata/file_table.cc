// FileTable: reading the region without trusting it.

#include "metadata/file_table.h"

#include <algorithm>

#include "metadata/namespace.h"

namespace monarch {

absl::StatusOr<FileTable> FileTable::Open(const char* data, uint64_t size) {
  FileTable table;
  table.data_ = data;
  table.size_ = size;
  if (size < sizeof(Header)) return absl::DataLossError("namespace table too small");
  std::memcpy(&table.header_, data, sizeof(Header));
  const Header& h = table.header_;
  bool valid = std::memcmp(h.magic, kMagic, sizeof(kMagic)) == 0 &&
               h.entry_count >= h.file_count && h.entry_count < UINT32_MAX &&
               (h.entry_count == h.file_count || h.extent_bytes > 0) &&
               h.hash_slots >= kSlotsPerLine && h.hash_slots % kSlotsPerLine == 0 &&
               h.hash_slots > h.file_count / 2 &&
               (h.class_index_bytes == 2 || h.class_index_bytes == 4) && h.bytes[kRoot] < 4096;
  // Each section where the header says, inside the region, and as large as
  // its count needs (a shorter one would read as zeros, but a table this
  // damaged is refused whole).
  const uint64_t entries = h.entry_count;
  const uint64_t files = h.file_count;
  const uint64_t need[kSectionCount] = {
      (entries + 1) * kRecordBytes,
      ((entries + 1 + kNamesPerBase - 1) / kNamesPerBase) * sizeof(uint64_t),
      files * 8,
      files * 8,
      files * 8,
      files * h.class_index_bytes,
      uint64_t{h.class_count} * sizeof(Class),
      uint64_t{h.split_count} * sizeof(Split),
      (entries - std::min(entries, files)) * sizeof(uint32_t),
      uint64_t{h.exception_count} * sizeof(BlockException),
      uint64_t{h.hash_slots} * sizeof(HashSlot),
      0,
      0};
  for (uint32_t s = 0; valid && s < kSectionCount; ++s) {
    valid = h.offset[s] % 8 == 0 && h.offset[s] <= size && h.bytes[s] <= size - h.offset[s] &&
            h.bytes[s] >= need[s];
  }
  if (!valid) return absl::DataLossError("namespace table header is damaged");
  table.records_ = data + h.offset[kRecords];
  table.name_bases_ = data + h.offset[kNameBase];
  table.slots_ = data + h.offset[kHash];
  table.names_ = absl::string_view(data + h.offset[kNames], h.bytes[kNames]);
  table.root_ = absl::string_view(data + h.offset[kRoot], h.bytes[kRoot]);
  return table;
}

FileAttributes FileTable::attributes(uint32_t id) const {
  const uint32_t file = source_file(id);
  FileAttributes a;
  if (file == kNoFile) return a;
  const uint64_t index = header_.class_index_bytes == 2
                             ? Load<uint16_t>(kClassOf, uint64_t{file} * 2)
                             : Load<uint32_t>(kClassOf, uint64_t{file} * 4);
  const Class c = Load<Class>(kClasses, index * sizeof(Class));
  a.device = c.device;
  a.mode = c.mode;
  a.link_count = c.link_count;
  a.uid = c.uid;
  a.gid = c.gid;
  a.block_size = c.block_size;
  a.via_symlink = c.via_symlink;
  a.inode = Load<uint64_t>(kInodes, uint64_t{file} * 8);
  a.ctime_ns = Load<int64_t>(kCtimes, uint64_t{file} * 8);
  a.atime_ns = Load<int64_t>(kAtimes, uint64_t{file} * 8);
  if (c.block_unit_log2 >= 9 && c.block_unit_log2 <= 30) {
    const uint64_t unit = uint64_t{1} << c.block_unit_log2;
    const uint64_t size = this->size(file);
    a.blocks = (size / unit + (size % unit != 0 ? 1 : 0)) * (unit / 512);
    return a;
  }
  // Listed apart (sparse files, and the like): found by halving the list.
  uint32_t lo = 0, hi = header_.exception_count;
  while (lo < hi) {
    const uint32_t mid = lo + (hi - lo) / 2;
    const BlockException entry =
        Load<BlockException>(kBlockExceptions, uint64_t{mid} * sizeof(BlockException));
    if (entry.file == file) {
      a.blocks = entry.blocks;
      break;
    }
    if (entry.file < file) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return a;
}

uint32_t FileTable::SearchFirstExtent(uint32_t file) const {
  uint32_t lo = 0, hi = header_.split_count;
  while (lo < hi) {
    const uint32_t mid = lo + (hi - lo) / 2;
    const Split split = Load<Split>(kSplit, uint64_t{mid} * sizeof(Split));
    if (split.file == file) {
      // Checked, as everything here: the extents must lie among the entries.
      const uint64_t count = extent_count(file);
      if (split.first_extent < header_.file_count || count == 0 ||
          count > header_.entry_count - split.first_extent) {
        return 0;
      }
      return split.first_extent;
    }
    if (split.file < file) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return 0;
}

uint32_t FileTable::extent_count(uint32_t file) const {
  if (header_.extent_bytes == 0 || size(file) <= header_.extent_threshold) return 0;
  const uint64_t count = (size(file) + header_.extent_bytes - 1) / header_.extent_bytes;
  return count > header_.entry_count ? 0 : static_cast<uint32_t>(count);
}

uint32_t FileTable::source_file(uint32_t id) const {
  if (id < header_.file_count) return id;
  if (id >= header_.entry_count) return kNoFile;
  const uint32_t file =
      Load<uint32_t>(kExtentFile, (uint64_t{id} - header_.file_count) * sizeof(uint32_t));
  return file < header_.file_count ? file : kNoFile;
}

uint64_t FileTable::part_offset(uint32_t id) const {
  if (id < header_.file_count) return 0;
  const uint32_t file = source_file(id);
  if (file == kNoFile) return 0;
  const uint32_t first = first_extent(file);
  return first != 0 && id >= first ? uint64_t{id - first} * header_.extent_bytes : 0;
}

std::optional<uint32_t> FileTable::FindFile(absl::string_view canonical,
                                            absl::string_view* stored) const {
  const uint32_t slots = header_.hash_slots;  // Whole lines: Open() checked.
  const uint64_t h = HashName(canonical);
  const uint32_t tag = TagOf(h);
  uint32_t line = SlotOf(h, slots);
  // Line by line, each at most once (a damaged table cannot loop forever),
  // so the wrap is asked once a line, not once a slot.
  for (uint32_t lines = slots / kSlotsPerLine; lines > 0; --lines) {
    const char* at = slots_ + uint64_t{line} * sizeof(HashSlot);
    for (uint32_t i = 0; i < kSlotsPerLine; ++i, at += sizeof(HashSlot)) {
      const HashSlot value = LoadInBounds<HashSlot>(at, 0);
      if (value.id_plus_one == 0) return std::nullopt;
      if (value.tag_and_name >> kNameLowBits != tag) continue;
      const uint32_t id = value.id_plus_one - 1;
      if (id >= header_.file_count) continue;
      // The name read from the slot's offset, and checked to be file id's
      // whole name (a damaged slot could point elsewhere).
      const uint64_t start =
          LoadInBounds<uint64_t>(name_bases_, uint64_t{id / kNamesPerBase} * sizeof(uint64_t)) +
          (value.tag_and_name & ((uint32_t{1} << kNameLowBits) - 1));
      if (start > names_.size() || canonical.size() > names_.size() - start) continue;
      // Fetched while the record loads: the name, and the record's end.
      __builtin_prefetch(names_.data() + start);
      __builtin_prefetch(data_ + header_.offset[kRecords] + uint64_t{id} * kRecordBytes +
                         kRecordBytes - 1);
      const uint64_t own_start = NameOffset(id);
      const uint64_t own_end = NameOffset(id + 1);
      if (own_start == start && own_end == start + canonical.size() &&
          std::memcmp(names_.data() + start, canonical.data(), canonical.size()) == 0) {
        if (stored != nullptr) *stored = names_.substr(start, canonical.size());
        return id;
      }
    }
    line = line + kSlotsPerLine == slots ? 0 : line + kSlotsPerLine;
  }
  return std::nullopt;
}

}  // namespace monarch
