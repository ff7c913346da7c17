// Memory pressure: finding the memory cgroup, the watcher's thread, a RAM
// arena giving pages back, and the governor shrinking (and growing) a RAM
// tier over real drivers, pins and placement. The whole of it in a real
// memory cgroup, with the node service and a job: tests/service/
// memory_pressure_test.py.

#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "common/memory_pressure.h"
#include "drivers/ram_arena.h"
#include "drivers/storage_driver.h"
#include "drivers/tier.h"
#include "metadata/namespace.h"
#include "placement/memory_governor.h"
#include "placement/placement_handler.h"
#include "placement/placement_policy.h"
#include "skip.h"
#include "test_util.h"

namespace monarch {
namespace {

using testing::BytesMatch;
using testing::MakeDataset;
using testing::ScratchDir;
using testing::TestFile;

TEST_CASE("the memory cgroup is found from /proc/self/cgroup and mountinfo, v1 and v2") {
  const char* mountinfo =
      "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
      "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
      "36 31 0:33 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
      "40 31 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
  const char* cgroup = "5:cpu,cpuacct:/\n4:memory:/job/42\n0::/user.slice/job\n";
  CHECK(CgroupMemory::FindDirectory(cgroup, mountinfo, CgroupMemory::Version::kV1) ==
        "/sys/fs/cgroup/memory/job/42");
  CHECK(CgroupMemory::FindDirectory(cgroup, mountinfo, CgroupMemory::Version::kV2) ==
        "/sys/fs/cgroup/unified/user.slice/job");
  // A container sees its own cgroup as the mount's root.
  const char* nested =
      "35 31 0:32 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n";
  CHECK(CgroupMemory::FindDirectory("4:memory:/docker/abc\n", nested,
                                    CgroupMemory::Version::kV1) == "/sys/fs/cgroup/memory");
  CHECK(CgroupMemory::FindDirectory("4:memory:/docker/abc/sub\n", nested,
                                    CgroupMemory::Version::kV1) == "/sys/fs/cgroup/memory/sub");
  // No memory controller, or no mount of it.
  CHECK(CgroupMemory::FindDirectory("5:cpu:/\n", mountinfo, CgroupMemory::Version::kV1).empty());
  CHECK(CgroupMemory::FindDirectory(cgroup, "", CgroupMemory::Version::kV1).empty());
}

TEST_CASE("this process's memory cgroup reads: a usage, and a headroom no larger than the system's") {
  const CgroupMemory cgroup = CgroupMemory::Discover();
  absl::StatusOr<MemorySample> sample = cgroup.Read();
  REQUIRE_MESSAGE(sample.ok(), sample.status().ToString());
  CHECK(sample->available_bytes > 0);
  CHECK(sample->headroom_bytes <= sample->available_bytes);
  if (cgroup.version() == CgroupMemory::Version::kNone) {
    MONARCH_SKIP("no memory cgroup here: only the system's memory is watched");
  }
  CHECK(sample->usage_bytes > 0);  // This process is charged to it.
  if (sample->limit_bytes != 0) CHECK(sample->headroom_bytes <= sample->limit_bytes);
  // A cgroup directory that does not exist is an error naming the file.
  absl::StatusOr<MemorySample> gone =
      CgroupMemory::At(cgroup.version(), "/nonexistent/cgroup").Read();
  CHECK_FALSE(gone.ok());
  CHECK(absl::StrContains(gone.status().message(), "/nonexistent/cgroup"));
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::trunc) << text;
}

TEST_CASE("cgroup files read into a sample: v1 and v2, inactive page cache not counted") {
  ScratchDir dir;
  SUBCASE("v1: the lower of the limit and the hierarchical one") {
    WriteText(dir.path() + "/memory.limit_in_bytes", "1073741824\n");
    WriteText(dir.path() + "/memory.usage_in_bytes", "943718400\n");
    WriteText(dir.path() + "/memory.stat",
              "cache 1\ninactive_file 5\nhierarchical_memory_limit 805306368\n"
              "total_inactive_file 104857600\n");
    absl::StatusOr<MemorySample> sample =
        CgroupMemory::At(CgroupMemory::Version::kV1, dir.path()).Read();
    REQUIRE_MESSAGE(sample.ok(), sample.status().ToString());
    CHECK(sample->limit_bytes == 768ull << 20);
    CHECK(sample->usage_bytes == 800ull << 20);  // 900 MiB less 100 MiB inactive.
    CHECK(sample->headroom_bytes == 0);          // Over the parent's limit.
  }
  SUBCASE("v1: no limit") {
    WriteText(dir.path() + "/memory.limit_in_bytes", "9223372036854771712\n");
    WriteText(dir.path() + "/memory.usage_in_bytes", "1048576\n");
    WriteText(dir.path() + "/memory.stat", "total_inactive_file 0\n");
    absl::StatusOr<MemorySample> sample =
        CgroupMemory::At(CgroupMemory::Version::kV1, dir.path()).Read();
    REQUIRE(sample.ok());
    CHECK(sample->limit_bytes == 0);
    CHECK(sample->headroom_bytes == sample->available_bytes);
  }
  SUBCASE("v2: memory.high below memory.max holds") {
    WriteText(dir.path() + "/memory.max", "max\n");
    WriteText(dir.path() + "/memory.high", "536870912\n");
    WriteText(dir.path() + "/memory.current", "419430400\n");
    WriteText(dir.path() + "/memory.stat", "anon 1\ninactive_file 20971520\nactive_file 3\n");
    absl::StatusOr<MemorySample> sample =
        CgroupMemory::At(CgroupMemory::Version::kV2, dir.path()).Read();
    REQUIRE(sample.ok());
    CHECK(sample->limit_bytes == 512ull << 20);
    CHECK(sample->usage_bytes == 380ull << 20);
    CHECK(sample->headroom_bytes == std::min<uint64_t>(132ull << 20, sample->available_bytes));
  }
  SUBCASE("a file that is not a number is an error naming it") {
    WriteText(dir.path() + "/memory.max", "lots\n");
    absl::StatusOr<MemorySample> sample =
        CgroupMemory::At(CgroupMemory::Version::kV2, dir.path()).Read();
    REQUIRE_FALSE(sample.ok());
    CHECK(absl::StrContains(sample.status().message(), "memory.max: expected a number, got 'lots'"));
  }
}

TEST_CASE("the watcher samples on its interval and stops within a bounded time") {
  std::atomic<int> samples{0};
  MemoryWatcher::Options options;
  options.interval_seconds = 0.01;
  absl::StatusOr<std::unique_ptr<MemoryWatcher>> watcher = MemoryWatcher::Start(
      CgroupMemory::Discover(), options, [&](const MemorySample& sample) {
        CHECK(sample.available_bytes > 0);
        samples.fetch_add(1);
      });
  REQUIRE_MESSAGE(watcher.ok(), watcher.status().ToString());
  const std::string& what = (*watcher)->description();
  CHECK((absl::StrContains(what, "PSI trigger") || absl::StrContains(what, "PSI sampled") ||
         absl::StrContains(what, "no PSI")));
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (samples.load() < 5 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHECK(samples.load() >= 5);
  const auto start = std::chrono::steady_clock::now();
  CHECK((*watcher)->Stop(DeadlineIn(2)));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));
  const int after = samples.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(samples.load() == after);
  CHECK((*watcher)->Stop(DeadlineIn(1)));  // Idempotent.
}

TEST_CASE("a releasable RAM arena gives freed pages back, a write-sealed one cannot") {
  constexpr uint64_t kBytes = 8 << 20;
  for (bool releasable : {true, false}) {
    CAPTURE(releasable);
    RamArena::Options options;
    options.releasable = releasable;
    absl::StatusOr<std::unique_ptr<RamArena>> arena =
        RamArena::Create(kBytes, 1, "test-release", options);
    REQUIRE(arena.ok());
    std::vector<char> data(kBytes / 4, 'x');
    std::vector<RamArena::Extent> extents;
    for (int i = 0; i < 4; ++i) {
      absl::StatusOr<RamArena::Extent> extent = (*arena)->Allocate(data.size());
      REQUIRE(extent.ok());
      REQUIRE((*arena)->Write(*extent, 0, data.data(), data.size()).ok());
      extents.push_back(*extent);
    }
    const uint64_t full = (*arena)->resident_bytes();
    CHECK(full >= kBytes - 4096);
    // Free the first and third quarter: the other two keep their bytes.
    (*arena)->Free(extents[0], data.size());
    (*arena)->Free(extents[2], data.size());
    const uint64_t released = (*arena)->ReleaseFreePages();
    if (releasable) {
      CHECK(released >= kBytes / 2 - 2 * 4096);
      CHECK((*arena)->resident_bytes() <= full - (kBytes / 2 - 2 * 4096));
      CHECK(std::memcmp((*arena)->data(extents[1]), data.data(), data.size()) == 0);
      CHECK(std::memcmp((*arena)->data(extents[3]), data.data(), data.size()) == 0);
      // A freed extent is used again: its pages come back.
      absl::StatusOr<RamArena::Extent> again = (*arena)->Allocate(data.size());
      REQUIRE(again.ok());
      CHECK((*arena)->Write(*again, 0, data.data(), data.size()).ok());
      CHECK(std::memcmp((*arena)->data(*again), data.data(), data.size()) == 0);
    } else {
      CHECK(released == 0);
      CHECK((*arena)->resident_bytes() == full);
    }
  }
}

// A RAM tier (and optionally a posix tier) over a source, with placement
// that pins readers, as an instance with memory.watch builds them.
struct Tiers {
  ScratchDir dataset;
  ScratchDir posix_dir;
  std::vector<TestFile> files;
  std::unique_ptr<Namespace> ns;
  std::vector<std::unique_ptr<Tier>> tiers;
  std::unique_ptr<PlacementHandler> placement;

  Tiers(uint64_t ram_bytes, uint64_t posix_bytes, int count, uint64_t size) {
    files = MakeDataset(dataset.path(), count, {size});
    const int source = posix_bytes > 0 ? 2 : 1;
    absl::StatusOr<std::unique_ptr<Namespace>> built = Namespace::Build(dataset.path(), "", source);
    REQUIRE(built.ok());
    ns = std::move(*built);
    TierConfig ram;
    ram.name = "ram";
    ram.kind = TierKind::kRam;
    ram.capacity_bytes = ram_bytes;
    RamTierOptions options;
    options.releasable = true;
    absl::StatusOr<std::unique_ptr<StorageDriver>> driver =
        NewRamDriver("ram", ram_bytes, ns->file_count(), options);
    REQUIRE(driver.ok());
    tiers.push_back(std::make_unique<Tier>(ram, std::move(*driver)));
    if (posix_bytes > 0) {
      TierConfig posix;
      posix.name = "posix";
      posix.kind = TierKind::kPosix;
      posix.path = posix_dir.path();
      posix.capacity_bytes = posix_bytes;
      tiers.push_back(std::make_unique<Tier>(posix, NewPosixDriver(posix_dir.path(), 64)));
    }
    TierConfig src;
    src.name = "source";
    src.kind = TierKind::kSource;
    tiers.push_back(std::make_unique<Tier>(src, NewSourceDriver(dataset.path(), 64)));
    PlacementConfig config;
    config.threads = 2;
    placement = std::make_unique<PlacementHandler>(
        &tiers, ns.get(), NewPlacementPolicy(PlacementPolicyKind::kFirstFit), config,
        /*pin_readers=*/true);
  }
  ~Tiers() { placement->Cancel(DeadlineIn(10)); }

  // Reads every file through placement (promoting it) and checks its bytes.
  void ReadAll() {
    for (const TestFile& f : files) CheckFile(f);
    placement->WaitIdle();
    for (const auto& tier : tiers) tier->driver().WaitForBackgroundWork();
  }
  // Reads `f` whole from where it lives now, as the read path does.
  void CheckFile(const TestFile& f) {
    std::optional<FileEntry> entry = ns->Find(f.name);
    REQUIRE(entry.has_value());
    std::vector<char> buffer(f.size);
    const int tier = placement->BeginTierRead(*entry);
    absl::StatusOr<size_t> got;
    if (tier == static_cast<int>(tiers.size()) - 1) {
      placement->EndTierRead(entry->ref.id);
      std::optional<absl::StatusOr<size_t>> read =
          placement->ReadIfOnSource(*entry, 0, buffer.data(), buffer.size());
      got = read.has_value() ? *read : tiers[entry->tier->load()]->Read(entry->ref, 0,
                                                                        buffer.data(), f.size);
    } else {
      got = tiers[tier]->Read(entry->ref, 0, buffer.data(), buffer.size());
      placement->EndTierRead(entry->ref.id);
    }
    REQUIRE_MESSAGE(got.ok(), got.status().ToString());
    CHECK(*got == f.size);
    CHECK(BytesMatch(f, buffer.data(), 0, f.size));
  }
  int OnTier(int tier) const {
    int n = 0;
    for (uint32_t id = 0; id < ns->file_count(); ++id) n += ns->entry(id).tier->load() == tier;
    return n;
  }
};

MemoryConfig GovernorConfig() {
  MemoryConfig config;
  config.headroom_bytes = 4 << 20;
  config.grow_after_seconds = 0;
  return config;
}

MemorySample Headroom(uint64_t bytes) {
  MemorySample sample;
  sample.limit_bytes = 1ull << 30;
  sample.usage_bytes = sample.limit_bytes - bytes;
  sample.available_bytes = 1ull << 34;
  sample.headroom_bytes = bytes;
  return sample;
}

uint64_t Counter(MemoryGovernor& governor, const std::string& name) {
  Stats stats;
  CounterSink sink(&stats);
  governor.ReportCounters(sink);
  for (const Metric& m : stats.metrics) {
    if (m.name == name) return m.value;
  }
  FAIL("no counter " << name);
  return 0;
}

TEST_CASE("under pressure the RAM tier shrinks, drops copies, gives memory back, and grows back") {
  constexpr uint64_t kSize = 256 << 10;
  Tiers t(/*ram=*/16 << 20, /*posix=*/0, /*count=*/48, kSize);
  t.ReadAll();
  Tier& ram = *t.tiers[0];
  REQUIRE(ram.reserved_bytes() == 48 * kSize);
  CHECK(ram.can().memory->ReleaseFreeMemory() == 0);  // Nothing freed yet.
  absl::StatusOr<std::unique_ptr<MemoryGovernor>> governor = MemoryGovernor::Start(
      GovernorConfig(), CgroupMemory::At(CgroupMemory::Version::kNone, ""), &t.tiers, t.ns.get(),
      t.placement.get(), /*start_watcher=*/false);
  REQUIRE(governor.ok());
  // A reader inside one copy: it is left alone.
  std::optional<FileEntry> pinned = t.ns->Find(t.files[0].name);
  REQUIRE(t.placement->BeginTierRead(*pinned) == 0);

  // 1 MiB left, 4 MiB wanted: shed 2 * 4 - 1 = 7 MiB.
  (*governor)->OnSample(Headroom(1 << 20));
  CHECK(ram.limit() == 5 << 20);  // The 12 MiB it held, less 7.
  CHECK(ram.reserved_bytes() <= ram.limit());
  CHECK(Counter(**governor, "memory_shrinks") == 1);
  CHECK(Counter(**governor, "memory_shed_bytes") >= 7 << 20);
  CHECK(Counter(**governor, "memory_dropped_bytes") == Counter(**governor, "memory_shed_bytes"));
  // 28 copies dropped (7 MiB): their pages, all but the partly shared ones, went back.
  CHECK(Counter(**governor, "memory_released_bytes") >= (7 << 20) - 28 * 8192);
  CHECK(pinned->tier->load() == 0);
  t.placement->EndTierRead(pinned->ref.id);
  CHECK(t.OnTier(1) == 28);

  // Every file still reads exact, from the tier or the source.
  for (const TestFile& f : t.files) t.CheckFile(f);
  t.placement->WaitIdle();
  // No new copy went above the lowered capacity.
  CHECK(ram.reserved_bytes() <= ram.limit());

  // No pressure (grow_after 0), plenty of room: one step of capacity/8.
  (*governor)->OnSample(Headroom(512 << 20));
  CHECK(ram.limit() == (5 << 20) + (2 << 20));
  CHECK(Counter(**governor, "memory_grows") == 1);
  // At most one step a second.
  (*governor)->OnSample(Headroom(512 << 20));
  CHECK(Counter(**governor, "memory_grows") == 1);
  // The files dropped may be placed again: the next read promotes them.
  for (const TestFile& f : t.files) t.CheckFile(f);
  t.placement->WaitIdle();
  CHECK(ram.reserved_bytes() > 5 << 20);
  CHECK(ram.reserved_bytes() <= ram.limit());
  CHECK((*governor)->Stop(DeadlineIn(1)));
}

// A node service between jobs (no client) only keeps its copies for the
// next job: they yield at four times the headroom, before a running job's.
TEST_CASE("kept copies (no reader attached) yield to memory pressure first") {
  constexpr uint64_t kSize = 256 << 10;
  Tiers t(/*ram=*/16 << 20, /*posix=*/0, /*count=*/48, kSize);
  t.ReadAll();
  Tier& ram = *t.tiers[0];
  REQUIRE(ram.reserved_bytes() == 12 << 20);
  absl::StatusOr<std::unique_ptr<MemoryGovernor>> governor = MemoryGovernor::Start(
      GovernorConfig(), CgroupMemory::At(CgroupMemory::Version::kNone, ""), &t.tiers, t.ns.get(),
      t.placement.get(), /*start_watcher=*/false);
  REQUIRE(governor.ok());
  // 10 MiB left, 4 MiB of headroom wanted: no pressure while readers attach.
  (*governor)->OnSample(Headroom(10 << 20));
  CHECK(Counter(**governor, "memory_shrinks") == 0);
  CHECK(ram.reserved_bytes() == 12 << 20);
  // Kept for the next job: 16 MiB wanted, so shed 2 * 16 - 10 = 22 MiB, all 12 it holds.
  (*governor)->SetKeeping(true);
  (*governor)->OnSample(Headroom(10 << 20));
  CHECK(Counter(**governor, "memory_shrinks") == 1);
  CHECK(ram.reserved_bytes() == 0);
  CHECK(ram.limit() == 0);
  for (const TestFile& f : t.files) t.CheckFile(f);  // Exact, from the source.
  CHECK((*governor)->Stop(DeadlineIn(1)));
}

TEST_CASE("under pressure copies move down to a file tier with room, bytes exact") {
  constexpr uint64_t kSize = 128 << 10;
  Tiers t(/*ram=*/8 << 20, /*posix=*/64 << 20, /*count=*/64, kSize);
  t.ReadAll();
  Tier& ram = *t.tiers[0];
  REQUIRE(ram.reserved_bytes() == 64 * kSize);
  absl::StatusOr<std::unique_ptr<MemoryGovernor>> governor = MemoryGovernor::Start(
      GovernorConfig(), CgroupMemory::At(CgroupMemory::Version::kNone, ""), &t.tiers, t.ns.get(),
      t.placement.get(), /*start_watcher=*/false);
  REQUIRE(governor.ok());
  // A PSI trigger with the limit far: an eighth of what the tier holds.
  MemorySample sample = Headroom(512 << 20);
  sample.psi_fired = true;
  (*governor)->OnSample(sample);
  CHECK(ram.limit() == 7 << 20);
  CHECK(Counter(**governor, "memory_demoted_bytes") == 1 << 20);
  CHECK(Counter(**governor, "memory_dropped_bytes") == 0);
  CHECK(t.OnTier(1) == 8);
  for (const TestFile& f : t.files) t.CheckFile(f);
  // Pressure that wants more than the tier holds: it empties, and stops at 0.
  (*governor)->OnSample(Headroom(0));
  CHECK(ram.limit() == 0);
  CHECK(ram.reserved_bytes() == 0);
  CHECK(t.OnTier(0) == 0);
  CHECK(t.OnTier(1) == 64);
  for (const TestFile& f : t.files) t.CheckFile(f);
  // Concurrent readers while it sheds read exact bytes.
  CHECK((*governor)->Stop(DeadlineIn(1)));
}

TEST_CASE("readers racing a shrink read exact bytes") {
  constexpr uint64_t kSize = 64 << 10;
  Tiers t(/*ram=*/8 << 20, /*posix=*/0, /*count=*/96, kSize);
  t.ReadAll();
  absl::StatusOr<std::unique_ptr<MemoryGovernor>> governor = MemoryGovernor::Start(
      GovernorConfig(), CgroupMemory::At(CgroupMemory::Version::kNone, ""), &t.tiers, t.ns.get(),
      t.placement.get(), /*start_watcher=*/false);
  REQUIRE(governor.ok());
  std::atomic<bool> done{false};
  std::vector<std::thread> readers;
  std::atomic<int> failures{0};
  for (int r = 0; r < 3; ++r) {
    readers.emplace_back([&, r] {
      std::vector<char> buffer(kSize);
      for (size_t i = r; !done.load(); i = (i + 7) % t.files.size()) {
        const TestFile& f = t.files[i];
        std::optional<FileEntry> entry = t.ns->Find(f.name);
        const int tier = t.placement->BeginTierRead(*entry);
        absl::StatusOr<size_t> got =
            t.tiers[tier]->Read(entry->ref, 0, buffer.data(), buffer.size());
        t.placement->EndTierRead(entry->ref.id);
        if (!got.ok() || *got != f.size || !BytesMatch(f, buffer.data(), 0, f.size)) {
          failures.fetch_add(1);
        }
      }
    });
  }
  for (uint64_t left = 3 << 20; left > 0; left -= 1 << 20) {
    (*governor)->OnSample(Headroom(left));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  done.store(true);
  for (std::thread& reader : readers) reader.join();
  CHECK(failures.load() == 0);
  CHECK(Counter(**governor, "memory_shrinks") >= 1);
  CHECK((*governor)->Stop(DeadlineIn(1)));
}

}  // namespace
}  // namespace monarch
