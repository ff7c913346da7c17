// NamespaceImage implementation.

#include "service/namespace_image.h"

#include <cstddef>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace monarch::service {
namespace {

constexpr char kMagic[8] = {'M', 'O', 'N', 'A', 'R', 'N', 'S', '3'};

struct Header {
  char magic[8];
  uint32_t file_count;
  uint32_t hash_slots;  // A power of two.
  uint64_t total_bytes;
  uint64_t records_offset;
  uint64_t hash_offset;
  uint64_t names_offset;
  uint64_t names_bytes;
  uint64_t root_offset;
  uint64_t root_bytes;
  uint32_t entry_count;  // Files, then extents (Namespace::entry_count()).
  uint32_t reserved;
  uint64_t extent_bytes;  // 0 when no file is cached by extents.
};

struct Record {
  uint64_t name_offset;  // Into the names.
  uint32_t name_bytes;
  // A file's: its first extent's id, or 0 (cached whole). An extent's: the
  // id of its file.
  uint32_t link;
  uint64_t size;
  int64_t mtime_ns;
  FileAttributes attributes;
};

uint64_t Fnv1a(absl::string_view s) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t Align8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }

}  // namespace

absl::StatusOr<ScopedFd> WriteNamespaceImage(const Namespace& ns) {
  const uint32_t count = ns.file_count();
  const uint32_t entries = ns.entry_count();
  uint32_t slots = 2;
  while (slots < uint64_t{count} * 2) slots *= 2;
  uint64_t names_bytes = 0;
  for (uint32_t id = 0; id < entries; ++id) names_bytes += ns.entry(id).ref.name.size();

  Header header{};
  std::memcpy(header.magic, kMagic, sizeof(kMagic));
  header.file_count = count;
  header.hash_slots = slots;
  header.total_bytes = ns.total_bytes();
  header.entry_count = entries;
  header.extent_bytes = entries > count ? ns.extent_layout().extent_bytes : 0;
  header.records_offset = Align8(sizeof(Header));
  header.hash_offset = header.records_offset + uint64_t{entries} * sizeof(Record);
  header.names_offset = Align8(header.hash_offset + uint64_t{slots} * sizeof(uint32_t));
  header.names_bytes = names_bytes;
  header.root_offset = header.names_offset + names_bytes;
  header.root_bytes = ns.root().size();
  const uint64_t total = header.root_offset + header.root_bytes;

  MONARCH_ASSIGN_OR_RETURN(WriteSealedRegion image, CreateWriteSealedRegion("monarch-namespace", total));
  char* base = image.writable.data();
  std::memcpy(base, &header, sizeof(header));
  Record* records = reinterpret_cast<Record*>(base + header.records_offset);
  uint32_t* hash = reinterpret_cast<uint32_t*>(base + header.hash_offset);
  char* names = base + header.names_offset;
  uint64_t name_offset = 0;
  for (uint32_t id = 0; id < entries; ++id) {
    const FileEntry& entry = ns.entry(id);
    const FileRef& ref = entry.ref;
    const uint32_t link = ref.part_of != nullptr ? ref.part_of->id : entry.first_extent;
    records[id] = Record{name_offset, static_cast<uint32_t>(ref.name.size()), link, ref.size,
                         ref.mtime_ns, ns.attributes(id)};
    std::memcpy(names + name_offset, ref.name.data(), ref.name.size());
    name_offset += ref.name.size();
    if (id >= count) continue;  // Extents are found through their file, not by name.
    for (uint64_t slot = Fnv1a(ref.name) & (slots - 1);; slot = (slot + 1) & (slots - 1)) {
      if (hash[slot] == 0) {
        hash[slot] = id + 1;
        break;
      }
    }
  }
  std::memcpy(base + header.root_offset, ns.root().data(), ns.root().size());
  return std::move(image.fd);
}

absl::StatusOr<std::unique_ptr<NamespaceImage>> NamespaceImage::Open(const ScopedFd& fd) {
  std::unique_ptr<NamespaceImage> image(new NamespaceImage());
  MONARCH_ASSIGN_OR_RETURN(image->region_, MappedRegion::Map(fd.get(), /*writable=*/false));
  const uint64_t size = image->region_.size();
  const char* base = image->region_.data();
  Header header;
  if (size < sizeof(header)) return absl::DataLossError("namespace image too small");
  std::memcpy(&header, base, sizeof(header));
  auto within = [size](uint64_t offset, uint64_t bytes) {
    return offset <= size && bytes <= size - offset;
  };
  const bool valid =
      std::memcmp(header.magic, kMagic, sizeof(kMagic)) == 0 && header.hash_slots >= 2 &&
      (header.hash_slots & (header.hash_slots - 1)) == 0 &&
      header.hash_slots >= header.file_count && header.records_offset % 8 == 0 &&
      header.hash_offset % 4 == 0 && header.entry_count >= header.file_count &&
      (header.entry_count == header.file_count || header.extent_bytes > 0) &&
      within(header.records_offset, uint64_t{header.entry_count} * sizeof(Record)) &&
      within(header.hash_offset, uint64_t{header.hash_slots} * sizeof(uint32_t)) &&
      within(header.names_offset, header.names_bytes) &&
      within(header.root_offset, header.root_bytes) && header.root_bytes < 4096;
  if (!valid) return absl::DataLossError("namespace image header is damaged");
  image->file_count_ = header.file_count;
  image->entry_count_ = header.entry_count;
  image->extent_bytes_ = header.extent_bytes;
  image->hash_slots_ = header.hash_slots;
  image->total_bytes_ = header.total_bytes;
  image->records_ = base + header.records_offset;
  image->hash_ = reinterpret_cast<const uint32_t*>(base + header.hash_offset);
  image->names_ = absl::string_view(base + header.names_offset, header.names_bytes);
  image->root_.assign(base + header.root_offset, header.root_bytes);
  return image;
}

absl::string_view NamespaceImage::file_name(uint32_t id) const {
  Record record;
  std::memcpy(&record, records_ + uint64_t{id} * sizeof(Record), sizeof(record));
  if (record.name_offset > names_.size() || record.name_bytes > names_.size() - record.name_offset)
    return {};
  return names_.substr(record.name_offset, record.name_bytes);
}

FileRef NamespaceImage::ref(uint32_t id) const {
  Record record;
  std::memcpy(&record, records_ + uint64_t{id} * sizeof(Record), sizeof(record));
  FileRef ref;
  ref.id = id;
  ref.name = file_name(id);
  ref.size = record.size;
  ref.mtime_ns = record.mtime_ns;
  if (id >= file_count_) {
    // An extent: where it starts in its file, from its place among the
    // file's extents (part_of stays null: the source reads the file).
    const uint32_t file = record.link;
    const uint32_t first = file < file_count_ ? first_extent(file) : 0;
    ref.part_offset = first != 0 && id >= first ? uint64_t{id - first} * extent_bytes_ : 0;
  }
  return ref;
}

uint32_t NamespaceImage::first_extent(uint32_t file) const {
  // Asked on every read: the link alone first, and nothing at all when no
  // file is cached by extents.
  if (extent_bytes_ == 0) return 0;
  const char* at = records_ + uint64_t{file} * sizeof(Record);
  uint32_t link;
  std::memcpy(&link, at + offsetof(Record, link), sizeof(link));
  if (link == 0) return 0;
  Record record;
  std::memcpy(&record, at, sizeof(record));
  // Checked, as everything here: the extents must lie among the entries.
  const uint64_t extents = (record.size + extent_bytes_ - 1) / extent_bytes_;
  if (record.link < file_count_ || record.link > entry_count_ || extents == 0 ||
      extents > entry_count_ - record.link) {
    return 0;
  }
  return record.link;
}

uint32_t NamespaceImage::file_of(uint32_t extent) const {
  Record record;
  std::memcpy(&record, records_ + uint64_t{extent} * sizeof(Record), sizeof(record));
  return record.link;
}

Monarch::FileStat NamespaceImage::Stat(uint32_t id) const {
  Record record;
  std::memcpy(&record, records_ + uint64_t{id} * sizeof(Record), sizeof(record));
  return MakeFileStat(ref(id), record.attributes);
}

std::optional<uint32_t> NamespaceImage::FindId(absl::string_view name) const {
  std::string scratch;
  absl::string_view canonical;
  if (!CanonicalDatasetName(root_, name, &scratch, &canonical) || canonical.empty()) {
    return std::nullopt;
  }
  const uint32_t mask = hash_slots_ - 1;
  // At most every slot once: a damaged table cannot loop forever.
  uint32_t slot = static_cast<uint32_t>(Fnv1a(canonical)) & mask;
  for (uint32_t probes = 0; probes < hash_slots_; ++probes, slot = (slot + 1) & mask) {
    const uint32_t value = hash_[slot];
    if (value == 0) return std::nullopt;
    const uint32_t id = value - 1;
    if (id < file_count_ && file_name(id) == canonical) return id;
  }
  return std::nullopt;
}

}  // namespace monarch::service
