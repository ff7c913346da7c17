// PurgeCopyTree (src/drivers/copy_purge.h): a file tier's copies and
// Monarch's bookkeeping go; a user's files, symlinks (and what they point
// to), other file systems and directories the purge did not empty stay.
// The whole `monarch purge` with a service, a RAM tier and a dataset:
// tests/service/service_processes_test.py, scenario "purge".

#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "drivers/copy_integrity.h"
#include "drivers/copy_purge.h"
#include "drivers/storage_driver.h"
#include "test_util.h"

namespace monarch {
namespace {

namespace fs = std::filesystem;
using testing::ScratchDir;

// Stores genuine copies (through the posix driver, trailers and all) of
// `names`, each `size` bytes; returns the bytes they take on disk.
uint64_t StoreCopies(const std::string& root, const std::vector<std::string>& names,
                     uint64_t size) {
  std::unique_ptr<StorageDriver> driver = NewPosixDriver(root, 16);
  // StoreCopy reads up to `n` rounded up to 4 KiB, from 4 KiB-aligned memory.
  alignas(4096) static char data[64 << 10];
  REQUIRE(size <= sizeof(data));
  for (uint64_t i = 0; i < size; ++i) data[i] = testing::ExpectedByte(7, i);
  uint32_t id = 0;
  for (const std::string& name : names) {
    FileRef file{id++, name, size, 1700000000000000000};
    REQUIRE(StoreCopy(*driver, file, data, size).ok());
  }
  driver->WaitForBackgroundWork();
  return names.size() * (size + CopyTrailerBytes(size));
}

void WriteText(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// Every path under `root` (relative), symlinks not followed.
std::set<std::string> Tree(const std::string& root) {
  std::set<std::string> paths;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator();
       ++it) {
    paths.insert(it->path().lexically_relative(root).string());
  }
  return paths;
}

TEST_CASE("purge removes every copy and what Monarch keeps, and only that") {
  ScratchDir scratch;
  const std::string tier = scratch.Sub("tier");
  const uint64_t copy_bytes =
      StoreCopies(tier, {"a.bin", "train/b.bin", "train/deep/c.bin", "val/d.bin"}, 10000);
  // The user's own, in the tier and in a directory copies went to too.
  WriteText(tier + "/notes.txt", "mine");
  WriteText(tier + "/train/README", "mine too");
  fs::create_directories(tier + "/empty-of-mine");
  // A file that only looks like a copy: long enough, no trailer.
  WriteText(tier + "/big.dat", std::string(100000, 'x'));
  // A copy cut short (a crash): not provably Monarch's any more.
  fs::copy_file(tier + "/a.bin", tier + "/cut.bin");
  fs::resize_file(tier + "/cut.bin", 5000);
  // A temporary of a writer that is gone, and one of a live one (this
  // process), in Monarch's reserved directory.
  WriteText(tier + "/.monarch/tmp/999999999.3", "half a copy");
  const std::string live = absl::StrCat(tier, "/.monarch/tmp/", ::getpid(), ".1");
  WriteText(live, "being written");
  // A symlink to a directory outside, holding a genuine copy: not followed.
  const std::string outside = scratch.Sub("outside");
  StoreCopies(outside, {"x.bin"}, 5000);
  fs::create_directory_symlink(outside, tier + "/link-to-outside");
  fs::create_symlink(tier + "/a.bin", tier + "/link-to-copy");
  // A FIFO must not block the walk.
  REQUIRE(::mkfifo((tier + "/fifo").c_str(), 0600) == 0);

  SUBCASE("dry run lists, removes nothing") {
    const std::set<std::string> before = Tree(tier);
    std::set<std::string> listed;
    PurgeOptions options;
    options.dry_run = true;
    options.on_file = [&](const std::string& path, uint64_t) { listed.insert(path); };
    absl::StatusOr<PurgeReport> report = PurgeCopyTree(tier, options);
    REQUIRE(report.ok());
    CHECK(report->copies == 4);
    CHECK(report->copy_bytes == copy_bytes);
    CHECK(report->temporaries == 1);
    CHECK(listed == std::set<std::string>{tier + "/a.bin", tier + "/train/b.bin",
                                          tier + "/train/deep/c.bin", tier + "/val/d.bin",
                                          tier + "/.monarch/tmp/999999999.3"});
    CHECK(Tree(tier) == before);
  }

  SUBCASE("purge") {
    std::set<std::string> removed;
    PurgeOptions options;
    options.on_file = [&](const std::string& path, uint64_t) { removed.insert(path); };
    absl::StatusOr<PurgeReport> report = PurgeCopyTree(tier, options);
    REQUIRE(report.ok());
    CHECK(report->errors.empty());
    CHECK(report->copies == 4);
    CHECK(report->copy_bytes == copy_bytes);
    CHECK(report->temporaries == 1);
    CHECK(report->live_temporaries == 1);
    CHECK(report->symlinks == 2);
    // notes.txt, README, big.dat, cut.bin, fifo.
    CHECK(report->foreign_files == 5);
    // train/deep and val: emptied. train keeps the README; .monarch/tmp a
    // live temporary; empty-of-mine was empty before.
    CHECK(report->directories == 2);
    CHECK(removed.size() == 5);
    const std::set<std::string> left = Tree(tier);
    std::string listing;
    for (const std::string& path : left) absl::StrAppend(&listing, path, " ");
    INFO("left: ", listing);
    CHECK(left == std::set<std::string>{".monarch", ".monarch/tmp",
                                              absl::StrCat(".monarch/tmp/", ::getpid(), ".1"),
                                              "notes.txt", "train", "train/README",
                                              "empty-of-mine", "big.dat", "cut.bin",
                                              "link-to-outside", "link-to-copy", "fifo"});
    // What the symlink pointed to is untouched.
    CHECK(fs::exists(outside + "/x.bin"));

    // Once the live writer is done, the reserved directory goes too.
    fs::remove(live);
    report = PurgeCopyTree(tier, PurgeOptions{});
    REQUIRE(report.ok());
    CHECK(report->copies == 0);
    CHECK(report->directories == 2);  // .monarch/tmp, .monarch
    CHECK(!fs::exists(tier + "/.monarch"));
  }
}

TEST_CASE("purge removes the copies of extents, and keeps what is not a copy among them") {
  ScratchDir scratch;
  const std::string tier = scratch.Sub("tier");
  const uint64_t copy_bytes =
      StoreCopies(tier, {".monarch/extents/1048576/big.bin/0",
                         ".monarch/extents/1048576/big.bin/1",
                         ".monarch/extents/1048576/sub/other.bin/7", "whole.bin"},
                  10000);
  WriteText(tier + "/.monarch/extents/1048576/big.bin/notes.txt", "mine");
  absl::StatusOr<PurgeReport> report = PurgeCopyTree(tier, PurgeOptions{});
  REQUIRE(report.ok());
  CHECK(report->errors.empty());
  CHECK(report->copies == 4);
  CHECK(report->copy_bytes == copy_bytes);
  CHECK(report->foreign_files == 1);
  CHECK(Tree(tier) == std::set<std::string>{".monarch", ".monarch/extents",
                                             ".monarch/extents/1048576",
                                             ".monarch/extents/1048576/big.bin",
                                             ".monarch/extents/1048576/big.bin/notes.txt"});
  fs::remove(tier + "/.monarch/extents/1048576/big.bin/notes.txt");
  report = PurgeCopyTree(tier, PurgeOptions{});
  REQUIRE(report.ok());
  CHECK(!fs::exists(tier + "/.monarch"));
}

TEST_CASE("purge of a directory that is no tier (a tier path set to $HOME) removes nothing") {
  ScratchDir scratch;
  const std::string home = scratch.Sub("home");
  WriteText(home + "/.bashrc", "export A=1\n");
  WriteText(home + "/src/project/main.cc", "int main() {}\n");
  WriteText(home + "/data/weights.bin", std::string(1 << 16, '\1'));
  fs::create_directories(home + "/empty");
  const std::set<std::string> before = Tree(home);
  absl::StatusOr<PurgeReport> report = PurgeCopyTree(home, PurgeOptions{});
  REQUIRE(report.ok());
  CHECK(report->copies == 0);
  CHECK(report->directories == 0);
  CHECK(report->foreign_files == 3);
  CHECK(Tree(home) == before);
}

TEST_CASE("purge names a tier directory that is missing or not a directory") {
  ScratchDir scratch;
  absl::StatusOr<PurgeReport> missing = PurgeCopyTree(scratch.path() + "/gone", PurgeOptions{});
  CHECK(absl::IsNotFound(missing.status()));
  CHECK(absl::StrContains(missing.status().message(), scratch.path() + "/gone"));
  WriteText(scratch.path() + "/file", "x");
  absl::StatusOr<PurgeReport> file = PurgeCopyTree(scratch.path() + "/file", PurgeOptions{});
  CHECK(absl::IsFailedPrecondition(file.status()));
  CHECK(absl::StrContains(file.status().message(), "not a directory"));
}

TEST_CASE("purge does not enter another file system mounted under the tier") {
  // A tmpfs mounted inside the tier, holding a genuine copy: not the tier's.
  ScratchDir scratch;
  const std::string tier = scratch.Sub("tier");
  const std::string mount = scratch.Sub("tier/mnt");
  if (std::system(("mount -t tmpfs -o size=1m monarch-purge-test '" + mount + "' 2>/dev/null")
                      .c_str()) != 0) {
    MONARCH_SKIP("cannot mount a tmpfs here (not root)");
  }
  StoreCopies(mount, {"m.bin"}, 4096);
  absl::StatusOr<PurgeReport> report = PurgeCopyTree(tier, PurgeOptions{});
  const bool kept = fs::exists(mount + "/m.bin");
  std::system(("umount '" + mount + "'").c_str());
  REQUIRE(report.ok());
  CHECK(report->mount_points == 1);
  CHECK(report->copies == 0);
  CHECK(kept);
}

}  // namespace
}  // namespace monarch
