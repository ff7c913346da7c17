// Unit tests for each storage driver: read/store/remove round trips, the
// temporary-then-rename publication, scans of earlier copies, and the
// source's refusal to write.

#include <dirent.h>
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <fstream>

#include "absl/strings/match.h"
#include "drivers/storage_driver.h"
#include "drivers/tier.h"
#include "test_util.h"

namespace monarch {
namespace {

using testing::ScratchDir;

std::shared_ptr<FileImage> ImageOf(uint32_t seed, size_t size) {
  auto image = std::make_shared<FileImage>(size);
  for (size_t i = 0; i < size; ++i) image->mutable_data()[i] = testing::ExpectedByte(seed, i);
  return image;
}

FileRef Ref(uint32_t id, absl::string_view name, uint64_t size,
            int64_t mtime_ns = 1234567890123456789) {
  FileRef ref;
  ref.id = id;
  ref.name = name;
  ref.size = size;
  ref.mtime_ns = mtime_ns;
  return ref;
}

std::vector<std::string> ListAll(const std::string& dir) {
  std::vector<std::string> names;
  std::string cmd = "cd '" + dir + "' && find . -type f | sort";
  FILE* p = ::popen(cmd.c_str(), "r");
  char line[4096];
  while (std::fgets(line, sizeof(line), p)) names.emplace_back(line, std::strlen(line) - 1);
  ::pclose(p);
  return names;
}

absl::Status Store(StorageDriver& driver, const FileRef& file, uint32_t seed) {
  std::shared_ptr<FileImage> image = ImageOf(seed, file.size);
  return StoreCopy(driver, file, image->data(), file.size);
}

// Store, read back whole and in pieces, read past the end, remove.
void RoundTrip(StorageDriver& driver) {
  const FileRef a = Ref(7, "sub/dir/a.bin", 300000);
  const FileRef empty = Ref(8, "empty.bin", 0);
  char buffer[4096];
  CHECK(driver.Read(a, 0, buffer, 10).status().code() == absl::StatusCode::kNotFound);

  REQUIRE(Store(driver, a, 1).ok());
  REQUIRE(Store(driver, empty, 2).ok());
  std::vector<char> whole(a.size);
  absl::StatusOr<size_t> n = driver.Read(a, 0, whole.data(), whole.size());
  REQUIRE(n.ok());
  CHECK(*n == a.size);
  testing::TestFile tf{"a", 1, a.size};
  CHECK(testing::BytesMatch(tf, whole.data(), 0, whole.size()));

  n = driver.Read(a, 299000, buffer, sizeof(buffer));  // Short at the end.
  REQUIRE(n.ok());
  CHECK(*n == 1000);
  CHECK(testing::BytesMatch(tf, buffer, 299000, 1000));
  n = driver.Read(a, a.size + 5, buffer, sizeof(buffer));  // Past the end.
  REQUIRE(n.ok());
  CHECK(*n == 0);
  n = driver.Read(empty, 0, buffer, sizeof(buffer));
  REQUIRE(n.ok());
  CHECK(*n == 0);

  REQUIRE(driver.Remove(a).ok());
  CHECK(driver.Read(a, 0, buffer, 10).status().code() == absl::StatusCode::kNotFound);
  CHECK(driver.Remove(a).code() == absl::StatusCode::kNotFound);
}

// A copy streamed in chunks: invisible until committed, readable back while
// in flight, and gone without a trace when abandoned.
void StreamedCopy(StorageDriver& driver, const std::string& root) {
  const FileRef f = Ref(11, "s/streamed.bin", 3 * 8192 + 100);
  std::shared_ptr<FileImage> image = ImageOf(21, f.size);
  const testing::TestFile tf{"", 21, f.size};
  char buffer[8192];
  {
    auto writer = driver.NewWriter(f);
    REQUIRE(writer.ok());
    REQUIRE((*writer)->Write(0, image->data(), 8192).ok());
    REQUIRE((*writer)->Write(8192, image->data() + 8192, 8192).ok());
    CHECK(driver.Read(f, 0, buffer, 10).status().code() == absl::StatusCode::kNotFound);
    REQUIRE(*(*writer)->ReadBack(8000, buffer, 300) == 300);
    CHECK(testing::BytesMatch(tf, buffer, 8000, 300));
  }  // Abandoned.
  CHECK(driver.Read(f, 0, buffer, 10).status().code() == absl::StatusCode::kNotFound);
  if (!root.empty()) CHECK(ListAll(root).empty());
  auto writer = driver.NewWriter(f);
  REQUIRE(writer.ok());
  for (uint64_t offset = 0; offset < f.size; offset += 8192) {
    REQUIRE((*writer)
                ->Write(offset, image->data() + offset, std::min<uint64_t>(8192, f.size - offset))
                .ok());
  }
  REQUIRE((*writer)->Commit().ok());
  std::vector<char> whole(f.size + 10);
  REQUIRE(*driver.Read(f, 0, whole.data(), whole.size()) == f.size);
  CHECK(testing::BytesMatch(tf, whole.data(), 0, f.size));
  REQUIRE(*(*writer)->ReadBack(f.size - 50, buffer, 500) == 50);  // Still readable after commit.
  CHECK(testing::BytesMatch(tf, buffer, f.size - 50, 50));
}

TEST_CASE("streamed copies: ram, posix, pmem") {
  std::unique_ptr<StorageDriver> ram = NewRamDriver();
  StreamedCopy(*ram, "");
  ScratchDir posix_dir, pmem_dir;
  std::unique_ptr<StorageDriver> posix = NewPosixDriver(posix_dir.path(), 8);
  StreamedCopy(*posix, posix_dir.path());
  std::unique_ptr<StorageDriver> pmem = NewPmemDriver(pmem_dir.path(), 8);
  StreamedCopy(*pmem, pmem_dir.path());
}

TEST_CASE("ram driver round trip") {
  std::unique_ptr<StorageDriver> driver = NewRamDriver();
  RoundTrip(*driver);
}

TEST_CASE("posix driver round trip, layout and mtime") {
  ScratchDir dir;
  std::unique_ptr<StorageDriver> driver = NewPosixDriver(dir.path(), 8);
  RoundTrip(*driver);
  const FileRef b = Ref(3, "x/b.bin", 5000, 1600000000123456789);
  REQUIRE(Store(*driver, b, 9).ok());
  struct stat st;
  REQUIRE(::stat((dir.path() + "/x/b.bin").c_str(), &st) == 0);
  CHECK(st.st_size == 5000);
  CHECK(st.st_mtim.tv_sec == 1600000000);
  CHECK(st.st_mtim.tv_nsec == 123456789);
  // No temporary is left behind.
  CHECK(ListAll(dir.path()) == std::vector<std::string>{"./empty.bin", "./x/b.bin"});
}

TEST_CASE("pmem driver round trip through libpmem") {
  ScratchDir dir;
  std::unique_ptr<StorageDriver> driver = NewPmemDriver(dir.path(), 8);
  RoundTrip(*driver);
  const FileRef b = Ref(3, "b.bin", 70000, 1600000000000000001);
  REQUIRE(Store(*driver, b, 5).ok());
  struct stat st;
  REQUIRE(::stat((dir.path() + "/b.bin").c_str(), &st) == 0);
  CHECK(st.st_size == 70000);
  CHECK(st.st_mtim.tv_nsec == 1);
  // Read it back through a second driver: what was persisted is on disk.
  std::unique_ptr<StorageDriver> again = NewPmemDriver(dir.path(), 8);
  std::vector<char> data(b.size);
  REQUIRE(*again->Read(b, 0, data.data(), data.size()) == b.size);
  CHECK(testing::BytesMatch({"b", 5, b.size}, data.data(), 0, data.size()));
}

TEST_CASE("bounded descriptor caches still serve many files") {
  ScratchDir dir;
  std::unique_ptr<StorageDriver> driver = NewPosixDriver(dir.path(), 4);
  std::vector<std::string> names;
  for (uint32_t i = 0; i < 50; ++i) names.push_back("f" + std::to_string(i));
  for (uint32_t i = 0; i < 50; ++i) REQUIRE(Store(*driver, Ref(i, names[i], 100), i).ok());
  for (int round = 0; round < 3; ++round) {
    for (uint32_t i = 0; i < 50; ++i) {
      char buffer[100];
      REQUIRE(*driver->Read(Ref(i, names[i], 100), 0, buffer, 100) == 100);
      CHECK(testing::BytesMatch({"", i, 100}, buffer, 0, 100));
    }
  }
}

TEST_CASE("source driver reads the dataset and refuses to write or delete") {
  ScratchDir dir;
  testing::WriteFile(dir.path() + "/d/s.bin", 4, 10000);
  std::unique_ptr<StorageDriver> driver = NewSourceDriver(dir.path(), 8);
  const FileRef s = Ref(0, "d/s.bin", 10000);
  std::vector<char> data(10000);
  REQUIRE(*driver->Read(s, 0, data.data(), data.size()) == 10000);
  CHECK(testing::BytesMatch({"", 4, 10000}, data.data(), 0, 10000));
  CHECK(Store(*driver, s, 1).code() == absl::StatusCode::kPermissionDenied);
  CHECK(driver->Remove(s).code() == absl::StatusCode::kPermissionDenied);
  CHECK(driver->Read(Ref(1, "missing.bin", 1), 0, data.data(), 1).status().code() ==
        absl::StatusCode::kNotFound);
  // The source file is untouched.
  std::vector<char> again(10000);
  REQUIRE(*NewSourceDriver(dir.path(), 8)->Read(s, 0, again.data(), again.size()) == 10000);
  CHECK(again == data);
}

TEST_CASE("scans report complete copies and clean up dead writers' temporaries") {
  ScratchDir dir;
  std::unique_ptr<StorageDriver> driver = NewPosixDriver(dir.path(), 8);
  REQUIRE(Store(*driver, Ref(0, "a/one.bin", 10, 111), 1).ok());
  REQUIRE(Store(*driver, Ref(1, "two.bin", 20, 222), 2).ok());
  // A temporary from a process that no longer exists (pid 0x7ffffffe is never
  // valid under the default pid_max), and one from this live process.
  std::ofstream(dir.path() + "/a/.one.bin.monarch-tmp.2147483646.0") << "partial";
  const std::string live =
      dir.path() + "/.two.bin.monarch-tmp." + std::to_string(::getpid()) + ".99";
  std::ofstream(live) << "in progress";

  std::vector<std::tuple<std::string, uint64_t, int64_t>> seen;
  REQUIRE(driver
              ->ScanCopies([&](absl::string_view name, uint64_t size, int64_t mtime) {
                seen.emplace_back(std::string(name), size, mtime);
              })
              .ok());
  std::sort(seen.begin(), seen.end());
  REQUIRE(seen.size() == 2);
  CHECK(seen[0] == std::make_tuple(std::string("a/one.bin"), uint64_t{10}, int64_t{111}));
  CHECK(seen[1] == std::make_tuple(std::string("two.bin"), uint64_t{20}, int64_t{222}));
  CHECK(::access((dir.path() + "/a/.one.bin.monarch-tmp.2147483646.0").c_str(), F_OK) != 0);
  CHECK(::access(live.c_str(), F_OK) == 0);  // A live writer's file is left alone.
}

TEST_CASE("tier capacity: reservations never overcommit, used counts complete copies") {
  Tier tier(testing::RamTier(1000), NewRamDriver());
  CHECK(tier.TryReserve(600));
  CHECK_FALSE(tier.TryReserve(500));  // 600 reserved + 500 > 1000.
  CHECK(tier.GetStats().bytes_used == 0);
  tier.Commit(600);
  CHECK(tier.GetStats().bytes_used == 600);
  CHECK(tier.GetStats().files == 1);
  CHECK(tier.TryReserve(400));
  tier.Release(400);
  CHECK(tier.TryReserve(300));
  tier.MarkFull();  // ENOSPC: nothing more fits, whatever the configured capacity.
  CHECK_FALSE(tier.TryReserve(1));
}

}  // namespace
}  // namespace monarch
