// Eviction (placement.policy "lru", PlacementHandler::MakeRoom): a full tier
// gives up its least recently used copy for a new file; a copy with a reader
// inside is never evicted; and under concurrent readers every byte stays
// exact and the tier's accounting stays true. The same through the node
// service, whose clients read RAM copies the service may evict under them.

#include <doctest/doctest.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "instance_util.h"
#include "monarch/monarch.h"
#include "service/node_service.h"
#include "test_util.h"

namespace monarch {
namespace {

using testing::FaultInjectingDriver;
using testing::MustCreate;
using testing::ReadWholeAndCheck;
using testing::ScratchDir;
using testing::TestFile;

Config LruConfig(const std::string& ds, uint64_t ram_bytes) {
  Config config = testing::MakeConfig(ds, {testing::RamTier(ram_bytes)});
  config.placement.policy = "lru";
  return config;
}

// Reads `f` whole and waits for its promotion, if one started.
void ReadAndSettle(Monarch& m, const TestFile& f) {
  ReadWholeAndCheck(m, f);
  m.WaitForPlacement();
}

// Which copies a posix tier holds, seen on disk (the hand's order follows
// file ids, which follow the namespace walk: the test does not assume it).
bool OnTier(const std::string& tier_dir, const TestFile& f) {
  struct stat st;
  return ::stat((tier_dir + "/" + f.name).c_str(), &st) == 0;
}

TEST_CASE("lru: a full tier evicts a copy not read since the hand passed, never a newer one") {
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  const std::string nvme = dir.Sub("nvme");
  const auto files = testing::MakeDataset(ds, 5, {10000});
  FaultInjectingDriver::Faults source;
  Config config = testing::MakeConfig(
      ds, {testing::FileTier(TierKind::kPosix, nvme, 3 * testing::OnDisk(10000), "nvme")});
  config.placement.policy = "lru";
  auto m = MustCreate(config, &source);  // Three copies fit.

  for (int i = 0; i < 3; ++i) ReadAndSettle(*m, files[i]);
  CHECK(m->GetStats().Tier(0, "files") == 3);

  // A fourth file: the hand gives each copy its second chance, then evicts
  // the first it comes back to.
  ReadAndSettle(*m, files[3]);
  CHECK(m->GetStats().Get("evictions") == 1);
  CHECK(m->GetStats().Tier(0, "files") == 3);
  CHECK(OnTier(nvme, files[3]));
  std::vector<const TestFile*> kept;
  for (int i = 0; i < 3; ++i) {
    if (OnTier(nvme, files[i])) kept.push_back(&files[i]);
  }
  REQUIRE(kept.size() == 2);

  // One survivor is read again; a fifth file then needs room. The only copy
  // not used since the hand cleared it is the other survivor: it goes, and
  // neither the one just read nor file 3 (newer) does.
  ReadWholeAndCheck(*m, *kept[0]);
  ReadAndSettle(*m, files[4]);
  CHECK(m->GetStats().Get("evictions") == 2);
  CHECK(OnTier(nvme, *kept[0]));
  CHECK_FALSE(OnTier(nvme, *kept[1]));
  CHECK(OnTier(nvme, files[3]));
  CHECK(OnTier(nvme, files[4]));
  CHECK(m->GetStats().Tier(0, "bytes_used") == 3 * testing::OnDisk(10000));
  const uint64_t before = source.BytesOf(kept[0]->name);
  ReadWholeAndCheck(*m, *kept[0]);
  CHECK(source.BytesOf(kept[0]->name) == before);  // Still a hit.
}

TEST_CASE("lru: a copy with a reader inside it is never evicted") {
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  const auto files = testing::MakeDataset(ds, 2, {10000});
  FaultInjectingDriver::Faults source;
  FaultInjectingDriver::Faults ram;
  auto m = MustCreate(LruConfig(ds, 10000), &source, 0, &ram);  // One copy fits.
  ReadAndSettle(*m, files[0]);
  REQUIRE(m->GetStats().Tier(0, "files") == 1);

  // A slow reader inside file 0's copy.
  ram.read_delay_us = 500000;
  std::thread reader([&] { ReadWholeAndCheck(*m, files[0]); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  // File 1 wants the room: the only candidate is in use, so no room is made
  // and file 1 is read from the source.
  ReadWholeAndCheck(*m, files[1]);
  reader.join();
  ram.read_delay_us = 0;
  const Stats stats = m->GetStats();
  CHECK(stats.Get("evictions") == 0);
  CHECK(stats.Get("eviction_failures") >= 1);
  CHECK(stats.Tier(0, "files") == 1);
  ReadWholeAndCheck(*m, files[0]);  // Still there.

  // Once nobody reads it, it goes.
  ReadAndSettle(*m, files[1]);
  CHECK(m->GetStats().Get("evictions") == 1);
  CHECK(source.BytesOf(files[0].name) == 10000);
}

// With an announced order, eviction knows what is read next (Belady): a
// file not read again is not admitted, and the copy read again last goes.
TEST_CASE("lru with an announced order: the copy read again last is evicted, a file never read again is not admitted") {
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  const auto files = testing::MakeDataset(ds, 3, {10000});
  const TestFile &a = files[0], &b = files[1], &c = files[2];
  FaultInjectingDriver::Faults source;
  Config config = LruConfig(ds, 20000);  // Two copies fit.
  config.prefetch.streams = 0;           // The order informs eviction only: no read-ahead.
  auto m = MustCreate(config, &source);

  SUBCASE("a file never read again is read from the source, not admitted") {
    REQUIRE(m->AnnounceOrder({a.name, b.name, c.name, a.name, b.name}).ok());
    for (const TestFile* f : {&a, &b, &c}) ReadAndSettle(*m, *f);
    Stats stats = m->GetStats();
    CHECK(stats.Get("admissions_declined") == 1);
    CHECK(stats.Get("evictions") == 0);
    ReadWholeAndCheck(*m, a);  // Hits: A and B were kept.
    ReadWholeAndCheck(*m, b);
    CHECK(source.bytes.load() == 30000);
  }
  SUBCASE("the copy whose next read is farthest goes") {
    REQUIRE(m->AnnounceOrder({a.name, b.name, c.name, a.name, c.name, b.name}).ok());
    for (const TestFile* f : {&a, &b, &c}) ReadAndSettle(*m, *f);
    CHECK(m->GetStats().Get("evictions") == 1);  // B: read again after A and C.
    ReadWholeAndCheck(*m, a);
    ReadWholeAndCheck(*m, c);
    CHECK(source.bytes.load() == 30000);  // A and C were hits.
    ReadWholeAndCheck(*m, b);
    CHECK(source.BytesOf(b.name) == 20000);  // B was the one evicted.
  }
  SUBCASE("without an order, C is admitted all the same (recency decides: A or B goes)") {
    for (const TestFile* f : {&a, &b, &c}) ReadAndSettle(*m, *f);
    CHECK(m->GetStats().Get("evictions") == 1);
    CHECK(m->GetStats().Get("admissions_declined") == 0);
    ReadWholeAndCheck(*m, c);
    CHECK(source.BytesOf(c.name) == 10000);  // A hit.
  }
}

TEST_CASE("lru: concurrent readers over twice the tier read exact bytes, accounting stays true") {
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  const auto files = testing::MakeDataset(ds, 24, {3000, 20000, 70000});
  const uint64_t total = testing::TotalBytes(files);
  Config config = LruConfig(ds, total / 2);
  config.placement.chunk_bytes = 16 << 10;  // Several chunks per file.
  auto m = MustCreate(config);
  std::atomic<bool> failed{false};
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::vector<char> buffer(70000);
      for (int i = 0; i < 400 && !failed; ++i) {
        const TestFile& f = files[rng() % files.size()];
        const uint64_t offset = rng() % f.size;
        absl::StatusOr<size_t> n = m->Read(f.name, buffer.data(), 9000, offset);
        const size_t want = static_cast<size_t>(std::min<uint64_t>(9000, f.size - offset));
        if (!n.ok() || *n != want || !testing::BytesMatch(f, buffer.data(), offset, *n)) {
          MESSAGE(f.name, " at ", offset, ": ", n.ok() ? std::to_string(*n) : n.status().ToString(),
                  " want ", want);
          failed = true;
        }
      }
    });
  }
  for (std::thread& t : readers) t.join();
  CHECK_FALSE(failed.load());
  m->WaitForPlacement();
  const Stats stats = m->GetStats();
  CHECK(stats.Get("evictions") > 0);
  CHECK(stats.Tier(0, "read_errors") == 0);
  CHECK(stats.Tier(0, "bytes_used") <= total / 2);
  CHECK(stats.Tier(0, "files") > 0);
  for (const TestFile& f : files) ReadWholeAndCheck(*m, f);  // Every copy left reads back.
}

TEST_CASE("lru: through the node service, clients read exact bytes while copies are evicted") {
  ScratchDir dir;
  const auto files = testing::MakeDataset(dir.Sub("data"), 12, {30000});
  Config config = LruConfig(dir.path() + "/data", 4 * 30000);
  config.node.shared = true;
  config.node.runtime_dir = dir.Sub("run");
  config.node.autostart = false;
  config.node.idle_exit_seconds = 0;
  auto node = service::NodeService::Start(config);
  REQUIRE(node.ok());
  std::vector<std::unique_ptr<Monarch>> clients;
  for (int c = 0; c < 3; ++c) {
    auto client = Monarch::Create(config);
    REQUIRE(client.ok());
    clients.push_back(std::move(*client));
  }
  std::atomic<bool> failed{false};
  std::vector<std::thread> threads;
  for (int c = 0; c < 3; ++c) {
    threads.emplace_back([&, c] {
      std::mt19937 rng(c);
      std::vector<char> buffer(30000);
      for (int i = 0; i < 300 && !failed; ++i) {
        const TestFile& f = files[rng() % files.size()];
        absl::StatusOr<size_t> n = clients[c]->Read(f.name, buffer.data(), buffer.size(), 0);
        if (!n.ok() || *n != f.size || !testing::BytesMatch(f, buffer.data(), 0, *n)) {
          failed = true;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK_FALSE(failed.load());
  const Stats stats = clients[0]->GetStats();
  CHECK(stats.Get("evictions") > 0);
  CHECK(stats.Tier(0, "bytes_used") <= 4 * 30000);
}

}  // namespace
}  // namespace monarch
