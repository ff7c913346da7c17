// FileTableWriter implementation.

#include "metadata/file_table_writer.h"

#include <algorithm>
#include <cstring>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "metadata/file_table.h"
#include "metadata/namespace.h"

namespace monarch {
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

absl::StatusOr<WriteSealedRegion> FileTableWriter::Write(const std::string& root,
                                                         const NamespaceListing& listing,
                                                         const ExtentLayout& extents) {
  FileTableWriter writer(root, listing, extents);
  MONARCH_RETURN_IF_ERROR(writer.Plan());
  MONARCH_ASSIGN_OR_RETURN(WriteSealedRegion region,
                           CreateWriteSealedRegion("monarch-namespace", writer.region_bytes_));
  MONARCH_RETURN_IF_ERROR(writer.WriteEntries(region.writable.data()));
  MONARCH_RETURN_IF_ERROR(writer.WriteSlots(region.writable.data(), region.writable.size()));
  return region;
}

FileTableWriter::FileTableWriter(const std::string& root, const NamespaceListing& listing,
                                 const ExtentLayout& extents)
    : root_(root),
      listing_(listing),
      extents_(extents),
      extent_prefix_(absl::StrCat(".monarch/extents/", extents.extent_bytes, "/")) {}

uint64_t FileTableWriter::ExtentCount(const ListedFile& file) const {
  if (!extents_.Splits(file.size)) return 0;
  return (file.size + extents_.extent_bytes - 1) / extents_.extent_bytes;
}

absl::Status FileTableWriter::Plan() {
  const std::vector<ListedFile>& files = listing_.files;
  const uint32_t file_count = static_cast<uint32_t>(files.size());
  Header& header = header_;
  std::memcpy(header.magic, kMagic, sizeof(kMagic));
  header.file_count = file_count;
  header.extent_bytes = extents_.extent_bytes;
  header.extent_threshold = extents_.threshold;
  header.root_device = listing_.root_device;
  uint64_t entry_count = file_count;
  uint64_t name_bytes = 0;
  using ClassKey =
      std::tuple<uint64_t, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t>;
  absl::flat_hash_map<ClassKey, uint32_t> class_index;
  class_of_.resize(file_count);
  for (uint32_t id = 0; id < file_count; ++id) {
    const ListedFile& f = files[id];
    header.total_bytes += f.size;
    name_bytes += f.name.size();
    const FileAttributes& a = f.attributes;
    const uint32_t unit = BlockUnitLog2(f.size, a.blocks);
    if (unit == kListedBlocks) exceptions_.push_back({id, 0, a.blocks});
    const ClassKey key{a.device, a.mode,       a.link_count,  a.uid,
                       a.gid,    a.block_size, a.via_symlink, unit};
    auto [it, added] = class_index.try_emplace(key, static_cast<uint32_t>(classes_.size()));
    if (added) {
      classes_.push_back(Class{a.device, a.mode, a.link_count, a.uid, a.gid, a.block_size,
                               a.via_symlink, unit, 0});
    }
    class_of_[id] = it->second;
    const uint64_t count = ExtentCount(f);
    if (count == 0) continue;
    splits_.push_back({id, static_cast<uint32_t>(std::min<uint64_t>(entry_count, UINT32_MAX))});
    entry_count += count;
    // "<prefix><name>/<index>".
    for (uint64_t k = 0; k < count; ++k) {
      name_bytes += extent_prefix_.size() + f.name.size() + 1 + absl::StrCat(k).size();
    }
  }
  if (entry_count >= UINT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("namespace listing: ", file_count, " files and ", entry_count - file_count,
                     " extents are more than 2^32-2 ids; set a larger placement.extent_bytes"));
  }
  header.entry_count = static_cast<uint32_t>(entry_count);
  header.hash_slots = HashSlots(file_count);
  header.class_count = static_cast<uint32_t>(classes_.size());
  header.class_index_bytes = classes_.size() <= 65536 ? 2 : 4;
  header.split_count = static_cast<uint32_t>(splits_.size());
  header.exception_count = static_cast<uint32_t>(exceptions_.size());
  const uint64_t entries = entry_count;
  header.bytes[kRecords] = (entries + 1) * kRecordBytes;
  header.bytes[kNameBase] = ((entries + 1 + kNamesPerBase - 1) / kNamesPerBase) * sizeof(uint64_t);
  header.bytes[kInodes] = header.bytes[kCtimes] = header.bytes[kAtimes] =
      uint64_t{file_count} * sizeof(uint64_t);
  header.bytes[kClassOf] = uint64_t{file_count} * header.class_index_bytes;
  header.bytes[kClasses] = classes_.size() * sizeof(Class);
  header.bytes[kSplit] = splits_.size() * sizeof(Split);
  header.bytes[kExtentFile] = (entries - file_count) * sizeof(uint32_t);
  header.bytes[kBlockExceptions] = exceptions_.size() * sizeof(BlockException);
  header.bytes[kHash] = uint64_t{header.hash_slots} * sizeof(HashSlot);
  header.bytes[kNames] = name_bytes;
  header.bytes[kRoot] = root_.size();
  uint64_t at = Align8(sizeof(Header));
  for (uint32_t s = 0; s < kSectionCount; ++s) {
    if (s == kHash) at = (at + 63) & ~uint64_t{63};  // Lines of slots on cache lines.
    header.offset[s] = at;
    at = Align8(at + header.bytes[s]);
  }
  region_bytes_ = at;
  return absl::OkStatus();
}

absl::Status FileTableWriter::WriteEntries(char* base) {
  const Header& header = header_;
  const std::vector<ListedFile>& files = listing_.files;
  const uint32_t file_count = header.file_count;
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
      put(kClassOf, uint64_t{id} * 2, static_cast<uint16_t>(class_of_[id]));
    } else {
      put(kClassOf, uint64_t{id} * 4, class_of_[id]);
    }
  }
  std::vector<uint32_t>().swap(class_of_);
  uint32_t next = file_count;
  for (const Split& split : splits_) {
    const ListedFile& f = files[split.file];
    const uint64_t count = ExtentCount(f);
    for (uint64_t k = 0; k < count; ++k, ++next) {
      start_name(next);
      append(extent_prefix_);
      append(f.name);
      append(absl::StrCat("/", k));
      const uint64_t offset = k * extents_.extent_bytes;
      put_record(next, std::min(extents_.extent_bytes, f.size - offset), f.mtime_ns);
      put(kExtentFile, uint64_t{next - file_count} * sizeof(uint32_t), split.file);
    }
  }
  start_name(header.entry_count);  // The end of the last name.
  if (!names_fit) {
    return absl::InvalidArgumentError(
        "namespace listing: 2,048 consecutive names hold more than 16 MiB");
  }
  auto copy = [&](Section s, const void* from) {
    if (header.bytes[s] > 0) std::memcpy(base + header.offset[s], from, header.bytes[s]);
  };
  copy(kClasses, classes_.data());
  copy(kSplit, splits_.data());
  copy(kBlockExceptions, exceptions_.data());
  copy(kRoot, root_.data());
  return absl::OkStatus();
}

absl::Status FileTableWriter::WriteSlots(char* base, uint64_t size) {
  // Opened on the bytes just written, to compare names in place.
  MONARCH_ASSIGN_OR_RETURN(FileTable table, FileTable::Open(base, size));
  char* slots = base + header_.offset[kHash];
  const char* records = base + header_.offset[kRecords];
  for (uint32_t id = 0; id < header_.file_count; ++id) {
    const absl::string_view name = table.name(id);
    const uint64_t h = HashName(name);
    for (uint32_t slot = SlotOf(h, header_.hash_slots);;
         slot = slot + 1 == header_.hash_slots ? 0 : slot + 1) {
      HashSlot value;
      std::memcpy(&value, slots + uint64_t{slot} * sizeof(value), sizeof(value));
      if (value.id_plus_one == 0) {
        uint32_t name_low;
        std::memcpy(&name_low, records + uint64_t{id} * kRecordBytes + kNameLowAt,
                    sizeof(name_low));
        value.id_plus_one = id + 1;
        value.tag_and_name = uint32_t{TagOf(h)} << kNameLowBits | name_low;
        std::memcpy(slots + uint64_t{slot} * sizeof(value), &value, sizeof(value));
        break;
      }
      if (value.tag_and_name >> kNameLowBits == TagOf(h) &&
          table.name(value.id_plus_one - 1) == name) {
        return absl::InvalidArgumentError(
            absl::StrCat("namespace listing: ", QuoteForError(name), " is listed twice"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace monarch
