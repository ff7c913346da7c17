// Integration tests of the whole read path: Monarch::Read against real
// drivers, with promotions running, failures injected, restarts and a low
// descriptor limit. Every read is checked byte for byte.

#include <doctest/doctest.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/os.h"
#include "drivers/copy_integrity.h"
#include "instance_util.h"
#include "monarch/monarch.h"
#include "core/monarch_internal.h"
#include "core/read_speeds.h"
#include "placement/chunk_pool.h"
#include "test_util.h"

namespace monarch {
namespace {

using testing::FaultInjectingDriver;
using testing::MustCreate;
using testing::OnDisk;
using testing::ReadWholeAndCheck;
using testing::ScratchDir;
using testing::TestFile;

TEST_CASE("pread semantics and errors") {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  auto files = testing::MakeDataset(ds, 3, {1000, 0, 5000});
  auto m = MustCreate(testing::MakeConfig(ds, {testing::RamTier(1 << 20)}));
  char buffer[8192];
  CHECK(m->Read("dir0/file0.bin", buffer, 8192, 0).value() == 1000);  // Short at the end.
  CHECK(testing::BytesMatch(files[0], buffer, 0, 1000));
  CHECK(m->Read("dir0/file0.bin", buffer, 100, 950).value() == 50);
  CHECK(testing::BytesMatch(files[0], buffer, 950, 50));
  CHECK(m->Read("dir0/file0.bin", buffer, 100, 1000).value() == 0);   // At the end.
  CHECK(m->Read("dir0/file0.bin", buffer, 100, 99999).value() == 0);  // Past it.
  CHECK(m->Read("dir1/file1.bin", buffer, 100, 0).value() == 0);      // Empty file.
  CHECK(m->Read("dir0/file0.bin", buffer, 0, 0).value() == 0);
  absl::StatusOr<size_t> missing = m->Read("dir0/nope.bin", buffer, 10, 0);
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK(absl::StrContains(missing.status().message(), "dir0/nope.bin"));
  // Absolute names inside the dataset mean the same file.
  CHECK(m->Read(ds + "/dir2/file2.bin", buffer, 10, 4990).value() == 10);
  CHECK(testing::BytesMatch(files[2], buffer, 4990, 10));
  CHECK(m->FileSize("dir2/file2.bin").value() == 5000);
  CHECK(m->FileSize("nope").status().code() == absl::StatusCode::kNotFound);
  CHECK(m->FileExists("dir1/file1.bin"));
  CHECK_FALSE(m->FileExists("dir1"));
  CHECK(m->IsDirectory("dir1"));
  CHECK(*m->ListDirectory("") == std::vector<std::string>{"dir0", "dir1", "dir2"});
  CHECK(m->ListFiles().size() == 3);
  CHECK(m->dataset_root() == ds);
}

// 8 threads of random reads (lengths and offsets across chunk boundaries and
// the end of files) while promotions run into a RAM and a posix tier, with a
// given staging budget: the default (placement threads write the copies), or
// 1 byte, raised to one 64 KiB chunk (readers write the chunks they loaded
// themselves, racing the placement threads that load and write the rest,
// and take turns for the one chunk of staging memory).
void RandomReadsStayExact(uint64_t staging_budget) {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  auto files = testing::MakeDataset(ds, 60, {1, 4096, 100000, 1 << 20, 3 << 20, 777777});
  FaultInjectingDriver::Faults source;
  source.read_delay_us = 200;  // Keep promotions in flight while readers run.
  Config config = testing::MakeConfig(
      ds, {testing::RamTier(8 << 20),
           testing::FileTier(TierKind::kPosix, dir.Sub("nvme"), 64 << 20, "nvme")});
  config.placement.chunk_bytes = 64 << 10;
  config.placement.max_staging_bytes = staging_budget;
  auto m = MustCreate(config, &source);

  std::atomic<int> bad{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 8; ++t) {
    readers.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::vector<char> buffer(1 << 20);
      for (int i = 0; i < 400; ++i) {
        const TestFile& f = files[rng() % files.size()];
        uint64_t offset = f.size > 1 ? rng() % (f.size + 10) : 0;
        size_t n = rng() % (1 << 20);
        absl::StatusOr<size_t> got = m->Read(f.name, buffer.data(), n, offset);
        size_t expected = offset >= f.size ? 0 : std::min<uint64_t>(n, f.size - offset);
        if (!got.ok() || *got != expected || !testing::BytesMatch(f, buffer.data(), offset, *got)) {
          bad.fetch_add(1);
        }
      }
    });
  }
  for (auto& r : readers) r.join();
  CHECK(bad.load() == 0);
  m->WaitForPlacement();
  Stats stats = m->GetStats();
  CHECK(stats.Get("promotions_failed") == 0);
  CHECK(stats.Get("promotions_completed") == stats.Get("promotions_started"));
  CHECK(stats.Get("staging_fallbacks") == 0);
  CHECK(stats.Get("staging_bytes") == 0);  // Every staged chunk was written and returned.
  CHECK(stats.Get("staging_peak_bytes") <= stats.Get("staging_budget_bytes"));
  if (staging_budget == 1) CHECK(stats.Get("staging_budget_bytes") == (64 << 10));
  CHECK(stats.Tier(0, "bytes_used") <= (8 << 20));
  CHECK(stats.Tier(0, "files") + stats.Tier(1, "files") == stats.Get("promotions_completed"));
  if (staging_budget == 1) CHECK(stats.Get("chunks_written_by_readers") > 0);
  // No byte was read twice from the PFS while its promotion was in flight.
  for (const TestFile& f : files) {
    if (source.BytesOf(f.name) > 0) CHECK_MESSAGE(source.BytesOf(f.name) == f.size, f.name);
  }
  // Everything the readers touched is now in a tier: a full pass reads no source byte.
  const uint64_t before = source.bytes.load();
  for (const TestFile& f : files) {
    if (source.BytesOf(f.name) > 0) ReadWholeAndCheck(*m, f);
  }
  CHECK(source.bytes.load() == before);
}

TEST_CASE("random reads from 8 threads stay byte-exact while promotions run") {
  RandomReadsStayExact(/*staging_budget=*/0);
}

TEST_CASE("random reads stay byte-exact when readers and placement threads both write copies") {
  RandomReadsStayExact(/*staging_budget=*/1);
}

TEST_CASE("over the staging budget, a reader writes its file's chunks before returning") {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  auto files = testing::MakeDataset(ds, 40, {100000});
  Config config = testing::MakeConfig(
      ds, {testing::FileTier(TierKind::kPosix, dir.Sub("nvme"), 64 << 20, "nvme")});
  config.placement.max_staging_bytes = 1;  // Any loaded chunk is over it.
  // The miss path through staging (the dataset is in the page cache, which
  // `defer` would serve without it).
  config.placement.cached_source = CachedSourcePolicy::kPromote;
  auto m = MustCreate(config);
  for (size_t i = 0; i < files.size(); ++i) {
    ReadWholeAndCheck(*m, files[i]);
    // No waiting: the read itself wrote the copy (its commit, a stat of the
    // source, is the commit threads' job).
    REQUIRE(m->GetStats().Get("chunks_written_by_readers") == i + 1);
  }
  m->WaitForPlacement();
  CHECK(m->GetStats().Tier(0, "files") == files.size());
  Stats stats = m->GetStats();
  CHECK(stats.Get("chunks_written_by_readers") == 40);
  CHECK(stats.Get("chunks_written_by_placement") == 0);
  CHECK(stats.Get("staging_bytes") == 0);
  CHECK(stats.Get("staging_peak_bytes") == 131072);  // One reader held one 100 kB chunk at a time.
  CHECK(stats.Get("staging_budget_bytes") == (1 << 20));  // Raised to one (default) chunk.
  CHECK(stats.Source("bytes_read") == testing::TotalBytes(files));
}

// A source whose Identify() (the stat a commit makes, one metadata round
// trip to a PFS) of one file blocks until released.
class SlowStatSource final : public ForwardingDriver {
 public:
  SlowStatSource(std::unique_ptr<StorageDriver> target, std::string slow_name)
      : ForwardingDriver(std::move(target)), slow_name_(std::move(slow_name)) {}
  absl::StatusOr<SourceIdentity> Identify(const FileRef& file,
                                          Clock::time_point opened_since) override {
    if (file.name == slow_name_) {
      MutexLock lock(&mu_);
      waiting_ = true;
      while (!released_) released_cv_.Wait(&mu_);
    }
    return ForwardingDriver::Identify(file, opened_since);
  }
  bool waiting() {
    MutexLock lock(&mu_);
    return waiting_;
  }
  void Release() {
    MutexLock lock(&mu_);
    released_ = true;
    released_cv_.SignalAll();
  }

 private:
  const std::string slow_name_;
  Mutex mu_;
  CondVar released_cv_;
  bool waiting_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
};

TEST_CASE("a commit waiting on the source holds up no other copy") {
  // One placement thread, and the source's stat of the first file never
  // answers: the other files' copies are still committed (commits run on
  // their own threads, not on the placement thread that copies).
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  auto files = testing::MakeDataset(ds, 12, {300000});
  Config config = testing::MakeConfig(ds, {testing::RamTier(64 << 20)});
  config.placement.threads = 1;
  config.placement.chunk_bytes = 64 << 10;  // Several chunks a file: the placement thread writes.
  SlowStatSource* source = nullptr;
  auto m = testing::MustCreateWrappingSource(config, [&](std::unique_ptr<StorageDriver> d) {
    auto wrapped = std::make_unique<SlowStatSource>(std::move(d), files[0].name);
    source = wrapped.get();
    return std::unique_ptr<StorageDriver>(std::move(wrapped));
  });
  char b[100];
  for (const TestFile& f : files) REQUIRE(m->Read(f.name, b, sizeof(b), 0).ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (m->GetStats().Tier(0, "files") < files.size() - 1 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHECK(source->waiting());
  CHECK(m->GetStats().Tier(0, "files") == files.size() - 1);
  source->Release();
  m->WaitForPlacement();
  CHECK(m->GetStats().Tier(0, "files") == files.size());
  for (const TestFile& f : files) ReadWholeAndCheck(*m, f);
}

TEST_CASE("staging memory stays within its budget while placement falls behind") {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  auto files = testing::MakeDataset(ds, 120, {100000});
  FaultInjectingDriver::Faults tier;
  // A slow tier (20 ms a chunk) and one placement thread: placement cannot
  // keep up with the readers, even when a sanitizer slows the readers down.
  tier.write_delay_us = 20000;
  Config config = testing::MakeConfig(ds, {testing::RamTier(64 << 20)});
  config.placement.max_staging_bytes = 1 << 20;
  config.placement.chunk_bytes = 128 << 10;  // Room for readers to park chunks, and to load more.
  config.placement.threads = 1;
  config.placement.cached_source = CachedSourcePolicy::kPromote;  // Through staging.
  auto m = MustCreate(config, nullptr, 0, &tier);
  std::atomic<int> bad{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&, t] {
      std::vector<char> buffer(100000);
      for (size_t i = t; i < files.size(); i += 4) {
        absl::StatusOr<size_t> got = m->Read(files[i].name, buffer.data(), buffer.size(), 0);
        if (!got.ok() || *got != files[i].size ||
            !testing::BytesMatch(files[i], buffer.data(), 0, *got)) {
          bad.fetch_add(1);
        }
      }
    });
  }
  for (auto& r : readers) r.join();
  m->WaitForPlacement();
  CHECK(bad.load() == 0);
  Stats stats = m->GetStats();
  // Never over: buffers are reserved before chunks are loaded.
  CHECK(stats.Get("staging_peak_bytes") <= (1 << 20));
  CHECK(stats.Get("staging_peak_bytes") >= 2 * 131072);  // Chunks were parked for placement...
  CHECK(stats.Get("chunks_written_by_placement") > 0);   // ...which wrote some,
  CHECK(stats.Get("chunks_written_by_readers") > 0);     // and readers wrote the rest.
  CHECK(stats.Get("chunks_written_by_placement") + stats.Get("chunks_written_by_readers") ==
        files.size());
  CHECK(stats.Tier(0, "files") == files.size());
  CHECK(stats.Get("staging_bytes") == 0);
  CHECK(stats.Source("bytes_read") == testing::TotalBytes(files));  // Each file read once.
}

// The busy-cpus scenario in miniature: many readers at once, a budget of a
// few chunks, placement far behind (a slow tier, one thread). Readers that
// find no room must wait for chunks in flight (never for the placement
// thread's backlog), and no byte may be read twice from the source.
TEST_CASE("staging never exceeds a small budget with many concurrent readers") {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  // 64 KiB chunks: 1 byte, 100000 (2 chunks), 300000 (5), 65536 (1).
  auto files = testing::MakeDataset(ds, 96, {1, 100000, 300000, 65536});
  FaultInjectingDriver::Faults source;
  source.read_delay_us = 2000;  // Loads overlap.
  FaultInjectingDriver::Faults tier;
  tier.write_delay_us = 5000;  // Placement falls behind.
  Config config = testing::MakeConfig(
      ds, {testing::FileTier(TierKind::kPosix, dir.Sub("nvme"), 256 << 20, "nvme")});
  config.placement.chunk_bytes = 64 << 10;
  config.placement.max_staging_bytes = 512 << 10;
  config.placement.threads = 1;
  auto m = MustCreate(config, &source, 0, &tier);

  constexpr int kReaders = 16;
  std::atomic<int> bad{0};
  std::atomic<int> ready{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < kReaders; ++t) {
    readers.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::vector<char> buffer(400000);
      ready.fetch_add(1);
      while (ready.load() < kReaders) std::this_thread::yield();  // All start at once.
      for (int i = 0; i < 40; ++i) {
        // Each thread starts on a 300000-byte file of its own, whole: 16
        // first reads of 5 chunks at once cannot all fit in 448 KiB.
        const TestFile& f = files[i == 0 ? t * 4 + 2 : rng() % files.size()];
        uint64_t offset = 0;
        size_t n = buffer.size();
        if (i > 0 && rng() % 2 == 0 && f.size > 1) {  // Or a partial read across chunks.
          offset = rng() % f.size;
          n = rng() % 200000;
        }
        absl::StatusOr<size_t> got = m->Read(f.name, buffer.data(), n, offset);
        const size_t expected = std::min<uint64_t>(n, f.size - offset);
        if (!got.ok() || *got != expected || !testing::BytesMatch(f, buffer.data(), offset, *got)) {
          bad.fetch_add(1);
        }
      }
    });
  }
  for (auto& r : readers) r.join();
  m->WaitForPlacement();
  CHECK(bad.load() == 0);
  Stats stats = m->GetStats();
  CHECK(stats.Get("staging_peak_bytes") <= (512 << 10));
  CHECK(stats.Get("staging_bytes") == 0);
  CHECK(stats.Get("staging_waits") > 0);  // The wait path was taken.
  CHECK(stats.Get("staging_fallbacks") == 0);
  CHECK(stats.Get("promotions_failed") == 0);
  CHECK(stats.Get("promotions_completed") == stats.Get("promotions_started"));
  CHECK(stats.Tier(0, "files") == stats.Get("promotions_completed"));
  // Every chunk of every promoted file was written once, by someone, and
  // read from the source once.
  uint64_t chunks = 0;
  uint64_t promoted_bytes = 0;
  for (const TestFile& f : files) {
    if (source.BytesOf(f.name) == 0) continue;
    CHECK_MESSAGE(source.BytesOf(f.name) == f.size, f.name);
    chunks += (f.size + (64 << 10) - 1) / (64 << 10);
    promoted_bytes += OnDisk(f.size);
  }
  CHECK(stats.Get("chunks_written_by_placement") + stats.Get("chunks_written_by_readers") ==
        chunks);
  CHECK(stats.Tier(0, "bytes_used") == promoted_bytes);
}

TEST_CASE("staging pool: reservations stay within the budget and its shares") {
  constexpr size_t kChunk = 64 << 10;
  // 256 KiB: one chunk kept for placement, 192 KiB for readers, of which
  // parked chunks may take 96 KiB.
  ChunkPool pool(kChunk, 256 << 10, kChunk, 96 << 10);
  std::vector<char*> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(pool.TryAcquire(kChunk));
    REQUIRE(held.back() != nullptr);
  }
  CHECK(pool.TryAcquire(kChunk) == nullptr);  // The readers' share is full...
  CHECK(pool.TryAcquire(1) == nullptr);       // ...even for a page.
  char* placement = pool.Acquire(kChunk, ChunkPool::Share::kPlacement);  // The reserved chunk.
  CHECK(pool.bytes_in_use() == (256u << 10));
  CHECK(pool.peak_bytes_in_use() == (256u << 10));
  CHECK(pool.waits() == 0);
  CHECK(pool.TryPark(kChunk));
  CHECK_FALSE(pool.TryPark(kChunk));  // 128 KiB would pass the parked limit.
  CHECK(pool.parked_bytes() == kChunk);
  pool.Unpark(kChunk);
  CHECK(pool.parked_bytes() == 0);

  // A reader waits for room until a buffer comes back.
  std::atomic<char*> waited{nullptr};
  std::thread reader([&] { waited = pool.Acquire(kChunk, ChunkPool::Share::kReaders); });
  REQUIRE(testing::Eventually([&] { return pool.refusals() >= 1; }));  // It looked: no room.
  CHECK(waited.load() == nullptr);
  const uint64_t looked = pool.refusals();
  pool.Release(placement, kChunk);  // Room in the reserved part only: still waiting.
  REQUIRE(testing::Eventually([&] { return pool.refusals() > looked; }));  // It looked again.
  CHECK(waited.load() == nullptr);
  pool.Release(held.back(), kChunk);
  held.pop_back();
  reader.join();
  REQUIRE(waited.load() != nullptr);
  held.push_back(waited.load());
  CHECK(pool.waits() == 1);
  for (char* buffer : held) pool.Release(buffer, kChunk);
  CHECK(pool.bytes_in_use() == 0);
  CHECK(pool.peak_bytes_in_use() == (256u << 10));

  // Small requests take pages, not chunks.
  char* small = pool.TryAcquire(1000);
  CHECK(pool.bytes_in_use() == 4096);
  pool.Release(small, 1000);

  // A budget below a chunk is raised to one; the reserved part and the
  // parked limit shrink so that readers still get a chunk.
  ChunkPool tiny(kChunk, 1, 10 * kChunk, 10 * kChunk);
  CHECK(tiny.budget_bytes() == kChunk);
  char* only = tiny.TryAcquire(kChunk);
  REQUIRE(only != nullptr);
  CHECK(tiny.TryAcquire(4096) == nullptr);
  CHECK_FALSE(tiny.TryPark(kChunk));
  tiny.Release(only, kChunk);
}

TEST_CASE("staging pool: concurrent reservations never pass the budget") {
  constexpr size_t kChunk = 16 << 10;
  constexpr uint64_t kBudget = 100 << 10;  // Not a multiple of the chunk.
  ChunkPool pool(kChunk, kBudget, 2 * kChunk, 3 * kChunk);
  std::atomic<bool> over{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 2000; ++i) {
        const size_t bytes = 1 + rng() % kChunk;
        // Like a placement thread (waits, one buffer at a time) or a reader.
        char* buffer =
            t < 2 ? pool.Acquire(bytes, ChunkPool::Share::kPlacement) : pool.TryAcquire(bytes);
        if (t >= 2 && buffer == nullptr && rng() % 4 == 0) {
          buffer = pool.Acquire(bytes, ChunkPool::Share::kReaders);
        }
        if (pool.bytes_in_use() > kBudget) over = true;
        if (buffer == nullptr) continue;
        buffer[0] = 1;
        buffer[bytes - 1] = 2;
        const bool parked = pool.TryPark(bytes);
        if (parked) pool.Unpark(bytes);
        pool.Release(buffer, bytes);
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK_FALSE(over.load());
  CHECK(pool.peak_bytes_in_use() <= kBudget);
  CHECK(pool.bytes_in_use() == 0);
  CHECK(pool.parked_bytes() == 0);
}

TEST_CASE("a partial read of a large file promotes the whole file, reading the PFS once") {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  auto files = testing::MakeDataset(ds, 1, {24 << 20});
  FaultInjectingDriver::Faults source;
  auto m =
      MustCreate(testing::MakeConfig(
                     ds, {testing::FileTier(TierKind::kPosix, dir.Sub("nvme"), 1 << 30, "nvme")}),
                 &source);
  char buffer[100];
  REQUIRE(m->Read(files[0].name, buffer, 100, 5 << 20).value() == 100);
  CHECK(testing::BytesMatch(files[0], buffer, 5 << 20, 100));
  m->WaitForPlacement();
  Stats stats = m->GetStats();
  CHECK(stats.Get("promotions_completed") == 1);
  CHECK(stats.Tier(0, "files") == 1);
  CHECK(stats.Tier(0, "bytes_used") == OnDisk(24u << 20));
  CHECK(source.bytes.load() == (24u << 20));  // The read's chunk was reused, not re-read.
  ReadWholeAndCheck(*m, files[0], 256 << 10);
  CHECK(source.bytes.load() == (24u << 20));
  CHECK(m->GetStats().Tier(0, "bytes_read") == (24u << 20));
}

TEST_CASE("concurrent first reads of one file start exactly one promotion") {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  auto files = testing::MakeDataset(ds, 1, {8 << 20});
  FaultInjectingDriver::Faults source;
  source.read_delay_us = 2000;
  auto m = MustCreate(testing::MakeConfig(ds, {testing::RamTier(1 << 30)}), &source);
  std::vector<std::thread> readers;
  std::atomic<int> bad{0};
  std::atomic<int> waiting{8};
  for (int t = 0; t < 8; ++t) {
    readers.emplace_back([&, t] {
      std::vector<char> buffer(3 << 20);
      // All start together, so they meet the one promotion.
      waiting.fetch_sub(1);
      while (waiting.load() > 0) std::this_thread::yield();
      uint64_t offset = static_cast<uint64_t>(t) * (1 << 20);
      size_t n = t % 2 ? (3 << 20) : 4096;
      absl::StatusOr<size_t> got = m->Read(files[0].name, buffer.data(), n, offset);
      size_t expected = std::min<uint64_t>(n, files[0].size - offset);
      if (!got.ok() || *got != expected ||
          !testing::BytesMatch(files[0], buffer.data(), offset, expected)) {
        bad.fetch_add(1);
      }
    });
  }
  for (auto& r : readers) r.join();
  m->WaitForPlacement();
  CHECK(bad.load() == 0);
  Stats stats = m->GetStats();
  CHECK(stats.Get("promotions_started") == 1);
  CHECK(stats.Get("promotions_completed") == 1);
  // Every reader was served by the one promotion (or, on a slow machine, by
  // the copy it had already published)...
  CHECK(stats.Get("staging_reads") + stats.Tier(0, "reads") == 8);
  CHECK(stats.Get("staging_reads") >= 1);
  CHECK(stats.Get("staging_fallbacks") == 0);  // ...none had to go around it.
  CHECK(source.bytes.load() == (8u << 20));  // One PFS read of each byte.
  CHECK(stats.Source("bytes_read") == (8u << 20));
}

// placement.cached_source: defer. The test datasets were just written, so
// the page cache holds them: every miss finds its bytes in memory.
TEST_CASE("a miss on bytes the source holds in memory is served from there, copied later") {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  auto files = testing::MakeDataset(ds, 30, {100000, 5000, 300000});
  const uint64_t total = testing::TotalBytes(files);
  auto m = MustCreate(testing::MakeConfig(
      ds, {testing::FileTier(TierKind::kPosix, dir.Sub("nvme"), 1 << 30, "nvme")}));
  for (const TestFile& f : files) ReadWholeAndCheck(*m, f);
  m->WaitForPlacement();
  Stats stats = m->GetStats();
  CHECK(stats.Get("deferred_copies_queued") == files.size());
  CHECK(stats.Get("deferred_copies_pending") == 0);
  CHECK(stats.Get("staging_reads") == 0);  // No reader went through staging.
  CHECK(stats.Get("promotions_completed") == files.size());
  CHECK(stats.Tier(0, "files") == files.size());
  // The readers read the source once; the copies took the same bytes from
  // its memory, apart from its reads.
  CHECK(stats.Source("bytes_read") == total);
  CHECK(stats.Get("promotion_bytes_from_memory") == total);
  for (const TestFile& f : files) ReadWholeAndCheck(*m, f, 65536);
  CHECK(m->GetStats().Source("bytes_read") == total);
  CHECK(m->GetStats().Tier(0, "bytes_read") == total);
}

// With an order announced, the prefetch streams copy every file it names,
// page-cached or not: a reader that took the bytes from the source's memory
// and deferred its copy would race them and read the source twice. The
// reader goes the order's other way, so it misses on files the streams
// have not reached.
TEST_CASE("while prefetch copies an announced order, misses are not deferred") {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  auto files = testing::MakeDataset(ds, 30, {100000, 5000, 300000});
  const uint64_t total = testing::TotalBytes(files);
  auto m = MustCreate(testing::MakeConfig(
      ds, {testing::FileTier(TierKind::kPosix, dir.Sub("nvme"), 1 << 30, "nvme")}));
  std::vector<std::string> order;
  for (const TestFile& f : files) order.push_back(f.name);
  REQUIRE(m->AnnounceOrder(order).ok());
  for (auto f = files.rbegin(); f != files.rend(); ++f) ReadWholeAndCheck(*m, *f);
  m->WaitForPlacement();
  Stats stats = m->GetStats();
  CHECK(stats.Get("deferred_copies_queued") == 0);
  CHECK(stats.Get("promotions_completed") == files.size());
  CHECK(stats.Source("bytes_read") == total);  // Each byte once.
  for (const TestFile& f : files) ReadWholeAndCheck(*m, f, 65536);
  CHECK(m->GetStats().Source("bytes_read") == total);
}

// Fails RWF_NOWAIT reads (the bytes "left memory") for the deferred copies'
// thread, or for everyone; counts the plain reads that thread makes.
class MemoryLeavesEnv final : public os::Env {
 public:
  ssize_t PreadNoWait(int fd, void* buffer, size_t n, off_t offset) override {
    if (everyone_.load() || OnCopiesThread()) {
      errno = EAGAIN;
      return -1;
    }
    return os::Env::PreadNoWait(fd, buffer, n, offset);
  }
  int Mincore(void* address, size_t length, unsigned char* vector) override {
    if (everyone_.load() || OnCopiesThread()) {
      std::memset(vector, 0, (length + 4095) / 4096);
      return 0;
    }
    return os::Env::Mincore(address, length, vector);
  }
  int Cachestat(int fd, uint64_t offset, uint64_t length, uint64_t* cached_pages) override {
    if (everyone_.load() || OnCopiesThread()) {
      *cached_pages = 0;
      return 0;
    }
    return os::Env::Cachestat(fd, offset, length, cached_pages);
  }
  ssize_t Pread(int fd, void* buffer, size_t n, off_t offset) override {
    if (OnCopiesThread()) copies_thread_reads_.fetch_add(1);
    return os::Env::Pread(fd, buffer, n, offset);
  }
  void ForEveryone() { everyone_.store(true); }
  int copies_thread_reads() const { return copies_thread_reads_.load(); }

 private:
  static bool OnCopiesThread() {
    char name[16] = {};
    ::pthread_getname_np(::pthread_self(), name, sizeof(name));
    return std::string(name) == "monarch-later";
  }
  std::atomic<bool> everyone_{false};
  std::atomic<int> copies_thread_reads_{0};
};

// placement.route_by_speed (core/read_speeds.h).
TEST_CASE("speed model: the source's page cache first only when measured faster, and kept measured") {
  constexpr size_t kBytes = 64 << 10;
  SUBCASE("nothing before the copy's own speed is known; then the source is asked, and after "
          "misses asked again after 2, 4, 8 ... up to 64 hits") {
    ReadSpeeds speeds(3);
    for (int i = 0; i < 200; ++i) CHECK_FALSE(speeds.TrySourceFirst(0, kBytes));
    speeds.CopyRead(0, kBytes, 5'000);
    CHECK(speeds.TrySourceFirst(0, kBytes));
    speeds.SourceAttempt(false, kBytes, 1'000);  // Not in memory.
    std::vector<int> asked;
    for (int i = 0; i < 640; ++i) {
      if (!speeds.TrySourceFirst(0, kBytes)) continue;
      asked.push_back(i);
      speeds.SourceAttempt(false, kBytes, 1'000);  // Never in memory.
    }
    REQUIRE(asked.size() >= 4);
    CHECK(asked[0] == 1);  // 2 hits after the first miss,
    CHECK(asked[1] == 5);  // then 4,
    CHECK(asked[2] == 13);  // then 8.
    // Then no more often than exploration's one in 64 and a few doublings.
    CHECK(asked.size() <= 640 / ReadSpeeds::kExploreEvery + 6);
    for (size_t k = 1; k < asked.size(); ++k) CHECK(asked[k] - asked[k - 1] <= 64);
  }
  // Attempts that serve, each of `ns`, until the model trusts the source's mean.
  auto warm_up = [](ReadSpeeds& speeds, uint64_t ns) {
    for (uint64_t k = 0; k < ReadSpeeds::kWarmUp; ++k) speeds.SourceAttempt(true, kBytes, ns);
  };
  SUBCASE("a miss, then attempts that serve: after a few the measured speeds decide") {
    ReadSpeeds speeds(3);
    speeds.CopyRead(0, kBytes, 2'000'000);  // 2 ms: the device.
    CHECK(speeds.TrySourceFirst(0, kBytes));
    speeds.SourceAttempt(false, kBytes, 1'000);  // This file's pages were out of memory.
    CHECK_FALSE(speeds.TrySourceFirst(0, kBytes));
    for (uint64_t k = 0; k < ReadSpeeds::kWarmUp; ++k) {  // Others' were in: every hit asks.
      CHECK(speeds.TrySourceFirst(0, kBytes));
      speeds.SourceAttempt(true, kBytes, 5'000);
    }
    int first = 0;
    for (int i = 0; i < 128; ++i) first += speeds.TrySourceFirst(0, kBytes);
    CHECK(first == 128);
  }
  SUBCASE("a slow copy, a fast source that serves: the source") {
    ReadSpeeds speeds(3);
    speeds.CopyRead(0, kBytes, 2'000'000);  // 2 ms: the device.
    warm_up(speeds, 5'000);                 // 5 us: memory.
    int first = 0;
    for (int i = 0; i < 128; ++i) first += speeds.TrySourceFirst(0, kBytes);
    CHECK(first == 128);
  }
  SUBCASE("one attempt that was slow (preempted) does not decide alone") {
    ReadSpeeds speeds(3);
    speeds.CopyRead(0, kBytes, 2'000'000);
    CHECK(speeds.TrySourceFirst(0, kBytes));
    speeds.SourceAttempt(true, kBytes, 4'000'000);  // Served, but slower than the copy.
    for (uint64_t k = 1; k < ReadSpeeds::kWarmUp; ++k) {
      CHECK(speeds.TrySourceFirst(0, kBytes));
      speeds.SourceAttempt(true, kBytes, 5'000);
    }
    int first = 0;
    for (int i = 0; i < 128; ++i) first += speeds.TrySourceFirst(0, kBytes);
    CHECK(first == 128);  // (4 ms + 3 * 5 us) / 4 is below 0.9 * 2 ms.
  }
  SUBCASE("a fast copy: the copy, but one hit in 64 asks the source") {
    ReadSpeeds speeds(3);
    speeds.CopyRead(0, kBytes, 5'000);
    warm_up(speeds, 5'000);  // As fast: not worth it.
    int first = 0;
    for (int i = 0; i < 640; ++i) first += speeds.TrySourceFirst(0, kBytes);
    CHECK(first == 640 / ReadSpeeds::kExploreEvery);
  }
  SUBCASE("a source that seldom has the bytes: the copy") {
    ReadSpeeds speeds(3);
    speeds.CopyRead(0, kBytes, 50'000);
    warm_up(speeds, 5'000);
    for (int i = 0; i < 40; ++i) speeds.SourceAttempt(false, kBytes, 40'000);
    int first = 0;
    for (int i = 0; i < 640; ++i) first += speeds.TrySourceFirst(0, kBytes);
    CHECK(first == 640 / ReadSpeeds::kExploreEvery);
  }
  SUBCASE("disabled (a source that cannot tell): never") {
    ReadSpeeds speeds(3);
    speeds.CopyRead(0, kBytes, 2'000'000);
    warm_up(speeds, 5'000);
    speeds.Disable();
    for (int i = 0; i < 200; ++i) CHECK_FALSE(speeds.TrySourceFirst(0, kBytes));
  }
}

TEST_CASE("speed model: slow copies are read from the source's page cache, bytes exact, and the copies again once it is gone") {
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  const std::string nvme = dir.Sub("nvme");
  auto files = testing::MakeDataset(ds, 16, {65536, 200000});
  testing::CopySpeedEnv env(nvme);
  os::ScopedEnvForTesting installed(&env);
  Config config =
      testing::MakeConfig(ds, {testing::FileTier(TierKind::kPosix, nvme, 1 << 30, "nvme")});
  config.placement.cached_source = CachedSourcePolicy::kPromote;  // Copies at once.
  config.placement.route_by_speed = true;
  auto m = MustCreate(config);
  for (const TestFile& f : files) ReadWholeAndCheck(*m, f);
  m->WaitForPlacement();
  REQUIRE(m->GetStats().Tier(0, "files") == files.size());

  // The copies take 2 ms a read; the source's bytes are in memory.
  env.SlowCopies(true);
  const Stats before = m->GetStats();
  constexpr int kRounds = 8;
  for (int round = 0; round < kRounds; ++round) {
    for (const TestFile& f : files) ReadWholeAndCheck(*m, f, 1 << 20);
  }
  const Stats slow = m->GetStats();
  const uint64_t hits = kRounds * files.size();
  const uint64_t from_copies = slow.Tier(0, "reads") - before.Tier(0, "reads");
  const uint64_t from_source = slow.Get("speed_source_cache_reads") - before.Get("speed_source_cache_reads");
  CHECK(from_copies + from_source == hits);
  CHECK(slow.Get("speed_source_first_chosen") > 0);
  // The first hit measures the copies; from then on the source serves.
  CHECK(from_copies <= 4);
  CHECK(slow.Tier(0, "speed_ns_per_mib") > slow.Get("speed_source_cache_ns_per_mib"));
  CHECK(slow.Get("promotions_started") == before.Get("promotions_started"));  // No new copy.

  // The source's bytes leave memory, and the copies are fast again: a few
  // attempts find that out, then the copies serve (one hit in 64 asks).
  env.SlowCopies(false);
  env.EvictSource(true);
  for (int round = 0; round < kRounds; ++round) {
    for (const TestFile& f : files) ReadWholeAndCheck(*m, f, 1 << 20);
  }
  const Stats evicted = m->GetStats();
  const uint64_t misses = evicted.Get("speed_source_cache_misses") - slow.Get("speed_source_cache_misses");
  CHECK(evicted.Tier(0, "reads") - slow.Tier(0, "reads") == hits);
  CHECK(evicted.Get("speed_source_cache_reads") == slow.Get("speed_source_cache_reads"));
  CHECK(misses >= 1);
  CHECK(misses <= hits / 4);
}

TEST_CASE("a deferred copy whose bytes left memory reads nothing and gives up, and the next miss promotes") {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  auto files = testing::MakeDataset(ds, 12, {100000, 300000});
  const uint64_t total = testing::TotalBytes(files);
  MemoryLeavesEnv env;
  os::ScopedEnvForTesting installed(&env);
  {
    auto m = MustCreate(testing::MakeConfig(
        ds, {testing::FileTier(TierKind::kPosix, dir.Sub("nvme"), 1 << 30, "nvme")}));
    for (const TestFile& f : files) ReadWholeAndCheck(*m, f);
    m->WaitForPlacement();
    Stats stats = m->GetStats();
    CHECK(stats.Get("deferred_copies_queued") == files.size());
    CHECK(stats.Get("promotions_not_in_memory") == files.size());
    CHECK(stats.Get("promotions_failed") == 0);
    CHECK(stats.Tier(0, "files") == 0);
    CHECK(env.copies_thread_reads() == 0);  // Not a byte from the device.
    CHECK(stats.Source("bytes_read") == total);
    // Now nothing is in memory: the misses promote the files as usual.
    env.ForEveryone();
    for (const TestFile& f : files) ReadWholeAndCheck(*m, f);
    m->WaitForPlacement();
    stats = m->GetStats();
    CHECK(stats.Get("promotions_completed") == files.size());
    CHECK(stats.Tier(0, "files") == files.size());
    CHECK(stats.Source("bytes_read") == 2 * total);
    for (const TestFile& f : files) ReadWholeAndCheck(*m, f);
    CHECK(m->GetStats().Source("bytes_read") == 2 * total);
  }
}

TEST_CASE("cached_source: promote promotes at the miss, and a shutdown drains deferred copies") {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  auto files = testing::MakeDataset(ds, 10, {100000});
  const std::string nvme = dir.Sub("nvme");
  Config config =
      testing::MakeConfig(ds, {testing::FileTier(TierKind::kPosix, nvme, 1 << 30, "nvme")});
  config.placement.cached_source = CachedSourcePolicy::kPromote;
  {
    auto m = MustCreate(config);
    for (const TestFile& f : files) ReadWholeAndCheck(*m, f);
    // Started by the misses themselves, before any wait.
    CHECK(m->GetStats().Get("promotions_started") == files.size());
    CHECK(m->GetStats().Get("deferred_copies_queued") == 0);
  }
  // Deferred: the instance shuts down right after the reads. Its drain
  // makes the copies (the readers are gone), so the next run finds them all.
  const std::string nvme2 = dir.Sub("nvme2");
  Config deferred =
      testing::MakeConfig(ds, {testing::FileTier(TierKind::kPosix, nvme2, 1 << 30, "nvme")});
  {
    auto m = MustCreate(deferred);
    for (const TestFile& f : files) ReadWholeAndCheck(*m, f);
    m->Shutdown(Monarch::ShutdownMode::kDrain);
    CHECK(m->GetStats().Get("deferred_copies_queued") == files.size());
  }
  auto m = MustCreate(deferred);
  CHECK(m->GetStats().Get("warm_files_reused") == files.size());
}

TEST_CASE("when the tiers hold half the dataset, the rest keeps coming from the source") {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  auto files = testing::MakeDataset(ds, 40, {100000});
  const uint64_t total = testing::TotalBytes(files);
  auto m = MustCreate(testing::MakeConfig(ds, {testing::RamTier(total / 2)}));
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (const TestFile& f : files) ReadWholeAndCheck(*m, f);
    m->WaitForPlacement();
  }
  Stats stats = m->GetStats();
  CHECK(stats.Tier(0, "files") == 20);
  CHECK(stats.Tier(0, "bytes_used") == total / 2);
  CHECK(stats.Get("promotions_skipped") == 20);  // Once per file that did not fit; not retried.
  CHECK(stats.Get("promotions_started") == 20);
  CHECK(stats.Source("bytes_read") ==
        total + total / 2);  // Epoch 1: all; epoch 2: the half that did not fit.
}

TEST_CASE("a tier that fails writes abandons the promotion and keeps serving from the source") {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  auto files = testing::MakeDataset(ds, 10, {50000});
  FaultInjectingDriver::Faults tier;
  tier.fail_stores = true;  // EIO on every write.
  auto m =
      MustCreate(testing::MakeConfig(
                     ds, {testing::FileTier(TierKind::kPosix, dir.Sub("nvme"), 1 << 30, "nvme")}),
                 nullptr, 0, &tier);
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (const TestFile& f : files) ReadWholeAndCheck(*m, f);
    m->WaitForPlacement();
  }
  Stats stats = m->GetStats();
  CHECK(stats.Get("promotions_failed") == 10);
  CHECK(stats.Get("promotions_started") == 10);  // Failed files are not retried on every read.
  CHECK(stats.Tier(0, "write_errors") == 10);
  CHECK(stats.Tier(0, "files") == 0);
  CHECK(stats.Tier(0, "bytes_used") == 0);
  CHECK(stats.Source("bytes_read") == 2 * testing::TotalBytes(files));
}

TEST_CASE("ENOSPC from a tier marks it full: later files stay on the source") {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  auto files = testing::MakeDataset(ds, 10, {50000});
  FaultInjectingDriver::Faults tier;
  tier.fail_stores = true;
  tier.store_error = absl::StatusCode::kResourceExhausted;
  Config config = testing::MakeConfig(
      ds, {testing::FileTier(TierKind::kPosix, dir.Sub("nvme"), 1 << 30, "nvme")});
  config.placement.threads = 1;
  auto m = MustCreate(config, nullptr, 0, &tier);
  ReadWholeAndCheck(*m, files[0]);
  m->WaitForPlacement();
  for (const TestFile& f : files) ReadWholeAndCheck(*m, f);
  m->WaitForPlacement();
  Stats stats = m->GetStats();
  CHECK(tier.stores.load() == 1);
  CHECK(stats.Get("promotions_failed") == 1);
  CHECK(stats.Get("promotions_skipped") == 9);
}

TEST_CASE("a real full device (small tmpfs) fails the copy cleanly") {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  auto files = testing::MakeDataset(ds, 8, {600000});
  std::string mount = dir.Sub("tiny");
  if (std::system(("mount -t tmpfs -o size=2m tmpfs '" + mount + "' 2>/dev/null").c_str()) != 0) {
    MONARCH_SKIP("cannot mount tmpfs here (not root?); the injected ENOSPC test above covers the logic");
  }
  {
    // Capacity equals the device, so validation passes, but 3 x 600 kB fill it.
    auto m = MustCreate(
        testing::MakeConfig(ds, {testing::FileTier(TierKind::kPosix, mount, 2 << 20, "tiny")}));
    for (int epoch = 0; epoch < 2; ++epoch) {
      for (const TestFile& f : files) ReadWholeAndCheck(*m, f);
      m->WaitForPlacement();
    }
    Stats stats = m->GetStats();
    CHECK(stats.Tier(0, "files") == 3);
    CHECK(stats.Tier(0, "bytes_used") == 3 * OnDisk(600000));
    CHECK(stats.Get("promotions_completed") + stats.Get("promotions_failed") == stats.Get("promotions_started"));
    CHECK(stats.Get("promotions_completed") == 3);
  }
  // Nothing partial is left on the device.
  std::string leftovers;
  FILE* p = ::popen(("find '" + mount + "/.monarch/tmp' -type f").c_str(), "r");
  char line[512];
  while (std::fgets(line, sizeof(line), p)) leftovers += line;
  ::pclose(p);
  CHECK(leftovers.empty());
  std::system(("umount '" + mount + "'").c_str());
}

TEST_CASE("injected source read errors become error statuses, never hangs or wrong bytes") {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  auto files = testing::MakeDataset(ds, 4, {3 << 20});
  FaultInjectingDriver::Faults source;
  source.fail_reads = true;
  auto m = MustCreate(testing::MakeConfig(ds, {testing::RamTier(1 << 30)}), &source);
  std::vector<char> buffer(1 << 20);
  std::vector<std::thread> readers;
  std::atomic<int> errors{0};
  for (int t = 0; t < 8; ++t) {
    readers.emplace_back([&, t] {
      std::vector<char> b(1 << 20);
      absl::StatusOr<size_t> r = m->Read(files[t % 4].name, b.data(), b.size(), 0);
      if (!r.ok() && r.status().code() == absl::StatusCode::kDataLoss) errors.fetch_add(1);
    });
  }
  for (auto& r : readers) r.join();
  CHECK(errors.load() == 8);
  m->WaitForPlacement();
  CHECK(m->GetStats().Get("promotions_failed") == m->GetStats().Get("promotions_started"));
  // The reader that started each file's promotion found its chunk failed and
  // was sent to the source; nobody was served from a failed promotion.
  CHECK(m->GetStats().Get("staging_reads") == 0);
  CHECK(m->GetStats().Get("staging_fallbacks") >= 4);
  source.fail_reads = false;  // The PFS recovers: reads work again, from the source.
  for (const TestFile& f : files) ReadWholeAndCheck(*m, f);
}

TEST_CASE("a tier copy that disappears is served from the source instead") {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  std::string nvme = dir.Sub("nvme");
  auto files = testing::MakeDataset(ds, 6, {10000});
  Config config =
      testing::MakeConfig(ds, {testing::FileTier(TierKind::kPosix, nvme, 1 << 30, "nvme")});
  // The copy removed is not open: one still open would be read through its
  // descriptor, the intact bytes of the removed file.
  config.placement.max_open_files = 4;
  auto m = MustCreate(config);
  for (const TestFile& f : files) ReadWholeAndCheck(*m, f);
  m->WaitForPlacement();
  REQUIRE(m->GetStats().Tier(0, "files") == 6);
  REQUIRE(m->GetStats().Tier(0, "copies_readied_ahead") == files.size());
  for (int i = 2; i < 6; ++i) ReadWholeAndCheck(*m, files[i]);  // Open: 2 to 5.
  std::remove((nvme + "/" + files[1].name).c_str());
  ReadWholeAndCheck(*m, files[1]);
  ReadWholeAndCheck(*m, files[1]);
  CHECK(m->GetStats().Tier(0, "read_errors") == 1);  // Dropped after the first failure.
}

// Reads `f` whole on another thread; fails the test (and exits, since a
// hung read cannot be cancelled) if it takes more than 20 s.
void ReadWholeWithWatchdog(Monarch& m, const TestFile& f) {
  std::atomic<bool> done{false};
  std::thread reader([&] {
    ReadWholeAndCheck(m, f);
    done = true;
  });
  for (int i = 0; i < 2000 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (!done) {
    std::fprintf(stderr, "read of %s hung\n", f.name.c_str());
    std::_Exit(1);
  }
  reader.join();
}

TEST_CASE("damaged posix copies are never served: symlink, FIFO, directory, truncation") {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  std::string nvme = dir.Sub("nvme");
  auto files = testing::MakeDataset(ds, 8, {300000});
  // Few descriptors: reads after the damage open the copies anew. (A copy
  // still open from before, as the tier opens each new copy ahead of its
  // first read, would be read through that descriptor: the intact bytes of
  // the file that was replaced.)
  Config config =
      testing::MakeConfig(ds, {testing::FileTier(TierKind::kPosix, nvme, 1 << 30, "nvme")});
  config.placement.max_open_files = 4;
  auto m = MustCreate(config);
  for (const TestFile& f : files) ReadWholeAndCheck(*m, f);
  m->WaitForPlacement();
  REQUIRE(m->GetStats().Tier(0, "files") == 8);
  REQUIRE(m->GetStats().Tier(0, "bytes_used") == 8 * OnDisk(300000));
  REQUIRE(m->GetStats().Tier(0, "copies_readied_ahead") == files.size());
  auto copy = [&](int i) { return nvme + "/" + files[i].name; };
  // A symlink to zeros of the right length, a FIFO (an open would block),
  // a directory, a truncated copy, and four copies left alone.
  REQUIRE(std::remove(copy(0).c_str()) == 0);
  REQUIRE(::symlink("/dev/zero", copy(0).c_str()) == 0);
  REQUIRE(std::remove(copy(1).c_str()) == 0);
  REQUIRE(::mkfifo(copy(1).c_str(), 0644) == 0);
  REQUIRE(std::remove(copy(2).c_str()) == 0);
  REQUIRE(::mkdir(copy(2).c_str(), 0755) == 0);
  REQUIRE(::truncate(copy(3).c_str(), 1000) == 0);
  // Reading the good copies first leaves none of the 4 others open: each
  // must be caught at its open.
  for (int i = 4; i < 8; ++i) ReadWholeWithWatchdog(*m, files[i]);
  for (int i = 0; i < 4; ++i) {
    ReadWholeWithWatchdog(*m, files[i]);
    ReadWholeWithWatchdog(*m, files[i]);
  }
  const Stats stats = m->GetStats();
  CHECK(stats.Tier(0, "read_errors") == 4);  // Each dropped at its first bad read.
  // Their room is given back: the tier counts only the good copies.
  CHECK(stats.Tier(0, "files") == 4);
  CHECK(stats.Tier(0, "bytes_used") == 4 * OnDisk(300000));
  // What was left of them is gone (the directory cannot be unlinked).
  struct stat st;
  CHECK(::lstat(copy(0).c_str(), &st) != 0);
  CHECK(::lstat(copy(1).c_str(), &st) != 0);
  CHECK(::lstat(copy(3).c_str(), &st) != 0);
}

TEST_CASE("a pmem copy truncated while mapped is served from the source, no SIGBUS") {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  std::string pmem = dir.Sub("pmem");
  auto files = testing::MakeDataset(ds, 2, {1 << 20});
  auto m = MustCreate(
      testing::MakeConfig(ds, {testing::FileTier(TierKind::kPmem, pmem, 1 << 30, "pmem")}));
  for (const TestFile& f : files) ReadWholeAndCheck(*m, f);
  m->WaitForPlacement();
  REQUIRE(m->GetStats().Tier(0, "files") == 2);
  ReadWholeAndCheck(*m, files[0]);  // Now mapped.
  REQUIRE(m->GetStats().Tier(0, "reads") > 0);
  REQUIRE(::truncate((pmem + "/" + files[0].name).c_str(), 4096) == 0);
  ReadWholeAndCheck(*m, files[0]);  // The pages past 4096 are gone: SIGBUS, caught.
  ReadWholeAndCheck(*m, files[0]);
  REQUIRE(::truncate((pmem + "/" + files[1].name).c_str(), 0) == 0);
  ReadWholeAndCheck(*m, files[1]);
  const Stats stats = m->GetStats();
  CHECK(stats.Tier(0, "read_errors") == 2);
  CHECK(stats.Tier(0, "files") == 0);
  CHECK(stats.Tier(0, "bytes_used") == 0);
}

// Bytes of the regular files under `dir`, however they are named.
uint64_t BytesOnDisk(const std::string& dir) {
  uint64_t total = 0;
  FILE* p = ::popen(("find '" + dir + "' -type f -printf '%s\\n'").c_str(), "r");
  unsigned long long size = 0;
  while (std::fscanf(p, "%llu", &size) == 1) total += size;
  ::pclose(p);
  return total;
}

TEST_CASE("dataset names that look like temporaries are ordinary files, capacity holds") {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  std::string nvme = dir.Sub("nvme");
  // Names of the old temporary layout, for a live and a dead pid, and of the
  // new one; and a ".monarch" directory at the dataset root, which is reserved.
  const std::string live = std::to_string(::getpid());
  std::vector<TestFile> files;
  for (const std::string& name : std::vector<std::string>{".x.monarch-tmp." + live + ".1", ".y.monarch-tmp.2147483646.3",
                                  std::string("sub/2147483646.0"), live + ".7"}) {
    files.push_back(TestFile{name, static_cast<uint32_t>(7000 + files.size()), 100000});
    testing::WriteFile(ds + "/" + name, files.back().seed, files.back().size);
  }
  testing::WriteFile(ds + "/.monarch/tmp/9.9", 99, 5000);
  const uint64_t capacity = 250000;  // Two of the four files.
  Config config =
      testing::MakeConfig(ds, {testing::FileTier(TierKind::kPosix, nvme, capacity, "nvme")});
  for (int run = 0; run < 3; ++run) {
    auto m = MustCreate(config);
    CHECK(m->ListFiles().size() == 4);  // The reserved directory is not part of the dataset.
    CHECK_FALSE(m->FileExists(".monarch/tmp/9.9"));
    for (const TestFile& f : files) ReadWholeAndCheck(*m, f);
    m->WaitForPlacement();
    const Stats stats = m->GetStats();
    CHECK(stats.Tier(0, "files") == 2);
    CHECK(stats.Tier(0, "bytes_used") == 2 * OnDisk(100000));
    CHECK(BytesOnDisk(nvme) == 2 * OnDisk(100000));  // On disk what the stats say, within capacity.
    if (run > 0) CHECK(stats.Get("warm_files_reused") == 2);
  }
}

TEST_CASE("warm restart reuses valid copies and discards stale ones") {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  std::string nvme = dir.Sub("nvme");
  std::string pmem = dir.Sub("pmem");
  auto files = testing::MakeDataset(ds, 20, {30000, 70000});
  const uint64_t total = testing::TotalBytes(files);
  Config config =
      testing::MakeConfig(ds, {testing::FileTier(TierKind::kPmem, pmem, total / 2, "pmem"),
                               testing::FileTier(TierKind::kPosix, nvme, 1 << 30, "nvme")});
  {
    auto m = MustCreate(config);
    for (const TestFile& f : files) ReadWholeAndCheck(*m, f);
    m->Shutdown(Monarch::ShutdownMode::kDrain);
    Stats stats = m->GetStats();
    REQUIRE(stats.Get("promotions_completed") == 20);
    REQUIRE(stats.Tier(0, "files") + stats.Tier(1, "files") == 20);
  }
  {
    FaultInjectingDriver::Faults source;
    auto m = MustCreate(config, &source);
    Stats stats = m->GetStats();
    CHECK(stats.Get("warm_files_reused") == 20);
    CHECK(stats.Get("warm_files_discarded") == 0);
    for (const TestFile& f : files) ReadWholeAndCheck(*m, f);
    CHECK(source.reads.load() == 0);  // Nothing from the PFS.
    CHECK(m->GetStats().Get("promotions_started") == 0);
  }
  // Change two source files: one in size, one only in content and mtime.
  testing::WriteFile(ds + "/" + files[3].name, 77, files[3].size + 5);
  files[3] = {files[3].name, 77, files[3].size + 5};
  testing::WriteFile(ds + "/" + files[4].name, 78, files[4].size);
  files[4].seed = 78;
  struct timespec times[2] = {{0, UTIME_OMIT}, {1700000000, 5}};
  REQUIRE(::utimensat(AT_FDCWD, (ds + "/" + files[4].name).c_str(), times, 0) == 0);
  {
    FaultInjectingDriver::Faults source;
    auto m = MustCreate(config, &source);
    Stats stats = m->GetStats();
    CHECK(stats.Get("warm_files_reused") == 18);
    CHECK(stats.Get("warm_files_discarded") == 2);
    for (const TestFile& f : files) ReadWholeAndCheck(*m, f);  // New bytes for the changed files.
    CHECK(source.bytes.load() == files[3].size + files[4].size);
  }
}

TEST_CASE("two processes promoting into the same tiers at once do not corrupt each other") {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  std::string nvme = dir.Sub("nvme");
  auto files = testing::MakeDataset(ds, 80, {50000, 300000});
  const std::string yaml = dir.path() + "/shared.yaml";
  std::ofstream(yaml) << "dataset: {path: " << ds
                      << "}\ntiers:\n  - {name: nvme, kind: posix, path: " << nvme
                      << ", capacity: 1GiB}\n  - {kind: source}\n";
  // Both start together and race on every file. Waited for with a deadline
  // (not through a shell: a run under TSan once sat 20 minutes in
  // std::system() after both children had exited, the shell never reaping
  // them).
  std::vector<std::vector<std::string>> runs;
  for (const char* seed : {"1", "2"}) {
    runs.push_back({MONARCH_EPOCHS_BINARY, "--config", yaml, "--epochs", "2", "--threads", "4",
                    "--verify", "--seed", seed});
  }
  CHECK(testing::RunAll(runs, /*timeout_seconds=*/600) == std::vector<int>{0, 0});
  FaultInjectingDriver::Faults source;
  auto m = MustCreate(
      testing::MakeConfig(ds, {testing::FileTier(TierKind::kPosix, nvme, 1 << 30, "nvme")}),
      &source);
  CHECK(m->GetStats().Get("warm_files_reused") == 80);
  for (const TestFile& f : files) ReadWholeAndCheck(*m, f);
  CHECK(source.reads.load() == 0);
}

TEST_CASE("open descriptors stay bounded: 8 readers, 400 files, ulimit -n 64") {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  auto files = testing::MakeDataset(ds, 400, {2000, 9000});
  Config config = testing::MakeConfig(
      ds, {testing::RamTier(1 << 20),
           testing::FileTier(TierKind::kPosix, dir.Sub("nvme"), 1 << 30, "nvme")});
  config.placement.max_open_files = 8;
  struct rlimit saved;
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
  struct rlimit low = saved;
  low.rlim_cur = 64;
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  std::atomic<int> bad{0};
  {
    auto m = MustCreate(config);
    for (int epoch = 0; epoch < 3; ++epoch) {
      std::vector<std::thread> readers;
      std::atomic<size_t> next{0};
      for (int t = 0; t < 8; ++t) {
        readers.emplace_back([&] {
          std::vector<char> buffer(9000);
          for (size_t i; (i = next.fetch_add(1)) < files.size();) {
            const TestFile& f = files[(i * 7919) % files.size()];
            absl::StatusOr<size_t> n = m->Read(f.name, buffer.data(), buffer.size(), 0);
            if (!n.ok() || *n != f.size || !testing::BytesMatch(f, buffer.data(), 0, f.size))
              bad.fetch_add(1);
          }
        });
      }
      for (auto& r : readers) r.join();
    }
    m->WaitForPlacement();
    CHECK(m->GetStats().Get("promotions_failed") == 0);
    CHECK(m->GetStats().Tier(1, "files") > 0);  // Both tiers were used, so both caches were busy.
  }
  ::setrlimit(RLIMIT_NOFILE, &saved);
  CHECK(bad.load() == 0);
}

TEST_CASE("shutdown: cancel leaves no partial copies, drain finishes everything, reads go on") {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  std::string nvme = dir.Sub("nvme");
  auto files = testing::MakeDataset(ds, 12, {4 << 20});
  FaultInjectingDriver::Faults source;
  source.read_delay_us = 20000;  // 20 ms per source call: promotions are slow.
  Config config =
      testing::MakeConfig(ds, {testing::FileTier(TierKind::kPosix, nvme, 1 << 30, "nvme")});
  config.placement.chunk_bytes = 256 << 10;
  {
    auto m = MustCreate(config, &source);
    char b[10];
    for (const TestFile& f : files) REQUIRE(m->Read(f.name, b, 10, 0).ok());
    m->Shutdown(Monarch::ShutdownMode::kCancel);
    Stats stats = m->GetStats();
    CHECK(stats.Get("promotions_cancelled") > 0);
    CHECK(stats.Get("promotions_completed") + stats.Get("promotions_cancelled") + stats.Get("promotions_failed") ==
          stats.Get("promotions_started"));
    source.read_delay_us = 0;
    for (const TestFile& f : files) ReadWholeAndCheck(*m, f);             // Reads still work.
    CHECK(m->GetStats().Get("promotions_started") == stats.Get("promotions_started"));  // But start nothing new.
  }
  {
    // Whatever was published is complete and valid; nothing half-written exists.
    auto m = MustCreate(config);
    Stats stats = m->GetStats();
    CHECK(stats.Get("warm_files_discarded") == 0);
    FILE* p = ::popen(("find '" + nvme + "/.monarch/tmp' -type f | wc -l").c_str(), "r");
    int temporaries = -1;
    CHECK(std::fscanf(p, "%d", &temporaries) == 1);
    ::pclose(p);
    CHECK(temporaries == 0);
    char b[10];
    for (const TestFile& f : files) REQUIRE(m->Read(f.name, b, 10, 0).ok());
    m->Shutdown(Monarch::ShutdownMode::kDrain);
    CHECK(m->GetStats().Tier(0, "files") == 12);
  }
}

TEST_CASE("create from YAML: good string and file, bad config is a clear error") {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  auto files = testing::MakeDataset(ds, 2, {100});
  std::string yaml =
      "dataset: {path: " + ds + "}\ntiers:\n  - {kind: ram, capacity: 1MiB}\n  - {kind: source}\n";
  auto from_string = Monarch::CreateFromYamlString(yaml);
  REQUIRE(from_string.ok());
  ReadWholeAndCheck(**from_string, files[0]);
  std::ofstream(dir.path() + "/c.yaml") << yaml;
  auto from_file = Monarch::CreateFromYamlFile(dir.path() + "/c.yaml");
  REQUIRE(from_file.ok());
  ReadWholeAndCheck(**from_file, files[1]);
  auto bad = Monarch::CreateFromYamlString("dataset: {path: " + ds + "}\ntiers: []\n");
  REQUIRE_FALSE(bad.ok());
  CHECK(absl::StrContains(bad.status().message(), "tiers:"));
  auto missing = Monarch::Create(DefaultConfig("/nonexistent/dataset"));
  CHECK(absl::StrContains(missing.status().message(), "dataset.path"));
}

TEST_CASE("stats JSON carries every counter") {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  auto files = testing::MakeDataset(ds, 3, {1000});
  auto m = MustCreate(testing::MakeConfig(ds, {testing::RamTier(1 << 20)}));
  for (const TestFile& f : files) ReadWholeAndCheck(*m, f);
  m->WaitForPlacement();
  for (const TestFile& f : files) ReadWholeAndCheck(*m, f);
  std::string json = m->GetStats().ToJson();
  CHECK(absl::StrContains(json,
                          "{\"name\":\"ram\",\"kind\":\"ram\",\"reads\":3,\"bytes_read\":3000,"
                          "\"files\":3,\"bytes_used\":3000,\"capacity\":1048576"));
  CHECK(absl::StrContains(json,
                          "{\"name\":\"pfs\",\"kind\":\"source\",\"reads\":3,\"bytes_read\":3000,"
                          "\"files\":3,\"bytes_used\":3000"));
  CHECK(absl::StrContains(
      json, "\"promotions_started\":3,\"promotions_completed\":3,\"promotions_failed\":0"));
  // Each 1000-byte file was staged in a 4 KiB buffer; up to all three at once.
  const uint64_t peak = m->GetStats().Get("staging_peak_bytes");
  CHECK((peak == 4096 || peak == 8192 || peak == 12288));
  CHECK(absl::StrContains(json, absl::StrCat("\"staging_bytes\":0,\"staging_peak_bytes\":", peak,
                                             ",\"chunks_written_by_placement\":3,"
                                             "\"chunks_written_by_readers\":0")));
}

TEST_CASE("one set of counters feeds JSON and Prometheus alike") {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  auto files = testing::MakeDataset(ds, 3, {1000});
  auto m = MustCreate(testing::MakeConfig(ds, {testing::RamTier(1 << 20)}));
  for (const TestFile& f : files) ReadWholeAndCheck(*m, f);
  m->WaitForPlacement();
  const Stats stats = m->GetStats();
  const std::string text = stats.ToPrometheus();
  CHECK(absl::StrContains(text,
                          "# TYPE monarch_promotions_completed_total counter\n"
                          "monarch_promotions_completed_total 3\n"));
  CHECK(absl::StrContains(text, "# TYPE monarch_tier_bytes_used gauge\n"
                                "monarch_tier_bytes_used{tier=\"ram\",kind=\"ram\"} 3000\n"
                                "monarch_tier_bytes_used{tier=\"pfs\",kind=\"source\"} 3000\n"));
  // Every metric has a help line, and appears once in each form.
  size_t samples = 0;
  for (const Metric& metric : stats.metrics) {
    CHECK_MESSAGE(!metric.help.empty(), metric.name);
    const std::string json_key = "\"" + metric.name + "\":";
    CHECK_MESSAGE(absl::StrContains(stats.ToJson(), json_key), metric.name);
    ++samples;
  }
  size_t lines = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    lines += !line.empty() && line[0] != '#';
  }
  CHECK(lines == samples);
  CHECK(stats.TierNames() == std::vector<std::string>{"ram", "pfs"});
}

}  // namespace
}  // namespace monarch
