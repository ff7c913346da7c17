// Shutdown always ends: every wait has a deadline or is cancelled, and a
// thread stuck in a read that never returns (a file system that stopped
// answering) is left behind with what it uses, instead of being joined.
// (Peers and the node service: tests/remote/exit_test.py and the peer
// network cases in test_remote.cc.)

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/mutex.h"
#include "common/shutdown.h"
#include "drivers/forwarding_driver.h"
#include "instance_util.h"
#include "monarch/monarch.h"
#include "core/monarch_internal.h"
#include "service/node_service.h"
#include "test_util.h"

namespace monarch {
namespace {

using testing::FaultInjectingDriver;
using testing::MustCreate;
using testing::MustCreateWrappingSource;
using testing::ReadWholeAndCheck;
using testing::ScratchDir;
using testing::TestFile;

// A source whose reads at or past `from_offset` block until Open(): a file
// system that stopped answering, the way a hung NFS or Lustre mount leaves
// pread() in the kernel.
struct Gate {
  Mutex mu;
  CondVar opened;
  bool open ABSL_GUARDED_BY(mu) = false;
  std::atomic<uint64_t> from_offset{~uint64_t{0}};
  std::atomic<int> blocked{0};
  std::atomic<int> left{0};

  // Lets the blocked reads go on, and returns once they have left the gate
  // (which may then be destroyed).
  void Open() {
    {
      MutexLock lock(&mu);
      open = true;
      opened.SignalAll();
    }
    while (left.load() < blocked.load()) std::this_thread::yield();
  }
  void PassOrBlock(uint64_t offset) {
    if (offset < from_offset.load()) return;
    blocked.fetch_add(1);
    {
      MutexLock lock(&mu);
      while (!open) opened.Wait(&mu);
    }
    left.fetch_add(1);
  }
};

class HungSource final : public ForwardingDriver {
 public:
  HungSource(std::unique_ptr<StorageDriver> target, Gate* gate)
      : ForwardingDriver(std::move(target)), gate_(gate) {}
  absl::StatusOr<size_t> Read(const FileRef& file, uint64_t offset, char* dst, size_t n) override {
    gate_->PassOrBlock(offset);
    return ForwardingDriver::Read(file, offset, dst, n);
  }

 private:
  Gate* const gate_;
};

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Runs `body` and returns how long it took; if it has not returned after
// `limit` seconds the test fails and the process exits (a hang is the bug
// these tests look for: it must not hang the test run too).
double TimeBounded(double limit, const std::function<void()>& body) {
  std::atomic<bool> done{false};
  const auto start = std::chrono::steady_clock::now();
  std::thread runner([&] {
    body();
    done.store(true);
  });
  while (!done.load()) {
    if (SecondsSince(start) > limit) {
      std::fprintf(stderr, "FAILED: still waiting after %.0f s: the wait has no end\n", limit);
      std::_Exit(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  runner.join();
  return SecondsSince(start);
}

void WaitUntilBlocked(const Gate& gate) {
  const auto start = std::chrono::steady_clock::now();
  while (gate.blocked.load() == 0) {
    REQUIRE_MESSAGE(SecondsSince(start) < 30, "no source read reached the gate");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// One 4 MiB file promoted in 1 MiB chunks over a source whose reads past
// the first chunk hang: a reader's first 4 KiB loads chunk 0 itself, then
// the placement thread blocks on chunk 1.
struct StuckPromotion {
  ScratchDir dir;
  Gate gate;
  std::vector<TestFile> files;
  std::unique_ptr<Monarch> monarch;

  explicit StuckPromotion(double shutdown_timeout) {
    const std::string ds = dir.Sub("ds");
    files = testing::MakeDataset(ds, 1, {4 << 20});
    Config config = testing::MakeConfig(ds, {testing::RamTier(64 << 20)});
    config.placement.chunk_bytes = 1 << 20;
    config.placement.threads = 1;
    config.placement.shutdown_timeout_seconds = shutdown_timeout;
    gate.from_offset = 1 << 20;
    monarch = MustCreateWrappingSource(config, [this](std::unique_ptr<StorageDriver> source) {
      return std::unique_ptr<StorageDriver>(new HungSource(std::move(source), &gate));
    });
    char head[4096];
    REQUIRE(monarch->Read(files[0].name, head, sizeof(head), 0).value() == sizeof(head));
    REQUIRE(testing::BytesMatch(files[0], head, 0, sizeof(head)));
    WaitUntilBlocked(gate);
  }
};

TEST_CASE("drain with a promotion stuck in a read that never returns ends after placement.shutdown_timeout") {
  StuckPromotion stuck(/*shutdown_timeout=*/0.5);
  const int abandoned = AbandonedCount();
  const double seconds =
      TimeBounded(60, [&] { stuck.monarch->Shutdown(Monarch::ShutdownMode::kDrain); });
  MESSAGE("drain with a stuck promotion returned after ", seconds, " s");
  CHECK(seconds >= 0.5);                              // It did drain for the timeout...
  CHECK(seconds <= 0.5 + kCancelGraceSeconds + 3);    // ...then cancelled, and gave up in time.
  const Stats stats = stuck.monarch->GetStats();
  CHECK(stats.Get("promotions_cancelled") == 1);
  CHECK(stats.Get("promotions_started") == 1);
  // The file system answers again: reads are exact, and nothing new starts.
  stuck.gate.Open();
  ReadWholeAndCheck(*stuck.monarch, stuck.files[0]);
  CHECK(stuck.monarch->GetStats().Get("promotions_started") == 1);
  // The destructor does not join the thread the shutdown gave up on: it
  // leaves the instance's parts behind.
  TimeBounded(30, [&] { stuck.monarch.reset(); });
  CHECK(AbandonedCount() == abandoned + 1);
}

TEST_CASE("cancel with a promotion stuck in a read that never returns ends after the grace") {
  StuckPromotion stuck(/*shutdown_timeout=*/30);
  const double seconds =
      TimeBounded(60, [&] { stuck.monarch->Shutdown(Monarch::ShutdownMode::kCancel); });
  MESSAGE("cancel with a stuck promotion returned after ", seconds, " s");
  CHECK(seconds <= kCancelGraceSeconds + 3);
  const int abandoned = AbandonedCount();
  stuck.gate.Open();
  TimeBounded(30, [&] { stuck.monarch.reset(); });
  CHECK(AbandonedCount() == abandoned + 1);
}

TEST_CASE("the destructor alone is bounded too, with a read still stuck") {
  StuckPromotion stuck(/*shutdown_timeout=*/30);
  const int abandoned = AbandonedCount();
  const double seconds = TimeBounded(60, [&] { stuck.monarch.reset(); });
  CHECK(seconds <= kCancelGraceSeconds + 3);
  CHECK(AbandonedCount() == abandoned + 1);
  stuck.gate.Open();  // The thread left behind finishes its read, in a pool nobody joins.
}

TEST_CASE("WaitForPlacement waiting on a stuck promotion returns once Shutdown cancels it") {
  StuckPromotion stuck(/*shutdown_timeout=*/30);
  std::atomic<bool> returned{false};
  std::thread waiter([&] {
    stuck.monarch->WaitForPlacement();
    returned.store(true);
  });
  // Once it waits on the promotions in flight, it would have returned had
  // placement been idle.
  REQUIRE(testing::Eventually(
      [&] { return stuck.monarch->GetStats().Get("placement_waiters") == 1; }));
  CHECK_FALSE(returned.load());  // The promotion is stuck: placement is not idle.
  const auto start = std::chrono::steady_clock::now();
  TimeBounded(60, [&] { stuck.monarch->Shutdown(Monarch::ShutdownMode::kCancel); });
  while (!returned.load() && SecondsSince(start) < 30) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHECK(returned.load());
  waiter.join();
  stuck.gate.Open();
}

TEST_CASE("a slow source is cut short by the drain timeout, nothing left behind, no partial copy") {
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  const std::string nvme = dir.Sub("nvme");
  auto files = testing::MakeDataset(ds, 16, {2 << 20});
  FaultInjectingDriver::Faults source;
  source.read_delay_us = 20000;  // 20 ms a source read: the drain cannot finish in 0.1 s.
  Config config =
      testing::MakeConfig(ds, {testing::FileTier(TierKind::kPosix, nvme, 1 << 30, "nvme")});
  config.placement.chunk_bytes = 256 << 10;
  config.placement.shutdown_timeout_seconds = 0.1;
  const int abandoned = AbandonedCount();
  {
    auto m = MustCreate(config, &source);
    char b[10];
    for (const TestFile& f : files) REQUIRE(m->Read(f.name, b, sizeof(b), 0).ok());
    const double seconds = TimeBounded(60, [&] { m->Shutdown(Monarch::ShutdownMode::kDrain); });
    // Each thread notices the cancellation at its next chunk, 20 ms away.
    CHECK(seconds < 0.1 + 2);
    const Stats stats = m->GetStats();
    CHECK(stats.Get("promotions_cancelled") > 0);
    CHECK(stats.Get("promotions_completed") + stats.Get("promotions_cancelled") +
              stats.Get("promotions_failed") ==
          stats.Get("promotions_started"));
    source.read_delay_us = 0;
    for (const TestFile& f : files) ReadWholeAndCheck(*m, f);
  }
  CHECK(AbandonedCount() == abandoned);  // A clean shutdown leaves nothing behind.
  int temporaries = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(nvme + "/.monarch/tmp")) {
    temporaries += entry.is_regular_file();
  }
  CHECK(temporaries == 0);
}

// A node service whose source reads (but the first chunk of each file's)
// hang, and a client of it.
struct StuckService {
  ScratchDir dir;
  Gate gate;
  std::vector<TestFile> files;
  Config config;
  std::unique_ptr<service::NodeService> node;

  StuckService() {
    files = testing::MakeDataset(dir.Sub("data"), 2, {4 << 20});
    config = testing::MakeConfig(dir.path() + "/data", {testing::RamTier(64 << 20)});
    config.placement.chunk_bytes = 1 << 20;
    config.placement.threads = 1;
    config.node.shared = true;
    config.node.runtime_dir = dir.Sub("run");
    config.node.autostart = false;
    config.node.idle_exit_seconds = 0;
    config.node.request_timeout_seconds = 1;
    gate.from_offset = 1 << 20;
    service::ServeOptions options;
    options.wrap = [this](int tier, std::unique_ptr<StorageDriver> driver) {
      if (tier != 1) return driver;
      return std::unique_ptr<StorageDriver>(new HungSource(std::move(driver), &gate));
    };
    absl::StatusOr<std::unique_ptr<service::NodeService>> started =
        service::NodeService::Start(testing::Valid(config), options);
    REQUIRE_MESSAGE(started.ok(), started.status().ToString());
    node = std::move(*started);
  }
};

TEST_CASE("node service: a client's miss stuck in the service is read from the source after node.request_timeout, and the stop is bounded") {
  StuckService stuck;
  auto client = Monarch::Create(stuck.config);
  REQUIRE(client.ok());
  // Past the first chunk: the service's read blocks in the source.
  const TestFile& f = stuck.files[0];
  std::vector<char> buffer(64 << 10);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<size_t> got = (*client)->Read(f.name, buffer.data(), buffer.size(), 2 << 20);
  const double seconds = SecondsSince(start);
  REQUIRE_MESSAGE(got.ok(), got.status().ToString());
  CHECK(*got == buffer.size());
  CHECK(testing::BytesMatch(f, buffer.data(), 2 << 20, buffer.size()));
  CHECK(seconds >= 1);  // It waited node.request_timeout...
  CHECK(seconds < 10);  // ...then read the source itself.
  CHECK(stuck.gate.blocked.load() >= 1);
  // The service stops although a connection is stuck in that read.
  stuck.node->RequestStop();
  const double stop = TimeBounded(60, [&] { stuck.node->Wait(); });
  MESSAGE("the stop took ", stop, " s");
  CHECK(stop < 2 * kCancelGraceSeconds + 3);
  CHECK_FALSE(stuck.node->stopped_cleanly());
  // Once the read returns, the service can go: its destructor joins the
  // connection left behind (`monarch serve` exits without waiting instead).
  stuck.gate.Open();
  TimeBounded(60, [&] { stuck.node.reset(); });
}

TEST_CASE("node service: a client waiting for placement returns when the service stops") {
  StuckService stuck;
  auto client = Monarch::Create(stuck.config);
  REQUIRE(client.ok());
  char head[4096];
  REQUIRE((*client)->Read(stuck.files[1].name, head, sizeof(head), 0).ok());  // Its promotion sticks.
  WaitUntilBlocked(stuck.gate);
  std::atomic<bool> returned{false};
  std::thread waiter([&] {
    (*client)->WaitForPlacement();
    returned.store(true);
  });
  // Its call waits in the service on the promotion in flight.
  REQUIRE(testing::Eventually(
      [&] { return stuck.node->NodeStats().node.Get("placement_waiters") == 1; }));
  CHECK_FALSE(returned.load());
  stuck.node->RequestStop();
  TimeBounded(60, [&] { stuck.node->Wait(); });
  const auto start = std::chrono::steady_clock::now();
  while (!returned.load() && SecondsSince(start) < 30) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHECK(returned.load());
  waiter.join();
  // Cancelled placement, no connection left in a read: a clean stop.
  CHECK(stuck.node->stopped_cleanly());
  stuck.gate.Open();
}

TEST_CASE("placement.shutdown_timeout is parsed and checked") {
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  testing::MakeDataset(ds, 1, {100});
  const std::string head = "dataset: {path: " + ds + "}\ntiers: [{kind: ram, capacity: 1MiB}, {kind: source}]\n";
  absl::StatusOr<Config> parsed = ParseConfigString(head + "placement: {shutdown_timeout: 2m}\n");
  REQUIRE_MESSAGE(parsed.ok(), parsed.status().ToString());
  CHECK(parsed->placement.shutdown_timeout_seconds == 120);
  CHECK(ParseConfigString(head + "placement: {shutdown_timeout: 0}\n")->placement.shutdown_timeout_seconds == 0);
  CHECK(Config().placement.shutdown_timeout_seconds == 30);
  absl::StatusOr<Config> bad = ParseConfigString(head + "placement: {shutdown_timeout: soon}\n");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("placement.shutdown_timeout") != std::string::npos);
  bad = ParseConfigString(head + "placement: {shutdown_timeout: 1500m}\n");
  CHECK_FALSE(bad.ok());
  absl::StatusOr<Config> node = ParseConfigString(head + "node: {request_timeout: 500ms}\n");
  REQUIRE_MESSAGE(node.ok(), node.status().ToString());
  CHECK(node->node.request_timeout_seconds == 0.5);
  bad = ParseConfigString(head + "node: {request_timeout: 0}\n");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("node.request_timeout") != std::string::npos);
}

}  // namespace
}  // namespace monarch
