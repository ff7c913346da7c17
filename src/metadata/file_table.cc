// FileTable: writing the region, and reading it without trusting it.

#include "metadata/file_table.h"

#include <algorithm>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "metadata/namespace.h"

namespace monarch {
namespace {

constexpr char kMagic[8] = {'M', 'O', 'N', 'A', 'R', 'F', 'T', '1'};

uint64_t Align8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }

// Lookup slots come in lines of 8 (64 bytes, one cache line): a name's
// probes start at the first slot of its line, so at load 3/4 a lookup
// mostly reads one line of slots (from the middle of a line, a third of
// lookups would run into the next).
constexpr uint32_t kSlotsPerLine = 8;

// The home slot of a hash among `slots`: the first of a line, the line
// from the high bits of a multiply, so the table's size need not be a
// power of two (Lemire's "fastrange").
uint32_t SlotOf(uint64_t hash, uint32_t slots) {
  const uint32_t lines = slots / kSlotsPerLine;
  return static_cast<uint32_t>(((hash >> 32) * uint64_t{lines}) >> 32) * kSlotsPerLine;
}

// The byte kept beside a slot: bits the slot's position does not use.
uint8_t TagOf(uint64_t hash) { return static_cast<uint8_t>(hash); }

// The lookup slots for `files` names: load 3/4, whole lines.
uint32_t HashSlots(uint32_t files) {
  const uint64_t slots = uint64_t{files} + files / 3 + 1;
  return static_cast<uint32_t>((slots + kSlotsPerLine - 1) / kSlotsPerLine * kSlotsPerLine);
}

}  // namespace

uint64_t FileTable::HashName(absl::string_view name) {
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
  if (i < name.size()) std::memcpy(&tail, name.data() + i, name.size() - i);  // data() may be null.
  h = (h ^ (tail * 0xFF51AFD7ED558CCDull)) * 0x9E3779B97F4A7C15ull;
  h ^= h >> 33;
  h *= 0xC4CEB9FE1A85EC53ull;
  h ^= h >> 29;
  return h;
}

namespace {

// The largest allocation unit, 2^k bytes (512 B to 1 GiB), that `size`
// rounded up to gives `blocks` 512-byte blocks; 0 if none does.
uint32_t BlockUnitLog2(uint64_t size, uint64_t blocks) {
  for (uint32_t k = 30; k >= 9; --k) {
    const uint64_t unit = uint64_t{1} << k;
    if ((size / unit + (size % unit != 0 ? 1 : 0)) * (unit / 512) == blocks) return k;
  }
  return 0;
}

}  // namespace

absl::StatusOr<WriteSealedRegion> FileTable::Write(const std::string& root,
                                                   const NamespaceListing& listing,
                                                   const ExtentLayout& extents) {
  const std::vector<ListedFile>& files = listing.files;
  const uint32_t file_count = static_cast<uint32_t>(files.size());
  const std::string extent_prefix = absl::StrCat(".monarch/extents/", extents.extent_bytes, "/");

  // Counted first: the region's size must be known before it is made.
  Header header{};
  std::memcpy(header.magic, kMagic, sizeof(kMagic));
  header.file_count = file_count;
  header.extent_bytes = extents.extent_bytes;
  header.extent_threshold = extents.threshold;
  header.root_device = listing.root_device;
  uint64_t entry_count = file_count;
  uint64_t name_bytes = 0;
  std::vector<Split> splits;
  std::vector<BlockException> exceptions;
  using ClassKey =
      std::tuple<uint64_t, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t>;
  absl::flat_hash_map<ClassKey, uint32_t> class_index;
  std::vector<Class> classes;
  std::vector<uint32_t> class_of(file_count);
  for (uint32_t id = 0; id < file_count; ++id) {
    const ListedFile& f = files[id];
    header.total_bytes += f.size;
    name_bytes += f.name.size();
    const FileAttributes& a = f.attributes;
    const uint32_t unit = BlockUnitLog2(f.size, a.blocks);
    if (unit == kListedBlocks) exceptions.push_back({id, 0, a.blocks});
    const ClassKey key{a.device, a.mode,       a.link_count,  a.uid,
                       a.gid,    a.block_size, a.via_symlink, unit};
    auto [it, added] = class_index.try_emplace(key, static_cast<uint32_t>(classes.size()));
    if (added) {
      classes.push_back(Class{a.device, a.mode, a.link_count, a.uid, a.gid, a.block_size,
                              a.via_symlink, unit, 0});
    }
    class_of[id] = it->second;
    if (!extents.Splits(f.size)) continue;
    const uint64_t count = (f.size + extents.extent_bytes - 1) / extents.extent_bytes;
    splits.push_back({id, static_cast<uint32_t>(std::min<uint64_t>(entry_count, UINT32_MAX))});
    entry_count += count;
    // "<prefix><name>/<index>".
    for (uint64_t k = 0; k < count; ++k) {
      name_bytes += extent_prefix.size() + f.name.size() + 1 + absl::StrCat(k).size();
    }
  }
  if (entry_count >= UINT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("namespace listing: ", file_count, " files and ", entry_count - file_count,
                     " extents are more than 2^32-2 ids; set a larger placement.extent_bytes"));
  }
  header.entry_count = static_cast<uint32_t>(entry_count);
  header.hash_slots = HashSlots(file_count);
  header.class_count = static_cast<uint32_t>(classes.size());
  header.class_index_bytes = classes.size() <= 65536 ? 2 : 4;
  header.split_count = static_cast<uint32_t>(splits.size());
  header.exception_count = static_cast<uint32_t>(exceptions.size());
  const uint64_t entries = entry_count;
  header.bytes[kRecords] = (entries + 1) * kRecordBytes;
  header.bytes[kNameBase] = ((entries + 1 + kNamesPerBase - 1) / kNamesPerBase) * sizeof(uint64_t);
  header.bytes[kInodes] = header.bytes[kCtimes] = header.bytes[kAtimes] =
      uint64_t{file_count} * sizeof(uint64_t);
  header.bytes[kClassOf] = uint64_t{file_count} * header.class_index_bytes;
  header.bytes[kClasses] = classes.size() * sizeof(Class);
  header.bytes[kSplit] = splits.size() * sizeof(Split);
  header.bytes[kExtentFile] = (entries - file_count) * sizeof(uint32_t);
  header.bytes[kBlockExceptions] = exceptions.size() * sizeof(BlockException);
  header.bytes[kHash] = uint64_t{header.hash_slots} * sizeof(HashSlot);
  header.bytes[kNames] = name_bytes;
  header.bytes[kRoot] = root.size();
  uint64_t at = Align8(sizeof(Header));
  for (uint32_t s = 0; s < kSectionCount; ++s) {
    if (s == kHash) at = (at + 63) & ~uint64_t{63};  // Lines of slots on cache lines.
    header.offset[s] = at;
    at = Align8(at + header.bytes[s]);
  }

  MONARCH_ASSIGN_OR_RETURN(WriteSealedRegion region,
                           CreateWriteSealedRegion("monarch-namespace", at));
  char* base = region.writable.data();
  std::memcpy(base, &header, sizeof(header));
  auto put = [&](Section s, uint64_t byte, auto value) {
    std::memcpy(base + header.offset[s] + byte, &value, sizeof(value));
  };
  auto put_record = [&](uint64_t id, uint64_t size, int64_t mtime_ns) {
    put(kRecords, id * kRecordBytes + kSizeAt, size);
    put(kRecords, id * kRecordBytes + kMtimeAt, mtime_ns);
  };
  // Names, files then extents, each entry's offset as its base plus a
  // remainder below 2^24 (kNamesPerBase).
  char* names = base + header.offset[kNames];
  uint64_t name_at = 0;
  uint64_t block_base = 0;
  bool names_fit = true;
  auto start_name = [&](uint64_t id) {
    if (id % kNamesPerBase == 0) {
      block_base = name_at;
      put(kNameBase, id / kNamesPerBase * sizeof(uint64_t), block_base);
    }
    names_fit = names_fit && name_at - block_base < (uint64_t{1} << kNameLowBits);
    put(kRecords, id * kRecordBytes + kNameLowAt, static_cast<uint32_t>(name_at - block_base));
  };
  auto append = [&](absl::string_view piece) {
    std::memcpy(names + name_at, piece.data(), piece.size());
    name_at += piece.size();
  };
  for (uint32_t id = 0; id < file_count; ++id) {
    const ListedFile& f = files[id];
    start_name(id);
    append(f.name);
    put_record(id, f.size, f.mtime_ns);
    put(kInodes, uint64_t{id} * sizeof(uint64_t), f.attributes.inode);
    put(kCtimes, uint64_t{id} * sizeof(int64_t), f.attributes.ctime_ns);
    put(kAtimes, uint64_t{id} * sizeof(int64_t), f.attributes.atime_ns);
    if (header.class_index_bytes == 2) {
      put(kClassOf, uint64_t{id} * 2, static_cast<uint16_t>(class_of[id]));
    } else {
      put(kClassOf, uint64_t{id} * 4, class_of[id]);
    }
  }
  std::vector<uint32_t>().swap(class_of);
  uint32_t next = file_count;
  for (const Split& split : splits) {
    const ListedFile& f = files[split.file];
    const uint64_t count = (f.size + extents.extent_bytes - 1) / extents.extent_bytes;
    for (uint64_t k = 0; k < count; ++k, ++next) {
      start_name(next);
      append(extent_prefix);
      append(f.name);
      append(absl::StrCat("/", k));
      const uint64_t offset = k * extents.extent_bytes;
      put_record(next, std::min(extents.extent_bytes, f.size - offset), f.mtime_ns);
      put(kExtentFile, uint64_t{next - file_count} * sizeof(uint32_t), split.file);
    }
  }
  start_name(entries);  // The end of the last name.
  if (!names_fit) {
    return absl::InvalidArgumentError(
        "namespace listing: 2,048 consecutive names hold more than 16 MiB");
  }
  auto copy = [&](Section s, const void* from) {
    if (header.bytes[s] > 0) std::memcpy(base + header.offset[s], from, header.bytes[s]);
  };
  copy(kClasses, classes.data());
  copy(kSplit, splits.data());
  copy(kBlockExceptions, exceptions.data());
  copy(kRoot, root.data());

  // The lookup slots, files only (an extent is found through its file).
  // Opened on the bytes just written, to compare names in place.
  MONARCH_ASSIGN_OR_RETURN(FileTable table, Open(base, region.writable.size()));
  char* hash = base + header.offset[kHash];
  for (uint32_t id = 0; id < file_count; ++id) {
    const absl::string_view name = table.name(id);
    const uint64_t h = HashName(name);
    for (uint32_t slot = SlotOf(h, header.hash_slots);;
         slot = slot + 1 == header.hash_slots ? 0 : slot + 1) {
      HashSlot value;
      std::memcpy(&value, hash + uint64_t{slot} * sizeof(value), sizeof(value));
      if (value.id_plus_one == 0) {
        value.id_plus_one = id + 1;
        value.tag_and_name =
            uint32_t{TagOf(h)} << kNameLowBits |
            table.Load<uint32_t>(kRecords, uint64_t{id} * kRecordBytes + kNameLowAt);
        std::memcpy(hash + uint64_t{slot} * sizeof(value), &value, sizeof(value));
        break;
      }
      if (value.tag_and_name >> kNameLowBits == TagOf(h) &&
          table.name(value.id_plus_one - 1) == name) {
        return absl::InvalidArgumentError(
            absl::StrCat("namespace listing: ", QuoteForError(name), " is listed twice"));
      }
    }
  }
  return region;
}

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

std::optional<uint32_t> FileTable::FindFile(absl::string_view canonical) const {
  const uint32_t slots = header_.hash_slots;
  const uint64_t h = HashName(canonical);
  const uint32_t tag = TagOf(h);
  uint32_t slot = SlotOf(h, slots);
  // At most every slot once: a damaged table cannot loop forever.
  for (uint32_t probes = 0; probes < slots; ++probes, slot = slot + 1 == slots ? 0 : slot + 1) {
    const HashSlot value = Checked<HashSlot>(slots_, uint64_t{slot} * sizeof(HashSlot));
    if (value.id_plus_one == 0) return std::nullopt;
    if (value.tag_and_name >> kNameLowBits != tag) continue;
    const uint32_t id = value.id_plus_one - 1;
    if (id >= header_.file_count) continue;
    // The name read from the slot's offset, and checked to be file id's
    // whole name (a damaged slot could point elsewhere).
    const uint64_t start =
        Checked<uint64_t>(name_bases_, uint64_t{id / kNamesPerBase} * sizeof(uint64_t)) +
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
      return id;
    }
  }
  return std::nullopt;
}

}  // namespace monarch
