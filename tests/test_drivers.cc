// Unit tests for each storage driver: read/store/remove round trips, the
// temporary-then-rename publication, scans of earlier copies, and the
// source's refusal to write.

#include <dirent.h>
#include <doctest/doctest.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <sys/vfs.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/handle_cache.h"
#include "common/process_mappings.h"
#include "drivers/copy_integrity.h"
#include "drivers/ram_arena.h"
#include "drivers/storage_driver.h"
#include "drivers/tier.h"
#include "fault_env.h"
#include "placement/placement_policy.h"
#include "test_util.h"

namespace monarch {
namespace {

using testing::ScratchDir;

// A file's bytes in a page-aligned buffer padded to whole pages, as the
// placement code hands them to writers.
std::shared_ptr<char> ImageOf(uint32_t seed, size_t size) {
  const size_t padded = (size + 4095) / 4096 * 4096 + 4096;
  std::shared_ptr<char> image(static_cast<char*>(std::aligned_alloc(4096, padded)), std::free);
  for (size_t i = 0; i < size; ++i) image.get()[i] = testing::ExpectedByte(seed, i);
  return image;
}

std::unique_ptr<StorageDriver> MustRam(uint64_t capacity = 64 << 20, uint32_t files = 64) {
  absl::StatusOr<std::unique_ptr<StorageDriver>> driver = NewRamDriver("ram", capacity, files);
  REQUIRE_MESSAGE(driver.ok(), driver.status().ToString());
  return std::move(*driver);
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
  std::shared_ptr<char> image = ImageOf(seed, file.size);
  return StoreCopy(driver, file, image.get(), file.size);
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
  std::shared_ptr<char> image = ImageOf(21, f.size);
  const testing::TestFile tf{"", 21, f.size};
  char buffer[8192];
  {
    auto writer = driver.NewWriter(f);
    REQUIRE(writer.ok());
    REQUIRE((*writer)->Write(0, image.get(), 8192).ok());
    REQUIRE((*writer)->Write(8192, image.get() + 8192, 8192).ok());
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
                ->Write(offset, image.get() + offset, std::min<uint64_t>(8192, f.size - offset))
                .ok());
  }
  REQUIRE((*writer)->Commit(SourceIdentity::Of(f)).ok());
  std::vector<char> whole(f.size + 10);
  REQUIRE(*driver.Read(f, 0, whole.data(), whole.size()) == f.size);
  CHECK(testing::BytesMatch(tf, whole.data(), 0, f.size));
  REQUIRE(*(*writer)->ReadBack(f.size - 50, buffer, 500) == 50);  // Still readable after commit.
  CHECK(testing::BytesMatch(tf, buffer, f.size - 50, 50));
}

TEST_CASE("streamed copies: ram, posix, pmem") {
  std::unique_ptr<StorageDriver> ram = MustRam();
  StreamedCopy(*ram, "");
  ScratchDir posix_dir, pmem_dir;
  std::unique_ptr<StorageDriver> posix = NewPosixDriver(posix_dir.path(), 8);
  StreamedCopy(*posix, posix_dir.path());
  std::unique_ptr<StorageDriver> pmem = NewPmemDriver(pmem_dir.path(), 8);
  StreamedCopy(*pmem, pmem_dir.path());
}

TEST_CASE("ram driver round trip") {
  std::unique_ptr<StorageDriver> driver = MustRam();
  RoundTrip(*driver);
}

TEST_CASE("ram driver: a copy's bytes where they rest, for a peer to send without a staging copy") {
  std::unique_ptr<StorageDriver> driver = MustRam();
  SharedCopies* shared = driver->capabilities().shared;
  REQUIRE(shared != nullptr);
  const FileRef a = Ref(2, "a.bin", 300000);
  REQUIRE(Store(*driver, a, 4).ok());
  const char* seen = nullptr;
  REQUIRE(shared->VisitInMemory(a, 1000, 5000, [&](const auto& bytes) { seen = bytes.data; }).ok());
  REQUIRE(seen != nullptr);
  CHECK(testing::BytesMatch({"a", 4, a.size}, seen, 1000, 5000));
  // A range past the copy's end is refused rather than clipped.
  CHECK(absl::IsOutOfRange(shared->VisitInMemory(a, a.size - 10, 20, [](const auto&) {})));
  // Removed (its memory free for reuse): no view at all.
  REQUIRE(driver->Remove(a).ok());
  bool visited = false;
  CHECK(absl::IsNotFound(shared->VisitInMemory(a, 0, 10, [&](const auto&) { visited = true; })));
  CHECK(!visited);
  // File-backed tiers have no copies in memory: they are read into staging.
  ScratchDir dir;
  std::unique_ptr<StorageDriver> posix = NewPosixDriver(dir.path(), 8);
  CHECK(posix->capabilities().shared == nullptr);
  Tier tier(testing::RamTier(1 << 20), std::move(posix));
  CHECK(absl::IsUnimplemented(tier.VisitInMemory(a, 0, 10, [](const auto&) {})));
}

TEST_CASE("posix driver round trip, layout and mtime") {
  ScratchDir dir;
  std::unique_ptr<StorageDriver> driver = NewPosixDriver(dir.path(), 8);
  RoundTrip(*driver);
  const FileRef b = Ref(3, "x/b.bin", 5000, 1600000000123456789);
  REQUIRE(Store(*driver, b, 9).ok());
  struct stat st;
  REQUIRE(::stat((dir.path() + "/x/b.bin").c_str(), &st) == 0);
  CHECK(st.st_size == 5000 + CopyTrailerBytes(5000));  // The bytes, then their checksums.
  CHECK(st.st_mtim.tv_sec == 1600000000);
  CHECK(st.st_mtim.tv_nsec == 123456789);
  // No temporary is left behind (the reserved directory holds none).
  CHECK(ListAll(dir.path()) == std::vector<std::string>{"./empty.bin", "./x/b.bin"});
  CHECK(ListAll(dir.path() + "/.monarch/tmp").empty());
}

TEST_CASE("pmem driver round trip through libpmem") {
  ScratchDir dir;
  std::unique_ptr<StorageDriver> driver = NewPmemDriver(dir.path(), 8);
  RoundTrip(*driver);
  const FileRef b = Ref(3, "b.bin", 70000, 1600000000000000001);
  REQUIRE(Store(*driver, b, 5).ok());
  struct stat st;
  REQUIRE(::stat((dir.path() + "/b.bin").c_str(), &st) == 0);
  CHECK(st.st_size == 70000 + CopyTrailerBytes(70000));
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

TEST_CASE("handle cache: bounded, least recently used out, an erase of one handle spares another") {
  HandleCache<int> cache(2);
  int opens = 0;
  auto open = [&](int value) {
    return [&opens, value]() -> absl::StatusOr<std::shared_ptr<int>> {
      ++opens;
      return std::make_shared<int>(value);
    };
  };
  std::shared_ptr<int> first = *cache.Get(1, open(10));
  REQUIRE(*cache.Get(2, open(20)) != nullptr);
  CHECK(*cache.Get(1, open(11)) == first);  // Cached: not opened again.
  CHECK(opens == 2);
  REQUIRE(*cache.Get(3, open(30)) != nullptr);  // Evicts 2, the least recently used.
  CHECK(cache.size() == 2);
  CHECK(**cache.Get(2, open(21)) == 21);
  CHECK(opens == 4);
  // Erasing with a handle that is not the cached one leaves the cached one.
  const int stale = 0;
  cache.Erase(2, &stale);
  CHECK(**cache.Get(2, open(22)) == 21);
  std::shared_ptr<int> cached = *cache.Get(2, open(23));
  cache.Erase(2, cached.get());
  CHECK(**cache.Get(2, open(24)) == 24);
  CHECK(*first == 10);  // An evicted handle stays valid for whoever holds it.
}

TEST_CASE("handle cache shrinks below a descriptor limit instead of failing opens") {
  // The system allows 5 open handles (a FUSE server's limit, say); the
  // cache was told 16. (`live` first: the caches' handles count it down.)
  int live = 0, refused = 0;
  HandleCache<int> cache(16);
  auto open = [&]() -> absl::StatusOr<std::shared_ptr<int>> {
    if (live >= 5) {
      ++refused;
      return absl::ResourceExhaustedError("open: Too many open files");
    }
    ++live;
    return std::shared_ptr<int>(new int(live), [&live](int* p) {
      --live;
      delete p;
    });
  };
  for (uint32_t key = 0; key < 40; ++key) {
    absl::StatusOr<std::shared_ptr<int>> got = cache.Get(key, open);
    REQUIRE_MESSAGE(got.ok(), "key ", key, ": ", got.status().ToString());
  }
  CHECK(refused > 0);                // It did meet the limit...
  CHECK(cache.capacity() < 5);       // ...and settled below it,
  CHECK(cache.size() <= cache.capacity());
  CHECK(live == static_cast<int>(cache.size()));
  // A failure with nothing cached to give back is the caller's.
  HandleCache<int> empty(4);
  live += 5;
  CHECK(absl::IsResourceExhausted(empty.Get(1, open).status()));
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
  const std::string dead = dir.path() + "/.monarch/tmp/2147483646.0";
  std::ofstream(dead) << "partial";
  const std::string live = dir.path() + "/.monarch/tmp/" + std::to_string(::getpid()) + ".99";
  std::ofstream(live) << "in progress";
  // Dataset files whose names look like temporaries of the old layout, or
  // like the new ones, are copies like any other.
  REQUIRE(Store(*driver, Ref(2, "a/.x.monarch-tmp." + std::to_string(::getpid()) + ".1", 30, 333),
                3)
              .ok());
  REQUIRE(Store(*driver, Ref(3, "b/2147483646.0", 40, 444), 4).ok());

  // And a file with no checksum record (not Monarch's, or cut short).
  std::ofstream(dir.path() + "/stray.bin") << "not a copy";

  std::vector<std::tuple<std::string, uint64_t, int64_t>> seen;
  REQUIRE(driver->capabilities()
              .kept->ScanCopies([&](absl::string_view name, const SourceIdentity* source) {
                if (source == nullptr) {
                  seen.emplace_back(std::string(name), 0, -1);
                } else {
                  seen.emplace_back(std::string(name), source->size, source->mtime_ns);
                }
              })
              .ok());
  std::sort(seen.begin(), seen.end());
  REQUIRE(seen.size() == 5);
  CHECK(seen[0] ==
        std::make_tuple("a/.x.monarch-tmp." + std::to_string(::getpid()) + ".1", uint64_t{30},
                        int64_t{333}));
  CHECK(seen[1] == std::make_tuple(std::string("a/one.bin"), uint64_t{10}, int64_t{111}));
  CHECK(seen[2] == std::make_tuple(std::string("b/2147483646.0"), uint64_t{40}, int64_t{444}));
  CHECK(seen[3] == std::make_tuple(std::string("stray.bin"), uint64_t{0}, int64_t{-1}));
  CHECK(seen[4] == std::make_tuple(std::string("two.bin"), uint64_t{20}, int64_t{222}));
  CHECK(::access(dead.c_str(), F_OK) != 0);
  CHECK(::access(live.c_str(), F_OK) == 0);  // A live writer's file is left alone.
}

TEST_CASE("tier capacity: reservations never overcommit, used counts complete copies") {
  Tier tier(testing::RamTier(1000), MustRam(1000));
  auto counter = [&](std::string_view name) {
    Stats stats;
    CounterSink sink(&stats);
    tier.ReportCounters(sink);
    return stats.Tier(0, name);
  };
  CHECK(tier.TryReserve(600));
  CHECK_FALSE(tier.TryReserve(500));  // 600 reserved + 500 > 1000.
  CHECK(counter("bytes_used") == 0);
  tier.Commit(600);
  CHECK(counter("bytes_used") == 600);
  CHECK(counter("files") == 1);
  CHECK(tier.TryReserve(400));
  tier.Release(400);
  CHECK(tier.TryReserve(300));
  tier.MarkFull();  // ENOSPC: nothing more fits, whatever the configured capacity.
  CHECK_FALSE(tier.TryReserve(1));
}

// The home share of a peer node: the room kept for its promised files must
// cover their checksum trailers on a file-backed tier, or a copy of another
// file can take the last bytes and leave a promised file on the source for
// good (seen as one small file re-read from the source every epoch).
TEST_CASE("placement: the kept share budgets checksum trailers on file-backed tiers") {
  ScratchDir dir;
  const std::vector<uint64_t> kept_sizes = {83352, 150001, 4096, 1};
  uint64_t kept_room = 0;
  for (uint64_t size : kept_sizes) kept_room += Tier::MaxFootprint(size);
  const uint64_t other = 20000;
  // Room for every kept file and a little less than one more copy of `other`.
  const uint64_t capacity = kept_room + Tier::MaxFootprint(other) - 1;
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(std::make_unique<Tier>(
      testing::FileTier(TierKind::kPosix, dir.path(), capacity, "nvme"),
      NewPosixDriver(dir.path(), 8)));
  tiers.push_back(std::make_unique<Tier>(testing::SourceTier(), NewSourceDriver(dir.path(), 8)));

  KeptShare share;
  share.is_kept = [&](uint32_t id) { return id < kept_sizes.size(); };
  share.pending_bytes = kept_room;
  auto policy = NewPlacementPolicy(PlacementPolicyKind::kFirstFit, std::move(share));
  REQUIRE(policy != nullptr);
  // Counting data bytes alone, `other` would fit next to the kept files.
  REQUIRE(capacity >= other + [&] {
    uint64_t data = 0;
    for (uint64_t size : kept_sizes) data += size;
    return data;
  }());
  auto ref = [](uint32_t id, uint64_t size) {
    FileRef file;
    file.id = id;
    file.size = size;
    return file;
  };
  CHECK_FALSE(policy->ChooseTier(ref(kept_sizes.size(), other), tiers).has_value());
  for (uint32_t id = 0; id < kept_sizes.size(); ++id) {
    CAPTURE(id);
    CHECK(policy->ChooseTier(ref(id, kept_sizes[id]), tiers) == std::optional<int>(0));
  }
}

// Pages of `path` in the page cache.
size_t ResidentPages(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  struct stat st;
  REQUIRE(::fstat(fd, &st) == 0);
  const size_t pages = (static_cast<size_t>(st.st_size) + 4095) / 4096;
  void* map = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  REQUIRE(map != MAP_FAILED);
  std::vector<unsigned char> resident(pages);
  REQUIRE(::mincore(map, static_cast<size_t>(st.st_size), resident.data()) == 0);
  ::munmap(map, static_cast<size_t>(st.st_size));
  size_t count = 0;
  for (unsigned char r : resident) count += r & 1;
  return count;
}

TEST_CASE("posix writes: buffered copies stay in the page cache, direct ones do not") {
  ScratchDir dir;
  {
    // O_DIRECT is what makes the difference; a file system without it
    // writes everything buffered, and tmpfs (which accepts O_DIRECT on
    // recent kernels) keeps every page in memory whatever it is asked.
    struct statfs fs {};
    const bool in_memory = ::statfs(dir.path().c_str(), &fs) == 0 &&
                           (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC);
    int probe = ::open((dir.path() + "/probe").c_str(), O_WRONLY | O_CREAT | O_DIRECT, 0644);
    if (probe < 0 || in_memory) {
      if (probe >= 0) ::close(probe);
      MONARCH_SKIP("no O_DIRECT to a device on " << dir.path()
                                                 << "; set TMPDIR to a disk to run this test");
    }
    ::close(probe);
    ::unlink((dir.path() + "/probe").c_str());
  }
  PosixWriteOptions options;
  options.mode = PosixWriteOptions::Mode::kAuto;
  options.buffered_budget_bytes = 3 << 20;
  std::unique_ptr<StorageDriver> driver = NewPosixDriver(dir.path(), 8, options);
  const FileRef first = Ref(1, "first.bin", 2 << 20);    // Fits the budget: buffered.
  const FileRef second = Ref(2, "second.bin", 2 << 20);  // Over it: direct.
  const FileRef small = Ref(3, "small.bin", 100000);     // Small files are always buffered.
  REQUIRE(Store(*driver, first, 1).ok());
  REQUIRE(Store(*driver, second, 2).ok());
  REQUIRE(Store(*driver, small, 3).ok());
  // Each copy's checksum trailer is one more page, always written buffered.
  CHECK(ResidentPages(dir.path() + "/first.bin") == 512 + 1);
  CHECK(ResidentPages(dir.path() + "/second.bin") == 1);
  CHECK(ResidentPages(dir.path() + "/small.bin") == 25);
  std::vector<char> whole(2 << 20);
  REQUIRE(*driver->Read(second, 0, whole.data(), whole.size()) == whole.size());
  CHECK(testing::BytesMatch(testing::TestFile{"", 2, second.size}, whole.data(), 0, whole.size()));

  options.mode = PosixWriteOptions::Mode::kBuffered;
  options.buffered_budget_bytes = 0;
  std::unique_ptr<StorageDriver> buffered = NewPosixDriver(dir.Sub("b"), 8, options);
  REQUIRE(Store(*buffered, second, 2).ok());
  CHECK(ResidentPages(dir.path() + "/b/second.bin") == 512 + 1);
  options.mode = PosixWriteOptions::Mode::kDirect;
  options.buffered_budget_bytes = 1ull << 40;
  std::unique_ptr<StorageDriver> direct = NewPosixDriver(dir.Sub("d"), 8, options);
  REQUIRE(Store(*direct, first, 1).ok());
  CHECK(ResidentPages(dir.path() + "/d/first.bin") == 1);
}

// Refuses RWF_NOWAIT as FUSE does, or mapping files (FUSE's direct_io), or
// both; counts the asks.
class InMemoryRefusedEnv final : public os::Env {
 public:
  InMemoryRefusedEnv(bool no_wait_refused, bool unmappable, bool no_cachestat = false)
      : no_wait_refused_(no_wait_refused), unmappable_(unmappable), no_cachestat_(no_cachestat) {}
  int Cachestat(int fd, uint64_t offset, uint64_t length, uint64_t* cached_pages) override {
    cachestat_asked_.fetch_add(1);
    if (no_cachestat_) {  // A kernel before 6.5.
      errno = ENOSYS;
      return -1;
    }
    return os::Env::Cachestat(fd, offset, length, cached_pages);
  }
  ssize_t PreadNoWait(int fd, void* buffer, size_t n, off_t offset) override {
    no_wait_asked_.fetch_add(1);
    if (no_wait_refused_) {
      errno = EOPNOTSUPP;
      return -1;
    }
    return os::Env::PreadNoWait(fd, buffer, n, offset);
  }
  void* Mmap(void* address, size_t length, int protection, int flags, int fd,
             off_t offset) override {
    maps_.fetch_add(1);
    if (unmappable_) {
      errno = ENODEV;
      return MAP_FAILED;
    }
    return os::Env::Mmap(address, length, protection, flags, fd, offset);
  }
  int no_wait_asked() const { return no_wait_asked_.load(); }
  int maps() const { return maps_.load(); }
  int cachestat_asked() const { return cachestat_asked_.load(); }

 private:
  const bool no_wait_refused_;
  const bool unmappable_;
  const bool no_cachestat_;
  std::atomic<int> no_wait_asked_{0};
  std::atomic<int> maps_{0};
  std::atomic<int> cachestat_asked_{0};
};

// The source's file system said to be FUSE's (remote); counts opens of
// files (not directories).
class RemoteSourceEnv final : public os::Env {
 public:
  int Fstatfs(int fd, struct statfs* fs) override {
    const int result = os::Env::Fstatfs(fd, fs);
    if (result == 0) fs->f_type = FUSE_SUPER_MAGIC;
    return result;
  }
  int OpenAt(int dir_fd, const char* path, int flags, mode_t mode) override {
    if ((flags & (O_DIRECTORY | O_PATH)) == 0) opens_.fetch_add(1);
    return os::Env::OpenAt(dir_fd, path, flags, mode);
  }
  int opens() const { return opens_.load(); }

 private:
  std::atomic<int> opens_{0};
};

TEST_CASE("source driver: only bytes in the page cache are read in memory, asked by cachestat "
          "or mincore, a miss by RWF_NOWAIT where the file system takes it") {
  ScratchDir dir;
  constexpr uint64_t kSize = 1 << 20;
  const std::string path = dir.path() + "/d/f.bin";
  testing::WriteFile(path, 7, kSize);
  {
    // Written back and dropped, so that nothing of it is in memory.
    const int fd = ::open(path.c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  if (ResidentPages(path) != 0) {
    MONARCH_SKIP(dir.path() << " keeps file pages in memory whatever it is asked (tmpfs?); set "
                               "TMPDIR to a disk to run this test");
  }
  // Reads [offset, offset + n) into the page cache, and no page around it.
  auto cache = [&](uint64_t offset, size_t n) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);  // No read-ahead.
    std::vector<char> bytes(n);
    REQUIRE(::pread(fd, bytes.data(), n, static_cast<off_t>(offset)) == static_cast<ssize_t>(n));
    ::close(fd);
  };
  const FileRef file = Ref(0, "d/f.bin", kSize);
  std::vector<char> data(kSize);
  // What the driver reads of [offset, offset + n), checked byte for byte.
  auto in_memory = [&](StorageDriver& driver, uint64_t offset, size_t n,
                       InMemoryReads::Asker asker =
                           InMemoryReads::Asker::kDeferredCopy) -> absl::StatusOr<size_t> {
    std::fill(data.begin(), data.end(), 0);
    absl::StatusOr<size_t> got =
        driver.capabilities().in_memory->ReadIfInMemory(file, offset, data.data(), n, asker);
    if (got.ok()) {
      CHECK(*got == n);
      CHECK(testing::BytesMatch({"", 7, kSize}, data.data(), offset, n));
    }
    return got;
  };
  // Pages 64 to 95 ([256 KiB, 384 KiB)) in memory, the rest not.
  auto check = [&](StorageDriver& driver) {
    CHECK(absl::IsUnavailable(in_memory(driver, 0, kSize).status()));
    cache(256 << 10, 128 << 10);
    REQUIRE(ResidentPages(path) == 32);
    CHECK(in_memory(driver, 256 << 10, 128 << 10).ok());
    CHECK(in_memory(driver, (256 << 10) + 1000, 5000).ok());  // Not page-aligned.
    CHECK(absl::IsUnavailable(in_memory(driver, (256 << 10) - 1, 2).status()));
    CHECK(absl::IsUnavailable(in_memory(driver, (384 << 10) - 1, 2).status()));
    CHECK(absl::IsUnavailable(in_memory(driver, 0, kSize).status()));
    // Asking neither read nor mapped anything into memory.
    CHECK(ResidentPages(path) == 32);
  };

  SUBCASE("cachestat once a first mapping showed pages are kept, then a plain read: no "
          "read-ahead for what is refused, RWF_NOWAIT not asked") {
    InMemoryRefusedEnv env(/*no_wait_refused=*/false, /*unmappable=*/false);
    os::ScopedEnvForTesting scoped(&env);
    {
      std::unique_ptr<StorageDriver> driver = NewSourceDriver(dir.path(), 8);
      check(*driver);
    }
    CHECK(env.maps() == 1);  // The first ask's, for the open file.
    CHECK(env.cachestat_asked() == 5);  // Every ask after the first.
    CHECK(env.no_wait_asked() == 0);
  }
  SUBCASE("no cachestat (before Linux 6.5): mincore on a mapping per open file") {
    InMemoryRefusedEnv env(/*no_wait_refused=*/false, /*unmappable=*/false,
                           /*no_cachestat=*/true);
    os::ScopedEnvForTesting scoped(&env);
    {
      std::unique_ptr<StorageDriver> driver = NewSourceDriver(dir.path(), 8);
      check(*driver);
    }
    CHECK(env.maps() == 1);
    CHECK(env.cachestat_asked() == 1);  // Refused once, then not asked again.
    CHECK(env.no_wait_asked() == 0);
  }
  SUBCASE("RWF_NOWAIT refused (FUSE): mincore, then a plain read, RWF_NOWAIT never needed") {
    InMemoryRefusedEnv env(/*no_wait_refused=*/true, /*unmappable=*/false);
    os::ScopedEnvForTesting scoped(&env);
    {
      std::unique_ptr<StorageDriver> driver = NewSourceDriver(dir.path(), 8);
      check(*driver);
      // Past the size the walk saw (the file grew): read the usual way.
      CHECK(absl::IsUnavailable(in_memory(*driver, kSize - 1, 2).status()));
    }
    CHECK(env.no_wait_asked() == 0);
    CHECK(env.maps() == 1);
  }
  SUBCASE("a miss asks with RWF_NOWAIT where the file system takes it: one call, no mapping") {
    InMemoryRefusedEnv env(/*no_wait_refused=*/false, /*unmappable=*/false);
    os::ScopedEnvForTesting scoped(&env);
    {
      std::unique_ptr<StorageDriver> driver = NewSourceDriver(dir.path(), 8);
      const auto kMiss = InMemoryReads::Asker::kMiss;
      cache(256 << 10, 128 << 10);
      CHECK(in_memory(*driver, 256 << 10, 128 << 10, kMiss).ok());
      CHECK(in_memory(*driver, (256 << 10) + 1000, 5000, kMiss).ok());
      // Across the cached range's end, then across pages further on. A
      // refusal starts the kernel's read of the refused page, which on a
      // loaded machine may land before the call looks at it again (then
      // the bytes are read, and in_memory checks them): so one refusal of
      // three asks, on pages 128 KiB apart (a disk's default read-ahead).
      int refused = 0;
      for (uint64_t end : {384u << 10, 512u << 10, 640u << 10}) {
        absl::StatusOr<size_t> got = in_memory(*driver, end - 1, 2, kMiss);
        CHECK((got.ok() || absl::IsUnavailable(got.status())));
        if (absl::IsUnavailable(got.status())) ++refused;
      }
      CHECK(refused >= 1);
    }
    CHECK(env.no_wait_asked() >= 3);
    CHECK(env.maps() == 0);
    CHECK(env.cachestat_asked() == 0);
  }
  SUBCASE("a miss on a file system that refuses RWF_NOWAIT (FUSE) asks residency instead") {
    InMemoryRefusedEnv env(/*no_wait_refused=*/true, /*unmappable=*/false);
    os::ScopedEnvForTesting scoped(&env);
    {
      std::unique_ptr<StorageDriver> driver = NewSourceDriver(dir.path(), 8);
      const auto kMiss = InMemoryReads::Asker::kMiss;
      CHECK(absl::IsUnavailable(in_memory(*driver, 0, kSize, kMiss).status()));
      cache(256 << 10, 128 << 10);
      CHECK(in_memory(*driver, 256 << 10, 128 << 10, kMiss).ok());
      CHECK(absl::IsUnavailable(in_memory(*driver, (384 << 10) - 1, 2, kMiss).status()));
      CHECK(ResidentPages(path) == 32);  // Nothing read in.
    }
    CHECK(env.no_wait_asked() == 1);  // Refused once, then not asked again.
    CHECK(env.maps() == 1);
    CHECK(env.cachestat_asked() == 2);
  }
  SUBCASE("a hit's ask (kHit) opens a file on a local disk, never on a remote source") {
    const auto kHit = InMemoryReads::Asker::kHit;
    cache(0, kSize);
    {
      std::unique_ptr<StorageDriver> driver = NewSourceDriver(dir.path(), 8);
      CHECK(in_memory(*driver, 0, 4096, kHit).ok());
    }
    RemoteSourceEnv env;
    os::ScopedEnvForTesting scoped(&env);
    std::unique_ptr<StorageDriver> driver = NewSourceDriver(dir.path(), 8);
    CHECK(absl::IsUnavailable(in_memory(*driver, 0, 4096, kHit).status()));
    CHECK(env.opens() == 0);
    REQUIRE(*driver->Read(file, 0, data.data(), 1) == 1);  // Opens the file.
    CHECK(env.opens() == 1);
    CHECK(in_memory(*driver, 0, 4096, kHit).ok());
    CHECK(env.opens() == 1);
  }
  SUBCASE("files that cannot be mapped: RWF_NOWAIT alone, mapping tried once") {
    InMemoryRefusedEnv env(/*no_wait_refused=*/false, /*unmappable=*/true);
    os::ScopedEnvForTesting scoped(&env);
    std::unique_ptr<StorageDriver> driver = NewSourceDriver(dir.path(), 8);
    cache(0, kSize);
    for (int i = 0; i < 3; ++i) CHECK(in_memory(*driver, 0, kSize).ok());
    CHECK(env.maps() == 1);
    CHECK(env.no_wait_asked() == 3);
    CHECK(env.cachestat_asked() == 0);  // It would say "none" of a file that keeps no pages.
  }
  SUBCASE("both refused (FUSE's direct_io): cannot tell, each asked once") {
    InMemoryRefusedEnv env(/*no_wait_refused=*/true, /*unmappable=*/true);
    os::ScopedEnvForTesting scoped(&env);
    {
      std::unique_ptr<StorageDriver> driver = NewSourceDriver(dir.path(), 8);
      cache(0, kSize);
      for (int i = 0; i < 3; ++i) {
        CHECK(absl::IsUnimplemented(in_memory(*driver, 0, 4096).status()));
      }
    }
    CHECK(env.no_wait_asked() == 1);
    CHECK(env.maps() == 1);
  }
}

// ShmemPmdMapped of this process: its shared-memory bytes mapped as whole
// 2 MiB pages.
uint64_t ShmemPmdMappedBytes() {
  std::ifstream rollup("/proc/self/smaps_rollup");
  std::string key;
  uint64_t kib = 0;
  while (rollup >> key) {
    if (key == "ShmemPmdMapped:" && rollup >> kib) return kib << 10;
  }
  return 0;
}

// Sets /sys/kernel/mm/transparent_hugepage/shmem_enabled for the test's
// life: "advise" makes the kernel honour MADV_HUGEPAGE on memfds, and only
// memory so advised is affected, so tests running alongside are not.
class ShmemHugePagesAdvised {
 public:
  ShmemHugePagesAdvised() {
    std::ifstream in(kPath);
    std::string line;
    std::getline(in, line);
    const size_t open = line.find('['), close = line.find(']');
    if (open == std::string::npos || close == std::string::npos) return;
    previous_ = line.substr(open + 1, close - open - 1);
    std::ofstream out(kPath);
    ok_ = static_cast<bool>(out << "advise" << std::flush);
  }
  ~ShmemHugePagesAdvised() {
    if (ok_) std::ofstream(kPath) << previous_ << std::flush;
  }
  bool ok() const { return ok_; }

 private:
  static constexpr const char* kPath = "/sys/kernel/mm/transparent_hugepage/shmem_enabled";
  std::string previous_;
  bool ok_ = false;
};

// Stores files "f0".."f<count-1>" of `size` bytes (file i with seed i + 1)
// in `ram`; returns their names.
std::vector<std::string> StoreNumberedFiles(StorageDriver& ram, uint32_t count, uint64_t size) {
  std::vector<std::string> names;
  for (uint32_t i = 0; i < count; ++i) names.push_back(absl::StrCat("f", i));
  for (uint32_t i = 0; i < count; ++i) REQUIRE(Store(ram, Ref(i, names[i], size), i + 1).ok());
  return names;
}

// A client's view of the RAM tier `ram`, made from its shared descriptors.
std::unique_ptr<StorageDriver> ReaderOf(StorageDriver& ram, uint32_t file_count,
                                        bool map_from_start) {
  std::vector<ScopedFd> fds;
  for (int fd : ram.capabilities().shared->SharedMemoryDescriptors()) fds.emplace_back(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  absl::StatusOr<std::unique_ptr<StorageDriver>> reader =
      NewRamReader(std::move(fds), file_count, map_from_start);
  REQUIRE(reader.ok());
  return std::move(*reader);
}

// The resident KiB of each of this process's mappings of a memfd named
// `name`, by the mapping's first address (/proc/self/smaps): the pages a
// mapping has in this process's page tables, whatever else faulted.
std::map<std::string, uint64_t> ResidentKiBOfMemfd(const std::string& name) {
  std::map<std::string, uint64_t> resident;
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  std::string current;  // The mapping whose fields follow, if it is one of name's.
  while (std::getline(smaps, line)) {
    // A mapping's header ("start-end perms offset dev inode path") starts
    // every block; its fields ("Rss:  12 kB") follow, each key with a colon.
    const std::string first = line.substr(0, line.find(' '));
    if (!first.empty() && first.back() != ':') {
      current = absl::StrContains(line, "/memfd:" + name + " ") ? first.substr(0, first.find('-'))
                                                                 : "";
    } else if (!current.empty() && absl::StartsWith(line, "Rss:")) {
      resident[current] = std::strtoull(line.c_str() + 4, nullptr, 10);
    }
  }
  return resident;
}

// Resident KiB of the mappings in `now` that `before` did not have.
uint64_t NewMappingsResidentKiB(const std::map<std::string, uint64_t>& before,
                                const std::map<std::string, uint64_t>& now) {
  uint64_t kib = 0;
  for (const auto& [start, resident] : now) kib += before.count(start) != 0 ? 0 : resident;
  return kib;
}

TEST_CASE("RAM tier with huge pages: a reader in another mapping maps 2 MiB pages whole, bytes exact") {
  ShmemHugePagesAdvised advised;
  if (!advised.ok()) {
    MONARCH_SKIP("cannot set transparent_hugepage/shmem_enabled (not root, or no THP)");
  }
  for (const bool huge : {false, true}) {
    CAPTURE(huge);
    constexpr uint32_t kFiles = 40;
    constexpr uint64_t kSize = 200000;  // 8 MB in all: whole 2 MiB pages in every stripe.
    RamTierOptions options;
    options.huge_pages = huge;
    absl::StatusOr<std::unique_ptr<StorageDriver>> ram =
        NewRamDriver("huge", kFiles * kSize, kFiles, options);
    REQUIRE(ram.ok());
    const std::vector<std::string> names = StoreNumberedFiles(**ram, kFiles, kSize);
    std::unique_ptr<StorageDriver> reader = ReaderOf(**ram, kFiles, /*map_from_start=*/huge);
    const uint64_t before = ShmemPmdMappedBytes();
    std::vector<char> buffer(kSize);
    for (uint32_t i = 0; i < kFiles; ++i) {
      absl::StatusOr<size_t> n = reader->Read(Ref(i, names[i], kSize), 0, buffer.data(), kSize);
      REQUIRE(n.ok());
      REQUIRE(*n == kSize);
      REQUIRE(testing::BytesMatch(testing::TestFile{names[i], i + 1, kSize}, buffer.data(), 0,
                                  kSize));
    }
    const uint64_t mapped = ShmemPmdMappedBytes() - before;
    if (huge) {
      CHECK(mapped >= (4u << 20));  // Most of the 8 MB, 2 MiB at a time.
    } else {
      CHECK(mapped == 0);
    }
  }
}

TEST_CASE("RAM reader: copies are read without mapping them until the process reads a file "
          "again and then through the mapping with bytes exact both ways and when pread fails "
          "or falls short") {
  constexpr uint32_t kFiles = 24;
  constexpr uint64_t kSize = 200000;
  absl::StatusOr<std::unique_ptr<StorageDriver>> ram = NewRamDriver("first", kFiles * kSize, kFiles);
  REQUIRE(ram.ok());
  const std::vector<std::string> names = StoreNumberedFiles(**ram, kFiles, kSize);
  auto new_reader = [&] { return ReaderOf(**ram, kFiles, /*map_from_start=*/false); };
  std::vector<char> buffer(kSize, 1);  // Touched: its own pages take no fault below.
  // Reads file i in `pieces` sequential reads; returns the page faults taken.
  auto read_file = [&](StorageDriver& reader, uint32_t i, int pieces = 1) {
    uint64_t faults = 0;
    const uint64_t piece = kSize / pieces;
    for (uint64_t offset = 0; offset < kSize; offset += piece) {
      const uint64_t before = testing::ThreadMinorFaults();
      absl::StatusOr<size_t> n =
          reader.Read(Ref(i, names[i], kSize), offset, buffer.data() + offset, piece);
      faults += testing::ThreadMinorFaults() - before;
      REQUIRE(n.ok());
      REQUIRE(*n == piece);
    }
    REQUIRE(testing::BytesMatch(testing::TestFile{names[i], i + 1, kSize}, buffer.data(), 0,
                                kSize));
    std::fill(buffer.begin(), buffer.end(), 0);
    return faults;
  };

  SUBCASE("pages mapped: none while each file is read once, in pieces or whole; then the copies'") {
    // Counted as the reader's own mappings' resident pages, not as this
    // thread's page faults: the kernel may migrate a page of the buffer (to
    // compact memory, under a loaded CI machine), and the fault that follows
    // is not the reader's.
    const std::map<std::string, uint64_t> others = ResidentKiBOfMemfd("monarch-ram:first");
    std::unique_ptr<StorageDriver> reader = new_reader();
    auto reader_kib = [&] {
      return NewMappingsResidentKiB(others, ResidentKiBOfMemfd("monarch-ram:first"));
    };
    const uint64_t at_start = reader_kib();
    uint64_t first_faults = 0;
    for (uint32_t i = 0; i < kFiles / 2; ++i) first_faults += read_file(*reader, i, 4);
    for (uint32_t i = kFiles / 2; i < kFiles - 1; ++i) first_faults += read_file(*reader, i);
    const uint64_t after_first = reader_kib();
    // Read again: from here on every read maps, also a first one.
    uint64_t second_faults = 0;
    for (uint32_t i = 0; i < kFiles - 1; ++i) second_faults += read_file(*reader, i);
    const uint64_t after_second = reader_kib();
    read_file(*reader, kFiles - 1);
    const uint64_t after_last = reader_kib();
    CAPTURE(at_start);
    CAPTURE(after_first);
    CAPTURE(after_second);
    CAPTURE(after_last);
    CAPTURE(first_faults);
    CAPTURE(second_faults);
    CHECK(after_first == at_start);
    // Every page holding a byte of files 0..kFiles-2 (in whatever stripes).
    CHECK(after_second - after_first >= (kFiles - 1) * kSize / 1024 - 8 * 4);
    // A first read after the switch maps its copy too.
    CHECK(after_last > after_second);
    // Mapping a 200 KB copy takes at least 3 faults (the kernel maps up to
    // 16 pages per fault).
    CHECK(second_faults >= 3 * (kFiles - 1));
  }
  SUBCASE("a pread that fails is served from the mapping") {
    testing::FaultInjectingEnv env;
    env.Fail(testing::FaultInjectingEnv::Op::kRead, "monarch-ram:first", EIO);
    os::ScopedEnvForTesting installed(&env);
    std::unique_ptr<StorageDriver> reader = new_reader();
    for (uint32_t i = 0; i < kFiles; ++i) read_file(*reader, i);
    CHECK(env.injected(testing::FaultInjectingEnv::Op::kRead) == kFiles);
  }
  SUBCASE("a pread that falls short is finished") {
    testing::FaultInjectingEnv env;
    env.ShortenReads("monarch-ram:first", 4096 + 17);
    os::ScopedEnvForTesting installed(&env);
    std::unique_ptr<StorageDriver> reader = new_reader();
    for (uint32_t i = 0; i < kFiles; ++i) read_file(*reader, i);
    CHECK(env.injected(testing::FaultInjectingEnv::Op::kRead) >= kFiles * (kSize / (4096 + 17)));
  }
}

TEST_CASE("process mappings: lines of /proc/<pid>/maps, private mappings of the files named only") {
  const std::vector<MappedFileKey> files{{makedev(0, 1), 4242}};
  MappedFileRange range;
  REQUIRE(ParsePrivateMapping("7f0000001000-7f0000003000 r--p 00200000 00:01 4242   "
                              "/memfd:monarch-ram:ram (deleted)",
                              files, &range));
  CHECK(range.begin == 0x200000);
  CHECK(range.end == 0x202000);
  // Shared, another inode, another device, or garbage: not reported.
  CHECK_FALSE(ParsePrivateMapping("7f0000001000-7f0000003000 r--s 00200000 00:01 4242 /x",
                                  files, &range));
  CHECK_FALSE(ParsePrivateMapping("7f0000001000-7f0000003000 r--p 00200000 00:01 4243 /x",
                                  files, &range));
  CHECK_FALSE(ParsePrivateMapping("7f0000001000-7f0000003000 r--p 00200000 08:01 4242 /x",
                                  files, &range));
  CHECK_FALSE(ParsePrivateMapping("7f0000001000 r--p zz 00:01 4242", files, &range));
  CHECK_FALSE(ParsePrivateMapping("", files, &range));
}

TEST_CASE("RAM tier: a removed copy that a process may map is held, not reused, until no process "
          "maps it, a forked child included") {
  constexpr uint64_t kSize = (2 << 20) + 100;  // 1 MiB or more: it starts on a page.
  constexpr uint64_t kPages = (2 << 20);       // Its whole pages.
  constexpr uint32_t kFiles = 16;
  std::unique_ptr<StorageDriver> ram = MustRam(64 << 20, kFiles);
  CopyMapping* const marks = ram->capabilities().mapping;
  SharedCopies* const shared = ram->capabilities().shared;
  REQUIRE(marks != nullptr);
  REQUIRE(shared != nullptr);
  // A walk of the node's processes, as the instance's MappingWatch makes
  // them, without its one a second.
  int walks = 0;
  auto release = [&] {
    return shared->ReleaseUnmapped([&](const std::vector<MappedFileKey>& files, int64_t since) {
      ++walks;
      return FindPrivateMappings(files, since);
    });
  };
  const testing::TestFile a{"a.bin", 1, kSize};
  const FileRef a_ref = Ref(0, a.name, a.size);
  REQUIRE(Store(*ram, a_ref, a.seed).ok());
  const FileRef small = Ref(1, "small.bin", 300000);
  REQUIRE(Store(*ram, small, 2).ok());
  CHECK_FALSE(marks->MarkMapped(small));  // Under 1 MiB: never mapped in place.
  CHECK_FALSE(shared->MayBeMapped(a_ref));
  CHECK(release() == 0);
  CHECK(walks == 0);  // Nothing marked or held: no walk.

  // A client maps the copy where it lies, through its RAM reader, and only
  // then asks the tier, as MapCopies does.
  std::unique_ptr<StorageDriver> reader = ReaderOf(*ram, kFiles, /*map_from_start=*/false);
  CopyMapping* const mapper = reader->capabilities().mapping;
  REQUIRE(mapper != nullptr);
  CHECK_FALSE(mapper->MarkMapped(a_ref));  // A client's view marks nothing: the service does.
  const SourceIdentity stamp = SourceIdentity::Of(a_ref);
  CHECK(absl::IsFailedPrecondition(mapper->OpenCheckedCopy(a_ref, &stamp).status()));
  absl::StatusOr<CopyMapping::MappableCopy> copy = mapper->OpenCheckedCopy(a_ref, nullptr);
  REQUIRE_MESSAGE(copy.ok(), copy.status().ToString());
  CHECK(copy->offset % 4096 == 0);
  char* mapped = static_cast<char*>(::mmap(nullptr, kPages, PROT_READ, MAP_PRIVATE, copy->fd,
                                           static_cast<off_t>(copy->offset)));
  REQUIRE(mapped != MAP_FAILED);
  REQUIRE(marks->MarkMapped(a_ref));  // What the service answers a client's kCheckedCopies.
  CHECK(shared->MayBeMapped(a_ref));
  CHECK(mapper->StillCopyOf(a_ref, *copy));
  CHECK(testing::BytesMatch(a, mapped, 0, kPages));
  struct stat st;
  REQUIRE(::fstat(copy->fd, &st) == 0);
  absl::StatusOr<std::vector<MappedFileRange>> found =
      FindPrivateMappings({{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)}},
                          BootTimeNanos());
  REQUIRE_MESSAGE(found.ok(), found.status().ToString());
  REQUIRE(found->size() == 1);  // This process's; the readers' own mappings are shared.
  CHECK((*found)[0].begin == copy->offset);
  CHECK((*found)[0].end == copy->offset + kPages);

  REQUIRE(ram->Remove(a_ref).ok());
  // A mapping made from here on is refused by its maker.
  CHECK_FALSE(mapper->StillCopyOf(a_ref, *copy));
  CHECK(shared->HeldBytes() == kSize);
  // New copies, one in every stripe at least, never take its memory.
  for (uint32_t id = 2; id < kFiles; ++id) {
    REQUIRE(Store(*ram, Ref(id, absl::StrCat("f", id), kSize), id + 1).ok());
  }
  CHECK(testing::BytesMatch(a, mapped, 0, kPages));
  CHECK(release() == 0);  // Mapped here.
  CHECK(walks == 1);
  CHECK(shared->HeldBytes() == kSize);

  // A child forked now maps it too; the parent unmaps.
  int to_child[2], from_child[2];
  REQUIRE(::pipe(to_child) == 0);
  REQUIRE(::pipe(from_child) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    char go;
    if (::read(to_child[0], &go, 1) != 1) ::_exit(2);
    const char verdict = testing::BytesMatch(a, mapped, 0, kPages) ? 'y' : 'n';
    if (::write(from_child[1], &verdict, 1) != 1) ::_exit(2);
    if (::read(to_child[0], &go, 1) != 1) ::_exit(2);
    ::_exit(0);
  }
  ::munmap(mapped, kPages);
  CHECK(release() == 0);
  CHECK(shared->HeldBytes() == kSize);
  // More copies meanwhile: the child still reads a's bytes.
  REQUIRE(ram->Remove(Ref(5, "f5", kSize)).ok());  // Never asked about: freed at once.
  REQUIRE(Store(*ram, Ref(5, "f5", kSize), 6).ok());
  char verdict = 0;
  REQUIRE(::write(to_child[1], "g", 1) == 1);
  REQUIRE(::read(from_child[0], &verdict, 1) == 1);
  CHECK(verdict == 'y');
  REQUIRE(::write(to_child[1], "g", 1) == 1);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  for (int fd : {to_child[0], to_child[1], from_child[0], from_child[1]}) ::close(fd);
  CHECK(shared->HeldBytes() == kSize);
  CHECK(release() == kSize);  // Nobody maps it: freed.
  CHECK(shared->HeldBytes() == 0);
  CHECK_FALSE(shared->MayBeMapped(a_ref));  // No copy of it, and nobody asked again.

  // A copy mapped and asked about, then unmapped: once a walk finds nobody
  // mapping it, eviction may take it again, and its removal frees it.
  const FileRef b_ref = Ref(2, "f2", kSize);
  absl::StatusOr<CopyMapping::MappableCopy> b = mapper->OpenCheckedCopy(b_ref, nullptr);
  REQUIRE(b.ok());
  void* b_mapped = ::mmap(nullptr, kPages, PROT_READ, MAP_PRIVATE, b->fd,
                          static_cast<off_t>(b->offset));
  REQUIRE(b_mapped != MAP_FAILED);
  REQUIRE(marks->MarkMapped(b_ref));
  ::munmap(b_mapped, kPages);
  CHECK(shared->MayBeMapped(b_ref));
  const int walks_before = walks;
  CHECK(release() == 0);  // Nothing held; the walk only unmarks b.
  CHECK(walks == walks_before + 1);
  CHECK_FALSE(shared->MayBeMapped(b_ref));
  REQUIRE(ram->Remove(b_ref).ok());
  CHECK(shared->HeldBytes() == 0);
  // A copy under 1 MiB starts on a page only by chance, and opens only then.
  absl::StatusOr<CopyMapping::MappableCopy> small_copy = mapper->OpenCheckedCopy(small, nullptr);
  CHECK((small_copy.ok() ? small_copy->offset % 4096 == 0
                         : absl::IsFailedPrecondition(small_copy.status())));
  CHECK(absl::IsNotFound(mapper->OpenCheckedCopy(a_ref, nullptr).status()));

  // The instance's watch: a tier walks at most once a second, and only when
  // it has something marked or held; each tier on its own.
  MappingWatch watch(2);
  int watched = 0;
  auto watch_release = [&](int tier) {
    return watch.ReleaseUnmapped(tier, [&](MappingWalk walk) {
      return shared->ReleaseUnmapped(
          [&](const std::vector<MappedFileKey>& files, int64_t since) {
            ++watched;
            return walk(files, since);
          });
    });
  };
  CHECK(watch_release(0) == 0);
  CHECK(watched == 0);  // Nothing marked: no walk, and the second is not taken.
  REQUIRE(marks->MarkMapped(Ref(3, "f3", kSize)));
  CHECK(watch_release(0) == 0);
  CHECK(watched == 1);
  REQUIRE(marks->MarkMapped(Ref(3, "f3", kSize)));
  CHECK(watch_release(0) == 0);
  CHECK(watched == 1);  // Within a second of its last walk.
  CHECK(watch_release(1) == 0);
  CHECK(watched == 2);  // Another tier's.
}

TEST_CASE("RAM arena: extents never overlap, freed space is reused, bytes read back") {
  absl::StatusOr<std::unique_ptr<RamArena>> made = RamArena::Create(8 << 20, 3, "test");
  REQUIRE(made.ok());
  RamArena& arena = **made;
  CHECK(arena.stripe_count() == 3);
  struct Held {
    RamArena::Extent extent;
    uint64_t size;
    uint32_t seed;
  };
  std::vector<Held> held;
  std::mt19937 rng(5);
  std::vector<char> bytes(300000);
  for (int round = 0; round < 400; ++round) {
    if (!held.empty() && rng() % 3 == 0) {
      const size_t k = rng() % held.size();
      arena.Free(held[k].extent, held[k].size);
      held.erase(held.begin() + static_cast<long>(k));
      continue;
    }
    const uint64_t size = 1 + rng() % bytes.size();
    absl::StatusOr<RamArena::Extent> extent = arena.Allocate(size);
    if (!extent.ok()) {
      CHECK(absl::IsResourceExhausted(extent.status()));
      continue;
    }
    const uint32_t seed = static_cast<uint32_t>(round);
    for (uint64_t i = 0; i < size; ++i) bytes[i] = testing::ExpectedByte(seed, i);
    REQUIRE(arena.Write(*extent, 0, bytes.data(), size).ok());
    held.push_back({*extent, size, seed});
  }
  REQUIRE(held.size() > 10);
  for (size_t a = 0; a < held.size(); ++a) {
    const Held& h = held[a];
    CHECK(h.extent.offset % 64 == 0);
    CHECK(testing::BytesMatch(testing::TestFile{"", h.seed, h.size}, arena.data(h.extent), 0,
                              h.size));
    for (size_t b = a + 1; b < held.size(); ++b) {
      const Held& o = held[b];
      if (o.extent.stripe != h.extent.stripe) continue;
      const bool apart = h.extent.offset + h.size <= o.extent.offset ||
                         o.extent.offset + o.size <= h.extent.offset;
      CHECK(apart);
    }
  }
  // Everything freed: each stripe is empty again and takes a whole-stripe extent.
  for (const Held& h : held) arena.Free(h.extent, h.size);
  for (int s = 0; s < arena.stripe_count(); ++s) {
    absl::StatusOr<RamArena::Extent> whole = arena.Allocate(8 << 20);
    REQUIRE(whole.ok());
    CHECK(whole->offset == 0);
  }
  CHECK(absl::IsResourceExhausted(arena.Allocate(1).status()));
}

TEST_CASE("RAM arena backing ahead: pages past the ends are allocated before any copy, within bounds") {
  constexpr uint64_t kMiB = 1 << 20;
  SUBCASE("the window past each stripe's end, and again after allocations move the ends") {
    RamArena::Options options;
    options.back_ahead = 4 * kMiB;  // 2 MiB per stripe.
    absl::StatusOr<std::unique_ptr<RamArena>> made = RamArena::Create(64 * kMiB, 2, "test", options);
    REQUIRE(made.ok());
    RamArena& arena = **made;
    REQUIRE(arena.WaitUntilBackedAhead(std::chrono::seconds(30)));
    CHECK(arena.resident_bytes() == 4 * kMiB);
    CHECK(arena.backed_ahead_bytes() == 4 * kMiB);
    // 3 MiB in each stripe: their ends move past what was backed.
    std::vector<char> bytes(3 * kMiB);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = testing::ExpectedByte(9, i);
    std::vector<RamArena::Extent> extents;
    for (int k = 0; k < 2; ++k) {
      absl::StatusOr<RamArena::Extent> extent = arena.Allocate(bytes.size());
      REQUIRE(extent.ok());
      REQUIRE(arena.Write(*extent, 0, bytes.data(), bytes.size()).ok());
      extents.push_back(*extent);
    }
    REQUIRE(arena.WaitUntilBackedAhead(std::chrono::seconds(30)));
    CHECK(arena.resident_bytes() == 2 * (3 * kMiB + 2 * kMiB));
    for (const RamArena::Extent& e : extents) {
      CHECK(std::memcmp(arena.data(e), bytes.data(), bytes.size()) == 0);
    }
  }
  SUBCASE("never more than the arena's size in all") {
    RamArena::Options options;
    options.back_ahead = 64 * kMiB;
    absl::StatusOr<std::unique_ptr<RamArena>> made = RamArena::Create(6 * kMiB, 4, "test", options);
    REQUIRE(made.ok());
    REQUIRE((*made)->WaitUntilBackedAhead(std::chrono::seconds(30)));
    CHECK((*made)->resident_bytes() <= 6 * kMiB);
    CHECK((*made)->resident_bytes() >= 4 * kMiB);  // Within a 2 MiB step of it.
  }
  SUBCASE("a releasable arena (memory.watch) backs only what it is allowed") {
    RamArena::Options options;
    options.back_ahead = 8 * kMiB;
    options.releasable = true;
    absl::StatusOr<std::unique_ptr<RamArena>> made = RamArena::Create(64 * kMiB, 2, "test", options);
    REQUIRE(made.ok());
    RamArena& arena = **made;
    // The backer settled: nothing allowed, no step under way.
    REQUIRE(arena.WaitUntilBackedAhead(std::chrono::seconds(30)));
    CHECK(arena.resident_bytes() == 0);  // Nothing until the governor's word.
    arena.AllowBackingAhead(4 * kMiB);
    REQUIRE(arena.WaitUntilBackedAhead(std::chrono::seconds(30)));
    CHECK(arena.resident_bytes() == 4 * kMiB);
    arena.AllowBackingAhead(0);
    REQUIRE(arena.WaitUntilBackedAhead(std::chrono::seconds(30)));
    CHECK(arena.resident_bytes() == 4 * kMiB);
    arena.AllowBackingAhead(64 * kMiB);
    REQUIRE(arena.WaitUntilBackedAhead(std::chrono::seconds(30)));
    CHECK(arena.resident_bytes() == 8 * kMiB);
  }
  SUBCASE("none without the option: no thread, nothing allocated") {
    absl::StatusOr<std::unique_ptr<RamArena>> made = RamArena::Create(8 * kMiB, 2, "test");
    REQUIRE(made.ok());
    CHECK((*made)->WaitUntilBackedAhead(std::chrono::seconds(0)));
    CHECK((*made)->resident_bytes() == 0);  // No thread to wait for.
  }
  SUBCASE("a release gives the backed pages back and ends the backing") {
    RamArena::Options options;
    options.back_ahead = 4 * kMiB;
    options.releasable = true;
    absl::StatusOr<std::unique_ptr<RamArena>> made = RamArena::Create(64 * kMiB, 2, "test", options);
    REQUIRE(made.ok());
    RamArena& arena = **made;
    arena.AllowBackingAhead(64 * kMiB);  // As memory.watch would, with room to spare.
    REQUIRE(arena.WaitUntilBackedAhead(std::chrono::seconds(30)));
    REQUIRE(arena.resident_bytes() == 4 * kMiB);
    CHECK(arena.ReleaseFreePages() == 4 * kMiB);
    // An allocation would wake the backer; stopped, it leaves the pages out.
    absl::StatusOr<RamArena::Extent> extent = arena.Allocate(64);
    REQUIRE(extent.ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    CHECK(arena.resident_bytes() == 0);
    CHECK(arena.backed_ahead_bytes() == 4 * kMiB);
  }
}

TEST_CASE("RAM arena backing ahead: copies written and freed by several threads meanwhile are exact") {
  RamArena::Options options;
  options.back_ahead = 8 << 20;
  absl::StatusOr<std::unique_ptr<RamArena>> made = RamArena::Create(48 << 20, 4, "test", options);
  REQUIRE(made.ok());
  RamArena& arena = **made;
  // The backer at work first: at SCHED_IDLE it may get no CPU from busy
  // writers (it has 4 MiB more to go in 2 MiB steps when they start).
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (arena.backed_ahead_bytes() == 0 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(arena.backed_ahead_bytes() > 0);
  std::atomic<int> wrong{0};
  std::vector<std::thread> writers;
  for (int t = 0; t < 3; ++t) {
    writers.emplace_back([&, t] {
      std::mt19937 rng(static_cast<uint32_t>(t));
      std::vector<char> bytes(400000);
      std::vector<std::pair<RamArena::Extent, uint64_t>> mine;
      for (int round = 0; round < 60; ++round) {
        const uint64_t size = 1 + rng() % bytes.size();
        absl::StatusOr<RamArena::Extent> extent = arena.Allocate(size);
        if (!extent.ok()) continue;
        const uint32_t seed = static_cast<uint32_t>(t * 1000 + round);
        for (uint64_t i = 0; i < size; ++i) bytes[i] = testing::ExpectedByte(seed, i);
        if (!arena.Write(*extent, 0, bytes.data(), size).ok()) {
          wrong.fetch_add(1);
          continue;
        }
        if (!testing::BytesMatch(testing::TestFile{"", seed, size}, arena.data(*extent), 0, size)) {
          wrong.fetch_add(1);
        }
        mine.emplace_back(*extent, size);
        if (rng() % 2 == 0) {
          arena.Free(mine.front().first, mine.front().second);
          mine.erase(mine.begin());
        }
      }
    });
  }
  for (std::thread& w : writers) w.join();
  CHECK(wrong.load() == 0);
  CHECK(arena.WaitUntilBackedAhead(std::chrono::seconds(30)));
  CHECK(arena.resident_bytes() <= (48 << 20));
}

TEST_CASE("RAM tier: a copy removed while readers read it never yields wrong bytes") {
  std::unique_ptr<StorageDriver> driver = MustRam(16 << 20, 8);
  const FileRef file = Ref(0, "f.bin", 1 << 20);
  // Extents are dealt out over up to 8 stripes in turn: storing 7 other
  // files after a removal reuses the removed copy's memory, whatever the
  // number of stripes.
  std::vector<std::string> names;
  std::vector<FileRef> others;
  for (uint32_t id = 1; id < 8; ++id) names.push_back("g" + std::to_string(id));
  for (uint32_t id = 1; id < 8; ++id) others.push_back(Ref(id, names[id - 1], 1 << 20));
  REQUIRE(Store(*driver, file, 1).ok());
  std::atomic<bool> stop{false};
  std::atomic<int> wrong{0}, served{0}, missing{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 2; ++t) {
    readers.emplace_back([&] {
      std::vector<char> buffer(file.size);
      while (!stop.load()) {
        absl::StatusOr<size_t> n = driver->Read(file, 0, buffer.data(), buffer.size());
        if (!n.ok()) {
          missing.fetch_add(1);
          continue;
        }
        served.fetch_add(1);
        if (*n != file.size ||
            !testing::BytesMatch(testing::TestFile{"", 1, file.size}, buffer.data(), 0, *n)) {
          wrong.fetch_add(1);
        }
      }
    });
  }
  // Remove the copy and fill its memory with other files' bytes, over and over.
  // Until the readers have had a fair chance (they may get little CPU on a
  // loaded machine), and at most 30 s.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (int i = 0; (i < 100 || served.load() < 200) && std::chrono::steady_clock::now() < give_up;
       ++i) {
    REQUIRE(driver->Remove(file).ok());
    for (const FileRef& other : others) REQUIRE(Store(*driver, other, 2).ok());
    for (const FileRef& other : others) REQUIRE(driver->Remove(other).ok());
    REQUIRE(Store(*driver, file, 1).ok());
  }
  // The copy stays in place now: a reader starved during the churn (the
  // copy is there only between a store and the next removal) reads it
  // whole at last.
  const int served_in_churn = served.load();
  const auto settle = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (served.load() == served_in_churn && std::chrono::steady_clock::now() < settle) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  stop.store(true);
  for (std::thread& r : readers) r.join();
  CHECK(wrong.load() == 0);
  CHECK(served.load() > served_in_churn);
}

}  // namespace
}  // namespace monarch
