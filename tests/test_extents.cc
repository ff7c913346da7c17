// Extents: big files cached by aligned ranges, each promoted, evicted,
// checked and counted as a file of its own (metadata/namespace.h).

#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "instance_util.h"
#include "monarch/monarch.h"
#include "test_util.h"

namespace monarch {
namespace {

using testing::MustCreate;
using testing::ReadWholeAndCheck;
using testing::ScratchDir;
using testing::TestFile;

constexpr uint64_t kMiB = 1 << 20;

// Extents of 1 MiB for files above 4 MiB. The test files sit in the page
// cache: misses promote at once, so every source read is counted where it
// happens (placement.cached_source: defer would take them from memory).
Config ExtentConfig(const std::string& dataset, std::vector<TierConfig> upper) {
  Config config = testing::MakeConfig(dataset, std::move(upper));
  config.placement.extent_bytes = kMiB;
  config.placement.extent_threshold = 4 * kMiB;
  config.placement.chunk_bytes = 256 << 10;
  config.placement.cached_source = CachedSourcePolicy::kPromote;
  // Hits stay on the copies: the speed model would serve some from the
  // source's page cache whenever a loaded machine made a copy's first reads
  // look slow, and these tests count the source's reads to tell a hit from
  // a miss (CI failed on it: 13 MiB read for a 12 MiB file).
  config.placement.route_by_speed = false;
  return config;
}

// One pass over `file` in records of `record` bytes (not aligned to the
// extents), in a random order, by `threads` threads; false if any byte
// differed or a read failed.
bool ReadRecordsAtRandom(Monarch& m, const TestFile& file, size_t record, int threads,
                         uint32_t seed) {
  std::vector<uint64_t> offsets;
  for (uint64_t offset = 0; offset < file.size; offset += record) offsets.push_back(offset);
  std::shuffle(offsets.begin(), offsets.end(), std::mt19937(seed));
  std::atomic<size_t> next{0};
  std::atomic<bool> ok{true};
  std::vector<std::thread> readers;
  for (int t = 0; t < threads; ++t) {
    readers.emplace_back([&] {
      std::vector<char> buffer(record);
      for (size_t i = next.fetch_add(1); i < offsets.size(); i = next.fetch_add(1)) {
        const uint64_t offset = offsets[i];
        const size_t want = static_cast<size_t>(std::min<uint64_t>(record, file.size - offset));
        absl::StatusOr<size_t> got = m.Read(file.name, buffer.data(), record, offset);
        if (!got.ok() || *got != want || !testing::BytesMatch(file, buffer.data(), offset, want)) {
          ok.store(false);
        }
      }
    });
  }
  for (std::thread& reader : readers) reader.join();
  return ok.load();
}

TEST_CASE("a file 4x the tier, read at random by 4 threads: exact bytes, the tier never over "
          "capacity, and later epochs read from the source only what does not fit") {
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  const TestFile big{"big.bin", 77, 32 * kMiB + 12345};  // The last extent is short.
  testing::WriteFile(ds + "/" + big.name, big.seed, big.size);
  const TestFile small{"small.bin", 78, 300000};  // Below the threshold: cached whole.
  testing::WriteFile(ds + "/" + small.name, small.seed, small.size);
  const uint64_t capacity = 8 * kMiB;
  auto m = MustCreate(ExtentConfig(ds, {testing::RamTier(capacity)}));

  // Capacity is watched throughout, not only between epochs.
  std::atomic<bool> done{false};
  std::atomic<uint64_t> most_used{0};
  std::thread watch([&] {
    while (!done.load()) {
      const uint64_t used = m->GetStats().Tier(0, "bytes_used");
      if (used > most_used.load()) most_used.store(used);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  ReadWholeAndCheck(*m, small);
  uint64_t source_before = 0;
  for (int epoch = 0; epoch < 3; ++epoch) {
    CHECK(ReadRecordsAtRandom(*m, big, 96 << 10, 4, 1 + epoch));
    m->WaitForPlacement();
    const Stats stats = m->GetStats();
    const uint64_t read = stats.Source("bytes_read") - source_before;
    source_before = stats.Source("bytes_read");
    // Extents first come, first served (first-fit) fill the tier beside the
    // small file, to within an extent; the rest stay on the source.
    const uint64_t cached = stats.Tier(0, "bytes_used") - small.size;
    CHECK(cached + kMiB > capacity - small.size);
    INFO("epoch ", epoch + 1, ": ", read, " bytes from the source, ", cached, " cached");
    if (epoch == 0) {
      CHECK(read == big.size + small.size);  // Every byte once.
    } else {
      CHECK(read <= big.size - cached);  // Only what does not fit.
    }
  }
  done.store(true);
  watch.join();
  CHECK(most_used.load() <= capacity);
  CHECK(m->GetStats().Tier(0, "bytes_used") <= capacity);
  ReadWholeAndCheck(*m, small);
  CHECK(m->GetStats().Source("bytes_read") == source_before);  // A whole-file hit.
}

TEST_CASE("a reader of a few bytes of a big file copies their extent, not the file") {
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  const TestFile big{"big.bin", 5, 64 * kMiB};
  testing::WriteFile(ds + "/" + big.name, big.seed, big.size);
  auto m = MustCreate(ExtentConfig(ds, {testing::RamTier(256 * kMiB)}));
  std::vector<char> buffer(8192);
  // 8 KiB across the boundary of extents 20 and 21.
  const uint64_t offset = 21 * kMiB - 4096;
  absl::StatusOr<size_t> got = m->Read(big.name, buffer.data(), buffer.size(), offset);
  REQUIRE(got.ok());
  REQUIRE(*got == buffer.size());
  CHECK(testing::BytesMatch(big, buffer.data(), offset, buffer.size()));
  m->WaitForPlacement();
  Stats stats = m->GetStats();
  CHECK(stats.Source("bytes_read") == 2 * kMiB);
  CHECK(stats.Tier(0, "files") == 2);
  CHECK(stats.Tier(0, "bytes_used") == 2 * kMiB);
  // Read again: from the tier.
  got = m->Read(big.name, buffer.data(), buffer.size(), offset);
  REQUIRE(got.ok());
  CHECK(testing::BytesMatch(big, buffer.data(), offset, buffer.size()));
  CHECK(m->GetStats().Source("bytes_read") == 2 * kMiB);
  // A read past the end is short, as pread's; at the end, 0.
  got = m->Read(big.name, buffer.data(), buffer.size(), big.size - 100);
  REQUIRE(got.ok());
  CHECK(*got == 100);
  CHECK(testing::BytesMatch(big, buffer.data(), big.size - 100, 100));
  got = m->Read(big.name, buffer.data(), buffer.size(), big.size);
  REQUIRE(got.ok());
  CHECK(*got == 0);
}

TEST_CASE("a file scanned front to back has its next extents promoted ahead of the reader, "
          "each byte still read from the source once") {
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  const TestFile shard{"shard.tar", 12, 16 * kMiB + 4096};
  testing::WriteFile(ds + "/" + shard.name, shard.seed, shard.size);
  auto m = MustCreate(ExtentConfig(ds, {testing::RamTier(64 * kMiB)}));
  ReadWholeAndCheck(*m, shard, 64 << 10);
  m->WaitForPlacement();
  Stats stats = m->GetStats();
  // Every extent but the first (and those the reader reached first) was
  // started ahead of it.
  CHECK(stats.Get("read_ahead_extents") >= 8);
  CHECK(stats.Get("read_ahead_extents") <= 16);
  CHECK(stats.Source("bytes_read") == shard.size);
  CHECK(stats.Tier(0, "files") == 17);
  // Random records far apart are no scan: nothing is read ahead for them.
  const TestFile other{"other.bin", 13, 16 * kMiB};
  testing::WriteFile(ds + "/" + other.name, other.seed, other.size);
  auto fresh = MustCreate(ExtentConfig(ds, {testing::RamTier(64 * kMiB)}));
  std::vector<char> buffer(4096);
  for (uint64_t offset : {uint64_t{9} * kMiB + 5, uint64_t{3} * kMiB + 7, uint64_t{14} * kMiB}) {
    absl::StatusOr<size_t> got = fresh->Read(other.name, buffer.data(), buffer.size(), offset);
    REQUIRE(got.ok());
    CHECK(testing::BytesMatch(other, buffer.data(), offset, buffer.size()));
  }
  fresh->WaitForPlacement();
  CHECK(fresh->GetStats().Get("read_ahead_extents") == 0);
  CHECK(fresh->GetStats().Source("bytes_read") == 3 * kMiB);
}

TEST_CASE("an order of ranges prefetches the extents that hold them, in that order") {
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  const TestFile big{"tokens.bin", 17, 32 * kMiB};
  testing::WriteFile(ds + "/" + big.name, big.seed, big.size);
  const TestFile small{"labels.bin", 18, 100000};  // Cached whole.
  testing::WriteFile(ds + "/" + small.name, small.seed, small.size);
  auto m = MustCreate(ExtentConfig(ds, {testing::RamTier(256 * kMiB)}));
  // Records of 64 KiB in extents 30, 2, 17 (two, one after the other: no
  // scan), and 5 and 6 (one across the two), and the small file whole.
  const std::vector<Monarch::SampleRange> samples = {
      {big.name, 30 * kMiB + 4096, 65536}, {big.name, 2 * kMiB, 65536},
      {small.name, 0, 0},                  {big.name, 17 * kMiB, 65536},
      {big.name, 17 * kMiB + 65536, 65536}, {big.name, 6 * kMiB - 1000, 65536}};
  REQUIRE(m->AnnounceRanges(samples).ok());
  // Each extent the streams fetched is loaded whole; nothing else is.
  const uint64_t fetched = 5 * kMiB + small.size;  // Extents 30, 2, 17, 5, 6; the small file.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (m->GetStats().Get("prefetch_files") < 6 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  m->WaitForPlacement();
  Stats stats = m->GetStats();
  CHECK(stats.Get("prefetch_files") == 6);
  CHECK(stats.Source("bytes_read") == fetched);
  CHECK(stats.Tier(0, "files") == 6);
  std::vector<char> buffer(65536);
  for (const Monarch::SampleRange& sample : samples) {
    const TestFile& f = sample.file == big.name ? big : small;
    const size_t n = sample.length != 0 ? sample.length : f.size;
    std::vector<char> bytes(n);
    absl::StatusOr<size_t> got = m->Read(f.name, bytes.data(), n, sample.offset);
    REQUIRE(got.ok());
    REQUIRE(*got == n);
    CHECK(testing::BytesMatch(f, bytes.data(), sample.offset, n));
  }
  stats = m->GetStats();
  m->WaitForPlacement();
  CHECK(stats.Source("bytes_read") == fetched);  // All hits.
  CHECK(stats.Get("read_ahead_extents") == 0);
  CHECK(stats.Get("prefetch_hits") >= 5);
  // Errors: nothing is announced.
  CHECK(absl::IsNotFound(m->AnnounceRanges({{"nope.bin", 0, 10}})));
  CHECK(absl::IsOutOfRange(m->AnnounceRanges({{big.name, big.size, 10}})));
  CHECK(m->AnnounceRanges({{big.name, big.size - 1, 0}}).ok());  // The last byte.
}

// Flips one byte of the file at `path`, at `offset`.
void FlipByte(const std::string& path, uint64_t offset) {
  const int fd = ::open(path.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  char c = 0;
  REQUIRE(::pread(fd, &c, 1, static_cast<off_t>(offset)) == 1);
  c = static_cast<char>(c ^ 0x5a);
  REQUIRE(::pwrite(fd, &c, 1, static_cast<off_t>(offset)) == 1);
  ::close(fd);
}

TEST_CASE("extent copies in a file tier: evicted and promoted again, checked by their CRCs, a "
          "flipped byte never served, adopted by a restart with the same extent size only") {
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  const std::string nvme = dir.Sub("nvme");
  const TestFile big{"sub/big.bin", 9, 12 * kMiB};
  testing::WriteFile(ds + "/" + big.name, big.seed, big.size);
  // Room for 4 of the 12 extents: lru evicts as the scan goes on.
  Config config = ExtentConfig(
      ds, {testing::FileTier(TierKind::kPosix, nvme, 4 * testing::OnDisk(kMiB), "nvme")});
  config.placement.policy = PlacementPolicyKind::kLru;
  {
    auto m = MustCreate(config);
    for (int epoch = 0; epoch < 2; ++epoch) {
      ReadWholeAndCheck(*m, big, 300000);
      m->WaitForPlacement();
    }
    const Stats stats = m->GetStats();
    // Each extent past the 4 that fit made room by eviction, or (an
    // eviction failed: a copy still pinned on a loaded machine) was read
    // around.
    CHECK(stats.Get("evictions") >= 4);
    CHECK(stats.Get("evictions") + stats.Get("promotions_skipped") >= 8);
    CHECK(stats.Tier(0, "files") == 4);
    CHECK(stats.Tier(0, "bytes_used") <= 4 * testing::OnDisk(kMiB));
  }
  // The last epoch left 4 extents in the tier: 8-11 when every eviction
  // went as the scan went, others when a loaded machine's timing let one
  // fail (a copy still pinned) and the reader read around it. One is
  // damaged, another is read first, as a hit.
  const std::string extents = absl::StrCat(nvme, "/.monarch/extents/", kMiB, "/sub/big.bin");
  std::vector<uint64_t> kept;
  for (const auto& entry : std::filesystem::directory_iterator(extents)) {
    kept.push_back(std::stoull(entry.path().filename().string()));
  }
  std::sort(kept.begin(), kept.end());
  REQUIRE(kept.size() == 4);
  const uint64_t hit = kept[0];
  const uint64_t damaged = kept[1];
  FlipByte(absl::StrCat(extents, "/", damaged), 4242);
  {
    auto m = MustCreate(config);
    Stats stats = m->GetStats();
    CHECK(stats.Get("warm_files_reused") == 4);
    std::vector<char> buffer(kMiB);
    absl::StatusOr<size_t> got = m->Read(big.name, buffer.data(), kMiB, hit * kMiB);
    REQUIRE(got.ok());
    REQUIRE(*got == kMiB);
    CHECK(testing::BytesMatch(big, buffer.data(), hit * kMiB, kMiB));
    stats = m->GetStats();
    CHECK(stats.Tier(0, "reads") == 1);  // An adopted copy served it,
    CHECK(stats.Source("bytes_read") == 0);
    // and the damaged one's damage is found when it is read: served from
    // the source (which a copy made again may read once more).
    got = m->Read(big.name, buffer.data(), kMiB, damaged * kMiB);
    REQUIRE(got.ok());
    REQUIRE(*got == kMiB);
    CHECK(testing::BytesMatch(big, buffer.data(), damaged * kMiB, kMiB));
    stats = m->GetStats();
    CHECK(stats.Tier(0, "damaged_copies") == 1);
    CHECK(stats.Source("bytes_read") >= kMiB);
  }
  // Another extent size: the copies are of other ranges, and never read (a
  // byte of one would differ from the file's at its offset here). Every byte
  // comes from the source at least once; a loaded machine may make a tier
  // of 2 such extents read one again.
  config.placement.extent_bytes = 2 * kMiB;
  auto m = MustCreate(config);
  CHECK(m->GetStats().Get("warm_files_reused") == 0);
  ReadWholeAndCheck(*m, big);
  CHECK(m->GetStats().Source("bytes_read") >= big.size);
}

// Regular files under `dir`, recursively: their bytes.
uint64_t FileBytesUnder(const std::string& dir) {
  uint64_t total = 0;
  std::error_code error;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, error);
       it != std::filesystem::recursive_directory_iterator(); it.increment(error)) {
    if (error) break;
    if (it->is_regular_file(error)) total += it->file_size(error);
  }
  return total;
}

TEST_CASE("SIGKILL in the middle of extents' promotions: a restart serves nothing wrong") {
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  const std::string nvme = dir.Sub("nvme");
  const TestFile big{"big.bin", 21, 24 * kMiB};
  testing::WriteFile(ds + "/" + big.name, big.seed, big.size);
  const Config config = ExtentConfig(
      ds, {testing::FileTier(TierKind::kPosix, nvme, 64 * kMiB, "nvme")});
  std::mt19937 rng(5);
  for (int round = 0; round < 4; ++round) {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      // A slow source: extents are in flight when the kill comes.
      testing::FaultInjectingDriver::Faults source;
      source.read_delay_us = 2000;
      absl::StatusOr<std::unique_ptr<Monarch>> m = testing::CreateWithFaults(config, &source);
      if (!m.ok()) ::_exit(2);
      std::vector<std::thread> readers;
      for (int t = 0; t < 3; ++t) {
        readers.emplace_back([&, t] {
          std::vector<char> buffer(100000);
          for (uint64_t offset = t * 3 * kMiB; offset < big.size; offset += 5 * kMiB / 2) {
            (void)(*m)->Read(big.name, buffer.data(), buffer.size(), offset);
          }
        });
      }
      for (std::thread& r : readers) r.join();
      ::pause();
      ::_exit(0);
    }
    testing::KillSoon(child, rng);
    // Now and then, damage an extent's copy the killed process published.
    if (round % 2 == 1) {
      for (uint32_t k = 0; k < 24; ++k) {
        const std::string path =
            absl::StrCat(nvme, "/.monarch/extents/", kMiB, "/", big.name, "/", k);
        if (::access(path.c_str(), F_OK) == 0) {
          FlipByte(path, 1000);
          break;
        }
      }
    }
    auto m = MustCreate(config);
    // The killed process's temporaries were removed by the start-up scan.
    CHECK(FileBytesUnder(nvme + "/.monarch/tmp") == 0);
    ReadWholeAndCheck(*m, big, 777777);
    m->Shutdown(Monarch::ShutdownMode::kCancel);
  }
}

TEST_CASE("mapping: pages of checked copies in a file tier are mapped from them, extents and "
          "whole files, and a damaged or unchecked copy never is") {
  using testing::MappedAt;
  using testing::SourceMapping;
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  const std::string nvme = dir.Sub("nvme");
  // 12 extents and a last one of 100,000 bytes: 24 whole pages and a part.
  const TestFile big{"big.bin", 5, 12 * kMiB + 100000};
  const TestFile whole{"whole.bin", 6, 3 * kMiB + 5};  // Below the threshold.
  const std::string big_source = ds + "/" + big.name;
  testing::WriteFile(big_source, big.seed, big.size);
  testing::WriteFile(ds + "/" + whole.name, whole.seed, whole.size);
  const std::string extents = absl::StrCat(nvme, "/.monarch/extents/");
  Config config =
      ExtentConfig(ds, {testing::FileTier(TierKind::kPosix, nvme, 64 * kMiB, "nvme")});
  {
    auto m = MustCreate(config);
    // A page of each of the first 8 extents is read, out of order (a scan
    // would read ahead), so only they have copies.
    std::vector<char> buffer(4096);
    for (uint64_t k : {7, 5, 3, 1, 6, 4, 2, 0}) {
      REQUIRE(*m->Read(big.name, buffer.data(), buffer.size(), k * kMiB + 4096) == 4096);
    }
    ReadWholeAndCheck(*m, whole);
    m->WaitForPlacement();  // Also waits for the copies to be checked.
    {
      SourceMapping map(big_source, big.size);
      CHECK(map.MapCopies(*m, big.name) == 8 * kMiB);
      CHECK(absl::StartsWith(MappedAt(map.data()), extents));
      CHECK(absl::StartsWith(MappedAt(map.data() + 8 * kMiB - 1), extents));
      CHECK(MappedAt(map.data() + 8 * kMiB) == big_source);  // No copy: the source.
      CHECK(testing::BytesMatch(big, map.data(), 0, big.size));
      // Each extent is its own copy, mapped at its place.
      CHECK(MappedAt(map.data() + 3 * kMiB) != MappedAt(map.data() + 2 * kMiB));
    }
    // The rest read and copied: all but the part of the last page.
    std::vector<char> rest(big.size - 8 * kMiB);
    REQUIRE(*m->Read(big.name, rest.data(), rest.size(), 8 * kMiB) == rest.size());
    m->WaitForPlacement();
    {
      SourceMapping map(big_source, big.size);
      CHECK(map.MapCopies(*m, big.name) == 12 * kMiB + 24 * 4096);
      CHECK(MappedAt(map.data() + big.size - 1) == big_source);
      CHECK(testing::BytesMatch(big, map.data(), 0, big.size));
      // Past the end of the file, in its last page: zeros, not the trailer.
      const char* tail = map.data() + big.size;
      CHECK(std::all_of(tail, tail + (4096 - big.size % 4096), [](char c) { return c == 0; }));
    }
    {  // A range of the file, at an offset in pages.
      SourceMapping part(big_source, 3 * kMiB, 5 * kMiB + 8192);
      CHECK(part.MapCopies(*m, big.name) == 3 * kMiB);
      CHECK(testing::BytesMatch(big, part.data(), 5 * kMiB + 8192, 3 * kMiB));
    }
    SourceMapping map(ds + "/" + whole.name, whole.size);
    CHECK(map.MapCopies(*m, whole.name) == 3 * kMiB);
    CHECK(MappedAt(map.data()) == nvme + "/" + whole.name);
    CHECK(testing::BytesMatch(whole, map.data(), 0, whole.size));
    CHECK(absl::IsNotFound(
        m->MapCopies("no/such/file", map.data(), 0, 4096, PROT_READ, MAP_PRIVATE).status()));
  }
  // A byte of extent 4's copy flipped while no instance runs. Copies an
  // earlier run left are opened ahead (their trailers read), but checked
  // only when read, or asked to be mapped.
  FlipByte(absl::StrCat(extents, kMiB, "/big.bin/4"), 777);
  {
    auto m = MustCreate(config);
    m->WaitForPlacement();  // Opened, not checked.
    CHECK(SourceMapping(big_source, big.size).MapCopies(*m, big.name) == 0);  // Now queued.
    m->WaitForPlacement();
    SourceMapping map(big_source, big.size);
    CHECK(map.MapCopies(*m, big.name) == 11 * kMiB + 24 * 4096);  // All but extent 4.
    CHECK(MappedAt(map.data() + 4 * kMiB + 777) == big_source);
    CHECK(testing::BytesMatch(big, map.data(), 0, big.size));
    // The check that found it forgot what it knew of the copy; a read
    // finds it damaged again, drops it and serves the source.
    std::vector<char> buffer(kMiB);
    REQUIRE(*m->Read(big.name, buffer.data(), kMiB, 4 * kMiB) == kMiB);
    CHECK(testing::BytesMatch(big, buffer.data(), 4 * kMiB, kMiB));
    CHECK(m->GetStats().Tier(0, "damaged_copies") == 1);
  }
  // Under verify: every-read, a page fault could not check what it reads.
  config.placement.verify = VerifyPolicy::kEveryRead;
  {
    auto m = MustCreate(config);
    ReadWholeAndCheck(*m, big);
    m->WaitForPlacement();
    CHECK(SourceMapping(big_source, big.size).MapCopies(*m, big.name) == 0);
  }
}

TEST_CASE("mapping: RAM copies are mapped where they lie, eviction passes over them while they "
          "are mapped, and takes them again once they are not") {
  using testing::MappedAt;
  using testing::SourceMapping;
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  const TestFile big{"big.bin", 5, 12 * kMiB + 100000};
  const TestFile other{"other.bin", 7, 12 * kMiB};
  const std::string big_source = ds + "/" + big.name;
  testing::WriteFile(big_source, big.seed, big.size);
  testing::WriteFile(ds + "/" + other.name, other.seed, other.size);
  // Room for one of the two files, and eviction to make room.
  Config config = ExtentConfig(ds, {testing::RamTier(16 * kMiB)});
  config.placement.policy = PlacementPolicyKind::kLru;
  auto m = MustCreate(config);
  ReadWholeAndCheck(*m, big);
  m->WaitForPlacement();
  {
    SourceMapping map(big_source, big.size);
    // The 12 extents of 1 MiB start on a page; the last, 100,000 bytes,
    // only by chance (copies under 1 MiB are aligned to 64 bytes).
    const uint64_t mapped = map.MapCopies(*m, big.name);
    CHECK(mapped >= 12 * kMiB);
    CHECK(mapped <= 12 * kMiB + 24 * 4096);
    CHECK(absl::StartsWith(MappedAt(map.data()), "/memfd:monarch-ram:"));
    CHECK(absl::StartsWith(MappedAt(map.data() + 12 * kMiB - 1), "/memfd:monarch-ram:"));
    CHECK(MappedAt(map.data() + big.size - 1) == big_source);  // The last, partial page.
    CHECK(testing::BytesMatch(big, map.data(), 0, big.size));
    const char* tail = map.data() + big.size;
    CHECK(std::all_of(tail, tail + (4096 - big.size % 4096), [](char c) { return c == 0; }));

    // other.bin wants big's room: the mapped extents are passed over, and
    // other's extents that find no room are read from the source.
    ReadWholeAndCheck(*m, other);
    m->WaitForPlacement();
    CHECK(testing::BytesMatch(big, map.data(), 0, big.size));
    CHECK(m->GetStats().Tier(0, "held_bytes") == 0);
    CHECK(m->GetStats().Tier(0, "bytes_used") <= 16 * kMiB);
    // The mapped extents are still in the tier; only the last one, which
    // is not mapped, may have made room.
    const uint64_t source_before = m->GetStats().Source("bytes_read");
    ReadWholeAndCheck(*m, big);
    CHECK(m->GetStats().Source("bytes_read") - source_before <= big.size - 12 * kMiB);
  }
  // Unmapped. The next walk of the mappings (at most one a second) finds
  // nobody mapping big's extents, and eviction takes them for other's:
  // other is read, and placed, until it is read from the tier.
  REQUIRE(testing::Eventually([&] {
    ReadWholeAndCheck(*m, other);
    m->WaitForPlacement();
    const uint64_t source_before = m->GetStats().Source("bytes_read");
    ReadWholeAndCheck(*m, other);
    return m->GetStats().Source("bytes_read") - source_before < other.size / 2;
  }));
  CHECK(m->GetStats().Tier(0, "held_bytes") == 0);
  CHECK(m->GetStats().Tier(0, "bytes_used") <= 16 * kMiB);
}

TEST_CASE("placement.extent_bytes: refused unless a multiple of 4KiB, naming the key") {
  ScratchDir dir;
  absl::StatusOr<Config> config = ParseConfigString(
      absl::StrCat("dataset: {path: ", dir.path(),
                   "}\ntiers:\n  - {kind: source}\nplacement: {extent_bytes: 5000}\n"));
  REQUIRE_FALSE(config.ok());
  CHECK(absl::StrContains(config.status().message(), "placement.extent_bytes"));
  CHECK(absl::StrContains(config.status().message(), "multiple of 4KiB"));
}

}  // namespace
}  // namespace monarch
