// Unit tests of a kept RAM tier (drivers/ram_keep.h): a driver made again
// on the same tmpfs directory adopts the copies whose source is unchanged
// and whose bytes match their CRC, frees the rest, and discards a journal
// that is damaged or of another tier; a reader of the driver before is sent
// to the source.

#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/shared_memory.h"
#include "drivers/ram_keep.h"
#include "drivers/storage_driver.h"
#include "skip.h"
#include "test_util.h"

namespace monarch {
namespace {

constexpr uint64_t kCapacity = 16 << 20;
constexpr uint32_t kFiles = 8;
constexpr uint32_t kStripes = 8;  // ram_driver.cc's.
constexpr char kShm[] = "/dev/shm";  // node.ram_dir's default.

// A kept directory of its own, removed at the end.
class KeptDir {
 public:
  KeptDir() {
    absl::StatusOr<std::string> dir = KeptRamDirectory(kShm, scratch_.Sub("runtime"));
    if (dir.ok()) tier_ = *dir + "/ram";
    if (dir.ok()) ::mkdir(tier_.c_str(), 0700);
  }
  ~KeptDir() { DiscardKeptRam(kShm, scratch_.path() + "/runtime"); }
  bool ok() const { return !tier_.empty(); }
  const std::string& tier() const { return tier_; }
  std::string runtime() const { return scratch_.path() + "/runtime"; }

 private:
  testing::ScratchDir scratch_;
  std::string tier_;
};

struct Files {
  std::vector<std::string> names;
  std::vector<FileRef> refs;
  Files() {
    const uint64_t sizes[kFiles] = {100000, 0, 2 << 20, 4097, 333, 70000, 1 << 20, 12345};
    for (uint32_t i = 0; i < kFiles; ++i) names.push_back(absl::StrCat("d/f", i, ".bin"));
    for (uint32_t i = 0; i < kFiles; ++i) {
      FileRef ref;
      ref.id = i;
      ref.name = names[i];
      ref.size = sizes[i];
      ref.mtime_ns = 1000 + i;
      refs.push_back(ref);
    }
  }
};

std::unique_ptr<StorageDriver> MustKept(const std::string& dir, uint64_t capacity = kCapacity) {
  RamTierOptions options;
  options.kept_dir = dir;
  options.releasable = true;
  absl::StatusOr<std::unique_ptr<StorageDriver>> driver =
      NewRamDriver("ram", capacity, kFiles, options);
  REQUIRE_MESSAGE(driver.ok(), driver.status().ToString());
  return std::move(*driver);
}

void Store(StorageDriver& driver, const FileRef& file) {
  std::vector<char> image(file.size + 4096);
  for (uint64_t i = 0; i < file.size; ++i) image[i] = testing::ExpectedByte(file.id, i);
  REQUIRE(StoreCopy(driver, file, image.data(), file.size).ok());
}

bool Exact(StorageDriver& driver, const FileRef& file) {
  std::vector<char> bytes(file.size + 1);
  absl::StatusOr<size_t> n = driver.Read(file, 0, bytes.data(), bytes.size());
  if (!n.ok() || *n != file.size) return false;
  for (uint64_t i = 0; i < file.size; ++i) {
    if (bytes[i] != testing::ExpectedByte(file.id, i)) return false;
  }
  return true;
}

// As the instance adopts (monarch_core.cc's ReuseEarlierCopies): after the
// scan, a copy whose recorded source is `files` as now, else removed.
// Returns what was visited: name -> whether it came with a source.
std::map<std::string, bool> Adopt(StorageDriver& driver, const std::vector<FileRef>& files) {
  KeptCopies* kept = driver.capabilities().kept;
  REQUIRE(kept != nullptr);
  std::map<std::string, bool> visited;
  std::vector<std::pair<const FileRef*, bool>> found;
  REQUIRE(kept->ScanCopies([&](absl::string_view name, const SourceIdentity* source) {
                visited[std::string(name)] = source != nullptr;
                for (const FileRef& file : files) {
                  if (file.name == name) {
                    found.emplace_back(&file,
                                       source != nullptr && *source == SourceIdentity::Of(file));
                  }
                }
              }).ok());
  for (const auto& [file, valid] : found) {
    if (valid) {
      kept->CopyAdopted(*file);
    } else {
      CHECK(driver.Remove(*file).ok());
    }
  }
  kept->AdoptionDone();
  return visited;
}

uint64_t AllocatedBytes(const std::string& dir) {
  uint64_t bytes = 0;
  for (uint32_t i = 0; i < kStripes; ++i) {
    struct stat st;
    if (::stat(absl::StrCat(dir, "/stripe-", i).c_str(), &st) == 0) bytes += st.st_blocks * 512;
  }
  return bytes;
}

TEST_CASE("kept RAM tier: the next driver adopts intact copies of unchanged files, frees the rest") {
  KeptDir dir;
  if (!dir.ok()) MONARCH_SKIP("/dev/shm is not a tmpfs here");
  Files files;
  std::unique_ptr<StorageDriver> reader;
  {
    std::unique_ptr<StorageDriver> first = MustKept(dir.tier());
    CHECK(Adopt(*first, files.refs).empty());  // Nothing kept yet; starts the journal.
    for (const FileRef& file : files.refs) Store(*first, file);
    CHECK(first->Remove(files.refs[5]).ok());
    // A client of this driver, which outlives it (as a client may outlive
    // its service).
    std::vector<ScopedFd> fds;
    for (int fd : first->capabilities().shared->SharedMemoryDescriptors()) {
      fds.push_back(*ReopenReadOnly(fd));
    }
    absl::StatusOr<std::unique_ptr<StorageDriver>> r = NewRamReader(std::move(fds), kFiles, true);
    REQUIRE(r.ok());
    reader = std::move(*r);
    CHECK(Exact(*reader, files.refs[0]));
  }  // Gone, as if killed: nothing is written at the end.

  // File 2's bytes damaged where they rest; file 3 changed on the source.
  absl::StatusOr<std::map<std::string, KeptCopy>> journal =
      RamJournal(dir.tier() + "/journal", kStripes, kCapacity).Read();
  REQUIRE_MESSAGE(journal.ok(), journal.status().ToString());
  CHECK(journal->size() == kFiles - 1);
  CHECK(journal->count(files.names[5]) == 0);
  const KeptCopy& damaged = journal->at(files.names[2]);
  {
    ScopedFd stripe(::open(absl::StrCat(dir.tier(), "/stripe-", damaged.stripe).c_str(), O_RDWR));
    char byte = ~testing::ExpectedByte(2, 1000);
    REQUIRE(::pwrite(stripe.get(), &byte, 1, damaged.offset + 1000) == 1);
  }
  std::vector<FileRef> now = files.refs;
  now[3].mtime_ns += 1;

  std::unique_ptr<StorageDriver> second = MustKept(dir.tier());
  // The reader of the driver before finds no copy, and goes to the source.
  char byte;
  CHECK(reader->Read(files.refs[0], 0, &byte, 1).status().code() == absl::StatusCode::kNotFound);
  const std::map<std::string, bool> visited = Adopt(*second, now);
  CHECK(visited.size() == kFiles - 1);
  CHECK(visited.at(files.names[2]) == false);  // Its CRC.
  CHECK(visited.at(files.names[3]) == true);   // Intact, but the source changed: removed.
  for (uint32_t i : {0, 1, 4, 6, 7}) CHECK_MESSAGE(Exact(*second, now[i]), "file ", i);
  for (uint32_t i : {2, 3, 5}) {
    CHECK(second->Read(now[i], 0, &byte, 1).status().code() == absl::StatusCode::kNotFound);
  }
  // What was not adopted was given back: the adopted copies' pages, a few
  // more at their edges.
  uint64_t adopted = 0;
  for (uint32_t i : {0, 1, 4, 6, 7}) adopted += now[i].size;
  CHECK(AllocatedBytes(dir.tier()) >= adopted);
  CHECK(AllocatedBytes(dir.tier()) <= adopted + 5 * 2 * 4096);
  // New copies never land on adopted ones.
  for (uint32_t i : {2, 3, 5}) Store(*second, now[i]);
  for (const FileRef& file : now) CHECK_MESSAGE(Exact(*second, file), "file ", file.id);
  second.reset();

  // A third driver finds all of them, the second's included.
  std::unique_ptr<StorageDriver> third = MustKept(dir.tier());
  const std::map<std::string, bool> all = Adopt(*third, now);
  CHECK(all.size() == kFiles);
  for (const FileRef& file : now) CHECK_MESSAGE(Exact(*third, file), "file ", file.id);

  // An idle exit's discard removes every file.
  third.reset();
  DiscardKeptRam(kShm, dir.runtime());
  struct stat st;
  CHECK(::stat(dir.tier().c_str(), &st) != 0);
}

TEST_CASE("kept RAM tier: a damaged, cut or foreign journal discards the kept copies") {
  KeptDir dir;
  if (!dir.ok()) MONARCH_SKIP("/dev/shm is not a tmpfs here");
  Files files;
  const std::string journal = dir.tier() + "/journal";
  auto fill = [&] {
    std::unique_ptr<StorageDriver> driver = MustKept(dir.tier());
    Adopt(*driver, files.refs);
    for (const FileRef& file : files.refs) {
      if (driver->Read(file, 0, nullptr, 0).ok()) continue;
      Store(*driver, file);
    }
  };
  auto expect_empty = [&](uint64_t capacity) {
    std::unique_ptr<StorageDriver> driver = MustKept(dir.tier(), capacity);
    CHECK(Adopt(*driver, files.refs).empty());
    CHECK(AllocatedBytes(dir.tier()) == 0);
    char byte;
    CHECK(driver->Read(files.refs[0], 0, &byte, 1).status().code() == absl::StatusCode::kNotFound);
    Store(*driver, files.refs[0]);  // And it works as ever.
    CHECK(Exact(*driver, files.refs[0]));
  };
  SUBCASE("cut short") {
    fill();
    struct stat st;
    REQUIRE(::stat(journal.c_str(), &st) == 0);
    REQUIRE(::truncate(journal.c_str(), st.st_size - 7) == 0);
    expect_empty(kCapacity);
  }
  SUBCASE("garbage in a record") {
    fill();
    ScopedFd fd(::open(journal.c_str(), O_RDWR));
    REQUIRE(::pwrite(fd.get(), "garbage!", 8, 100) == 8);
    fd = ScopedFd();
    expect_empty(kCapacity);
  }
  SUBCASE("garbage for a header") {
    fill();
    ScopedFd fd(::open(journal.c_str(), O_RDWR | O_TRUNC));
    REQUIRE(::write(fd.get(), "not a journal at all, really", 28) == 28);
    fd = ScopedFd();
    expect_empty(kCapacity);
  }
  SUBCASE("a tier of another size") {
    fill();
    expect_empty(kCapacity * 2);
  }
}

TEST_CASE("kept RAM tier: the journal stays bounded however often copies come and go") {
  KeptDir dir;
  if (!dir.ok()) MONARCH_SKIP("/dev/shm is not a tmpfs here");
  Files files;
  std::unique_ptr<StorageDriver> driver = MustKept(dir.tier());
  Adopt(*driver, files.refs);
  for (int round = 0; round < 3000; ++round) {
    Store(*driver, files.refs[4]);
    REQUIRE(driver->Remove(files.refs[4]).ok());
  }
  Store(*driver, files.refs[4]);
  struct stat st;
  REQUIRE(::stat((dir.tier() + "/journal").c_str(), &st) == 0);
  CHECK(st.st_size < 3 * (64 << 10));  // 6,001 records of ~90 bytes were written.
  driver.reset();
  driver = MustKept(dir.tier());
  CHECK(Adopt(*driver, files.refs).size() == 1);
  CHECK(Exact(*driver, files.refs[4]));
}

TEST_CASE("kept RAM tier: a copy a process maps in place is never reused: the kept arena is left "
          "to it") {
  KeptDir dir;
  if (!dir.ok()) MONARCH_SKIP("/dev/shm is not a tmpfs here");
  Files files;
  const FileRef& big = files.refs[2];  // 2 MiB: starts on a page, may be mapped.
  {
    std::unique_ptr<StorageDriver> first = MustKept(dir.tier());
    Adopt(*first, files.refs);
    Store(*first, big);
  }
  const KeptCopy copy =
      RamJournal(dir.tier() + "/journal", kStripes, kCapacity).Read()->at(files.names[2]);
  ScopedFd stripe(::open(absl::StrCat(dir.tier(), "/stripe-", copy.stripe).c_str(), O_RDONLY));
  void* map = ::mmap(nullptr, big.size, PROT_READ, MAP_PRIVATE, stripe.get(),
                     static_cast<off_t>(copy.offset));
  REQUIRE(map != MAP_FAILED);
  {
    std::unique_ptr<StorageDriver> second = MustKept(dir.tier());
    CHECK(Adopt(*second, files.refs).empty());
    for (const FileRef& file : files.refs) Store(*second, file);
    for (const FileRef& file : files.refs) CHECK(Exact(*second, file));
  }
  bool exact = true;
  for (uint64_t i = 0; i < big.size; ++i) {
    exact = exact && static_cast<const char*>(map)[i] == testing::ExpectedByte(2, i);
  }
  CHECK(exact);  // Its pages were not reused.
  ::munmap(map, big.size);
}

TEST_CASE("kept RAM tier: kept for the runtime directory as it is, not one made again, nor one gone") {
  KeptDir dir;
  if (!dir.ok()) MONARCH_SKIP("/dev/shm is not a tmpfs here");
  testing::ScratchDir other;
  const std::string gone = other.Sub("gone"), again = other.Sub("again");
  absl::StatusOr<std::string> gone_kept = KeptRamDirectory(kShm, gone);
  absl::StatusOr<std::string> again_kept = KeptRamDirectory(kShm, again);
  REQUIRE(gone_kept.ok());
  REQUIRE(again_kept.ok());
  CHECK(*KeptRamDirectory(kShm, again) == *again_kept);
  for (const std::string& kept : {*gone_kept, *again_kept}) {
    ScopedFd(::open((kept + "/journal").c_str(), O_CREAT | O_WRONLY, 0600));
  }
  REQUIRE(*KeptRamDirectory(kShm, again) == *again_kept);
  struct stat st;
  CHECK(::stat((*again_kept + "/journal").c_str(), &st) == 0);  // Still its own.
  // Both go (with the token each carries); one is made again at once, as
  // a test's or a benchmark's scratch directory is, likely with the inode
  // number the old one had.
  REQUIRE(std::filesystem::remove_all(gone) > 0);
  REQUIRE(std::filesystem::remove_all(again) > 0);
  REQUIRE(::mkdir(again.c_str(), 0700) == 0);
  REQUIRE(*KeptRamDirectory(kShm, again) == *again_kept);
  CHECK(::stat((*again_kept + "/journal").c_str(), &st) != 0);  // Another directory's.
  CHECK(::stat(gone_kept->c_str(), &st) != 0);                 // Its directory is gone.
  DiscardKeptRam(kShm, again);
}

TEST_CASE("kept RAM tier: node.ram_dir names the tmpfs it lives on, and is refused elsewhere") {
  testing::ScratchDir scratch;  // Not a tmpfs: /tmp or /var/tmp here.
  const std::string runtime = scratch.Sub("runtime");
  absl::StatusOr<std::string> refused = KeptRamDirectory(scratch.path(), runtime);
  struct statfs fs;
  REQUIRE(::statfs(scratch.path().c_str(), &fs) == 0);
  if (fs.f_type == TMPFS_MAGIC) MONARCH_SKIP("the scratch directory is on a tmpfs here");
  REQUIRE(!refused.ok());
  CHECK(absl::IsFailedPrecondition(refused.status()));
  CHECK(absl::StrContains(refused.status().message(), "node.ram_dir '" + scratch.path() + "'"));
  CHECK(absl::StrContains(refused.status().message(), "not on a tmpfs"));
  CHECK(!KeptRamDirectory(scratch.path() + "/missing", runtime).ok());

  // A directory on /dev/shm of its own is a tmpfs: the kept arena is made
  // under it, and discarded from it.
  struct stat st;
  if (::stat(kShm, &st) != 0) MONARCH_SKIP("no /dev/shm here");
  const std::string ram_dir = absl::StrCat(kShm, "/monarch-test-ram-dir-", ::getpid());
  REQUIRE(::mkdir(ram_dir.c_str(), 0700) == 0);
  absl::StatusOr<std::string> kept = KeptRamDirectory(ram_dir, runtime);
  REQUIRE(kept.ok());
  CHECK(absl::StartsWith(*kept, absl::StrCat(ram_dir, "/monarch-", ::geteuid(), "/")));
  CHECK(*kept == KeptRamPath(ram_dir, runtime));
  CHECK(::stat(kept->c_str(), &st) == 0);
  DiscardKeptRam(ram_dir, runtime);
  CHECK(::stat(kept->c_str(), &st) != 0);
  std::filesystem::remove_all(ram_dir);
}

TEST_CASE("kept RAM tier: the page size of node.ram_dir is read from its tmpfs mount's options") {
  // Lines as the kernel writes them: /dev/shm twice (the later on top), a
  // tmpfs with huge pages, one with a space in its path, and a disk.
  const std::string mountinfo =
      "22 1 259:1 / / rw,relatime shared:1 - ext4 /dev/root rw\n"
      "25 22 0:21 / /dev/shm rw,nosuid shared:4 - tmpfs tmpfs rw,size=1024k,huge=always\n"
      "26 22 0:22 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24683652k\n"
      "30 22 0:30 / /mnt/huge rw,relatime - tmpfs tmpfs rw,size=4194304k,huge=within_size\n"
      "31 30 0:31 / /mnt/huge/advise rw shared:9 master:2 - tmpfs none rw,huge=advise\n"
      "32 22 0:32 / /mnt/my\\040ram rw - tmpfs tmpfs rw,huge=always\n"
      "40 22 8:1 / /var/tmp rw - xfs /dev/sda1 rw\n"
      "garbage\n";
  CHECK(TmpfsPageSize(mountinfo, "/dev/shm", false) == 4096);
  CHECK(TmpfsPageSize(mountinfo, "/dev/shm/monarch-0/x", true) == 4096);
  CHECK(TmpfsPageSize(mountinfo, "/mnt/huge", false) == 2 << 20);
  CHECK(TmpfsPageSize(mountinfo, "/mnt/huge/sub/dir", false) == 2 << 20);
  CHECK(TmpfsPageSize(mountinfo, "/mnt/hugepages", false) == 0);  // The root file system's.
  CHECK(TmpfsPageSize(mountinfo, "/mnt/huge/advise", false) == 4096);
  CHECK(TmpfsPageSize(mountinfo, "/mnt/huge/advise/x", true) == 2 << 20);
  CHECK(TmpfsPageSize(mountinfo, "/mnt/my ram/kept", false) == 2 << 20);
  CHECK(TmpfsPageSize(mountinfo, "/var/tmp", true) == 0);
  CHECK(TmpfsPageSize(mountinfo, "/", true) == 0);
  CHECK(TmpfsPageSize("", "/dev/shm", true) == 0);
  // This process's own: /dev/shm is a tmpfs on every machine the tests run
  // on, of one page size or the other.
  const uint64_t here = TmpfsPageSize(kShm, false);
  CHECK((here == 4096 || here == (2 << 20)));
}

}  // namespace
}  // namespace monarch