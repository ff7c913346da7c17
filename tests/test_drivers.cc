// Unit tests for each storage driver: read/store/remove round trips, the
// temporary-then-rename publication, scans of earlier copies, and the
// source's refusal to write.

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <dirent.h>

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

FileRef Ref(uint32_t id, absl::string_view name, uint64_t size, int64_t mtime_ns = 1234567890123456789) {
  FileRef ref;
  ref.id = id;
  ref.name = name;
  ref.size = size;
  ref.mtime_ns = mtime_ns;
  return ref;
}

// Store, read back whole and in pieces, read past the end, remove.
void RoundTrip(StorageDriver& driver) {
  const FileRef a = Ref(7, "sub/dir/a.bin", 300000);
  const FileRef empty = Ref(8, "empty.bin", 0);
  char buffer[4096];
  CHECK(driver.Read(a, 0, buffer, 10).status().code() == absl::StatusCode::kNotFound);

  REQUIRE(driver.Store(a, ImageOf(1, a.size)).ok());
  REQUIRE(driver.Store(empty, ImageOf(2, 0)).ok());
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

std::vector<std::string> ListAll(const std::string& dir) {
  std::vector<std::string> names;
  std::string cmd = "cd '" + dir + "' && find . -type f | sort";
  FILE* p = ::popen(cmd.c_str(), "r");
  char line[4096];
  while (std::fgets(line, sizeof(line), p)) names.emplace_back(line, std::strlen(line) - 1);
  ::pclose(p);
  return names;
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
  REQUIRE(driver->Store(b, ImageOf(9, b.size)).ok());
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
  REQUIRE(driver->Store(b, ImageOf(5, b.size)).ok());
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
  for (uint32_t i = 0; i < 50; ++i) REQUIRE(driver->Store(Ref(i, names[i], 100), ImageOf(i, 100)).ok());
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
  CHECK(driver->Store(s, ImageOf(1, 10)).code() == absl::StatusCode::kPermissionDenied);
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
  REQUIRE(driver->Store(Ref(0, "a/one.bin", 10, 111), ImageOf(1, 10)).ok());
  REQUIRE(driver->Store(Ref(1, "two.bin", 20, 222), ImageOf(2, 20)).ok());
  // A temporary from a process that no longer exists (pid 0x7ffffffe is never
  // valid under the default pid_max), and one from this live process.
  std::ofstream(dir.path() + "/a/.one.bin.monarch-tmp.2147483646.0") << "partial";
  const std::string live = dir.path() + "/.two.bin.monarch-tmp." + std::to_string(::getpid()) + ".99";
  std::ofstream(live) << "in progress";

  std::vector<std::tuple<std::string, uint64_t, int64_t>> seen;
  REQUIRE(driver->ScanCopies([&](absl::string_view name, uint64_t size, int64_t mtime) {
    seen.emplace_back(std::string(name), size, mtime);
  }).ok());
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
