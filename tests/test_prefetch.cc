// Clairvoyant prefetch (src/placement/prefetcher.h): announced files are
// promoted ahead of the reader, each read from the source once, within the
// lookahead; readers are never queued behind the prefetch, and it gives way
// to their misses; files no tier has room for are not read at all.

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "common/mutex.h"
#include "drivers/forwarding_driver.h"
#include "instance_util.h"
#include "monarch/monarch.h"
#include "core/monarch_internal.h"
#include "test_util.h"

namespace monarch {
namespace {

using testing::ReadWholeAndCheck;
using testing::ScratchDir;
using testing::TestFile;

// The source, with reads of chosen files held at a gate until released,
// and the reads in flight counted.
class GatedSource final : public ForwardingDriver {
 public:
  struct Gate {
    Mutex mu;
    CondVar changed;
    bool all_open ABSL_GUARDED_BY(mu) = true;
    absl::flat_hash_set<std::string> released ABSL_GUARDED_BY(mu);
    absl::flat_hash_set<std::string> waiting ABSL_GUARDED_BY(mu);  // Held at the gate now.
    std::atomic<uint64_t> reads{0};
    std::atomic<uint64_t> bytes{0};

    void Close() {
      MutexLock lock(&mu);
      all_open = false;
    }
    void Release(const std::string& name) {
      MutexLock lock(&mu);
      released.insert(name);
      changed.SignalAll();
    }
    void OpenAll() {
      MutexLock lock(&mu);
      all_open = true;
      changed.SignalAll();
    }
    std::vector<std::string> Waiting() {
      MutexLock lock(&mu);
      return {waiting.begin(), waiting.end()};
    }
    // Waits until `done(waiting set)` holds, up to 10 s.
    bool WaitFor(const std::function<bool(const absl::flat_hash_set<std::string>&)>& done) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      MutexLock lock(&mu);
      while (!done(waiting)) {
        if (!changed.WaitUntil(&mu, deadline) && std::chrono::steady_clock::now() >= deadline) {
          return done(waiting);
        }
      }
      return true;
    }
  };

  GatedSource(std::unique_ptr<StorageDriver> target, Gate* gate)
      : ForwardingDriver(std::move(target)), gate_(gate) {}

  absl::StatusOr<size_t> Read(const FileRef& file, uint64_t offset, char* dst, size_t n) override {
    const std::string name(file.name);
    {
      MutexLock lock(&gate_->mu);
      gate_->waiting.insert(name);
      gate_->changed.SignalAll();
      while (!gate_->all_open && !gate_->released.contains(name)) gate_->changed.Wait(&gate_->mu);
      gate_->waiting.erase(name);
      gate_->changed.SignalAll();
    }
    absl::StatusOr<size_t> got = ForwardingDriver::Read(file, offset, dst, n);
    gate_->reads.fetch_add(1);
    if (got.ok()) gate_->bytes.fetch_add(*got);
    return got;
  }

 private:
  GatedSource::Gate* const gate_;
};

std::unique_ptr<Monarch> CreateGated(const Config& config, GatedSource::Gate* gate) {
  return testing::MustCreateWrappingSource(config, [gate](std::unique_ptr<StorageDriver> d) {
    return std::unique_ptr<StorageDriver>(new GatedSource(std::move(d), gate));
  });
}

std::vector<std::string> Names(const std::vector<TestFile>& files) {
  std::vector<std::string> names;
  for (const TestFile& f : files) names.push_back(f.name);
  return names;
}

// Polls `m`'s counter `name` until it reaches `want` (10 s at most).
bool WaitForCounter(Monarch& m, const std::string& name, uint64_t want) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (m.GetStats().Get(name) < want) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

TEST_CASE("prefetch: announced files are promoted before any read, each read from the source once") {
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  const auto files = testing::MakeDataset(ds, 60, {1, 5000, 70000, 300000});
  Config config = testing::MakeConfig(ds, {testing::RamTier(64 << 20)});
  config.placement.chunk_bytes = 64 << 10;  // The large files take several chunks.
  config.prefetch.streams = 3;
  GatedSource::Gate gate;
  auto m = CreateGated(config, &gate);

  REQUIRE(m->AnnounceOrder(Names(files)).ok());
  REQUIRE(WaitForCounter(*m, "prefetch_files", files.size()));
  m->WaitForPlacement();
  const Stats before = m->GetStats();
  CHECK(before.Tier(0, "files") == files.size());
  CHECK(before.Get("prefetch_bytes") == testing::TotalBytes(files));
  CHECK(gate.bytes.load() == testing::TotalBytes(files));  // Once each, no read yet.

  for (const TestFile& f : files) ReadWholeAndCheck(*m, f, 10000);
  const Stats after = m->GetStats();
  CHECK(gate.bytes.load() == testing::TotalBytes(files));  // Every read was a hit.
  CHECK(after.Tier(0, "reads") >= files.size());
  CHECK(after.Get("prefetch_hits") == files.size());
  CHECK(after.Get("prefetch_lookahead_bytes") == 0);  // All of it was read.
}

TEST_CASE("prefetch: the lookahead bounds what is fetched ahead, reads free it") {
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  const auto files = testing::MakeDataset(ds, 20, {10000});
  Config config = testing::MakeConfig(ds, {testing::RamTier(64 << 20)});
  config.prefetch.streams = 2;
  config.prefetch.lookahead_bytes = 30000;  // Three files.
  GatedSource::Gate gate;
  auto m = CreateGated(config, &gate);

  REQUIRE(m->AnnounceOrder(Names(files)).ok());
  REQUIRE(WaitForCounter(*m, "prefetch_files", 3));
  // It stays there: both streams wait for the readers, none fetching.
  REQUIRE(WaitForCounter(*m, "prefetch_streams_held", 2));
  CHECK(m->GetStats().Get("prefetch_files") == 3);
  CHECK(m->GetStats().Get("prefetch_lookahead_bytes") == 30000);

  // The reader takes two of them: two more come, and no more.
  ReadWholeAndCheck(*m, files[0]);
  ReadWholeAndCheck(*m, files[1]);
  REQUIRE(WaitForCounter(*m, "prefetch_files", 5));
  REQUIRE(WaitForCounter(*m, "prefetch_streams_held", 2));
  CHECK(m->GetStats().Get("prefetch_files") == 5);

  // Reading in order to the end: every file is read from the source once.
  for (const TestFile& f : files) ReadWholeAndCheck(*m, f);
  m->WaitForPlacement();
  CHECK(gate.bytes.load() == testing::TotalBytes(files));
  CHECK(m->GetStats().Tier(0, "files") == files.size());
}

TEST_CASE("prefetch: a read the streams have not reached is served at once, not after them") {
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  const auto files = testing::MakeDataset(ds, 10, {20000});
  Config config = testing::MakeConfig(ds, {testing::RamTier(64 << 20)});
  config.prefetch.streams = 1;
  GatedSource::Gate gate;
  gate.Close();
  auto m = CreateGated(config, &gate);

  REQUIRE(m->AnnounceOrder(Names(files)).ok());
  // The one stream is stuck on the first file of the order.
  REQUIRE(gate.WaitFor([&](const auto& waiting) { return waiting.contains(files[0].name); }));
  // A reader wants the last one: its read goes to the source itself.
  gate.Release(files[9].name);
  const auto started = std::chrono::steady_clock::now();
  ReadWholeAndCheck(*m, files[9]);
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(5));
  CHECK(gate.Waiting() == std::vector<std::string>{files[0].name});  // Still stuck.

  gate.OpenAll();
  for (const TestFile& f : files) ReadWholeAndCheck(*m, f);
  m->WaitForPlacement();
  CHECK(gate.bytes.load() == testing::TotalBytes(files));  // Each file once all the same.
}

TEST_CASE("prefetch: the streams give way to the readers' own misses") {
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  const auto files = testing::MakeDataset(ds, 12, {8000});
  Config config = testing::MakeConfig(ds, {testing::RamTier(64 << 20)});
  config.prefetch.streams = 3;
  GatedSource::Gate gate;
  gate.Close();
  auto m = CreateGated(config, &gate);

  // Two readers miss on files outside the order and wait at the gate.
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) readers.emplace_back([&, r] { ReadWholeAndCheck(*m, files[r]); });
  REQUIRE(gate.WaitFor([&](const auto& waiting) { return waiting.size() == 2; }));
  const std::vector<TestFile> ordered(files.begin() + 2, files.end());
  REQUIRE(m->AnnounceOrder(Names(ordered)).ok());
  // 3 streams less 2 misses: one stream fetches (at least one always does).
  REQUIRE(gate.WaitFor([](const auto& waiting) { return waiting.size() == 3; }));
  // Both other streams looked again since, and gave way again.
  const uint64_t yields = m->GetStats().Get("prefetch_yields");
  REQUIRE(WaitForCounter(*m, "prefetch_yields", yields + 2));
  CHECK(gate.Waiting().size() == 3);

  // The misses end: all three streams fetch.
  gate.Release(files[0].name);
  gate.Release(files[1].name);
  for (std::thread& t : readers) t.join();
  REQUIRE(gate.WaitFor([](const auto& waiting) { return waiting.size() == 3; }));
  gate.OpenAll();
  for (const TestFile& f : files) ReadWholeAndCheck(*m, f);
  m->WaitForPlacement();
  CHECK(gate.bytes.load() == testing::TotalBytes(files));
}

TEST_CASE("prefetch: files no tier has room for are not read ahead") {
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  const auto files = testing::MakeDataset(ds, 6, {40000});
  Config config = testing::MakeConfig(ds, {testing::RamTier(100000)});  // Two files fit.
  GatedSource::Gate gate;
  auto m = CreateGated(config, &gate);

  REQUIRE(m->AnnounceOrder(Names(files)).ok());
  REQUIRE(WaitForCounter(*m, "prefetch_no_room_files", 4));
  // A stream counts its file after the promotion it drove is done, so
  // WaitForPlacement alone may return first (seen under TSan).
  CHECK(WaitForCounter(*m, "prefetch_files", 2));
  m->WaitForPlacement();
  const Stats stats = m->GetStats();
  CHECK(stats.Get("prefetch_files") == 2);
  CHECK(gate.bytes.load() == 2 * 40000);  // The other four stay unread until asked for.
  CHECK(stats.Get("prefetch_lookahead_bytes") == 2 * 40000);
  for (const TestFile& f : files) ReadWholeAndCheck(*m, f);
  CHECK(gate.bytes.load() == testing::TotalBytes(files));
}

TEST_CASE("prefetch: an announcement naming a file not in the dataset announces nothing") {
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  const auto files = testing::MakeDataset(ds, 4, {1000});
  GatedSource::Gate gate;
  auto m = CreateGated(testing::MakeConfig(ds, {testing::RamTier(1 << 20)}), &gate);
  absl::Status status = m->AnnounceOrder({files[0].name, "dir0/nope.bin", files[1].name});
  CHECK(absl::IsNotFound(status));
  CHECK(absl::StrContains(status.message(), "dir0/nope.bin"));
  // Nothing to wait for: an announcement is taken, or not, in the call, and
  // the streams start with the first one taken.
  CHECK(m->GetStats().Get("prefetch_announced_files") == 0);
  CHECK(gate.reads.load() == 0);
  // Paths inside the dataset are names too; an empty order withdraws it.
  CHECK(m->AnnounceOrder({ds + "/" + files[2].name}).ok());
  REQUIRE(WaitForCounter(*m, "prefetch_files", 1));
  CHECK(m->AnnounceOrder({}).ok());
  CHECK(m->GetStats().Get("prefetch_order_files") == 0);
}

// The files of `how`'s order over `files`, each at its first occurrence:
// the order in which one prefetch stream fetches them.
std::vector<std::string> FirstOccurrences(const std::vector<std::string>& files,
                                          const SampledOrder& how) {
  absl::StatusOr<std::vector<uint64_t>> indices = SampledOrderIndices(how, files.size());
  REQUIRE(indices.ok());
  std::vector<std::string> order;
  absl::flat_hash_set<uint64_t> seen;
  for (uint64_t i : *indices) {
    if (seen.insert(i).second) order.push_back(files[i]);
  }
  return order;
}

TEST_CASE("prefetch: a sampled order is rebuilt and fetched in that order, all its epochs") {
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  const auto files = testing::MakeDataset(ds, 12, {5000});
  Config config = testing::MakeConfig(ds, {testing::RamTier(64 << 20)});
  config.prefetch.streams = 1;  // One stream: the fetches follow the order exactly.
  GatedSource::Gate gate;
  gate.Close();
  auto m = CreateGated(config, &gate);

  SampledOrder how;
  how.seed = 9;
  how.first_epoch = 2;
  how.epochs = 3;
  how.rank = 1;
  how.world_size = 2;
  // Rank 1's half of epoch 2, then of epochs 3 and 4: files the first half
  // did not have come as they first occur.
  const std::vector<std::string> want = FirstOccurrences(Names(files), how);
  REQUIRE(want.size() > 6);  // Later epochs bring files the first did not.
  REQUIRE(m->AnnounceSampledOrder(Names(files), how).ok());
  for (const std::string& name : want) {
    CAPTURE(name);
    REQUIRE(gate.WaitFor([&](const auto& waiting) { return waiting.contains(name); }));
    CHECK(gate.Waiting() == std::vector<std::string>{name});  // That one, nothing else.
    gate.Release(name);
  }
  const uint64_t positions = 3 * 6;  // 3 epochs of 12 / 2 samples.
  REQUIRE(WaitForCounter(*m, "prefetch_skipped_files", positions - want.size()));
  m->WaitForPlacement();
  const Stats stats = m->GetStats();
  CHECK(stats.Get("prefetch_announced_files") == positions);
  CHECK(stats.Get("prefetch_order_files") == positions);
  CHECK(stats.Get("prefetch_files") == want.size());
  CHECK(gate.bytes.load() == want.size() * 5000);  // Each once.
}

TEST_CASE("prefetch: a bad sampled order is InvalidArgument or NotFound, and announces nothing") {
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  const auto files = testing::MakeDataset(ds, 4, {1000});
  GatedSource::Gate gate;
  auto m = CreateGated(testing::MakeConfig(ds, {testing::RamTier(1 << 20)}), &gate);
  SampledOrder how;
  how.rank = 2;
  how.world_size = 2;
  absl::Status status = m->AnnounceSampledOrder(Names(files), how);
  CHECK(absl::IsInvalidArgument(status));
  CHECK(absl::StrContains(status.message(), "rank"));
  how.rank = 0;
  how.world_size = 1;  // From here on this rank reads every file.
  how.epochs = 101;    // The node service's bound.
  status = m->AnnounceSampledOrder(Names(files), how);
  CHECK(absl::IsInvalidArgument(status));
  CHECK(absl::StrContains(status.message(), "epochs"));
  how.epochs = 1;
  status = m->AnnounceSampledOrder({}, how);
  CHECK(absl::IsInvalidArgument(status));
  CHECK(absl::StrContains(status.message(), "files"));
  status = m->AnnounceSampledOrder({files[0].name, "dir0/nope.bin"}, how);
  CHECK(absl::IsNotFound(status));
  CHECK(absl::StrContains(status.message(), "dir0/nope.bin"));
  // Nothing to wait for: an announcement is taken, or not, in the call, and
  // the streams start with the first one taken.
  CHECK(m->GetStats().Get("prefetch_announced_files") == 0);
  CHECK(gate.reads.load() == 0);
}

// Several epochs announced at once reach eviction: with only the coming
// epoch known, its last file is never read again and is not admitted; with
// the next one known too, the copy read again last (Belady) goes instead.
TEST_CASE("prefetch: eviction sees the epochs of a sampled order beyond the coming one") {
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  const auto files = testing::MakeDataset(ds, 3, {10000});
  // A seed whose epoch 1 puts epoch 0's last file before one of the
  // others, so that knowing epoch 1 changes what eviction does.
  SampledOrder how;
  std::vector<uint64_t> first, second;
  for (how.seed = 0;; ++how.seed) {
    first = *SampledEpochIndices(how, 3, 0);
    second = *SampledEpochIndices(how, 3, 1);
    if (second[2] != first[2]) break;
  }
  std::vector<std::string> names;
  for (const auto& f : files) names.push_back(f.name);
  for (uint32_t epochs : {1u, 2u}) {
    CAPTURE(epochs);
    testing::FaultInjectingDriver::Faults source;
    Config config = testing::MakeConfig(ds, {testing::RamTier(20000)});  // Two copies fit.
    config.placement.policy = PlacementPolicyKind::kLru;
    config.prefetch.streams = 0;  // The order informs eviction only.
    auto m = testing::MustCreate(config, &source);
    how.epochs = epochs;
    REQUIRE(m->AnnounceSampledOrder(names, how).ok());
    for (uint64_t i : first) {
      ReadWholeAndCheck(*m, files[i]);
      m->WaitForPlacement();
    }
    const Stats stats = m->GetStats();
    if (epochs == 1) {
      CHECK(stats.Get("admissions_declined") == 1);
      CHECK(stats.Get("evictions") == 0);
      continue;
    }
    CHECK(stats.Get("admissions_declined") == 0);
    CHECK(stats.Get("evictions") == 1);
    // Epoch 1: only the file read last in it was given up.
    for (uint64_t i : second) ReadWholeAndCheck(*m, files[i]);
    CHECK(source.bytes.load() == 4 * 10000);
    CHECK(source.BytesOf(files[second[2]].name) == 2 * 10000);
  }
}

}  // namespace
}  // namespace monarch
