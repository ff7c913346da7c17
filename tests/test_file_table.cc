// FileTable (metadata/file_table.h): the compact region of names, sizes and
// stat() answers that the namespace keeps and a node service's clients map.
// What each of its space-saving layouts must still answer exactly, and what
// a damaged region must never do.

#include <doctest/doctest.h>

#include <deque>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "metadata/file_table.h"
#include "metadata/file_table_writer.h"
#include "metadata/namespace.h"

namespace monarch {
namespace {

// A flat listing of `count` files "d<k>/f<i>.bin" over `dirs` directories;
// `attributes(i)` gives file i's stat() answers.
struct Listing {
  std::deque<std::string> names;
  NamespaceListing listing;
};

template <typename Attributes>
Listing MakeListing(uint32_t count, uint32_t dirs, Attributes attributes,
                    uint64_t (*size)(uint32_t) = [](uint32_t i) { return uint64_t{i} * 7 + 1; }) {
  Listing out;
  out.listing.directories.push_back({"", 0});
  for (uint32_t d = 0; d < dirs; ++d) out.listing.directories.push_back({absl::StrCat("d", d), 0});
  for (uint32_t i = 0; i < count; ++i) {
    out.names.push_back(absl::StrCat("d", i % dirs, "/f", i, ".bin"));
    out.listing.files.push_back(
        {out.names.back(), 1 + i % dirs, size(i), 1000 + int64_t{i}, attributes(i)});
  }
  out.listing.root_device = 77;
  return out;
}

FileAttributes Plain(uint32_t i) {
  FileAttributes a;
  a.device = 77;
  a.inode = 5000 + i;
  a.atime_ns = 3000000000 + int64_t{i} * 3;
  a.ctime_ns = 2000000000 + int64_t{i} * 5;
  a.blocks = 8;
  a.mode = 0100644;
  a.link_count = 1;
  a.uid = 1000;
  a.gid = 100;
  a.block_size = 4096;
  return a;
}

void CheckSame(const FileAttributes& got, const FileAttributes& want) {
  CHECK(got.device == want.device);
  CHECK(got.inode == want.inode);
  CHECK(got.atime_ns == want.atime_ns);
  CHECK(got.ctime_ns == want.ctime_ns);
  CHECK(got.blocks == want.blocks);
  CHECK(got.mode == want.mode);
  CHECK(got.link_count == want.link_count);
  CHECK(got.uid == want.uid);
  CHECK(got.gid == want.gid);
  CHECK(got.block_size == want.block_size);
  CHECK(got.via_symlink == want.via_symlink);
}

TEST_CASE("every file is found by name and answers what the listing said, across name blocks") {
  // 5,000 files: three blocks of 2,048 names, so offsets cross block bases.
  const Listing in = MakeListing(5000, 7, Plain);
  auto region = FileTableWriter::Write("/data", in.listing, ExtentLayout{});
  REQUIRE(region.ok());
  auto table = FileTable::Open(region->writable.data(), region->writable.size());
  REQUIRE(table.ok());
  CHECK(table->file_count() == 5000);
  CHECK(table->entry_count() == 5000);
  CHECK(table->root() == "/data");
  CHECK(table->root_device() == 77);
  uint64_t total = 0;
  for (uint32_t i = 0; i < 5000; ++i) {
    const ListedFile& f = in.listing.files[i];
    total += f.size;
    absl::string_view stored;
    REQUIRE(table->FindFile(f.name, &stored) == i);
    CHECK(table->name(i) == f.name);
    // The table's own bytes, not the caller's.
    CHECK(stored.data() == table->name(i).data());
    CHECK(stored.size() == f.name.size());
    CHECK(table->size(i) == f.size);
    CHECK(table->mtime_ns(i) == f.mtime_ns);
    CheckSame(table->attributes(i), f.attributes);
    CHECK(table->first_extent(i) == 0);
  }
  CHECK(table->total_bytes() == total);
  // Not files: a prefix, a longer name, a directory, the empty name.
  CHECK_FALSE(table->FindFile("d0/f0.bi").has_value());
  CHECK_FALSE(table->FindFile("d0/f0.bin2").has_value());
  CHECK_FALSE(table->FindFile("d0").has_value());
  CHECK_FALSE(table->FindFile("").has_value());
  CHECK_FALSE(table->FindFile(absl::string_view()).has_value());  // No bytes at all.
  CHECK(table->name(5000).empty());  // Out of range.
}

// A table's slots are placed by HashName, and processes other than its
// writer look names up in it (a client maps its service's table): the hash
// is part of the format and must not change by accident. Its values at
// every length and alignment of a fixed byte string, folded into one, are
// pinned here.
TEST_CASE("a name's hash is the format's at every length and alignment") {
  std::mt19937 random(11);
  std::string bytes(80, '\0');
  for (char& c : bytes) c = static_cast<char>(random());
  uint64_t fold = 0;
  for (size_t start = 0; start < 8; ++start) {
    for (size_t length = 0; start + length <= bytes.size(); ++length) {
      fold = fold * 31 + FileTable::HashName(absl::string_view(bytes.data() + start, length));
    }
  }
  CHECK(fold == 13317807053669796040ull);
  CHECK(FileTable::HashName("train/n01440764/n01440764_10026.JPEG") == 14739915157544882794ull);
  CHECK(FileTable::HashName(absl::string_view()) == FileTable::HashName(""));
}

TEST_CASE("a file is found by any spelling of its name, and nothing outside the root is") {
  // Files "x" and "2/x": "/data2/x" must not become "2/x" of root "/data".
  for (const std::string root : {"/data", "/"}) {
    CAPTURE(root);
    NamespaceListing listing;
    listing.directories = {{"", 0}, {"2", 0}};
    listing.files = {{"x", 0, 10, 1, Plain(0)}, {"2/x", 1, 20, 2, Plain(1)}};
    auto region = FileTableWriter::Write(root, listing, ExtentLayout{});
    REQUIRE(region.ok());
    auto table = FileTable::Open(region->writable.data(), region->writable.size());
    REQUIRE(table.ok());
    const std::string inside = root == "/" ? "/" : root + "/";
    auto find = [&](absl::string_view name) { return FindDatasetFile(*table, root, name); };
    CHECK(find("x") == 0u);
    CHECK(find("2/x") == 1u);
    CHECK(find(inside + "x") == 0u);
    CHECK(find(inside + "2/x") == 1u);
    CHECK(find("./2//x") == 1u);
    CHECK(find(inside + "./2/./x") == 1u);
    CHECK(find(root + "//x") == 0u);
    CHECK(find("2/x/") == 1u);  // A trailing slash, as CanonicalDatasetName drops it.
    CHECK(find("2/../x") == std::nullopt);  // ".." never resolves.
    CHECK(find("") == std::nullopt);
    CHECK(find("/") == std::nullopt);
    CHECK(find("2") == std::nullopt);  // A directory.
    CHECK(find("x2") == std::nullopt);
    absl::string_view stored;
    CHECK(FindDatasetFile(*table, root, inside + "2/x", &stored) == 1u);
    CHECK(stored.data() == table->name(1).data());
    if (root != "/") {
      CHECK(find("/data2/x") == std::nullopt);  // A sibling of the root, not inside it.
      CHECK(find("/elsewhere/x") == std::nullopt);
      CHECK(find("/dat") == std::nullopt);
    }
  }
}

TEST_CASE("shared attributes are stored once, and a dataset of many owners still answers") {
  // 70,000 distinct owners: more classes than a 2-byte index holds.
  auto many = [](uint32_t i) {
    FileAttributes a = Plain(i);
    a.uid = 10000 + i;
    a.via_symlink = i % 2;
    return a;
  };
  const Listing in = MakeListing(70000, 3, many);
  auto region = FileTableWriter::Write("/d", in.listing, ExtentLayout{});
  REQUIRE(region.ok());
  auto table = FileTable::Open(region->writable.data(), region->writable.size());
  REQUIRE(table.ok());
  for (uint32_t i : {0u, 1u, 65535u, 65536u, 65537u, 69999u}) {
    CheckSame(table->attributes(i), many(i));
  }
  // One class for all: the table of 70,000 plain files is smaller by at
  // least the 2 bytes per file the wide index costs.
  const Listing plain = MakeListing(70000, 3, Plain);
  auto small = FileTableWriter::Write("/d", plain.listing, ExtentLayout{});
  REQUIRE(small.ok());
  auto small_table = FileTable::Open(small->writable.data(), small->writable.size());
  REQUIRE(small_table.ok());
  CHECK(small_table->table_bytes() + 2 * 70000 <= table->table_bytes());
}

TEST_CASE("block counts of 2^32-1 and more are answered exactly") {
  auto huge = [](uint32_t i) {
    FileAttributes a = Plain(i);
    if (i % 3 == 0) a.blocks = (uint64_t{1} << 33) + i;  // 4 TiB of blocks.
    if (i == 4) a.blocks = UINT32_MAX;
    return a;
  };
  const Listing in = MakeListing(10, 2, huge);
  auto region = FileTableWriter::Write("/d", in.listing, ExtentLayout{});
  REQUIRE(region.ok());
  auto table = FileTable::Open(region->writable.data(), region->writable.size());
  REQUIRE(table.ok());
  for (uint32_t i = 0; i < 10; ++i) CHECK(table->attributes(i).blocks == huge(i).blocks);
}

TEST_CASE("block counts follow from the size and the unit, sparse files listed apart") {
  auto blocks = [](uint32_t i) {
    FileAttributes a = Plain(i);
    const uint64_t size = uint64_t{i} * 7 + 1;
    a.blocks = (size + 4095) / 4096 * 8;  // ext4's and xfs's 4 KiB unit.
    if (i % 5 == 0) a.blocks = 0;         // Sparse: no block allocated.
    if (i == 7) a.blocks = 1234567;       // Nothing a unit gives.
    return a;
  };
  const Listing in = MakeListing(3000, 4, blocks);
  auto region = FileTableWriter::Write("/d", in.listing, ExtentLayout{});
  REQUIRE(region.ok());
  auto table = FileTable::Open(region->writable.data(), region->writable.size());
  REQUIRE(table.ok());
  for (uint32_t i = 0; i < 3000; ++i) REQUIRE(table->attributes(i).blocks == blocks(i).blocks);
  // A file's block count costs nothing but its class: the same listing with
  // every count a unit's is no smaller than with a fifth of them listed apart,
  // less their 16 bytes each.
  auto plain = [](uint32_t i) {
    FileAttributes a = Plain(i);
    a.blocks = (uint64_t{i} * 7 + 1 + 4095) / 4096 * 8;
    return a;
  };
  const Listing whole = MakeListing(3000, 4, plain);
  auto whole_region = FileTableWriter::Write("/d", whole.listing, ExtentLayout{});
  REQUIRE(whole_region.ok());
  auto whole_table = FileTable::Open(whole_region->writable.data(), whole_region->writable.size());
  REQUIRE(whole_table.ok());
  CHECK(whole_table->table_bytes() < table->table_bytes());
  CHECK(table->table_bytes() - whole_table->table_bytes() <= 16 * 601 + 4096);
}

TEST_CASE("files cached by extents: their extents' names, sizes and places in the file") {
  const uint64_t mib = 1 << 20;
  const Listing in = MakeListing(6, 2, Plain, [](uint32_t i) -> uint64_t {
    return i == 1 ? 5 * (1 << 20) + 99 : i == 4 ? 9 * (1 << 20) : 1000;
  });
  const ExtentLayout layout{mib, 4 * mib};
  auto region = FileTableWriter::Write("/d", in.listing, layout);
  REQUIRE(region.ok());
  auto table = FileTable::Open(region->writable.data(), region->writable.size());
  REQUIRE(table.ok());
  CHECK(table->entry_count() == 6 + 6 + 9);
  CHECK(table->first_extent(1) == 6);
  CHECK(table->extent_count(1) == 6);
  CHECK(table->first_extent(4) == 12);
  CHECK(table->extent_count(4) == 9);
  CHECK(table->first_extent(0) == 0);
  CHECK(table->extent_count(0) == 0);
  for (uint32_t k = 0; k < 6; ++k) {
    const uint32_t id = 6 + k;
    CHECK(table->name(id) == absl::StrCat(".monarch/extents/", mib, "/", in.names[1], "/", k));
    CHECK(table->size(id) == (k < 5 ? mib : 99));
    CHECK(table->part_offset(id) == k * mib);
    CHECK(table->source_file(id) == 1);
    CHECK(table->mtime_ns(id) == in.listing.files[1].mtime_ns);
    CheckSame(table->attributes(id), in.listing.files[1].attributes);
    // An extent is found through its file, not by name.
    CHECK_FALSE(table->FindFile(table->name(id)).has_value());
  }
  CHECK(table->source_file(20) == 4);
  CHECK(table->source_file(21) == FileTable::kNoFile);
}

TEST_CASE("two files of one name are refused") {
  Listing in = MakeListing(3, 1, Plain);
  in.names.push_back(std::string(in.names[1]));
  in.listing.files.push_back({in.names.back(), 1, 5, 0, Plain(9)});
  auto region = FileTableWriter::Write("/d", in.listing, ExtentLayout{});
  REQUIRE_FALSE(region.ok());
  CHECK(absl::StrContains(region.status().message(), "'d0/f1.bin' is listed twice"));
}

TEST_CASE("a damaged table is refused or answers nothing outside itself") {
  const Listing in = MakeListing(3000, 5, Plain, [](uint32_t i) -> uint64_t {
    return i % 1000 == 0 ? 6 * (1 << 20) : 100;
  });
  auto region = FileTableWriter::Write("/d", in.listing, ExtentLayout{1 << 20, 4 << 20});
  REQUIRE(region.ok());
  const std::string good(region->writable.data(), region->writable.size());
  CHECK_FALSE(FileTable::Open(good.data(), 100).ok());  // Shorter than its header.
  std::string truncated = good.substr(0, good.size() / 2);
  CHECK_FALSE(FileTable::Open(truncated.data(), truncated.size()).ok());
  std::mt19937_64 random(11);
  int opened = 0;
  for (int round = 0; round < 300; ++round) {
    std::string bad = good;
    // A few random bytes anywhere, the header's half the time.
    const size_t span = round % 2 == 0 ? 512 : bad.size();
    for (int k = 0; k < 1 + round % 8; ++k) bad[random() % span] = static_cast<char>(random());
    auto table = FileTable::Open(bad.data(), bad.size());
    if (!table.ok()) continue;
    ++opened;
    // Every answer from inside the region (ASan checks), whatever it is.
    for (uint32_t id : {0u, 1u, 999u, 1000u, 2999u, 3000u, 3005u, table->entry_count()}) {
      const absl::string_view name = table->name(id);
      CHECK((name.empty() || (name.data() >= bad.data() &&
                              name.data() + name.size() <= bad.data() + bad.size())));
      (void)table->attributes(id);
      (void)table->size(id);
      (void)table->mtime_ns(id);
      (void)table->part_offset(id);
      const uint32_t file = table->source_file(id);
      CHECK((file == FileTable::kNoFile || file < table->file_count()));
      if (id < table->file_count()) {
        const uint32_t first = table->first_extent(id);
        CHECK((first == 0 || (first >= table->file_count() &&
                              uint64_t{first} + table->extent_count(id) <= table->entry_count())));
      }
    }
    for (uint32_t i : {0u, 7u, 2999u}) {
      const std::optional<uint32_t> found = table->FindFile(in.names[i]);
      CHECK((!found.has_value() || table->name(*found) == in.names[i]));
    }
  }
  CHECK(opened > 0);  // The mutations that miss the header leave it usable.
}

}  // namespace
}  // namespace monarch
