// Tests of the front half (core/front.h): what a Monarch does around its
// reads, written once, answers the same in process and through a node
// service's client. Each case runs the same calls both ways, against the
// same dataset, and compares: name lookup and stat(), directory calls,
// announcements, the read-ahead scan rule, stats and the speed model
// (placement.route_by_speed).

#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/os.h"
#include "instance_util.h"
#include "monarch/monarch.h"
#include "service/client.h"
#include "service/node_service.h"
#include "test_util.h"

namespace monarch {
namespace {

using testing::ScratchDir;
using testing::TestFile;

// A Monarch over `config`: in this process, or a client of a node service
// run here. The client goes before its service.
struct Opened {
  std::unique_ptr<service::NodeService> node;
  std::unique_ptr<Monarch> m;
};

constexpr bool kModes[] = {false, true};  // In process, then through a client.

Config ForMode(Config config, bool through_service, const std::string& run_dir) {
  if (through_service) {
    config.node.shared = true;
    config.node.runtime_dir = run_dir;
    config.node.autostart = false;
    config.node.idle_exit_seconds = 0;
  }
  return config;
}

// A new instance, or a new client of the service `opened` started.
void OpenMonarch(Opened& opened, const Config& config, bool through_service) {
  opened.m.reset();
  auto m = Monarch::Create(config);
  REQUIRE_MESSAGE(m.ok(), m.status().ToString());
  opened.m = std::move(*m);
  REQUIRE(service::IsServiceClient(*opened.m) == through_service);
}

Opened Open(Config config, bool through_service, const std::string& run_dir) {
  Opened opened;
  config = ForMode(std::move(config), through_service, run_dir);
  if (through_service) {
    auto node = service::NodeService::Start(testing::Valid(config));
    REQUIRE_MESSAGE(node.ok(), node.status().ToString());
    opened.node = std::move(*node);
  }
  OpenMonarch(opened, config, through_service);
  return opened;
}

// Waits (at most 10 s) until the general metric `name` reaches `at_least`:
// a client's notices are one-way, and prefetch runs on its own threads.
uint64_t WaitForStat(Monarch& m, const char* name, uint64_t at_least) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  uint64_t value = m.GetStats().Get(name);
  while (value < at_least && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    value = m.GetStats().Get(name);
  }
  return value;
}

std::string Describe(const absl::Status& status) {
  return absl::StrCat(absl::StatusCodeToString(status.code()), ": ", status.message());
}

TEST_CASE("front: lookup, stat and directory calls answer the same in process and through a client") {
  ScratchDir dir;
  const std::string data = dir.Sub("data");
  const auto files = testing::MakeDataset(data, 12, {1, 4096, 70000});
  std::vector<std::string> answers[2];
  for (bool shared : kModes) {
    Opened o = Open(testing::MakeConfig(data, {testing::RamTier(16 << 20)}), shared,
                    dir.Sub(shared ? "run" : "unused"));
    Monarch& m = *o.m;
    std::vector<std::string>& out = answers[shared];
    for (const std::string& name :
         {files[3].name, data + "/" + files[3].name, "dir0/../" + files[3].name,
          std::string("dir0/nope.bin"), std::string("dir1"), std::string("")}) {
      absl::StatusOr<Monarch::FileStat> stat = m.Stat(name);
      absl::StatusOr<uint64_t> size = m.FileSize(name);
      out.push_back(absl::StrCat(name, " exists ", m.FileExists(name), " dir ",
                                 m.IsDirectory(name), " size ",
                                 size.ok() ? absl::StrCat(*size) : Describe(size.status()),
                                 " stat ",
                                 stat.ok() ? absl::StrCat(stat->size, "/", stat->mtime_ns, "/",
                                                          stat->inode, "/", stat->mode)
                                           : Describe(stat.status())));
    }
    for (const std::string& name : {std::string(""), std::string("dir2"), std::string("nope")}) {
      absl::StatusOr<std::vector<std::string>> listed = m.ListDirectory(name);
      out.push_back(listed.ok() ? absl::StrJoin(*listed, ",") : Describe(listed.status()));
    }
    out.push_back(absl::StrJoin(m.ListFiles(), ","));
    out.push_back(Describe(m.Read("dir0/nope.bin", nullptr, 0, 0).status()));
    // What both must say, whatever the other says.
    CHECK(m.FileExists(files[3].name));
    CHECK_FALSE(m.FileExists("dir0/../" + files[3].name));
    CHECK(*m.FileSize(files[3].name) == files[3].size);
    CHECK(*m.ListDirectory("") == std::vector<std::string>{"dir0", "dir1", "dir2", "dir3"});
    CHECK(m.ListFiles().size() == files.size());
    CHECK(absl::IsNotFound(m.ListDirectory("nope").status()));
  }
  CHECK(answers[0] == answers[1]);
}

TEST_CASE("front: announcements are refused alike, and prefetch every file in both") {
  ScratchDir dir;
  const std::string data = dir.Sub("data");
  const auto files = testing::MakeDataset(data, 30, {3000, 9000});
  std::vector<std::string> order;
  for (const TestFile& f : files) order.push_back(f.name);
  std::string refusals[2];
  for (bool shared : kModes) {
    Opened o = Open(testing::MakeConfig(data, {testing::RamTier(16 << 20)}), shared,
                    dir.Sub(shared ? "run" : "unused"));
    Monarch& m = *o.m;
    const absl::Status unknown = m.AnnounceOrder({files[0].name, "dir0/nope.bin"});
    CHECK(absl::IsNotFound(unknown));
    const absl::Status past_end = m.AnnounceRanges({{files[1].name, files[1].size + 1, 10}});
    CHECK(absl::IsOutOfRange(past_end));
    const absl::Status unknown_range = m.AnnounceRanges({{"nope", 0, 0}});
    CHECK(absl::IsNotFound(unknown_range));
    refusals[shared] = absl::StrCat(Describe(unknown), "|", Describe(past_end), "|",
                                    Describe(unknown_range));

    REQUIRE(m.AnnounceOrder(order).ok());
    CHECK(WaitForStat(m, "prefetch_files", files.size()) == files.size());
    m.WaitForPlacement();
    const Stats stats = m.GetStats();
    CHECK(stats.Tier(0, "files") == files.size());
    CHECK(stats.Source("bytes_read") == testing::TotalBytes(files));
    // Samples by range: a file cached whole is fetched whole, once.
    REQUIRE(m.AnnounceRanges({{files[2].name, 100, 10}, {files[2].name, 0, 0}}).ok());
  }
  CHECK(refusals[0] == refusals[1]);
}

TEST_CASE("front: a scan reads ahead and a random reader does not, in process and through a client") {
  ScratchDir dir;
  const std::string data = dir.Sub("data");
  const TestFile big{"shards/big.bin", 47, 24 * (1 << 20) - 3333};
  testing::WriteFile(data + "/" + big.name, big.seed, big.size);
  uint64_t files_after_scan[2] = {0, 0};
  for (bool shared : kModes) {
    Config config = testing::MakeConfig(data, {testing::RamTier(64 << 20)});
    config.placement.extent_bytes = 1 << 20;
    config.placement.extent_threshold = 4 << 20;
    config.placement.cached_source = CachedSourcePolicy::kPromote;
    // What a scan reads ahead, alone: no staging of the file's directory
    // by the service (prefetch.stage_ahead) behind the reads.
    config.prefetch.stage_ahead = false;
    Opened o = Open(config, shared, dir.Sub(shared ? "run" : "unused"));
    Monarch& m = *o.m;
    std::vector<char> piece(256 << 10);
    auto read_at = [&](uint64_t offset, size_t n) {
      absl::StatusOr<size_t> got = m.Read(big.name, piece.data(), n, offset);
      REQUIRE(got.ok());
      REQUIRE(*got == n);
      REQUIRE(testing::BytesMatch(big, piece.data(), offset, n));
    };
    // Records here and there, two of them back to back: no scan.
    for (uint64_t offset : {uint64_t{13} << 20, (uint64_t{5} << 20) + 100, uint64_t{19} << 20,
                            (uint64_t{19} << 20) + 4096, uint64_t{9} << 20}) {
      read_at(offset, 4096);
    }
    m.WaitForPlacement();
    CHECK(m.GetStats().Get("read_ahead_extents") == 0);
    CHECK(m.GetStats().Tier(0, "files") == 4);  // Each record's extent, no more.
    // A scan of the first 8 MiB: the extents past it are read ahead.
    for (uint64_t offset = 0; offset < (uint64_t{8} << 20); offset += piece.size()) {
      read_at(offset, piece.size());
    }
    CHECK(WaitForStat(m, "read_ahead_extents", 1) >= 1);
    m.WaitForPlacement();
    files_after_scan[shared] = m.GetStats().Tier(0, "files");
    // The 8 scanned, the records' 3 past them, and some ahead; not all 24.
    CHECK(files_after_scan[shared] > 11);
    CHECK(files_after_scan[shared] < 24);
  }
}

TEST_CASE("front: the same reads give the same stats in process and through a client") {
  ScratchDir dir;
  const std::string data = dir.Sub("data");
  const auto files = testing::MakeDataset(data, 20, {1, 4096, 70000, 300000});
  const char* const kGeneral[] = {"promotions_started", "promotions_completed"};
  const char* const kTier[] = {"reads", "bytes_read", "files", "bytes_used"};
  std::vector<uint64_t> figures[2];
  for (bool shared : kModes) {
    Config config = testing::MakeConfig(data, {testing::RamTier(16 << 20)});
    config.placement.cached_source = CachedSourcePolicy::kPromote;
    Opened o = Open(config, shared, dir.Sub(shared ? "run" : "unused"));
    std::vector<uint64_t> passes[2];
    for (std::vector<uint64_t>& pass : passes) {
      for (const TestFile& f : files) testing::ReadWholeAndCheck(*o.m, f, 64 << 10);
      o.m->WaitForPlacement();
      const Stats stats = o.m->GetStats();
      for (const char* name : kGeneral) pass.push_back(stats.Get(name));
      for (size_t tier = 0; tier < 2; ++tier) {
        for (const char* name : kTier) pass.push_back(stats.Tier(tier, name));
      }
    }
    // The first pass's misses: where its reads of the RAM tier's copies are
    // counted depends on when each promotion lands (a reader in process
    // joins it, a client asks again per transfer buffer). The rest is the
    // same, and so is everything the second pass, all hits, adds.
    for (size_t i = 0; i < passes[0].size(); ++i) {
      if (i != 2 && i != 3) figures[shared].push_back(passes[0][i]);
      figures[shared].push_back(passes[1][i] - passes[0][i]);
    }
    CHECK(passes[1][2] - passes[0][2] == 45);  // Every read a hit: 5 * (1 + 1 + 2 + 5).
    CHECK(passes[1][7] == testing::TotalBytes(files));  // The source, once.
    CHECK(passes[1][4] == files.size());
  }
  CHECK(figures[0] == figures[1]);
}

TEST_CASE("front: the speed model routes slow copies' hits to the source's page cache, in "
          "process and through a client") {
  ScratchDir dir;
  const std::string data = dir.Sub("data");
  const auto files = testing::MakeDataset(data, 16, {65536, 200000});
  for (bool shared : kModes) {
    const std::string nvme = dir.Sub(shared ? "nvme-shared" : "nvme");
    testing::CopySpeedEnv env(nvme);
    os::ScopedEnvForTesting installed(&env);
    Config config =
        testing::MakeConfig(data, {testing::FileTier(TierKind::kPosix, nvme, 1 << 30, "nvme")});
    config.placement.cached_source = CachedSourcePolicy::kPromote;
    config.placement.route_by_speed = true;
    const std::string run = dir.Sub(shared ? "run" : "unused");
    Opened o = Open(config, shared, run);
    for (const TestFile& f : files) testing::ReadWholeAndCheck(*o.m, f);
    o.m->WaitForPlacement();
    // The first pass's reads fed the model whatever the machine's load made
    // of them; a new instance (or client) adopts the copies and starts it
    // afresh, so what follows is the model's answer to slow copies alone.
    OpenMonarch(o, ForMode(config, shared, run), shared);
    Monarch& m = *o.m;
    REQUIRE(m.GetStats().Tier(0, "files") == files.size());

    env.SlowCopies(true);  // 2 ms a read of a copy; the source's bytes are in memory,
    const Stats before = m.GetStats();
    constexpr int kRounds = 4;
    for (int round = 0; round < kRounds; ++round) {
      for (size_t i = 0; i < files.size(); ++i) {
        // but the first two files' are not, as a page cache under pressure
        // may have it. The first hit measures the copies, the second asks
        // the source and misses: that must not leave the copies serving for
        // long.
        env.EvictSource(round == 0 && i < 2);
        testing::ReadWholeAndCheck(m, files[i]);
      }
    }
    const Stats slow = m.GetStats();
    const uint64_t hits = kRounds * files.size();
    const uint64_t from_copies = slow.Tier(0, "reads") - before.Tier(0, "reads");
    const uint64_t from_source =
        slow.Get("speed_source_cache_reads") - before.Get("speed_source_cache_reads");
    CHECK(from_copies + from_source == hits);
    INFO("through a client: ", shared, "; attempts that missed: ",
         slow.Get("speed_source_cache_misses") - before.Get("speed_source_cache_misses"));
    // The first hit measures the copies, the miss waits 2 hits; then the source serves.
    CHECK(from_copies <= 4);
    CHECK(slow.Get("speed_source_first_chosen") > 0);
    CHECK(slow.Tier(0, "speed_ns_per_mib") > slow.Get("speed_source_cache_ns_per_mib"));
    CHECK(slow.Get("promotions_started") == before.Get("promotions_started"));
  }
}

}  // namespace
}  // namespace monarch
