// Peers over UCX: several Monarch instances in one process, each with its
// own tiers over one shared source, talking UCX over loopback TCP exactly as
// separate processes do. (Separate processes, SIGKILL and network namespaces
// are in tests/remote/.)

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "doctest/doctest.h"
#include "drivers/tier.h"
#include "monarch/monarch.h"
#include "core/monarch_internal.h"
#include "remote/bootstrap.h"
#include "common/crc32c.h"
#include "common/environment.h"
#include "remote/peer_network.h"
#include "remote/rendezvous_hash.h"
#include "test_util.h"

namespace monarch {
namespace {

using testing::FaultInjectingDriver;
using testing::ScratchDir;
using testing::TestFile;

// A counter of the peers tier (what this process got from homes).
uint64_t PeersTier(const Stats& stats, std::string_view counter) {
  const std::vector<std::string> names = stats.TierNames();
  for (size_t t = 0; t < names.size(); ++t) {
    if (names[t] == "peers") return stats.Tier(t, counter);
  }
  FAIL("no peers tier");
  return 0;
}

Config PeerConfig(const std::string& dataset, const std::string& rendezvous, int rank, int size,
                  uint64_t capacity) {
  Config c = testing::MakeConfig(dataset, {testing::RamTier(capacity)});
  c.remote.enabled = true;
  c.remote.rank = std::to_string(rank);
  c.remote.size = std::to_string(size);
  c.remote.rendezvous_dir = rendezvous;
  c.remote.rendezvous_timeout_seconds = 30;
  // Long enough that a home loading a file for a request under a sanitizer,
  // beside other tests on 2 cores, still answers (5 s did not: a request
  // timed out, and its file was read from the source twice). The tests of
  // timeouts set their own.
  c.remote.request_timeout_seconds = 60;
  c.remote.retry_after_seconds = 60;
  return c;
}

// A cluster of `size` instances started together (each blocks at the
// rendezvous until all have arrived), with their source reads counted.
struct Cluster {
  std::vector<std::unique_ptr<FaultInjectingDriver::Faults>> faults;
  std::vector<std::unique_ptr<Monarch>> peers;

  Cluster(const std::vector<Config>& configs) {
    const size_t n = configs.size();
    for (size_t r = 0; r < n; ++r)
      faults.push_back(std::make_unique<FaultInjectingDriver::Faults>());
    std::vector<absl::StatusOr<std::unique_ptr<Monarch>>> made(n);
    std::vector<std::thread> threads;
    for (size_t r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        const int source = static_cast<int>(configs[r].tiers.size()) - 1;
        made[r] = CreateMonarchWithDriverWrapper(
            configs[r], [&, r, source](int tier, std::unique_ptr<StorageDriver> driver) {
              if (tier != source) return driver;
              return std::unique_ptr<StorageDriver>(
                  new FaultInjectingDriver(std::move(driver), faults[r].get()));
            });
      });
    }
    for (auto& t : threads) t.join();
    for (size_t r = 0; r < n; ++r) {
      REQUIRE_MESSAGE(made[r].ok(), made[r].status().ToString());
      peers.push_back(std::move(*made[r]));
    }
  }

  uint64_t SourceBytes() const {
    uint64_t total = 0;
    for (const auto& f : faults) total += f->bytes.load();
    return total;
  }
  uint64_t SourceBytesOf(const std::string& name) const {
    uint64_t total = 0;
    for (const auto& f : faults) total += f->BytesOf(name);
    return total;
  }
  void Settle() {
    for (auto& p : peers) {
      if (p != nullptr) p->WaitForPlacement();  // Null: a peer the test took down.
    }
  }
};

// Every peer reads every file (whole, in `piece` byte calls), shuffled, from
// `threads` threads each; returns the number of wrong or failed reads.
int ReadEverything(Cluster& cluster, const std::vector<TestFile>& files, int threads, size_t piece,
                   uint64_t seed) {
  std::atomic<int> bad{0};
  std::vector<std::thread> readers;
  for (size_t r = 0; r < cluster.peers.size(); ++r) {
    for (int t = 0; t < threads; ++t) {
      readers.emplace_back([&, r, t] {
        std::vector<size_t> order(files.size());
        for (size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::mt19937_64 rng(seed * 100 + r * 10 + t);
        std::shuffle(order.begin(), order.end(), rng);
        std::vector<char> buffer(piece);
        for (size_t i : order) {
          const TestFile& f = files[i];
          for (uint64_t off = 0; off < f.size; off += piece) {
            absl::StatusOr<size_t> got = cluster.peers[r]->Read(f.name, buffer.data(), piece, off);
            const size_t want = std::min<uint64_t>(piece, f.size - off);
            if (!got.ok() || *got != want || !testing::BytesMatch(f, buffer.data(), off, want)) {
              bad.fetch_add(1);
            }
          }
        }
      });
    }
  }
  for (auto& t : readers) t.join();
  return bad.load();
}

TEST_CASE("peers: each file is read from the source once in the whole cluster, bytes exact") {
  ScratchDir dir;
  const std::string dataset = dir.Sub("dataset");
  auto files = testing::MakeDataset(dataset, 48, {4096, 100 << 10, 1536 << 10, 3 << 20, 7});
  const uint64_t total = testing::TotalBytes(files);
  const int size = 3;
  std::vector<Config> configs;
  for (int r = 0; r < size; ++r) {
    configs.push_back(PeerConfig(dataset, dir.Sub("rdv"), r, size, 2 * total));
    // Small buffers, so multi-MiB files stream through a ring of pieces.
    configs.back().remote.buffer_bytes = 256 << 10;
    configs.back().remote.chunk_bytes = 64 << 10;
  }
  Cluster cluster(configs);

  CHECK(ReadEverything(cluster, files, 2, 1 << 20, 1) == 0);
  cluster.Settle();
  CHECK(cluster.SourceBytes() == total);  // Once per file, cluster-wide.
  uint64_t peer_reads = 0, peer_bytes = 0, served_bytes = 0, home_files = 0;
  // A home counts a reply's bytes when UCX reports the send complete, which
  // may come after the requester has received and used them.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    uint64_t served = 0, received = 0;
    for (auto& p : cluster.peers) {
      const Stats s = p->GetStats();
      served += s.Get("remote.bytes_served");
      received += PeersTier(s, "bytes_read");
    }
    if (served == received) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (auto& p : cluster.peers) {
    const Stats s = p->GetStats();
    CHECK(s.Get("remote.enabled"));
    CHECK(s.Get("remote.checksum_failures") == 0);
    CHECK(s.Get("remote.fallbacks") == 0);
    // The peers tier sits just before the source and counts what homes sent.
    const std::vector<std::string> names = s.TierNames();
    REQUIRE(names.size() >= 2);
    CHECK(names[names.size() - 2] == "peers");
    peer_reads += PeersTier(s, "reads");
    peer_bytes += PeersTier(s, "bytes_read");
    CHECK(PeersTier(s, "read_errors") == 0);
    served_bytes += s.Get("remote.bytes_served");
    home_files += s.Get("remote.home_files");
  }
  CHECK(home_files == files.size());  // Every file has exactly one home.
  CHECK(peer_reads > 0);
  CHECK(served_bytes == peer_bytes);  // Every byte a home sent arrived and was used.

  // Epoch 2: the tiers hold everything; no source reads at all.
  CHECK(ReadEverything(cluster, files, 2, 300000, 2) == 0);
  CHECK(cluster.SourceBytes() == total);
}

TEST_CASE("peers: big files cached by extents spread their homes over every peer") {
  ScratchDir dir;
  const std::string dataset = dir.Sub("dataset");
  // 2 files of 24 extents each, the last one short.
  const std::vector<TestFile> files = {{"a/big0.bin", 31, 24 * (1 << 20) - 1000},
                                       {"b/big1.bin", 32, 24 * (1 << 20) - 3000}};
  for (const TestFile& f : files) testing::WriteFile(dataset + "/" + f.name, f.seed, f.size);
  const uint64_t total = testing::TotalBytes(files);
  const int size = 4;
  std::vector<Config> configs;
  for (int r = 0; r < size; ++r) {
    configs.push_back(PeerConfig(dataset, dir.Sub("rdv"), r, size, 2 * total));
    configs.back().placement.extent_bytes = 1 << 20;
    configs.back().placement.extent_threshold = 4 << 20;
  }
  Cluster cluster(configs);
  CHECK(ReadEverything(cluster, files, 2, 300000, 5) == 0);
  cluster.Settle();
  CHECK(cluster.SourceBytes() == total);  // Each extent once, cluster-wide.
  uint64_t home_extents = 0;
  for (auto& p : cluster.peers) {
    const Stats s = p->GetStats();
    // Striped homes: each file's 24 extents go round the 4 peers.
    CHECK(s.Get("remote.home_files") == 12);
    home_extents += s.Get("remote.home_files");
    CHECK(s.Get("remote.fallbacks") == 0);
    CHECK(s.Get("remote.bytes_served") > 0);  // Every peer served its share.
  }
  CHECK(home_extents == 48);  // Every extent has one home; the files none.
  CHECK(ReadEverything(cluster, files, 2, 1 << 20, 6) == 0);
  CHECK(cluster.SourceBytes() == total);
}

TEST_CASE("peers: tiers holding part of the dataset still keep every home file") {
  ScratchDir dir;
  const std::string dataset = dir.Sub("dataset");
  auto files = testing::MakeDataset(dataset, 40, {200 << 10, 300 << 10});
  const uint64_t total = testing::TotalBytes(files);
  std::vector<Config> configs;
  // 70% of the dataset each: both home shares fit, inclusive copies of the
  // other's files must not crowd them out.
  for (int r = 0; r < 2; ++r)
    configs.push_back(PeerConfig(dataset, dir.Sub("rdv"), r, 2, total * 7 / 10));
  Cluster cluster(configs);
  CHECK(ReadEverything(cluster, files, 2, 1 << 20, 3) == 0);
  cluster.Settle();
  CHECK(cluster.SourceBytes() == total);
  CHECK(ReadEverything(cluster, files, 2, 1 << 20, 4) == 0);
  CHECK(cluster.SourceBytes() == total);
  // Some reads in epoch 2 had to go to the peer (no room for every copy).
  uint64_t peer_reads = 0;
  for (auto& p : cluster.peers) peer_reads += PeersTier(p->GetStats(), "reads");
  CHECK(peer_reads > 0);
}

TEST_CASE("peers: concurrent first reads of one file on every peer cause one source read") {
  ScratchDir dir;
  const std::string dataset = dir.Sub("dataset");
  auto files = testing::MakeDataset(dataset, 6, {8 << 20, 4096});
  std::vector<Config> configs;
  for (int r = 0; r < 2; ++r)
    configs.push_back(PeerConfig(dataset, dir.Sub("rdv"), r, 2, 64 << 20));
  Cluster cluster(configs);
  const TestFile& big = files[0];
  std::atomic<int> bad{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    for (int t = 0; t < 4; ++t) {
      readers.emplace_back([&, r, t] {
        std::vector<char> buffer(256 << 10);
        // Each thread starts at a different place in the file.
        for (uint64_t k = 0; k < 32; ++k) {
          const uint64_t off = ((k + t * 8) % 32) * (256 << 10);
          absl::StatusOr<size_t> got =
              cluster.peers[r]->Read(big.name, buffer.data(), 256 << 10, off);
          if (!got.ok() || *got != (256u << 10) ||
              !testing::BytesMatch(big, buffer.data(), off, 256 << 10)) {
            bad.fetch_add(1);
          }
        }
      });
    }
  }
  for (auto& t : readers) t.join();
  cluster.Settle();
  CHECK(bad.load() == 0);
  CHECK(cluster.SourceBytesOf(big.name) == big.size);
}

TEST_CASE("peers: a home that does not answer in time: reads go to the source, bytes exact") {
  ScratchDir dir;
  const std::string dataset = dir.Sub("dataset");
  auto files = testing::MakeDataset(dataset, 24, {64 << 10});
  std::vector<Config> configs;
  for (int r = 0; r < 2; ++r) {
    configs.push_back(PeerConfig(dataset, dir.Sub("rdv"), r, 2, 64 << 20));
    configs.back().remote.request_timeout_seconds = 0.5;
  }
  Cluster cluster(configs);
  cluster.faults[1]->read_delay_us = 1500 * 1000;  // Rank 1's PFS hangs for 1.5 s a read.
  const auto start = std::chrono::steady_clock::now();
  std::vector<char> buffer(64 << 10);
  int bad = 0;
  for (const TestFile& f : files) {
    absl::StatusOr<size_t> got = cluster.peers[0]->Read(f.name, buffer.data(), buffer.size(), 0);
    if (!got.ok() || *got != f.size || !testing::BytesMatch(f, buffer.data(), 0, f.size)) ++bad;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(bad == 0);
  const Stats s = cluster.peers[0]->GetStats();
  CHECK(s.Get("remote.timeouts") == 1);  // The first timeout marks the peer down...
  CHECK(s.Get("remote.fallbacks") >= 1);
  CHECK(s.Get("remote.down_skips") >= 1);  // ...and later reads go straight to the source.
  CHECK(s.Get("remote.peer_failures") == 1);
  // A failed fetch is the peers tier's read error; a down home is not.
  CHECK(PeersTier(s, "read_errors") == s.Get("remote.fallbacks"));
  CHECK(seconds < 10);
  cluster.faults[1]->read_delay_us = 0;
}

TEST_CASE("peers: a peer that shuts down: the others serve every read from the source") {
  ScratchDir dir;
  const std::string dataset = dir.Sub("dataset");
  auto files = testing::MakeDataset(dataset, 30, {100 << 10, 2 << 20});
  std::vector<Config> configs;
  for (int r = 0; r < 2; ++r) configs.push_back(PeerConfig(dataset, dir.Sub("rdv"), r, 2, 1 << 30));
  for (auto& c : configs) c.placement.policy = PlacementPolicyKind::kNone;  // Every read goes to a peer or the source.
  Cluster cluster(configs);
  std::vector<char> buffer(2 << 20);
  CHECK(cluster.peers[0]->Read(files[0].name, buffer.data(), buffer.size(), 0).ok());
  cluster.peers[1]->Shutdown(Monarch::ShutdownMode::kCancel);
  cluster.peers[1].reset();
  int bad = 0;
  for (const TestFile& f : files) {
    absl::StatusOr<size_t> got = cluster.peers[0]->Read(f.name, buffer.data(), buffer.size(), 0);
    if (!got.ok() || *got != f.size || !testing::BytesMatch(f, buffer.data(), 0, f.size)) ++bad;
  }
  CHECK(bad == 0);
  const Stats s = cluster.peers[0]->GetStats();
  CHECK(s.Get("remote.peer_failures") == 0);  // It said goodbye: not a failure...
  CHECK(s.Get("remote.down_skips") >= 1);     // ...and its files now come from the source.
  // The goodbye reaches peer 0's progress thread asynchronously: under load,
  // one fetch may still be sent before it is handled, fail, and go to the
  // source (seen in 2 of 12 runs beside another test). Never more than one.
  CHECK(s.Get("remote.fallbacks") <= 1);
}

// Rank r of the cluster reads files i with i % parts == r (a data-parallel
// job's share); returns the number of wrong or failed reads.
int ReadShare(Monarch& peer, const std::vector<TestFile>& files, size_t r, size_t parts) {
  int bad = 0;
  std::vector<char> buffer(4 << 20);
  for (size_t i = r; i < files.size(); i += parts) {
    const TestFile& f = files[i];
    absl::StatusOr<size_t> got = peer.Read(f.name, buffer.data(), buffer.size(), 0);
    if (!got.ok() || *got != f.size || !testing::BytesMatch(f, buffer.data(), 0, f.size)) ++bad;
  }
  return bad;
}

// `reader` reads every file (each read exact) every 100 ms until `home`, a
// peer that came back, has served some of them; false if it has not within
// 20 s. A first try may meet the old endpoint and wait out one more
// retry_after.
bool ReadUntilServedBy(Monarch& reader, Monarch& home, const std::vector<TestFile>& files) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    CHECK(ReadShare(reader, files, 0, 1) == 0);
    if (home.GetStats().Get("remote.bytes_served") > 0) return true;
  }
  return false;
}

// Waits until every live peer of the cluster has marked `down` peers down
// (a goodbye reaches each asynchronously).
void WaitUntilDown(Cluster& cluster, uint64_t down) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (auto& p : cluster.peers) {
    while (p != nullptr && p->GetStats().Get("remote.peers_down") < down &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (p != nullptr) REQUIRE(p->GetStats().Get("remote.peers_down") == down);
  }
}

// Waits until `peer`'s counter `name` reaches at least `value` (10 s at
// most), then requires it. For a crash seen by a cluster whose retry_after
// is short: remote.peers_down counts a peer only for retry_after after it
// failed, a window a busy machine can let pass between two looks, while
// remote.peer_failures stays.
void WaitForCounter(Monarch& peer, const char* name, uint64_t value) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (peer.GetStats().Get(name) < value && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  REQUIRE(peer.GetStats().Get(name) >= value);
}

// One peer in a child process, so that the test can SIGKILL it: a crash,
// which unlike a shutdown says no goodbye, and is what re-homing is for.
// Forked before the test starts any thread; it creates its instance (meeting
// the others at the rendezvous), reads share `r` of `parts` of `files`, and
// reports when the parent asks, then waits to be killed.
class CrashablePeer {
 public:
  CrashablePeer(const Config& config, const std::vector<TestFile>& files, size_t r, size_t parts) {
    int ask[2], answer[2];
    REQUIRE(::pipe(ask) == 0);
    REQUIRE(::pipe(answer) == 0);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::close(ask[1]);
      ::close(answer[0]);
      RunChild(config, files, r, parts, ask[0], answer[1]);
    }
    ::close(ask[0]);
    ::close(answer[1]);
    ask_ = ask[1];
    answer_ = answer[0];
  }
  ~CrashablePeer() {
    Kill();
    ::close(ask_);
    ::close(answer_);
  }

  // Once every peer has read its share: the bytes this one read from the
  // source (the requests it served included), or -1 if it failed.
  int64_t SourceBytes() {
    const char go = 1;
    int64_t bytes = -1;
    if (::write(ask_, &go, 1) != 1 || ::read(answer_, &bytes, sizeof(bytes)) != sizeof(bytes)) {
      return -1;
    }
    return bytes;
  }

  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  [[noreturn]] static void RunChild(const Config& config, const std::vector<TestFile>& files,
                                    size_t r, size_t parts, int ask, int answer) {
    FaultInjectingDriver::Faults faults;
    const int source = static_cast<int>(config.tiers.size()) - 1;
    absl::StatusOr<std::unique_ptr<Monarch>> peer = CreateMonarchWithDriverWrapper(
        config, [&](int tier, std::unique_ptr<StorageDriver> driver) {
          if (tier != source) return driver;
          return std::unique_ptr<StorageDriver>(new FaultInjectingDriver(std::move(driver), &faults));
        });
    int64_t bytes = -1;
    if (peer.ok() && ReadShare(**peer, files, r, parts) == 0) {
      char go;
      if (::read(ask, &go, 1) == 1) {
        (*peer)->WaitForPlacement();
        bytes = static_cast<int64_t>(faults.bytes.load());
      }
    }
    if (::write(answer, &bytes, sizeof(bytes)) != sizeof(bytes)) ::_exit(1);
    for (;;) ::pause();
  }

  pid_t pid_ = -1;
  int ask_ = -1;
  int answer_ = -1;
};

// The rank that takes a file over when the ranks before it are gone.
std::vector<int> OrderOf(const std::string& name, int size) {
  std::vector<int> order;
  RendezvousOrder(StableNameHash(name), size, &order);
  return order;
}

TEST_CASE("rendezvous order: the home first, the same for every caller, a lost rank moves only its files") {
  for (int i = 0; i < 500; ++i) {
    const std::string name = "class" + std::to_string(i % 7) + "/img" + std::to_string(i);
    const std::vector<int> order = OrderOf(name, 9);
    REQUIRE(order.size() == 9);
    CHECK(order[0] == HomeRank(StableNameHash(name), 9));
    std::vector<int> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    for (int r = 0; r < 9; ++r) CHECK(sorted[r] == r);  // A permutation.
    // Losing rank 8 leaves the others in the order they had.
    std::vector<int> order8 = OrderOf(name, 8);
    std::vector<int> without8;
    for (int r : order) {
      if (r != 8) without8.push_back(r);
    }
    CHECK(order8 == without8);
  }
}

TEST_CASE("holder order: extents go round the peers, and a lost peer's spread over the others") {
  const int peers = 4, extents = 64;
  std::vector<int> share(peers, 0), taken_over(peers, 0);
  for (const std::string file : {"shards/big0.bin", "big1.h5"}) {
    const uint64_t file_hash = StableNameHash(file);
    for (uint32_t k = 0; k < extents; ++k) {
      const std::string name = ".monarch/extents/4194304/" + file + "/" + std::to_string(k);
      const HolderOrder holder =
          HolderOrder::OfExtent(StableNameHash(name), file_hash, k, peers);
      std::vector<int> order;
      holder.Ranks(peers, &order);
      REQUIRE(order.size() == peers);
      // Round the peers from the file's home.
      CHECK(order[0] == (HomeRank(file_hash, peers) + static_cast<int>(k)) % peers);
      CHECK(order[0] == holder.Home(peers));
      std::vector<int> sorted = order;
      std::sort(sorted.begin(), sorted.end());
      for (int r = 0; r < peers; ++r) CHECK(sorted[r] == r);  // A permutation...
      for (int i = 0; i < peers; ++i) {
        for (int j = 0; j < peers; ++j) {
          // ...that ComesBefore agrees with.
          CHECK(holder.ComesBefore(order[i], order[j]) == (i < j));
        }
      }
      // The others in the rendezvous order of the extent's own name.
      std::vector<int> rest = OrderOf(name, peers);
      rest.erase(std::find(rest.begin(), rest.end(), order[0]));
      CHECK(std::vector<int>(order.begin() + 1, order.end()) == rest);
      ++share[order[0]];
      if (order[0] == 0) ++taken_over[order[1]];
    }
  }
  for (int s : share) CHECK(s == 2 * extents / peers);  // Exactly even.
  // Rank 0's 32 extents spread over the 3 others (hashed: not one takes all).
  CHECK(taken_over[0] == 0);
  for (int r = 1; r < peers; ++r) CHECK(taken_over[r] >= 4);
  // A file's order is its name's rendezvous order.
  std::vector<int> order;
  HolderOrder::OfFile(StableNameHash("a/b.jpg")).Ranks(peers, &order);
  CHECK(order == OrderOf("a/b.jpg", peers));
}

TEST_CASE("peers: a lost peer's files move to the next rank of their order, read from the source once") {
  ScratchDir dir;
  const std::string dataset = dir.Sub("dataset");
  auto files = testing::MakeDataset(dataset, 64, {4096, 100 << 10, 700 << 10, 7});
  const uint64_t total = testing::TotalBytes(files);
  const int size = 4, lost = 3;  // Rank 3 runs in a child process, and is killed.
  std::vector<Config> configs;
  for (int r = 0; r < size; ++r) configs.push_back(PeerConfig(dataset, dir.Sub("rdv"), r, size, 2 * total));
  CrashablePeer crashing(configs[lost], files, lost, size);
  configs.pop_back();
  Cluster cluster(configs);
  for (int r = 0; r < lost; ++r) CHECK(ReadShare(*cluster.peers[r], files, r, size) == 0);
  cluster.Settle();
  const int64_t lost_bytes = crashing.SourceBytes();
  REQUIRE(lost_bytes >= 0);
  REQUIRE(cluster.SourceBytes() + static_cast<uint64_t>(lost_bytes) == total);

  // What losing rank 3 must cost: each of its files once, by the next rank
  // of its order, unless that rank already holds a copy it read itself.
  uint64_t expected = 0, lost_files = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    const std::vector<int> order = OrderOf(files[i].name, size);
    if (order[0] != lost) continue;
    ++lost_files;
    if (static_cast<int>(i % size) != order[1]) expected += files[i].size;
  }
  REQUIRE(lost_files > 0);
  const uint64_t before = cluster.SourceBytes();
  crashing.Kill();
  WaitUntilDown(cluster, 1);
  cluster.Settle();  // The new holders fetch what they took over.
  CHECK(cluster.SourceBytes() == before + expected);
  uint64_t adopted = 0;
  for (int r = 0; r < lost; ++r) adopted += cluster.peers[r]->GetStats().Get("remote.adopted_files");
  CHECK(adopted == lost_files);

  // Two more epochs over the survivors, in other shares: not one source read.
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (int r = 0; r < lost; ++r) {
      CHECK(ReadShare(*cluster.peers[r], files, (r + epoch) % lost, lost) == 0);
    }
  }
  CHECK(cluster.SourceBytes() == before + expected);
  for (int r = 0; r < lost; ++r) {
    const Stats s = cluster.peers[r]->GetStats();
    CHECK(s.Get("remote.peer_failures") == 1);
    CHECK(s.Get("remote.checksum_failures") == 0);
  }
}

TEST_CASE("peers: a peer that leaves cleanly is not adopted ahead of reads") {
  // At the end of a job every peer leaves: the last ones running must not
  // fetch the others' files for nothing.
  ScratchDir dir;
  const std::string dataset = dir.Sub("dataset");
  auto files = testing::MakeDataset(dataset, 32, {100 << 10});
  const uint64_t total = testing::TotalBytes(files);
  std::vector<Config> configs;
  for (int r = 0; r < 3; ++r) configs.push_back(PeerConfig(dataset, dir.Sub("rdv"), r, 3, 2 * total));
  Cluster cluster(configs);
  for (int r = 0; r < 3; ++r) CHECK(ReadShare(*cluster.peers[r], files, r, 3) == 0);
  cluster.Settle();
  REQUIRE(cluster.SourceBytes() == total);
  cluster.peers[2]->Shutdown(Monarch::ShutdownMode::kCancel);
  cluster.peers[2].reset();
  WaitUntilDown(cluster, 1);
  cluster.Settle();
  CHECK(cluster.SourceBytes() == total);
  for (int r = 0; r < 2; ++r) {
    CHECK(cluster.peers[r]->GetStats().Get("remote.adopted_files") == 0);
    CHECK(cluster.peers[r]->GetStats().Get("remote.peer_failures") == 0);
  }
  // Its files still move, a read at a time: every read exact.
  for (int r = 0; r < 2; ++r) CHECK(ReadShare(*cluster.peers[r], files, 0, 1) == 0);
}

TEST_CASE("peers: files taken over from a lost peer evict copies of other peers' files to fit") {
  ScratchDir dir;
  const std::string dataset = dir.Sub("dataset");
  auto files = testing::MakeDataset(dataset, 96, {60 << 10, 200 << 10, 90 << 10});
  const int size = 4, lost = 3;  // In a child process, killed.
  // Each tier holds what its rank keeps once rank 3 is gone, and no more:
  // the copies of other ranks' files it takes in epoch 1 fill that room.
  std::vector<uint64_t> keeps(size, 0);
  for (const TestFile& f : files) {
    const std::vector<int> order = OrderOf(f.name, size);
    keeps[order[0] != lost ? order[0] : order[1]] += Tier::MaxFootprint(f.size);
  }
  std::vector<Config> configs;
  for (int r = 0; r < size; ++r) {
    configs.push_back(PeerConfig(dataset, dir.Sub("rdv"), r, size, keeps[r] + (64 << 10)));
  }
  CrashablePeer crashing(configs[lost], files, lost, size);
  configs.pop_back();
  Cluster cluster(configs);
  for (int r = 0; r < lost; ++r) CHECK(ReadShare(*cluster.peers[r], files, r, size) == 0);
  cluster.Settle();
  REQUIRE(crashing.SourceBytes() >= 0);
  const uint64_t before = cluster.SourceBytes();
  crashing.Kill();
  WaitUntilDown(cluster, 1);
  cluster.Settle();
  uint64_t evictions = 0;
  for (auto& p : cluster.peers) evictions += p->GetStats().Get("evictions");
  CHECK(evictions > 0);  // Room made by evicting copies of files kept elsewhere.
  const uint64_t after_loss = cluster.SourceBytes();
  CHECK(after_loss > before);
  // Every file is now kept by a survivor: no epoch reads the source again.
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (int r = 0; r < lost; ++r) CHECK(ReadShare(*cluster.peers[r], files, (r + epoch) % lost, lost) == 0);
  }
  CHECK(cluster.SourceBytes() == after_loss);
}

TEST_CASE("peers: with two replicas, losing a peer costs no source read") {
  ScratchDir dir;
  const std::string dataset = dir.Sub("dataset");
  auto files = testing::MakeDataset(dataset, 64, {4096, 100 << 10, 700 << 10, 7});
  const uint64_t total = testing::TotalBytes(files);
  const int size = 4, lost = 3;  // In a child process, killed.
  std::vector<Config> configs;
  for (int r = 0; r < size; ++r) {
    configs.push_back(PeerConfig(dataset, dir.Sub("rdv"), r, size, 2 * total));
    configs.back().remote.replicas = 2;
  }
  CrashablePeer crashing(configs[lost], files, lost, size);
  configs.pop_back();
  Cluster cluster(configs);
  for (int r = 0; r < lost; ++r) CHECK(ReadShare(*cluster.peers[r], files, r, size) == 0);
  cluster.Settle();  // Second copies fetched from the homes.
  const int64_t lost_bytes = crashing.SourceBytes();
  REQUIRE(lost_bytes >= 0);
  CHECK(cluster.SourceBytes() + static_cast<uint64_t>(lost_bytes) == total);
  uint64_t replica_files = 0, lost_replicas = 0;
  for (auto& p : cluster.peers) replica_files += p->GetStats().Get("remote.replica_files");
  for (const TestFile& f : files) lost_replicas += OrderOf(f.name, size)[1] == lost;
  CHECK(replica_files + lost_replicas == files.size());  // One second holder per file.

  const uint64_t before = cluster.SourceBytes();
  crashing.Kill();
  WaitUntilDown(cluster, 1);
  cluster.Settle();  // What rank 3 held gets a new second holder, from the first.
  uint64_t adopted = 0;
  for (auto& p : cluster.peers) adopted += p->GetStats().Get("remote.adopted_files");
  CHECK(adopted > 0);
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (int r = 0; r < lost; ++r) CHECK(ReadShare(*cluster.peers[r], files, (r + epoch) % lost, lost) == 0);
  }
  CHECK(cluster.SourceBytes() == before);
}

TEST_CASE("peers: a peer that comes back rejoins without a restart of the others") {
  ScratchDir dir;
  const std::string dataset = dir.Sub("dataset");
  auto files = testing::MakeDataset(dataset, 24, {64 << 10, 300 << 10});
  std::vector<Config> configs;
  for (int r = 0; r < 2; ++r) {
    configs.push_back(PeerConfig(dataset, dir.Sub("rdv"), r, 2, 1 << 30));
    configs.back().placement.policy = PlacementPolicyKind::kNone;  // Every read asks a peer or the source.
    configs.back().remote.retry_after_seconds = 0.2;
  }
  Cluster cluster(configs);
  std::vector<std::string> homed_on_1;
  for (const TestFile& f : files) {
    if (OrderOf(f.name, 2)[0] == 1) homed_on_1.push_back(f.name);
  }
  REQUIRE(!homed_on_1.empty());
  std::vector<char> buffer(1 << 20);
  cluster.peers[1]->Shutdown(Monarch::ShutdownMode::kCancel);
  cluster.peers[1].reset();
  CHECK(ReadShare(*cluster.peers[0], files, 0, 1) == 0);  // Rank 0 alone: from the source.
  const uint64_t from_peers_alone = PeersTier(cluster.peers[0]->GetStats(), "bytes_read");

  // Rank 1 again: a new process, a new address in the rendezvous directory.
  absl::StatusOr<std::unique_ptr<Monarch>> back = Monarch::Create(configs[1]);
  REQUIRE_MESSAGE(back.ok(), back.status().ToString());
  cluster.peers[1] = std::move(*back);
  // Rank 0 tries it again after retry_after.
  CHECK(ReadUntilServedBy(*cluster.peers[0], *cluster.peers[1], files));
  CHECK(PeersTier(cluster.peers[0]->GetStats(), "bytes_read") > from_peers_alone);
}

TEST_CASE("peers: rank 0 killed and started again rejoins with the job's secret") {
  ScratchDir dir;
  const std::string dataset = dir.Sub("dataset");
  const std::string rdv = dir.Sub("rdv");
  auto files = testing::MakeDataset(dataset, 24, {64 << 10, 300 << 10});
  std::vector<Config> configs;
  for (int r = 0; r < 2; ++r) {
    configs.push_back(PeerConfig(dataset, rdv, r, 2, 1 << 30));
    configs.back().placement.policy = PlacementPolicyKind::kNone;  // Every read asks a peer or the source.
    configs.back().remote.retry_after_seconds = 0.2;
  }
  CrashablePeer crashing(configs[0], files, 0, 2);  // Rank 0, in a child process.
  Cluster cluster({configs[1]});
  Monarch& rank1 = *cluster.peers[0];
  CHECK(ReadShare(rank1, files, 1, 2) == 0);
  REQUIRE(crashing.SourceBytes() >= 0);
  absl::StatusOr<std::string> secret = ReadSmallFile(rdv + "/job.secret");
  REQUIRE(secret.ok());
  crashing.Kill();  // No shutdown: the secret stays where the launcher's restart finds it.
  WaitForCounter(rank1, "remote.peer_failures", 1);
  const uint64_t served_by_1 = rank1.GetStats().Get("remote.bytes_served");

  absl::StatusOr<std::unique_ptr<Monarch>> back = Monarch::Create(configs[0]);
  REQUIRE_MESSAGE(back.ok(), back.status().ToString());
  Monarch& rank0 = **back;
  CHECK(ReadSmallFile(rdv + "/job.secret").value() == *secret);
  // Rank 1 tries rank 0 again after retry_after, then is served by it.
  CHECK(ReadUntilServedBy(rank1, rank0, files));
  CHECK(ReadShare(rank0, files, 0, 1) == 0);  // And rank 0 is served by rank 1.
  CHECK(rank1.GetStats().Get("remote.bytes_served") > served_by_1);
  CHECK(rank0.GetStats().Get("remote.requests_unauthenticated") == 0);
  CHECK(rank1.GetStats().Get("remote.requests_unauthenticated") == 0);
}

TEST_CASE("peers: a peer that never arrives is a clear start-up error, not a hang") {
  ScratchDir dir;
  const std::string dataset = dir.Sub("dataset");
  testing::MakeDataset(dataset, 2, {4096});
  Config c = PeerConfig(dataset, dir.Sub("rdv"), 0, 3, 1 << 20);
  c.remote.rendezvous_timeout_seconds = 1;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<Monarch>> m = Monarch::Create(c);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE(!m.ok());
  CHECK(absl::IsDeadlineExceeded(m.status()));
  CHECK(m.status().message().find("ranks 1, 2 never arrived") != std::string::npos);
  CHECK(m.status().message().find("remote.rendezvous_timeout") != std::string::npos);
  CHECK(seconds < 5);
}

TEST_CASE("peers: rank and size errors name the key") {
  ScratchDir dir;
  const std::string dataset = dir.Sub("dataset");
  testing::MakeDataset(dataset, 2, {4096});
  Config c = PeerConfig(dataset, dir.Sub("rdv"), 3, 2, 1 << 20);
  absl::StatusOr<std::unique_ptr<Monarch>> m = Monarch::Create(c);
  REQUIRE(!m.ok());
  CHECK(m.status().message().find("remote.rank: expected 0 to 1") != std::string::npos);

  c.remote.rank = "env:MONARCH_TEST_NO_SUCH_VARIABLE";
  m = Monarch::Create(c);
  REQUIRE(!m.ok());
  CHECK(m.status().message().find("remote.rank") != std::string::npos);
  CHECK(m.status().message().find("MONARCH_TEST_NO_SUCH_VARIABLE") != std::string::npos);

  c.remote.rank = "0";
  c.remote.rendezvous_dir = dir.path() + "/${MONARCH_TEST_NO_SUCH_VARIABLE}";
  m = Monarch::Create(c);
  REQUIRE(!m.ok());
  CHECK(m.status().message().find("remote.rendezvous_dir") != std::string::npos);

  c.remote.rendezvous_dir = dir.path() + "/rdv";
  c.remote.transports = "no_such_transport";
  c.remote.size = "1";  // Alone: starts without UCX, nothing to check.
  CHECK(Monarch::Create(c).ok());
}

TEST_CASE("remote config: bad values are refused with the key and what was expected") {
  ScratchDir dir;
  const std::string dataset = dir.Sub("dataset");
  const std::string head = "dataset: {path: " + dataset + "}\ntiers: [{kind: source}]\n";
  struct Case {
    std::string remote;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"remote: {enabled: maybe}", "remote.enabled: expected true or false, got 'maybe'"},
      {"remote: {enabled: true, rank: -1, rendezvous_dir: /tmp}",
       "remote.rank: expected an integer, 'auto' or 'env:VARIABLE', got '-1'"},
      {"remote: {enabled: true, size: lots, rendezvous_dir: /tmp}", "remote.size: expected"},
      {"remote: {enabled: true, size: 0, rendezvous_dir: /tmp}",
       "remote.size: expected at least 1"},
      {"remote: {enabled: true, bootstrap: pmi, rendezvous_dir: /tmp}",
       "remote.bootstrap: expected 'directory' or 'mpi', got 'pmi'"},
      {"remote: {enabled: true}", "remote.rendezvous_dir: required"},
      {"remote: {enabled: true, rendezvous_dir: rdv}",
       "remote.rendezvous_dir: expected an absolute path"},
      {"remote: {enabled: true, rendezvous_dir: /tmp, transports: 'tcp;rm'}",
       "remote.transports: expected a UCX transport list"},
      {"remote: {enabled: true, rendezvous_dir: /tmp, buffer_size: lots}",
       "remote.buffer_size: expected 'auto' or a size"},
      {"remote: {enabled: true, rendezvous_dir: /tmp, chunk_size: 1000}",
       "remote.chunk_size: expected a multiple of 4KiB"},
      {"remote: {enabled: true, rendezvous_dir: /tmp, request_timeout: 0s}",
       "remote.request_timeout: expected a duration such as 30s"},
      {"remote: {enabled: true, rendezvous_dir: /tmp, retry_after: soon}",
       "remote.retry_after: expected a duration"},
      {"remote: {enabled: true, rendezvous_dir: /tmp, peers: 4}", "remote.peers: unknown key"},
      {"remote: [1, 2]", "remote: expected a mapping"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Config> parsed = ParseConfigString(head + c.remote);
    REQUIRE_MESSAGE(!parsed.ok(), c.remote);
    CHECK_MESSAGE(parsed.status().message().find(c.message) != std::string::npos,
                  parsed.status().message());
  }
  absl::StatusOr<Config> good = ParseConfigString(
      head +
      "remote: {enabled: true, rank: env:MY_RANK, size: auto, rendezvous_dir: '/x/${JOB}', "
      "rendezvous_timeout: 2m, transports: 'rc,ud,sm', buffer_size: auto, chunk_size: 512KiB, "
      "request_timeout: 1500ms, retry_after: 10}");
  REQUIRE_MESSAGE(good.ok(), good.status().ToString());
  CHECK(good->remote.rank == "env:MY_RANK");
  CHECK(good->remote.rendezvous_timeout_seconds == doctest::Approx(120));
  CHECK(good->remote.request_timeout_seconds == doctest::Approx(1.5));
  CHECK(good->remote.retry_after_seconds == doctest::Approx(10));
  CHECK(good->remote.chunk_bytes == 512 << 10);
  CHECK(good->remote.buffer_bytes == 0);
}

TEST_CASE("rendezvous hashing: even shares, and a departing peer moves only its own files") {
  const int files = 20000;
  std::vector<int> share(4, 0);
  int moved = 0, moved_elsewhere = 0;
  for (int i = 0; i < files; ++i) {
    const uint64_t h = StableNameHash("train/n" + std::to_string(i) + ".JPEG");
    const int home4 = HomeRank(h, 4);
    const int home3 = HomeRank(h, 3);
    ++share[home4];
    if (home4 != home3) {
      ++moved;
      if (home4 != 3) ++moved_elsewhere;
    }
  }
  for (int s : share) CHECK(std::abs(s - files / 4) < files / 20);  // Within 20% of even.
  CHECK(moved == share[3]);     // Exactly rank 3's files moved...
  CHECK(moved_elsewhere == 0);  // ...and nobody else's.
  // Stable across processes and builds: a fixed value.
  CHECK(StableNameHash("a/b.rec") == StableNameHash(std::string("a/b.rec")));
  CHECK(HomeRank(StableNameHash("x"), 1) == 0);
}

TEST_CASE("crc32c: a copy's CRC is the bytes' and pieces' CRCs concatenate") {
  std::vector<char> data((1 << 20) + 64);
  std::mt19937_64 rng(7);
  for (char& c : data) c = static_cast<char>(rng());
  std::vector<char> copy(data.size());
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{4095}, size_t{4096}, size_t{3 * 1360 + 17},
                   size_t{1 << 20}}) {
    for (size_t align : {size_t{0}, size_t{3}}) {
      CAPTURE(n);
      CAPTURE(align);
      std::fill(copy.begin(), copy.end(), 0);
      CHECK(Crc32cCopy(copy.data() + align, data.data() + 1, n) == Crc32c(data.data() + 1, n));
      CHECK(std::equal(copy.begin() + align, copy.begin() + align + n, data.begin() + 1));
      CHECK(copy[align + n] == 0);  // Nothing written past the end.
    }
  }
  // The CRC of A B from the CRCs of A and B: whole 4 KiB blocks and odd cuts.
  for (size_t cut : {size_t{0}, size_t{1}, size_t{4096}, size_t{100000}}) {
    for (size_t tail : {size_t{0}, size_t{17}, size_t{4096}, size_t{70000}}) {
      CAPTURE(cut);
      CAPTURE(tail);
      CHECK(Crc32cConcat(Crc32c(data.data(), cut), Crc32c(data.data() + cut, tail), tail) ==
            Crc32c(data.data(), cut + tail));
    }
  }
  const uint32_t sum = Crc32c(data.data(), 1 << 20);
  copy.assign(data.begin(), data.end());
  copy[12345] ^= 0x10;
  CHECK(Crc32c(copy.data(), 1 << 20) != sum);
  copy[12345] ^= 0x10;
  std::swap_ranges(copy.begin(), copy.begin() + 8, copy.begin() + 64);
  CHECK(Crc32c(copy.data(), 1 << 20) != sum);
  CHECK(Crc32c(data.data(), (1 << 20) - 1) != sum);
}

TEST_CASE("RAM tier of a home: a whole-block range's CRC comes from the copy's block sums") {
  const FileRef file{0, "a.bin", 3 * 4096 + 100, 1};
  std::vector<char> data(file.size + 4096);  // Readable up to a whole block.
  std::mt19937_64 rng(11);
  for (char& c : data) c = static_cast<char>(rng());
  for (const bool keep : {true, false}) {
    CAPTURE(keep);
    RamTierOptions options;
    options.keep_block_sums = keep;
    absl::StatusOr<std::unique_ptr<StorageDriver>> made = NewRamDriver("sums", 1 << 20, 2, options);
    REQUIRE(made.ok());
    StorageDriver& ram = **made;
    SharedCopies& shared = *ram.capabilities().shared;
    {
      auto writer = ram.NewWriter(file);
      REQUIRE(writer.ok());
      // Out of order, as a reader and a placement thread may write them.
      REQUIRE((*writer)->Write(8192, data.data() + 8192, file.size - 8192).ok());
      REQUIRE((*writer)->Write(0, data.data(), 8192).ok());
      REQUIRE((*writer)->Commit(SourceIdentity{}).ok());
    }
    auto crc_of = [&](uint64_t offset, size_t n) -> std::optional<uint32_t> {
      std::optional<uint32_t> seen;
      const char* bytes = nullptr;
      absl::Status visited = shared.VisitInMemory(file, offset, n, [&](const auto& shown) {
        bytes = shown.data;
        seen = shown.crc32c;
      });
      REQUIRE_MESSAGE(visited.ok(), visited.ToString());
      CHECK(std::equal(bytes, bytes + n, data.begin() + offset));
      return seen;
    };
    if (keep) {
      CHECK(crc_of(0, file.size) == Crc32c(data.data(), file.size));
      CHECK(crc_of(4096, 8192) == Crc32c(data.data() + 4096, 8192));
      CHECK(crc_of(8192, file.size - 8192) == Crc32c(data.data() + 8192, file.size - 8192));
      CHECK(crc_of(3 * 4096, 100) == Crc32c(data.data() + 3 * 4096, 100));
    }
    // Not whole blocks: no CRC, the sender computes it.
    CHECK(crc_of(100, 4096) == std::nullopt);
    CHECK(crc_of(0, 5000) == std::nullopt);
    if (!keep) CHECK(crc_of(0, file.size) == std::nullopt);
    // Removed: no bytes, no CRC; a new copy has its own sums.
    REQUIRE(ram.Remove(file).ok());
    CHECK(absl::IsNotFound(shared.VisitInMemory(file, 0, 4096, [](const auto&) {})));
    std::vector<char> other(data.size(), 'x');
    auto writer = ram.NewWriter(file);
    REQUIRE(writer.ok());
    REQUIRE((*writer)->Write(0, other.data(), file.size).ok());
    REQUIRE((*writer)->Commit(SourceIdentity{}).ok());
    std::optional<uint32_t> again;
    REQUIRE(shared.VisitInMemory(file, 0, file.size, [&](const auto& shown) { again = shown.crc32c; })
                .ok());
    CHECK(again == (keep ? std::optional<uint32_t>(Crc32c(other.data(), file.size)) : std::nullopt));
    // A writer that leaves a block half written keeps no sums.
    const FileRef odd{1, "b.bin", 3 * 4096, 1};
    auto odd_writer = ram.NewWriter(odd);
    REQUIRE(odd_writer.ok());
    REQUIRE((*odd_writer)->Write(0, data.data(), 5000).ok());
    REQUIRE((*odd_writer)->Write(8192, data.data() + 8192, odd.size - 8192).ok());
    REQUIRE((*odd_writer)->Commit(SourceIdentity{}).ok());
    std::optional<uint32_t> none = 1;
    REQUIRE(shared.VisitInMemory(odd, 0, odd.size, [&](const auto& shown) { none = shown.crc32c; }).ok());
    CHECK(none == std::nullopt);
  }
}

TEST_CASE("bootstrap: environment expansion and rank variables") {
  ::setenv("MONARCH_TEST_JOB", "1234", 1);
  absl::StatusOr<std::string> path =
      ExpandEnvironment("/scratch/rdv/${MONARCH_TEST_JOB}/x$MONARCH_TEST_JOB", "k");
  REQUIRE(path.ok());
  CHECK(*path == "/scratch/rdv/1234/x1234");
  CHECK(!ExpandEnvironment("/a/${UNTERMINATED", "k").ok());
  ::setenv("MONARCH_TEST_RANK", "3", 1);
  CHECK(*ResolveRankSpec("env:MONARCH_TEST_RANK", "remote.rank", {}) == 3);
  CHECK(*ResolveRankSpec("auto", "remote.rank", {"MONARCH_TEST_NOPE", "MONARCH_TEST_RANK"}) == 3);
  ::setenv("MONARCH_TEST_RANK", "three", 1);
  absl::StatusOr<int> bad = ResolveRankSpec("env:MONARCH_TEST_RANK", "remote.rank", {});
  REQUIRE(!bad.ok());
  CHECK(bad.status().message().find("'three' is not a non-negative integer") != std::string::npos);
}

// ---- Job identity: the secret every peer request carries ----

// The mode bits of `path` (lstat: a symlink is not what was written), or -1.
int ModeOf(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return -1;
  return static_cast<int>(st.st_mode & 07777) | (S_ISREG(st.st_mode) ? 0100000 : 0) |
         (S_ISDIR(st.st_mode) ? 040000 : 0);
}

std::string SecretOrDie() {
  absl::StatusOr<std::string> secret = NewJobSecret();
  REQUIRE_MESSAGE(secret.ok(), secret.status().ToString());
  return *secret;
}

// A bare PeerNetwork of a `size`-rank job (2 unless set) meeting through
// `rendezvous`, whose requests carry `secret`; `serve` fills with a byte
// pattern and counts.
struct BareRank {
  std::atomic<int> served{0};
  std::unique_ptr<PeerNetwork> network;
  absl::Status status;
  size_t buffer_bytes = 64 << 10;
  int size = 2;
  double retry_after_seconds = 60;
  std::function<absl::StatusOr<std::string>(int rank)> lookup_address;
  // Set: requests are served from these bytes "in memory", with their
  // CRC given (as a RAM copy's block sums give it), XORed with `crc_error`.
  std::vector<char> memory;
  uint32_t crc_error = 0;

  void Start(int rank, const std::string& rendezvous, const std::string& secret,
             const std::string& fingerprint, bool serve_now = true) {
    PeerNetwork::Options options;
    options.rank = rank;
    options.size = size;
    options.buffer_bytes = buffer_bytes;
    options.chunk_bytes = buffer_bytes;
    options.request_timeout_seconds = 5;
    options.retry_after_seconds = retry_after_seconds;
    options.lookup_address = lookup_address;
    options.secret = [secret] { return absl::StatusOr<std::string>(secret); };
    auto serve = [this](const PeerNetwork::FileRequest& request, char* staging,
                        PeerNetwork::TakeFn take) -> absl::Status {
      if (!memory.empty()) {
        served.fetch_add(1);
        const char* bytes = memory.data() + request.offset;
        take(bytes, Crc32c(bytes, request.length) ^ crc_error);
        return absl::OkStatus();
      }
      if (staging == nullptr) return absl::UnavailableError("nothing in memory here");
      served.fetch_add(1);
      for (size_t i = 0; i < request.length; ++i) staging[i] = static_cast<char>(request.offset + i);
      take(staging, std::nullopt);
      return absl::OkStatus();
    };
    absl::StatusOr<std::unique_ptr<PeerNetwork>> made = PeerNetwork::Start(
        options,
        [&](const std::string& mine) {
          return ExchangeThroughDirectory(rendezvous, rank, size, mine, 30, fingerprint);
        },
        serve);
    status = made.status();
    if (made.ok()) network = std::move(*made);
    if (made.ok() && serve_now) network->StartServing();
  }
  uint64_t Counter(std::string_view name) const {
    Stats stats;
    CounterSink sink(&stats);
    network->ReportCounters(sink);
    return stats.Get(name);
  }
};

TEST_CASE("job secret: 32 random bytes, 0600 in a directory created 0700, no temporary left") {
  ScratchDir dir;
  const std::string rdv = dir.path() + "/job/rdv";  // Neither exists yet.
  const std::string secret = SecretOrDie();
  CHECK(secret.size() == kJobSecretBytes);
  CHECK(SecretOrDie() != secret);
  const std::string fingerprint = JobSecretFingerprint(secret);
  CHECK(fingerprint.size() == 16);
  CHECK(fingerprint == JobSecretFingerprint(std::string(secret)));
  CHECK(fingerprint != JobSecretFingerprint(SecretOrDie()));

  REQUIRE(PublishJobSecret(rdv, secret).ok());
  CHECK(ModeOf(rdv) == (040000 | 0700));
  CHECK(ModeOf(rdv + "/job.secret") == (0100000 | 0600));
  std::vector<std::string> entries;
  for (const auto& entry : std::filesystem::directory_iterator(rdv))
    entries.push_back(entry.path().filename().string());
  CHECK(entries == std::vector<std::string>{"job.secret"});
  absl::StatusOr<std::string> read = ReadJobSecret(rdv, fingerprint, 5);
  REQUIRE_MESSAGE(read.ok(), read.status().ToString());
  CHECK(*read == secret);

  // A second job's rank 0 replaces it whole, still 0600.
  const std::string next = SecretOrDie();
  REQUIRE(PublishJobSecret(rdv, next).ok());
  CHECK(ModeOf(rdv + "/job.secret") == (0100000 | 0600));
  CHECK(*ReadJobSecret(rdv, JobSecretFingerprint(next), 5) == next);

  absl::Status bad = PublishJobSecret(rdv, "too short");
  CHECK(absl::IsInvalidArgument(bad));
  RemoveJobSecret(rdv);
  CHECK(ModeOf(rdv + "/job.secret") == -1);
  absl::StatusOr<std::string> gone = ReadJobSecret(rdv, JobSecretFingerprint(next), 0.1);
  CHECK(absl::IsFailedPrecondition(gone.status()));
  CHECK(gone.status().message().find("remote.rendezvous_timeout") != std::string::npos);
}

TEST_CASE("job secret: a restarted rank 0 takes only a secret this user left, 0600") {
  ScratchDir dir;
  const std::string rdv = dir.Sub("rdv");
  const std::string path = rdv + "/job.secret";
  CHECK(absl::IsNotFound(ReadLeftJobSecret(rdv).status()));  // None left.
  const std::string secret = SecretOrDie();
  REQUIRE(PublishJobSecret(rdv, secret).ok());
  absl::StatusOr<std::string> left = ReadLeftJobSecret(rdv);
  REQUIRE_MESSAGE(left.ok(), left.status().ToString());
  CHECK(*left == secret);

  REQUIRE(::chmod(path.c_str(), 0640) == 0);  // Readable by the group: not taken.
  CHECK(absl::IsNotFound(ReadLeftJobSecret(rdv).status()));
  REQUIRE(::chmod(path.c_str(), 0600) == 0);
  REQUIRE(::truncate(path.c_str(), kJobSecretBytes - 1) == 0);  // Cut short.
  CHECK(absl::IsNotFound(ReadLeftJobSecret(rdv).status()));
  REQUIRE(PublishJobSecret(rdv, secret).ok());
  if (::geteuid() == 0) {  // Root can give it to another user.
    REQUIRE(::chown(path.c_str(), 65534, 65534) == 0);
    CHECK(absl::IsNotFound(ReadLeftJobSecret(rdv).status()));
  }
  REQUIRE(::unlink(path.c_str()) == 0);
  REQUIRE(PublishJobSecret(dir.Sub("elsewhere"), secret).ok());
  REQUIRE(::symlink((dir.path() + "/elsewhere/job.secret").c_str(), path.c_str()) == 0);
  CHECK(!ReadLeftJobSecret(rdv).ok());  // A symbolic link is not followed.
}

TEST_CASE("job secret: a stale secret left by an earlier job is never adopted") {
  ScratchDir dir;
  const std::string rdv = dir.Sub("rdv");
  const std::string stale = SecretOrDie(), fresh = SecretOrDie();
  REQUIRE(PublishJobSecret(rdv, stale).ok());  // The earlier job crashed and left it.

  // Rank 0's address file names the fresh one: the stale one is refused
  // until the timeout, with an error that says why.
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::string> got = ReadJobSecret(rdv, JobSecretFingerprint(fresh), 0.3);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE(!got.ok());
  CHECK(absl::IsFailedPrecondition(got.status()));
  CHECK(got.status().message().find("left by an earlier job") != std::string::npos);
  CHECK(waited >= 0.3);

  // It is read again until the fresh one is there (a PFS's cache may show
  // the old file a little longer), then that one is returned.
  std::thread rank0([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CHECK(PublishJobSecret(rdv, fresh).ok());
  });
  got = ReadJobSecret(rdv, JobSecretFingerprint(fresh), 10);
  rank0.join();
  REQUIRE_MESSAGE(got.ok(), got.status().ToString());
  CHECK(*got == fresh);

  // An address file without a fingerprint names no secret at all.
  CHECK(absl::IsFailedPrecondition(ReadJobSecret(rdv, "", 10).status()));
}

TEST_CASE("bootstrap: rank 0's address file carries the secret's fingerprint to the others") {
  ScratchDir dir;
  const std::string rdv = dir.path() + "/rdv";
  const std::string fingerprint = JobSecretFingerprint(SecretOrDie());
  absl::StatusOr<std::vector<std::string>> at0, at1;
  std::string seen_by_1 = "unset";
  std::thread rank0([&] { at0 = ExchangeThroughDirectory(rdv, 0, 2, "zero", 10, fingerprint); });
  std::thread rank1(
      [&] { at1 = ExchangeThroughDirectory(rdv, 1, 2, "one\n\x01", 10, "", &seen_by_1); });
  rank0.join();
  rank1.join();
  REQUIRE_MESSAGE(at0.ok(), at0.status().ToString());
  REQUIRE_MESSAGE(at1.ok(), at1.status().ToString());
  CHECK(*at0 == std::vector<std::string>{"zero", "one\n\x01"});
  CHECK(*at1 == *at0);
  CHECK(seen_by_1 == fingerprint);
  CHECK(ModeOf(rdv) == (040000 | 0700));  // Whichever rank made it.

  // A file of the earlier format (no fingerprint line) is refused at once.
  const std::string old = dir.Sub("old");
  REQUIRE(WriteSmallFile(old + "/rank-1.addr",
                         "monarch-rendezvous-v1\n2\nhost pid 1 rank 1\n\nb25l\n")
              .ok());
  absl::StatusOr<std::vector<std::string>> mixed =
      ExchangeThroughDirectory(old, 0, 2, "zero", 10, fingerprint);
  REQUIRE(!mixed.ok());
  CHECK(mixed.status().message().find("not a Monarch rendezvous file of this version") !=
        std::string::npos);
}

TEST_CASE("peer wire: the job secret is compared whole, and a header without it is refused") {
  peer_wire::RequestHeader header{peer_wire::kProtocol, 1, 7, 0, 4096, 4096, 1, {}};
  const std::string secret = SecretOrDie();
  std::memcpy(header.secret, secret.data(), sizeof(header.secret));
  CHECK(peer_wire::CarriesSecret(header, secret));
  for (size_t i = 0; i < sizeof(header.secret); ++i) {
    std::string other = secret;
    other[i] ^= 0x01;
    CHECK_MESSAGE(!peer_wire::CarriesSecret(header, other), "byte ", i);
  }
  CHECK(!peer_wire::CarriesSecret(header, secret.substr(0, 31)));
  CHECK(!peer_wire::CarriesSecret(header, secret + "x"));
  CHECK(!peer_wire::CarriesSecret(header, ""));
  const std::string bytes(reinterpret_cast<const char*>(&header), sizeof(header));
  CHECK(peer_wire::DecodeRequestHeader(bytes, 0, 2).ok());
  // The previous format (48 bytes, "MON1", no secret): dropped as malformed.
  CHECK(absl::IsInvalidArgument(peer_wire::DecodeRequestHeader(bytes.substr(0, 48), 0, 2).status()));
  peer_wire::RequestHeader old = header;
  old.protocol = 0x4d4f4e31;
  CHECK(absl::IsInvalidArgument(
      peer_wire::DecodeRequestHeader(
          absl::string_view(reinterpret_cast<const char*>(&old), sizeof(old)), 0, 2)
          .status()));
}

TEST_CASE("peer network: served with the job's secret, refused and counted with another") {
  for (const bool same : {true, false}) {
    CAPTURE(same);
    ScratchDir dir;
    const std::string rdv = dir.path() + "/rdv";
    const std::string secret = SecretOrDie();
    BareRank ranks[2];
    std::thread rank1([&] { ranks[1].Start(1, rdv, same ? secret : SecretOrDie(), ""); });
    ranks[0].Start(0, rdv, secret, JobSecretFingerprint(secret));
    rank1.join();
    REQUIRE_MESSAGE(ranks[0].status.ok(), ranks[0].status.ToString());
    REQUIRE_MESSAGE(ranks[1].status.ok(), ranks[1].status.ToString());
    std::vector<char> buffer(60000);  // One piece: one request per fetch.
    const FileRef file{0, "train/a.jpg", buffer.size() + 1000, 1};
    std::vector<absl::StatusOr<size_t>> fetched;
    for (int k = 0; k < 3; ++k) {
      fetched.push_back(ranks[0].network->Fetch(1, file, 1000, buffer.data(), buffer.size()));
      if (same && fetched.back().ok()) CHECK(buffer[5] == static_cast<char>(1005));
    }
    CHECK(ranks[0].network->IsUp(1));  // A refusal is not a failure of the peer.
    CHECK(ranks[1].served.load() == (same ? 3 : 0));
    CHECK(ranks[1].Counter("remote.requests_unauthenticated") == (same ? 0 : 3));
    CHECK(ranks[0].Counter("remote.requests_unauthenticated") == 0);
    // Statuses made on a progress thread are read once it has stopped:
    // Abseil's (uninstrumented) reference count is invisible to TSan.
    for (BareRank& r : ranks) r.network->Shutdown(DeadlineIn(10));
    for (const absl::StatusOr<size_t>& got : fetched) {
      if (same) {
        CHECK_MESSAGE(got.ok(), got.status().ToString());
      } else {
        CHECK(absl::IsUnavailable(got.status()));
        CHECK(got.status().message().find("UNAUTHENTICATED") != std::string::npos);
      }
    }
  }
}

TEST_CASE("peer network: a lost peer's address is looked up by the fetching thread, never the progress thread") {
  ScratchDir dir;
  const std::string rdv = dir.path() + "/rdv";
  const std::string secret = SecretOrDie();
  BareRank ranks[3];
  // Rank 0 looks rank 2 up again on a file system that hangs until told.
  Mutex mu;
  bool looking = false, released = false;
  CondVar changed;
  ranks[0].lookup_address = [&](int rank) -> absl::StatusOr<std::string> {
    MutexLock lock(&mu);
    looking = true;
    changed.SignalAll();
    while (!released) changed.Wait(&mu);
    return absl::NotFoundError(absl::StrCat("no address for rank ", rank));
  };
  ranks[0].retry_after_seconds = 0.1;
  std::vector<std::thread> starting;
  for (int r = 0; r < 3; ++r) {
    ranks[r].size = 3;
    starting.emplace_back([&, r] {
      ranks[r].Start(r, rdv, secret, r == 0 ? JobSecretFingerprint(secret) : "");
    });
  }
  for (std::thread& t : starting) t.join();
  for (BareRank& r : ranks) REQUIRE_MESSAGE(r.status.ok(), r.status.ToString());
  std::vector<char> buffer(60000);
  const FileRef file{0, "train/a.jpg", buffer.size(), 1};
  REQUIRE(ranks[0].network->Fetch(2, file, 0, buffer.data(), buffer.size()).ok());

  ranks[2].network->Shutdown(DeadlineIn(10));  // Rank 2 leaves: rank 0 marks it down.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (ranks[0].network->IsUp(2) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  REQUIRE(!ranks[0].network->IsUp(2));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // Past retry_after.
  absl::StatusOr<size_t> retried;
  std::thread retrying([&] {
    retried = ranks[0].network->Fetch(2, file, 0, buffer.data(), buffer.size());
  });
  {
    MutexLock lock(&mu);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!looking && changed.WaitUntil(&mu, give_up)) {
    }
    CHECK(looking);
  }
  // While that lookup hangs, rank 1 still answers rank 0 at once.
  std::vector<char> other(60000);
  absl::StatusOr<size_t> fetched = ranks[0].network->Fetch(1, file, 0, other.data(), other.size());
  {
    MutexLock lock(&mu);
    released = true;
    changed.SignalAll();
  }
  retrying.join();
  CHECK(ranks[1].served.load() == 1);
  for (BareRank& r : ranks) r.network->Shutdown(DeadlineIn(10));
  CHECK_MESSAGE(fetched.ok(), fetched.status().ToString());
  CHECK(other[5] == static_cast<char>(5));
  CHECK(!retried.ok());  // No address: rank 2 stays down, and the reader reads the source.
}

// Ranks 0 and 1 meet in `rdv`; rank 1 holds every request it gets until its
// StartServing() (a peer still starting, or up but silent).
void StartPairHoldingRequests(BareRank (&ranks)[2], const std::string& rdv,
                              const std::string& secret) {
  std::thread rank1([&] { ranks[1].Start(1, rdv, secret, "", /*serve_now=*/false); });
  ranks[0].Start(0, rdv, secret, JobSecretFingerprint(secret));
  rank1.join();
  REQUIRE_MESSAGE(ranks[0].status.ok(), ranks[0].status.ToString());
  REQUIRE_MESSAGE(ranks[1].status.ok(), ranks[1].status.ToString());
}

TEST_CASE("peer network: a request that comes before its peer serves waits, then gets its bytes") {
  ScratchDir dir;
  const std::string rdv = dir.path() + "/rdv";
  const std::string secret = SecretOrDie();
  BareRank ranks[2];
  StartPairHoldingRequests(ranks, rdv, secret);
  std::vector<char> buffer(60000);
  const FileRef file{0, "train/a.jpg", buffer.size() + 1000, 1};
  std::atomic<bool> fetched{false};
  absl::StatusOr<size_t> got;
  std::thread reader([&] {
    got = ranks[0].network->Fetch(1, file, 1000, buffer.data(), buffer.size());
    fetched.store(true);
  });
  REQUIRE(testing::Eventually([&] { return ranks[1].Counter("remote.requests_held") == 1; }));
  CHECK(!fetched.load());  // Held: neither served nor refused.
  CHECK(ranks[1].served.load() == 0);
  ranks[1].network->StartServing();
  reader.join();
  CHECK(ranks[1].served.load() == 1);
  CHECK(buffer[5] == static_cast<char>(1005));
  CHECK(ranks[0].network->IsUp(1));
  for (BareRank& r : ranks) r.network->Shutdown(DeadlineIn(10));
  CHECK_MESSAGE(got.ok(), got.status().ToString());

  // Held when it shuts down instead: refused, so the reader goes to the source.
  ScratchDir dir2;
  const std::string rdv2 = dir2.path() + "/rdv";
  BareRank again[2];
  StartPairHoldingRequests(again, rdv2, secret);
  std::thread refused([&] {
    got = again[0].network->Fetch(1, file, 1000, buffer.data(), buffer.size());
  });
  REQUIRE(testing::Eventually([&] { return again[1].Counter("remote.requests_held") == 1; }));
  again[1].network->Shutdown(DeadlineIn(10));
  refused.join();
  again[0].network->Shutdown(DeadlineIn(10));
  CHECK(again[1].served.load() == 0);
  CHECK(absl::IsUnavailable(got.status()));
}

TEST_CASE("peer network: shutting down cuts short a fetch waiting on a peer that does not answer") {
  // Rank 1 holds every request (it never starts serving): a peer that is up
  // but silent. Rank 0's fetch would wait for the request timeout (5 s
  // here, 10 s by default); shutdown must not.
  ScratchDir dir;
  const std::string rdv = dir.path() + "/rdv";
  const std::string secret = SecretOrDie();
  BareRank ranks[2];
  StartPairHoldingRequests(ranks, rdv, secret);
  std::vector<char> buffer(60000);
  const FileRef file{0, "train/a.jpg", buffer.size() + 1000, 1};
  std::atomic<bool> fetched{false};
  absl::StatusOr<size_t> got;
  std::thread reader([&] {
    got = ranks[0].network->Fetch(1, file, 1000, buffer.data(), buffer.size());
    fetched.store(true);
  });
  REQUIRE(testing::Eventually([&] { return ranks[1].Counter("remote.requests_held") == 1; }));
  REQUIRE_FALSE(fetched.load());
  const auto start = std::chrono::steady_clock::now();
  ranks[0].network->CancelFetches();
  while (!fetched.load() && std::chrono::steady_clock::now() - start < std::chrono::seconds(4)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK_MESSAGE(fetched.load(), "the fetch still waits ", seconds, " s after CancelFetches");
  reader.join();
  CHECK(seconds < 1);
  // Later fetches fail at once; the peer is not marked down for it.
  const auto again = std::chrono::steady_clock::now();
  absl::StatusOr<size_t> later = ranks[0].network->Fetch(1, file, 1000, buffer.data(), buffer.size());
  CHECK(std::chrono::steady_clock::now() - again < std::chrono::seconds(1));
  CHECK(ranks[0].network->IsUp(1));
  CHECK(ranks[0].Counter("remote.timeouts") == 0);
  for (BareRank& r : ranks) CHECK(r.network->Shutdown(DeadlineIn(10)));
  CHECK(absl::IsUnavailable(got.status()));
  CHECK(absl::IsUnavailable(later.status()));
}

TEST_CASE("peer network: bytes sent with a known CRC arrive exact, a wrong CRC is refused and counted") {
  // 64 KiB pieces come eagerly, straight into the caller's buffer; 1 MiB
  // ones by rendezvous into a receive buffer, checked as they are copied.
  for (const size_t piece : {size_t{64} << 10, size_t{1} << 20}) {
    CAPTURE(piece);
    ScratchDir dir;
    const std::string rdv = dir.path() + "/rdv";
    const std::string secret = SecretOrDie();
    BareRank ranks[2];
    ranks[1].buffer_bytes = ranks[0].buffer_bytes = piece;
    ranks[1].memory.resize(2 * piece);
    std::mt19937_64 rng(piece);
    for (char& c : ranks[1].memory) c = static_cast<char>(rng());
    std::thread rank1([&] { ranks[1].Start(1, rdv, secret, ""); });
    ranks[0].Start(0, rdv, secret, JobSecretFingerprint(secret));
    rank1.join();
    REQUIRE_MESSAGE(ranks[0].status.ok(), ranks[0].status.ToString());
    REQUIRE_MESSAGE(ranks[1].status.ok(), ranks[1].status.ToString());
    const FileRef file{0, "train/a.bin", 2 * piece, 1};
    std::vector<char> buffer(2 * piece);
    absl::StatusOr<size_t> good = ranks[0].network->Fetch(1, file, 0, buffer.data(), buffer.size());
    const bool exact = buffer == ranks[1].memory;
    ranks[1].crc_error = 1;  // One bit of the CRC wrong, as if the bytes changed.
    std::fill(buffer.begin(), buffer.end(), 0);
    absl::StatusOr<size_t> bad = ranks[0].network->Fetch(1, file, 0, buffer.data(), piece);
    CHECK(ranks[0].Counter("remote.checksum_failures") == 1);
    CHECK(ranks[0].network->IsUp(1));
    for (BareRank& r : ranks) r.network->Shutdown(DeadlineIn(10));
    CHECK_MESSAGE(good.ok(), good.status().ToString());
    CHECK(exact);
    CHECK(absl::IsDataLoss(bad.status()));
  }
}

TEST_CASE("peer network: a secret missing or of another size is a start-up error") {
  PeerNetwork::Options options;
  options.rank = 0;
  options.size = 2;
  auto exchange = [](const std::string& mine) {
    return absl::StatusOr<std::vector<std::string>>(std::vector<std::string>{mine, mine});
  };
  auto serve = [](const PeerNetwork::FileRequest&, char*, PeerNetwork::TakeFn) {
    return absl::OkStatus();
  };
  absl::StatusOr<std::unique_ptr<PeerNetwork>> made = PeerNetwork::Start(options, exchange, serve);
  REQUIRE(!made.ok());
  CHECK(absl::IsInvalidArgument(made.status()));
  CHECK(made.status().message().find("no job secret") != std::string::npos);
  options.secret = [] { return absl::StatusOr<std::string>("short"); };
  made = PeerNetwork::Start(options, exchange, serve);
  REQUIRE(!made.ok());
  CHECK(made.status().message().find("5 bytes, not 32") != std::string::npos);
  options.secret = [] { return absl::StatusOr<std::string>(absl::DeadlineExceededError("late")); };
  made = PeerNetwork::Start(options, exchange, serve);
  CHECK(absl::IsDeadlineExceeded(made.status()));
}

TEST_CASE("peers: requests without the job secret are refused and counted, reads get exact bytes from the source") {
  ScratchDir dir;
  const std::string dataset = dir.Sub("dataset");
  auto files = testing::MakeDataset(dataset, 16, {64 << 10, 4096, 300 << 10});
  const std::string rdv = dir.path() + "/rdv";
  // Rank 0 is a Monarch instance and makes the job's secret; rank 1 is a
  // bare network that meets it through the directory but carries and
  // expects another secret, as a process of another job would.
  BareRank rank1;
  std::thread starter([&] { rank1.Start(1, rdv, SecretOrDie(), ""); });
  Config c = PeerConfig(dataset, rdv, 0, 2, 64 << 20);
  c.placement.policy = PlacementPolicyKind::kNone;  // Every read asks the home (or the source) again.
  absl::StatusOr<std::unique_ptr<Monarch>> rank0 = Monarch::Create(c);
  starter.join();
  REQUIRE_MESSAGE(rank0.ok(), rank0.status().ToString());
  REQUIRE_MESSAGE(rank1.status.ok(), rank1.status.ToString());
  Monarch& peer = **rank0;

  // Rank 0 asks rank 1 for rank 1's files with the job's secret: refused
  // at once (no timeout, no peer marked down), and read from the source.
  const auto start = std::chrono::steady_clock::now();
  int bad = 0;
  std::vector<char> buffer(1 << 20);
  for (const TestFile& f : files) {
    absl::StatusOr<size_t> got = peer.Read(f.name, buffer.data(), buffer.size(), 0);
    if (!got.ok() || *got != f.size || !testing::BytesMatch(f, buffer.data(), 0, f.size)) ++bad;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(bad == 0);
  CHECK(seconds < 4);  // No request waited out its timeout: all refused at once.
  Stats s = peer.GetStats();
  const uint64_t refused = rank1.Counter("remote.requests_unauthenticated");
  CHECK(refused >= 1);  // Some files are rank 1's (16 files, 2 ranks).
  CHECK(rank1.served.load() == 0);
  CHECK(s.Get("remote.fallbacks") == refused);
  CHECK(s.Get("remote.timeouts") == 0);
  CHECK(s.Get("remote.peer_failures") == 0);
  CHECK(PeersTier(s, "bytes_read") == 0);

  // The other way: rank 1 asks the Monarch home without its secret.
  std::vector<absl::StatusOr<size_t>> fetched;
  for (const TestFile& f : files) {
    const FileRef ref{0, f.name, f.size, 0};
    fetched.push_back(
        rank1.network->Fetch(0, ref, 0, buffer.data(), std::min<size_t>(f.size, 4096)));
  }
  s = peer.GetStats();
  CHECK(s.Get("remote.requests_unauthenticated") == files.size());
  CHECK(s.Get("remote.requests_served") == 0);
  CHECK(s.Get("remote.bytes_served") == 0);
  // In the stats' JSON and Prometheus text, like every counter.
  const std::string counted = std::to_string(files.size());
  CHECK(s.ToJson().find("\"requests_unauthenticated\":" + counted) != std::string::npos);
  CHECK(s.ToPrometheus().find("monarch_remote_requests_unauthenticated_total " + counted) !=
        std::string::npos);
  rank0->reset();
  rank1.network->Shutdown(DeadlineIn(10));  // Before reading statuses its progress thread made (TSan).
  for (const absl::StatusOr<size_t>& got : fetched) CHECK(absl::IsUnavailable(got.status()));
}

TEST_CASE("peers: the job's secret is 0600 in a 0700 directory while it runs, and gone after") {
  ScratchDir dir;
  const std::string dataset = dir.Sub("dataset");
  auto files = testing::MakeDataset(dataset, 20, {64 << 10});
  const std::string rdv = dir.path() + "/scratch/rdv";
  std::vector<Config> configs;
  for (int r = 0; r < 2; ++r) configs.push_back(PeerConfig(dataset, rdv, r, 2, 64 << 20));
  auto cluster = std::make_unique<Cluster>(configs);
  CHECK(ModeOf(rdv) == (040000 | 0700));
  CHECK(ModeOf(rdv + "/job.secret") == (0100000 | 0600));
  CHECK(ReadEverything(*cluster, files, 1, 1 << 20, 5) == 0);
  uint64_t peer_reads = 0;
  for (auto& p : cluster->peers) {
    const Stats s = p->GetStats();
    CHECK(s.Get("remote.requests_unauthenticated") == 0);
    CHECK(s.Get("remote.fallbacks") == 0);
    peer_reads += PeersTier(s, "reads");
  }
  CHECK(peer_reads > 0);  // Both ranks hold the secret: the homes served.
  cluster.reset();
  CHECK(ModeOf(rdv + "/job.secret") == -1);
  CHECK(ModeOf(rdv + "/rank-0.addr") == -1);
}

}  // namespace
}  // namespace monarch
