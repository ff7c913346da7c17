// Tests of the node service and its client in one process (so they also
// run under ASan/UBSan and TSan): the shared namespace image, hits read in
// the client, misses through the service, a dead and a restarted service,
// refusals, and hostile messages. tests/service/service_processes_test.py
// runs the same with real processes.

#include <doctest/doctest.h>
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "drivers/ram_keep.h"
#include "metadata/namespace.h"
#include "monarch/monarch.h"
#include "service/client.h"
#include "service/namespace_image.h"
#include "service/node_service.h"
#include "service/protocol.h"
#include "service/ram_keeper.h"
#include "service/unix_socket.h"
#include "instance_util.h"
#include "test_util.h"

namespace monarch {
namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

using service::NodeService;
using testing::ScratchDir;
using testing::TestFile;

Config SharedConfig(const std::string& dataset, std::vector<TierConfig> tiers,
                    const std::string& runtime_dir) {
  Config config = testing::MakeConfig(dataset, std::move(tiers));
  config.node.shared = true;
  config.node.runtime_dir = runtime_dir;
  config.node.autostart = false;  // Tests start their services themselves.
  config.node.idle_exit_seconds = 0;
  // The dataset stands for a PFS that the node reads once for all its
  // clients: `promote`, since its local files are in the page cache, which
  // `defer` would serve from there (test_read_path.cc covers that).
  config.placement.cached_source = CachedSourcePolicy::kPromote;
  // Each test counts the misses its reads make: no staging behind them
  // (the stage-ahead test turns it on).
  config.prefetch.stage_ahead = false;
  return config;
}

// Reads every file whole through `monarch` and checks every byte.
void ReadAllExact(Monarch& monarch, const std::vector<TestFile>& files) {
  for (const TestFile& f : files) {
    std::string buffer(f.size + 1, '\0');
    absl::StatusOr<size_t> n = monarch.Read(f.name, buffer.data(), buffer.size(), 0);
    REQUIRE(n.ok());
    REQUIRE(*n == f.size);
    REQUIRE(testing::BytesMatch(f, buffer.data(), 0, f.size));
  }
}

uint64_t SourceBytes(const Stats& stats) { return stats.Source("bytes_read"); }

TEST_CASE("service: a client reads every byte exactly, the source once, then hits from shared RAM") {
  ScratchDir dir;
  const auto files = testing::MakeDataset(dir.Sub("data"), 40, {1, 4096, 70000, 300000});
  const Config config =
      SharedConfig(dir.path() + "/data", {testing::RamTier(64 << 20)}, dir.Sub("run"));
  service::ServeOptions options;
  options.buffer_bytes = 64 * 1024;  // Smaller than the largest file: misses come in pieces.
  auto node = NodeService::Start(testing::Valid(config), options);
  REQUIRE(node.ok());
  auto client = Monarch::Create(config);
  REQUIRE(client.ok());
  CHECK(service::IsServiceClient(**client));  // Usable after fork(): monarch_usable_after_fork.

  ReadAllExact(**client, files);  // Misses, through the service.
  (*client)->WaitForPlacement();
  const Stats after_first = (*client)->GetStats();
  CHECK(SourceBytes(after_first) == testing::TotalBytes(files));
  CHECK(after_first.Tier(0, "files") == files.size());
  const uint64_t ram_reads = after_first.Tier(0, "reads");

  ReadAllExact(**client, files);  // Hits, in the client.
  const Stats after_second = (*client)->GetStats();
  CHECK(SourceBytes(after_second) == testing::TotalBytes(files));
  // The service saw no miss, yet the node's RAM tier counts the client's hits.
  CHECK(after_second.Tier(0, "reads") == ram_reads + files.size());
  const service::StatsReply node_stats = (*node)->NodeStats();
  REQUIRE(node_stats.clients.size() == 1);
  CHECK(node_stats.clients[0].pid == static_cast<uint32_t>(::getpid()));
  CHECK(node_stats.clients[0].hits == files.size());

  // Namespace queries come from the shared image.
  CHECK((*client)->ListFiles().size() == files.size());
  CHECK((*client)->FileExists(files[3].name));
  CHECK((*client)->FileExists(dir.path() + "/data/" + files[3].name));
  CHECK_FALSE((*client)->FileExists("dir0/../" + files[3].name));
  CHECK(*(*client)->FileSize(files[3].name) == files[3].size);
  CHECK((*client)->IsDirectory("dir1"));
  CHECK((*client)->IsDirectory(""));
  auto listing = (*client)->ListDirectory("");
  REQUIRE(listing.ok());
  CHECK(*listing == std::vector<std::string>{"dir0", "dir1", "dir2", "dir3"});
  CHECK(absl::IsNotFound((*client)->Read("nope.bin", nullptr, 0, 0).status()));

  // Partial reads at odd offsets, hits and past the end.
  const TestFile& big = files[3];
  char piece[1000];
  auto n = (*client)->Read(big.name, piece, sizeof(piece), big.size - 10);
  REQUIRE(n.ok());
  CHECK(*n == 10);
  CHECK(testing::BytesMatch(big, piece, big.size - 10, 10));
  CHECK(*(*client)->Read(big.name, piece, sizeof(piece), big.size + 5) == 0);
}

TEST_CASE("service: a file the service caches by extents reads exact through a client, each "
          "extent from the source once") {
  ScratchDir dir;
  const std::string data = dir.Sub("data");
  const TestFile big{"big.bin", 41, 20 * (1 << 20) + 777};
  testing::WriteFile(data + "/" + big.name, big.seed, big.size);
  Config config = SharedConfig(data, {testing::RamTier(64 << 20)}, dir.Sub("run"));
  config.placement.extent_bytes = 1 << 20;
  config.placement.extent_threshold = 4 << 20;
  service::ServeOptions options;
  options.buffer_bytes = 256 * 1024;
  auto node = NodeService::Start(testing::Valid(config), options);
  REQUIRE(node.ok());
  auto client = Monarch::Create(config);
  REQUIRE(client.ok());
  // A few records first: only their extents are copied.
  std::vector<char> buffer(100000);
  for (uint64_t offset : {uint64_t{3} << 20, (uint64_t{11} << 20) - 50000}) {
    absl::StatusOr<size_t> n = (*client)->Read(big.name, buffer.data(), buffer.size(), offset);
    REQUIRE(n.ok());
    REQUIRE(*n == buffer.size());
    CHECK(testing::BytesMatch(big, buffer.data(), offset, buffer.size()));
  }
  (*client)->WaitForPlacement();
  Stats stats = (*client)->GetStats();
  CHECK(SourceBytes(stats) == 3 * (1 << 20));  // Extents 3, 10 and 11.
  CHECK(stats.Tier(0, "files") == 3);
  ReadAllExact(**client, {big});
  (*client)->WaitForPlacement();
  ReadAllExact(**client, {big});
  stats = (*client)->GetStats();
  CHECK(SourceBytes(stats) == big.size);
  CHECK(stats.Tier(0, "files") == 21);
  CHECK(stats.Tier(0, "bytes_used") == big.size);
  CHECK(*(*client)->FileSize(big.name) == big.size);
  CHECK((*client)->ListFiles() == std::vector<std::string>{big.name});  // No extent names.
}

// A client reads the extents of a file the service caches by extents as it
// reads whole files' copies: hits with no message. Its scans find no
// service read to continue them, so it tells the service itself
// (kReadAhead), and the extents ahead load. A damaged extent copy is never
// served.
// A shared config over `data` with a posix tier in `nvme`: files above 4 MiB
// cached by extents of 1 MiB, each promoted on its first read.
// Files of 4 MiB or more cached by extents of 1 MiB, in `tier`.
Config ExtentsConfig(const std::string& data, TierConfig tier, const std::string& run) {
  Config config = SharedConfig(data, {std::move(tier)}, run);
  config.placement.extent_bytes = 1 << 20;
  config.placement.extent_threshold = 4 << 20;
  config.placement.cached_source = CachedSourcePolicy::kPromote;
  return config;
}

Config ExtentsOnPosixConfig(const std::string& data, const std::string& nvme,
                            const std::string& run) {
  return ExtentsConfig(data, testing::FileTier(TierKind::kPosix, nvme, 64 << 20, "nvme"), run);
}

// Under `data`: a file cached by extents (6 MiB and a part) and one cached
// whole (2 MiB and a byte), of seeds `seed` and `seed` + 1.
std::pair<TestFile, TestFile> WriteBigAndWholeFiles(const std::string& data, uint32_t seed) {
  const TestFile big{"shards/big.bin", seed, 6 * (1 << 20) + 5000};
  const TestFile whole{"whole.bin", seed + 1, 2 * (1 << 20) + 1};
  testing::WriteFile(data + "/" + big.name, big.seed, big.size);
  testing::WriteFile(data + "/" + whole.name, whole.seed, whole.size);
  return {big, whole};
}

// Through `client`: a page of extents 1 and 4 of `big` and of `whole` read,
// so that the service copies those extents and all of `whole`.
void CopyTwoExtentsAndAFile(Monarch& client, const TestFile& big, const TestFile& whole) {
  std::vector<char> page(4096);
  for (uint64_t at : {(1 << 20) + 4096, (4 << 20) + 4096}) {
    REQUIRE(*client.Read(big.name, page.data(), page.size(), at) == page.size());
  }
  REQUIRE(*client.Read(whole.name, page.data(), page.size(), 0) == page.size());
  client.WaitForPlacement();  // The service's copies written (and a file tier's checked).
}

TEST_CASE("service: a client reads extent copies itself, its scans read ahead, a damaged extent "
          "copy is never served") {
  ScratchDir dir;
  const std::string data = dir.Sub("data");
  const TestFile big{"shards/big.bin", 43, 24 * (1 << 20) - 3333};
  testing::WriteFile(data + "/" + big.name, big.seed, big.size);
  const std::string nvme = dir.Sub("nvme");
  const Config config = ExtentsOnPosixConfig(data, nvme, dir.Sub("run"));
  auto node = NodeService::Start(testing::Valid(config));
  REQUIRE(node.ok());
  auto client = Monarch::Create(config);
  REQUIRE(client.ok());
  // A scan in 256 KiB reads, bytes checked.
  auto scan = [&big](Monarch& m) {
    std::vector<char> piece(256 << 10);
    for (uint64_t offset = 0; offset < big.size; offset += piece.size()) {
      absl::StatusOr<size_t> got = m.Read(big.name, piece.data(), piece.size(), offset);
      REQUIRE(got.ok());
      const size_t want = static_cast<size_t>(std::min<uint64_t>(piece.size(), big.size - offset));
      REQUIRE(*got == want);
      REQUIRE(testing::BytesMatch(big, piece.data(), offset, want));
    }
  };
  scan(**client);
  (*client)->WaitForPlacement();
  Stats stats = (*client)->GetStats();
  CHECK(SourceBytes(stats) == big.size);  // Each extent once.
  CHECK(stats.Tier(0, "files") == 24);
  // The scan's reads told the service where it was: the extents ahead were
  // promoted on its placement threads, not each by a miss of its own.
  CHECK(stats.Get("read_ahead_extents") >= 8);
  const service::ClientStats first = (*node)->NodeStats().clients.at(0);
  CHECK(first.hits > 0);
  // A second pass: every read a hit, in this process.
  scan(**client);
  const service::ClientStats second = (*node)->NodeStats().clients.at(0);
  CHECK(second.misses == first.misses);
  CHECK(second.hit_bytes - first.hit_bytes == big.size);
  CHECK(SourceBytes((*client)->GetStats()) == big.size);

  // A byte flipped in extent 5's copy while no process has the tier open
  // (bit rot, or a write while the job was down; a write under a running
  // service breaks its read lease and is tested with whole files): a new
  // service adopts the other copies, and the damaged one is never served.
  client->reset();
  node->reset();
  const std::string copy = nvme + "/.monarch/extents/1048576/" + big.name + "/5";
  {
    const int fd = ::open(copy.c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    char c = 0;
    REQUIRE(::pread(fd, &c, 1, 4096 + 17) == 1);
    c = static_cast<char>(c ^ 0x5a);
    REQUIRE(::pwrite(fd, &c, 1, 4096 + 17) == 1);
    ::close(fd);
  }
  auto restarted = NodeService::Start(testing::Valid(config));
  REQUIRE(restarted.ok());
  auto fresh = Monarch::Create(config);
  REQUIRE(fresh.ok());
  scan(**fresh);
  (*fresh)->WaitForPlacement();
  stats = (*fresh)->GetStats();
  CHECK(stats.Tier(0, "damaged_copies") >= 1);
  // From the source again: the damaged extent, about once; the others were
  // adopted.
  CHECK(SourceBytes(stats) >= (1 << 20) - 4096);
  CHECK(SourceBytes(stats) <= (1 << 20) + 4096);
}

TEST_CASE("service: a client maps the copies the service checked, extents and whole files, and "
          "nothing with no service") {
  using testing::MappedAt;
  using testing::SourceMapping;
  ScratchDir dir;
  const std::string data = dir.Sub("data");
  const auto [big, whole] = WriteBigAndWholeFiles(data, 44);
  const std::string nvme = dir.Sub("nvme");
  const Config config = ExtentsOnPosixConfig(data, nvme, dir.Sub("run"));
  auto node = NodeService::Start(testing::Valid(config));
  REQUIRE(node.ok());
  auto client = Monarch::Create(config);
  REQUIRE(client.ok());
  CopyTwoExtentsAndAFile(**client, big, whole);
  {
    SourceMapping map(data + "/" + big.name, big.size);
    CHECK(map.MapCopies(**client, big.name) == 2 << 20);
    CHECK(absl::StartsWith(MappedAt(map.data() + (1 << 20)), nvme + "/.monarch/extents/"));
    CHECK(absl::StartsWith(MappedAt(map.data() + (5 << 20) - 1), nvme + "/.monarch/extents/"));
    CHECK(MappedAt(map.data()) == data + "/" + big.name);
    CHECK(MappedAt(map.data() + (2 << 20)) == data + "/" + big.name);
    CHECK(testing::BytesMatch(big, map.data(), 0, big.size));
  }
  {
    SourceMapping map(data + "/" + whole.name, whole.size);
    CHECK(map.MapCopies(**client, whole.name) == 2 << 20);  // All but the last page, of 1 byte.
    CHECK(MappedAt(map.data()) == nvme + "/" + whole.name);
    CHECK(testing::BytesMatch(whole, map.data(), 0, whole.size));
  }
  // The service gone: no word on any copy, so the source stays mapped.
  node->reset();
  SourceMapping map(data + "/" + whole.name, whole.size);
  CHECK(map.MapCopies(**client, whole.name) == 0);
  CHECK(MappedAt(map.data()) == data + "/" + whole.name);
  CHECK(testing::BytesMatch(whole, map.data(), 0, whole.size));
}

// What a mapping of the service's RAM tier shows in /proc/<pid>/maps: a
// memfd, or a kept tier's file (node.keep_ram, the default).
bool IsRamTier(const std::string& mapped) {
  return absl::StartsWith(mapped, "/memfd:monarch-ram:") ||
         (absl::StartsWith(mapped, "/dev/shm/monarch-") && absl::StrContains(mapped, "/stripe-"));
}

TEST_CASE("service: a client maps the service's RAM copies where they lie, extents and whole "
          "files, bytes exact") {
  using testing::MappedAt;
  using testing::SourceMapping;
  ScratchDir dir;
  const std::string data = dir.Sub("data");
  const auto [big, whole] = WriteBigAndWholeFiles(data, 46);
  const Config config = ExtentsConfig(data, testing::RamTier(64 << 20), dir.Sub("run"));
  auto node = NodeService::Start(testing::Valid(config));
  REQUIRE(node.ok());
  auto client = Monarch::Create(config);
  REQUIRE(client.ok());
  CopyTwoExtentsAndAFile(**client, big, whole);
  {
    SourceMapping map(data + "/" + big.name, big.size);
    CHECK(map.MapCopies(**client, big.name) == 2 << 20);
    CHECK(IsRamTier(MappedAt(map.data() + (1 << 20))));
    CHECK(IsRamTier(MappedAt(map.data() + (5 << 20) - 1)));
    CHECK(MappedAt(map.data()) == data + "/" + big.name);
    CHECK(testing::BytesMatch(big, map.data(), 0, big.size));
  }
  SourceMapping map(data + "/" + whole.name, whole.size);
  CHECK(map.MapCopies(**client, whole.name) == 2 << 20);  // All but the last page, of 1 byte.
  CHECK(IsRamTier(MappedAt(map.data())));
  // The service gone: its memory stays mapped, and exact.
  client->reset();
  node->reset();
  CHECK(testing::BytesMatch(whole, map.data(), 0, whole.size));
}

// Page faults taken reading every file whole through `monarch`, bytes checked.
uint64_t FaultsReadingAll(Monarch& monarch, const std::vector<TestFile>& files) {
  std::string buffer(files.front().size, '\1');  // Touched before the reads.
  uint64_t faults = 0;
  for (const TestFile& f : files) {
    const uint64_t before = testing::ThreadMinorFaults();
    absl::StatusOr<size_t> n = monarch.Read(f.name, buffer.data(), f.size, 0);
    faults += testing::ThreadMinorFaults() - before;
    if (!n.ok() || *n != f.size || !testing::BytesMatch(f, buffer.data(), 0, f.size)) {
      return ~uint64_t{0};
    }
  }
  return faults;
}

// Runs `passes` in a forked child, which leaves with _exit, and returns the
// two fault counts it sends back through a pipe (~0: a pass failed).
std::array<uint64_t, 2> FaultsInChild(const std::function<std::array<uint64_t, 2>()>& passes) {
  std::array<uint64_t, 2> child = {~uint64_t{0}, ~uint64_t{0}};
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const std::array<uint64_t, 2> faults = passes();
    const bool sent = ::write(pipe_fds[1], faults.data(), sizeof(faults)) == sizeof(faults);
    ::_exit(sent ? 0 : 1);
  }
  ::close(pipe_fds[1]);
  const bool received = ::read(pipe_fds[0], child.data(), sizeof(child)) == sizeof(child);
  ::close(pipe_fds[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  REQUIRE(received);
  return child;
}

// A client of `config`'s service that has read `files` (misses, through
// the service) and waited for their copies in the RAM tier, tier 0.
std::unique_ptr<Monarch> ClientAfterFilling(const Config& config,
                                            const std::vector<TestFile>& files) {
  auto client = Monarch::Create(config);
  REQUIRE(client.ok());
  ReadAllExact(**client, files);
  (*client)->WaitForPlacement();
  REQUIRE((*client)->GetStats().Tier(0, "files") == files.size());
  return std::move(*client);
}

// A client forked from `client` (as a DataLoader worker is) reads `first`,
// which sets up what a fresh process maps once, then `measured` twice: the
// faults of the two passes, bytes checked (~0: a read failed or was wrong).
std::array<uint64_t, 2> ForkedClientFaults(Monarch& client, const TestFile& first,
                                           const std::vector<TestFile>& measured) {
  const std::array<uint64_t, 2> child = FaultsInChild([&] {
    const bool warm = FaultsReadingAll(client, {first}) != ~uint64_t{0};
    std::array<uint64_t, 2> faults = {FaultsReadingAll(client, measured),
                                      FaultsReadingAll(client, measured)};
    if (!warm) faults[0] = ~uint64_t{0};
    return faults;
  });
  CAPTURE(child[0]);
  CAPTURE(child[1]);
  REQUIRE(child[0] != ~uint64_t{0});
  REQUIRE(child[1] != ~uint64_t{0});
  return child;
}

TEST_CASE("service: a forked client copies RAM hits with pread until it reads a file again and the "
          "client it was forked from maps them") {
  ScratchDir dir;
  const auto files = testing::MakeDataset(dir.Sub("data"), 17, {1 << 20});
  const std::vector<TestFile> measured(files.begin() + 1, files.end());
  // A tier of 4 KiB pages: of 2 MiB ones a forked client maps from the start
  // (the test of node.ram_dir auto below).
  if (TmpfsPageSize("/dev/shm", false) != 4096) MONARCH_SKIP("/dev/shm has no 4 KiB pages");
  Config config = SharedConfig(dir.path() + "/data", {testing::RamTier(64 << 20)}, dir.Sub("run"));
  config.node.ram_dir = "/dev/shm";
  auto node = NodeService::Start(testing::Valid(config), service::ServeOptions{});
  REQUIRE(node.ok());
  std::unique_ptr<Monarch> client = ClientAfterFilling(config, files);

  // The child reads the measured files twice: few faults on the first pass
  // (pread), then a mapping's on the second.
  const std::array<uint64_t, 2> child = ForkedClientFaults(*client, files[0], measured);
  const uint64_t parent = FaultsReadingAll(*client, measured);  // Its first hits.
  CAPTURE(child[0]);
  CAPTURE(child[1]);
  CAPTURE(parent);
  REQUIRE(parent != ~uint64_t{0});
  // Mapping a 1 MiB copy takes at least 16 faults (the kernel maps up to 16
  // pages per fault); sanitizers' shadow memory may add a few anywhere.
  const uint64_t mapping = 16 * measured.size();
  CHECK(child[1] >= mapping);
  CHECK(child[0] * 4 < child[1]);
  CHECK(parent >= mapping);
}

// A tmpfs mounted with 2 MiB pages for the test, detached at its end.
class HugeTmpfs {
 public:
  explicit HugeTmpfs(const std::string& at) : at_(at) {
    mounted_ = ::mount("tmpfs", at.c_str(), "tmpfs", 0, "size=256m,huge=within_size") == 0;
    error_ = mounted_ ? "" : std::strerror(errno);
  }
  ~HugeTmpfs() {
    if (mounted_) ::umount2(at_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }

 private:
  std::string at_;
  bool mounted_ = false;
  std::string error_;
};

TEST_CASE("service: with node.ram_dir on a tmpfs of 2 MiB pages, a new process maps the RAM "
          "copies in a fault per 2 MiB, bytes exact") {
  ScratchDir dir;
  const std::string ram_dir = dir.Sub("huge");
  HugeTmpfs tmpfs(ram_dir);
  if (!tmpfs.mounted()) MONARCH_SKIP("cannot mount a tmpfs here: " << tmpfs.error());
  if (TmpfsPageSize(ram_dir, false) != (2 << 20)) {
    MONARCH_SKIP("this kernel ignores tmpfs's huge=within_size (shmem_enabled 'deny'?)");
  }
  const auto files = testing::MakeDataset(dir.Sub("data"), 17, {1 << 20});
  const std::vector<TestFile> measured(files.begin() + 1, files.end());
  Config config = SharedConfig(dir.path() + "/data", {testing::RamTier(64 << 20)}, dir.Sub("run"));
  config.node.ram_dir = ram_dir;
  auto node = NodeService::Start(testing::Valid(config), service::ServeOptions{});
  REQUIRE(node.ok());
  ClientAfterFilling(config, files);
  // The copies are files under node.ram_dir, not on /dev/shm.
  struct stat st;
  CHECK(::stat(JoinPath(KeptRamPath(ram_dir, config.node.runtime_dir), "ram/stripe-0").c_str(),
               &st) == 0);

  // A new process (forked before it opens Monarch, as a new job is) reads
  // the files twice: with pread first, then from its mapping, which takes a
  // fault per 2 MiB page; with 4 KiB pages it would take at least 16 per
  // 1 MiB file (the test of forked clients above).
  const std::array<uint64_t, 2> child = FaultsInChild([&] {
    std::array<uint64_t, 2> faults = {~uint64_t{0}, ~uint64_t{0}};
    auto client = Monarch::Create(config);
    if (client.ok()) {
      faults[0] = FaultsReadingAll(**client, measured);
      faults[1] = FaultsReadingAll(**client, measured);
    }
    return faults;
  });
  CAPTURE(child[0]);
  CAPTURE(child[1]);
  REQUIRE(child[0] != ~uint64_t{0});  // Bytes exact on both passes.
  REQUIRE(child[1] != ~uint64_t{0});
  node->reset();
  // A sanitizer's memcpy checks fault in shadow memory of their own, about
  // one page per 32 KiB copied, which hides the page size from this count.
  if (kSanitized) MONARCH_SKIP("sanitizer shadow memory hides the faults; release builds count");
  // 16 MiB of copies span at most 9 huge pages, each one fault. 4 KiB
  // pages: at least 256.
  CHECK(child[1] < 4 * measured.size());
}

TEST_CASE("service: node.ram_dir auto keeps the RAM tier on a keeper's tmpfs of 2 MiB pages "
          "that outlives the service, and a forked client maps it from its first read") {
  ScratchDir dir;
  const auto files = testing::MakeDataset(dir.Sub("data"), 17, {1 << 20});
  const std::vector<TestFile> measured(files.begin() + 1, files.end());
  const Config config =
      SharedConfig(dir.path() + "/data", {testing::RamTier(64 << 20)}, dir.Sub("run"));
  REQUIRE(config.node.ram_dir == "auto");  // The default.
  const std::string run = config.node.runtime_dir;
  auto node = NodeService::Start(testing::Valid(config), service::ServeOptions{});
  REQUIRE(node.ok());
  const std::optional<std::string> keeper = service::LiveRamKeeperDir(run);
  if (!keeper.has_value()) {
    // Where user namespaces are refused the tier is on /dev/shm (logged).
    CHECK(::access(KeptRamPath("/dev/shm", run).c_str(), F_OK) == 0);
    MONARCH_SKIP("no RAM keeper could start here (user namespaces refused?)");
  }
  CHECK(absl::StartsWith(*keeper, "/proc/"));
  CHECK(TmpfsPageSize(*keeper, false) == (2 << 20));
  std::unique_ptr<Monarch> client = ClientAfterFilling(config, files);
  struct stat st;
  CHECK(::stat(JoinPath(KeptRamPath(*keeper, run), "ram/stripe-0").c_str(), &st) == 0);
  CHECK(::stat(KeptRamPath("/dev/shm", run).c_str(), &st) != 0);

  // A forked client (a DataLoader worker) maps the copies from its first
  // read: its faults come on the first pass, a fault per 2 MiB page.
  const std::array<uint64_t, 2> child = ForkedClientFaults(*client, files[0], measured);
  CAPTURE(child[0]);
  CAPTURE(child[1]);

  // The service goes, the keeper stays: the next service adopts every copy.
  client.reset();
  node->reset();
  CHECK(service::LiveRamKeeperDir(run) == keeper);
  node = NodeService::Start(testing::Valid(config), service::ServeOptions{});
  REQUIRE(node.ok());
  CHECK(service::LiveRamKeeperDir(run) == keeper);
  auto next = Monarch::Create(config);
  REQUIRE(next.ok());
  CHECK((*next)->GetStats().Tier(0, "files") == files.size());
  ReadAllExact(**next, files);
  CHECK((*next)->GetStats().Tier(1, "bytes_read") == 0);  // Nothing from the source.
  next->reset();
  node->reset();
  service::StopRamKeeper(run);
  CHECK(!service::LiveRamKeeperDir(run).has_value());
  if (kSanitized) MONARCH_SKIP("sanitizer shadow memory hides the faults; release builds count");
  // 16 MiB of copies span at most 9 huge pages, each one fault, all on the
  // first pass. A client that copied with pread first would fault on the
  // second; one of 4 KiB pages at least 256 times.
  CHECK(child[0] < 4 * measured.size());
  CHECK(child[1] * 2 < child[0]);
}

// The RAM tier's copies, its slot table, the tier slots and the namespace
// image live in memfds that any process of the same user could reopen
// read-write through /proc/<pid>/fd. They are sealed against writes: such a
// reopening can neither write() them nor map them writable, so no process
// but the service can alter a copy or say a file is elsewhere.
// With memory.watch (the default) the RAM copies' memory is the one
// exception: it must stay releasable when the tier shrinks, and a memfd
// sealed against writes refuses hole punching (shared_memory.h).
TEST_CASE("service: the shared RAM copies and tables cannot be written by any other process") {
  for (const bool watch : {false, true}) {
    CAPTURE(watch);
    ScratchDir dir;
    const auto files = testing::MakeDataset(dir.Sub("data"), 12, {5000, 200000});
    Config config =
        SharedConfig(dir.path() + "/data", {testing::RamTier(64 << 20)}, dir.Sub("run"));
    config.memory.watch = watch;
    // Kept RAM tiers (the default) are tmpfs files, which cannot be sealed.
    config.node.keep_ram = false;
    auto node = NodeService::Start(testing::Valid(config));
    REQUIRE(node.ok());
    auto client = Monarch::Create(config);
    REQUIRE(client.ok());
    ReadAllExact(**client, files);
    (*client)->WaitForPlacement();
    REQUIRE((*client)->GetStats().Tier(0, "files") == files.size());

    std::set<std::string> sealed_kinds;
    int tried = 0;
    DIR* fds = ::opendir("/proc/self/fd");
    REQUIRE(fds != nullptr);
    while (struct dirent* entry = ::readdir(fds)) {
      const std::string fd_path = absl::StrCat("/proc/self/fd/", entry->d_name);
      char target[256] = {};
      if (::readlink(fd_path.c_str(), target, sizeof(target) - 1) <= 0) continue;
      const std::string name = target;  // "/memfd:monarch-ram:ram (deleted)"
      if (!absl::StartsWith(name, "/memfd:monarch-")) continue;
      if (absl::StartsWith(name, "/memfd:monarch-transfer")) continue;  // The client's own channel.
      CAPTURE(name);
      const int rw = ::open(fd_path.c_str(), O_RDWR | O_CLOEXEC);  // What another process would do.
      REQUIRE(rw >= 0);
      if (watch && absl::StartsWith(name, "/memfd:monarch-ram:")) {
        // Releasable: not write-sealed (the cost memory.watch documents).
        void* map = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
        CHECK(map != MAP_FAILED);
        if (map != MAP_FAILED) ::munmap(map, 4096);
        ::close(rw);
        ++tried;
        continue;
      }
      const char junk = 0x5a;
      errno = 0;
      CHECK(::pwrite(rw, &junk, 1, 0) == -1);
      CHECK(errno == EPERM);
      errno = 0;
      void* map = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
      CHECK(map == MAP_FAILED);
      CHECK(errno == EPERM);
      if (map != MAP_FAILED) ::munmap(map, 4096);
      ::close(rw);
      sealed_kinds.insert(name.substr(0, name.find_first_of(": ", 7)));
      ++tried;
    }
    ::closedir(fds);
    CHECK(tried >= 4);
    CHECK(sealed_kinds.count("/memfd:monarch-ram") == (watch ? 0 : 1));  // The copies.
    CHECK(sealed_kinds.count("/memfd:monarch-ram-slots") == 1);  // Where each copy is.
    CHECK(sealed_kinds.count("/memfd:monarch-tier-slots") == 1);
    CHECK(sealed_kinds.count("/memfd:monarch-namespace") == 1);
    ReadAllExact(**client, files);  // And the service still wrote them all.
  }
}

TEST_CASE("service: concurrent clients share one promotion per file") {
  ScratchDir dir;
  const auto files = testing::MakeDataset(dir.Sub("data"), 64, {200000});
  const Config config =
      SharedConfig(dir.path() + "/data", {testing::RamTier(64 << 20)}, dir.Sub("run"));
  auto node = NodeService::Start(testing::Valid(config));
  REQUIRE(node.ok());
  std::vector<std::unique_ptr<Monarch>> clients;
  for (int i = 0; i < 3; ++i) {
    auto client = Monarch::Create(config);
    REQUIRE(client.ok());
    clients.push_back(std::move(*client));
  }
  std::atomic<int> wrong{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 6; ++t) {
    readers.emplace_back([&, t] {
      Monarch& client = *clients[t % clients.size()];
      std::mt19937 rng(t);
      std::string buffer(200000, '\0');
      for (int i = 0; i < 200; ++i) {
        const TestFile& f = files[rng() % files.size()];
        const uint64_t offset = rng() % f.size;
        auto n = client.Read(f.name, buffer.data(), 50000, offset);
        if (!n.ok() || !testing::BytesMatch(f, buffer.data(), offset, *n)) ++wrong;
      }
    });
  }
  for (auto& r : readers) r.join();
  CHECK(wrong.load() == 0);
  clients[0]->WaitForPlacement();
  const Stats stats = clients[0]->GetStats();
  // Every file read from the source at most once, whatever the readers.
  CHECK(SourceBytes(stats) <= testing::TotalBytes(files));
  CHECK(stats.Get("promotions_started") <= files.size());
}

TEST_CASE("service: a client reads posix copies itself") {
  ScratchDir dir;
  const auto files = testing::MakeDataset(dir.Sub("data"), 12, {100000});
  const Config config = SharedConfig(
      dir.path() + "/data",
      {testing::FileTier(TierKind::kPosix, dir.Sub("nvme"), 64 << 20, "nvme")}, dir.Sub("run"));
  auto node = NodeService::Start(testing::Valid(config));
  REQUIRE(node.ok());
  auto client = Monarch::Create(config);
  REQUIRE(client.ok());
  ReadAllExact(**client, files);
  (*client)->WaitForPlacement();
  ReadAllExact(**client, files);
  const service::StatsReply stats = (*node)->NodeStats();
  REQUIRE(stats.clients.size() == 1);
  CHECK(stats.clients[0].hits == files.size());
  CHECK(stats.clients[0].misses == files.size());
}

TEST_CASE("service: a dead service costs no read, and a new one is picked up") {
  ScratchDir dir;
  const auto files = testing::MakeDataset(dir.Sub("data"), 30, {50000, 3000});
  const Config config =
      SharedConfig(dir.path() + "/data", {testing::RamTier(64 << 20)}, dir.Sub("run"));
  auto node = NodeService::Start(testing::Valid(config));
  REQUIRE(node.ok());
  auto client = Monarch::Create(config);
  REQUIRE(client.ok());
  // Half the files in RAM, then the service goes away.
  std::vector<TestFile> half(files.begin(), files.begin() + 15);
  ReadAllExact(**client, half);
  (*client)->WaitForPlacement();
  node->reset();
  ReadAllExact(**client, files);  // RAM copies of the dead service, the rest from the source.
  ReadAllExact(**client, files);

  auto again = NodeService::Start(testing::Valid(config));
  REQUIRE(again.ok());
  // The client tries to reconnect at most once a second, on a miss: it
  // reads one (a file the dead service did not hold) until it has.
  REQUIRE(testing::Eventually([&] {
    ReadAllExact(**client, {files.back()});
    return (*again)->NodeStats().clients.size() == 1;
  }));
  ReadAllExact(**client, files);
  const service::StatsReply stats = (*again)->NodeStats();
  REQUIRE(stats.clients.size() == 1);
  CHECK(stats.clients[0].misses > 0);
}

TEST_CASE("service: a source I/O error reaches the client as the same status, and reads go on") {
  ScratchDir dir;
  const auto files = testing::MakeDataset(dir.Sub("data"), 6, {20000});
  Config config = SharedConfig(dir.path() + "/data", {testing::RamTier(8 << 20)}, dir.Sub("run"));
  config.placement.policy = PlacementPolicyKind::kNone;  // Every read goes to the source.
  testing::FaultInjectingDriver::Faults faults;
  service::ServeOptions options;
  options.wrap = [&](int tier, std::unique_ptr<StorageDriver> driver) {
    if (tier != 1) return driver;
    return std::unique_ptr<StorageDriver>(
        new testing::FaultInjectingDriver(std::move(driver), &faults));
  };
  auto node = NodeService::Start(testing::Valid(config), options);
  REQUIRE(node.ok());
  auto client = Monarch::Create(config);
  REQUIRE(client.ok());
  char buffer[100];
  faults.fail_reads = true;
  auto failed = (*client)->Read(files[0].name, buffer, sizeof(buffer), 0);
  CHECK(absl::IsDataLoss(failed.status()));
  faults.fail_reads = false;
  ReadAllExact(**client, files);  // The same connection goes on.
  CHECK((*node)->NodeStats().clients.at(0).misses == files.size());
}

TEST_CASE("service: refusals name the problem") {
  ScratchDir dir;
  testing::MakeDataset(dir.Sub("data"), 3, {1000});
  testing::MakeDataset(dir.Sub("other"), 3, {1000});
  const std::string run = dir.Sub("run");
  Config config = SharedConfig(dir.path() + "/data", {testing::RamTier(1 << 20)}, run);

  auto none = Monarch::Create(config);  // No service, autostart off.
  REQUIRE_FALSE(none.ok());
  CHECK(absl::IsFailedPrecondition(none.status()));
  CHECK(absl::StrContains(none.status().message(), "monarch serve"));

  auto node = NodeService::Start(testing::Valid(config));
  REQUIRE(node.ok());
  auto second = NodeService::Start(testing::Valid(config));  // One service per runtime directory.
  REQUIRE_FALSE(second.ok());
  CHECK(absl::StrContains(second.status().message(), "already running"));

  Config other = config;
  other.dataset.path = dir.path() + "/other";
  auto wrong = Monarch::Create(other);
  REQUIRE_FALSE(wrong.ok());
  CHECK(absl::StrContains(wrong.status().message(), "/data"));
  CHECK(absl::StrContains(wrong.status().message(), "/other"));
  // The same directory with another filter is another dataset too.
  Config filtered = config;
  filtered.dataset.file_regex = "dir0/.*";
  auto narrower = Monarch::Create(filtered);
  REQUIRE_FALSE(narrower.ok());
  CHECK(absl::IsFailedPrecondition(narrower.status()));
  CHECK(absl::StrContains(narrower.status().message(), "node.runtime_dir"));
}

TEST_CASE("service: the namespace image answers as the namespace does") {
  ScratchDir dir;
  const auto files = testing::MakeDataset(dir.Sub("data"), 50, {10, 20});
  auto ns = Namespace::Build(dir.path() + "/data", "", 1);
  REQUIRE(ns.ok());
  auto fd = service::WriteNamespaceImage(**ns);
  REQUIRE(fd.ok());
  auto image = service::NamespaceImage::Open(*fd);
  REQUIRE(image.ok());
  CHECK((*image)->file_count() == files.size());
  CHECK((*image)->total_bytes() == (*ns)->total_bytes());
  for (const TestFile& f : files) {
    auto id = (*image)->FindId(f.name);
    REQUIRE(id.has_value());
    CHECK((*image)->ref(*id).name == f.name);
    CHECK((*image)->ref(*id).size == f.size);
    // stat() as the walk saw it, for the preload library's stat hooks.
    struct stat st;
    REQUIRE(::stat((dir.path() + "/data/" + f.name).c_str(), &st) == 0);
    const Monarch::FileStat stat = (*image)->Stat(*id);
    CHECK(stat.inode == st.st_ino);
    CHECK(stat.device == st.st_dev);
    CHECK(stat.mode == st.st_mode);
    CHECK(stat.uid == st.st_uid);
    CHECK(stat.link_count == st.st_nlink);
    CHECK(stat.blocks == static_cast<uint64_t>(st.st_blocks));
    CHECK(stat.ctime_ns == st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec);
    CHECK(stat.size == f.size);
    CHECK(*id == (*ns)->Find(f.name)->ref.id);
    CHECK((*image)->FindId("./" + f.name) == id);
    CHECK((*image)->FindId(dir.path() + "/data/" + f.name) == id);
  }
  CHECK_FALSE((*image)->FindId("dir0").has_value());
  CHECK_FALSE((*image)->FindId("../data/" + files[0].name).has_value());
  CHECK_FALSE((*image)->FindId("").has_value());
  for (const char* d : {"", "dir0", "dir3"}) {
    CHECK((*image)->List(d).value() == (*ns)->List(d).value());
  }
  CHECK(absl::IsNotFound((*image)->List("dir9").status()));
  CHECK((*image)->entry_count() == files.size());  // No extents.
  CHECK((*image)->first_extent(0) == 0);
}

TEST_CASE("service: the namespace image holds the extents of files cached by extents") {
  ScratchDir dir;
  const std::string data = dir.Sub("data");
  const TestFile big{"a/big.bin", 3, 5 * (1 << 20) + 99};  // 6 extents, the last short.
  const TestFile small{"a/small.bin", 4, 4000};
  const TestFile other{"b/other.bin", 5, 9 * (1 << 20)};  // 9 extents.
  for (const TestFile& f : {big, small, other}) testing::WriteFile(data + "/" + f.name, f.seed, f.size);
  auto ns = Namespace::Build(data, "", 1, 1, {}, SymlinkPolicy::kFollow,
                             ExtentLayout{1 << 20, 4 << 20});
  REQUIRE(ns.ok());
  auto fd = service::WriteNamespaceImage(**ns);
  REQUIRE(fd.ok());
  auto image = service::NamespaceImage::Open(*fd);
  REQUIRE(image.ok());
  CHECK((*image)->file_count() == 3);
  CHECK((*image)->entry_count() == 3 + 6 + 9);
  CHECK((*image)->entry_count() == (*ns)->entry_count());
  CHECK((*image)->extent_bytes() == 1 << 20);
  for (const TestFile& f : {big, small, other}) {
    const std::optional<FileEntry> file = (*ns)->Find(f.name);
    REQUIRE(file.has_value());
    const uint32_t id = *(*image)->FindId(f.name);
    CHECK(id == file->ref.id);
    CHECK((*image)->first_extent(id) == file->first_extent);
    for (uint32_t k = 0; k < file->extent_count; ++k) {
      const FileRef& want = (*ns)->entry(file->first_extent + k).ref;
      const FileRef got = (*image)->ref(file->first_extent + k);
      CHECK(got.id == want.id);
      CHECK(got.name == want.name);
      CHECK(got.size == want.size);
      CHECK(got.mtime_ns == want.mtime_ns);
      CHECK(got.part_offset == want.part_offset);
      CHECK_FALSE(got.is_extent);
      CHECK((*image)->file_of(got.id) == id);
    }
    // Extents are not files: not found by name, not listed.
    if (file->extent_count > 0) {
      CHECK_FALSE((*image)->FindId((*ns)->entry(file->first_extent).ref.name).has_value());
    }
  }
  CHECK((*image)->first_extent(*(*image)->FindId(small.name)) == 0);
  CHECK((*image)->List("").value() == std::vector<std::string>{"a", "b"});
  CHECK((*image)->List("a").value() == std::vector<std::string>{"big.bin", "small.bin"});
}

// Every decoder on random mutations of valid messages and on random bytes:
// an error or a value, never a crash (ASan/UBSan check the "never").
TEST_CASE("service: decoders survive mutated and random messages") {
  using namespace service;
  HelloReply hello;
  hello.instance_id = 7;
  hello.dataset_root = "/data";
  hello.tiers = {{0, "ram", "", 9, /*huge_pages=*/true}, {3, "source", "/data", 0}};
  StatsReply stats;
  stats.node.metrics.push_back(Metric{"reads", Metric::Kind::kCounter, 5, "h", "ram", "ram"});
  stats.clients.push_back(ClientStats{1, 2, 3, 4, 5, 6});
  stats.jobs.push_back(JobStats{"slurm-7", 2, 3, 4, 5, 6, 7});
  const std::vector<std::string> valid = {
      Encode(Hello{kProtocolVersion, "/data", "k", "slurm-7"}), Encode(hello),
      Encode(ReadRequest{1, 2, 3}),            Encode(ReadReply{4}),
      Encode(ErrorReply{5, "no"}),             Encode(stats),
      Encode(StageRequest{{"a/*", "b"}}),      Encode(StageProgress{1, 2, 3, 4, 5, 1}),
      Encode(StatusReply{1, 2.5, "/d", 3, 4, 5, 6, 7}),
      Encode(AnnounceRequest{true, false, {1, 2, 3}}), Encode(ConsumedNotice{{4, 5}}),
      Encode(AnnounceRequest{false, true, {}, true, {{7, 1 << 20, 4096}, {8, 0, 0}}}),
      Encode(ReadAheadNotice{3, 5 << 20}),
      Encode(CheckedCopiesRequest{{9, 10}}),
      Encode(CheckedCopiesReply{{{9, SourceIdentity{1, 2, 3, 4, 5}}}}),
      Encode(ProveAccessRequest{11})};
  auto decode_all = [](absl::string_view p) {
    (void)DecodeHello(p);
    (void)DecodeHelloReply(p);
    (void)DecodeReadRequest(p);
    (void)DecodeReadReply(p);
    (void)DecodeErrorReply(p);
    (void)DecodeStatsReply(p);
    (void)DecodeStageRequest(p);
    (void)DecodeStageProgress(p);
    (void)DecodeStatusReply(p);
    (void)DecodeAnnounceRequest(p);
    (void)DecodeConsumedNotice(p);
    (void)DecodeReadAheadNotice(p);
    (void)DecodeCheckedCopiesRequest(p);
    (void)DecodeCheckedCopiesReply(p);
    (void)DecodeProveAccessRequest(p);
    char header[kFrameHeaderBytes] = {};
    std::memcpy(header, p.data(), std::min(p.size(), sizeof(header)));
    (void)DecodeFrameHeader(header);
  };
  // Each valid message round-trips through its own decoder.
  CHECK(DecodeHelloReply(valid[1])->tiers.size() == 2);
  CHECK(DecodeHelloReply(valid[1])->tiers[0].huge_pages);
  CHECK_FALSE(DecodeHelloReply(valid[1])->tiers[1].huge_pages);
  {
    // The first tier's huge_pages byte comes just before the last tier's 28
    // bytes (kind, name, path, descriptors, huge_pages), the empty cache
    // shape's length and the guest flag. Only 0 and 1 re-encode as sent.
    std::string two = valid[1];
    const size_t at = valid[1].size() - (4 + 4 + 6 + 4 + 5 + 4 + 1) - 4 - 1 - 1;
    REQUIRE(two[at] == 1);
    two[at] = 2;
    CHECK(absl::StartsWith(DecodeHelloReply(two).status().message(), "malformed hello reply"));
  }
  CHECK(DecodeProveAccessRequest(valid.back())->file_id == 11);
  {
    HelloReply guest = hello;
    guest.guest = true;
    CHECK(DecodeHelloReply(Encode(guest))->guest);
    CHECK_FALSE(DecodeHelloReply(valid[1])->guest);
  }
  CHECK(DecodeStatsReply(valid[5])->clients[0].miss_bytes == 6);
  CHECK(DecodeStatsReply(valid[5])->jobs[0].name == "slurm-7");
  CHECK(DecodeStatsReply(valid[5])->jobs[0].source_bytes == 7);
  CHECK(DecodeHello(valid[0])->job == "slurm-7");
  CHECK(DecodeStageRequest(valid[6])->globs[1] == "b");
  CHECK(DecodeAnnounceRequest(valid[9])->file_ids[2] == 3);
  CHECK_FALSE(DecodeAnnounceRequest(valid[9])->last);
  CHECK(DecodeConsumedNotice(valid[10])->file_ids == std::vector<uint32_t>{4, 5});
  {
    absl::StatusOr<AnnounceRequest> ranges = DecodeAnnounceRequest(valid[11]);
    REQUIRE(ranges.ok());
    CHECK(ranges->ranges);
    CHECK_FALSE(ranges->first);
    REQUIRE(ranges->samples.size() == 2);
    CHECK(ranges->samples[0].file_id == 7);
    CHECK(ranges->samples[0].offset == 1 << 20);
    CHECK(ranges->samples[0].length == 4096);
    CHECK(ranges->samples[1].file_id == 8);
    CHECK(ranges->file_ids.empty());
    CHECK(DecodeReadAheadNotice(valid[12])->end == 5 << 20);
    CHECK_FALSE(DecodeReadAheadNotice(valid[12] + "x").ok());
    CHECK(DecodeCheckedCopiesRequest(valid[13])->ids == std::vector<uint32_t>{9, 10});
    absl::StatusOr<CheckedCopiesReply> stamps = DecodeCheckedCopiesReply(valid[14]);
    REQUIRE(stamps.ok());
    REQUIRE(stamps->copies.size() == 1);
    CHECK(stamps->copies[0].id == 9);
    CHECK(stamps->copies[0].copy == SourceIdentity{1, 2, 3, 4, 5});
    CHECK_FALSE(DecodeCheckedCopiesReply(valid[14].substr(0, valid[14].size() - 1)).ok());
    // More ids than a reply could answer.
    CheckedCopiesRequest many;
    many.ids.assign(kMaxCheckedCopiesPerMessage + 1, 0);
    CHECK_FALSE(DecodeCheckedCopiesRequest(Encode(many)).ok());
    // A count of samples the payload cannot hold.
    std::string cut = valid[11];
    cut.resize(cut.size() - 1);
    CHECK_FALSE(DecodeAnnounceRequest(cut).ok());
  }
  CHECK_FALSE(DecodeReadRequest(valid[2] + "x").ok());  // Trailing bytes.
  CHECK_FALSE(DecodeHelloReply(valid[1].substr(0, valid[1].size() - 1)).ok());  // Cut short.
  std::mt19937 rng(12345);
  for (int round = 0; round < 20000; ++round) {
    std::string m = valid[rng() % valid.size()];
    const int edits = 1 + rng() % 4;
    for (int e = 0; e < edits; ++e) {
      switch (rng() % 4) {
        case 0:
          if (!m.empty()) m[rng() % m.size()] = static_cast<char>(rng());
          break;
        case 1:
          m.resize(m.empty() ? 0 : rng() % m.size());
          break;
        case 2:
          m.insert(m.empty() ? 0 : rng() % m.size(), std::string(1 + rng() % 8, char(rng())));
          break;
        case 3: {  // A huge length or count where one is read.
          const uint32_t big = 0xfffffff0u + rng() % 16;
          if (m.size() >= 4) std::memcpy(&m[(rng() % (m.size() - 3))], &big, 4);
          break;
        }
      }
    }
    decode_all(m);
  }
  for (int round = 0; round < 5000; ++round) {
    std::string m(rng() % 64, '\0');
    for (char& c : m) c = static_cast<char>(rng());
    decode_all(m);
  }
}

TEST_CASE("service: hostile connections get an error or a closed socket, and it goes on") {
  ScratchDir dir;
  const auto files = testing::MakeDataset(dir.Sub("data"), 4, {5000});
  const Config config =
      SharedConfig(dir.path() + "/data", {testing::RamTier(1 << 20)}, dir.Sub("run"));
  auto node = NodeService::Start(testing::Valid(config));
  REQUIRE(node.ok());
  const std::string socket_path = (*node)->paths().socket;
  std::mt19937 rng(99);
  for (int round = 0; round < 40; ++round) {
    auto socket = service::ConnectUnix(socket_path);
    REQUIRE(socket.ok());
    std::string junk(1 + rng() % 100, '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    if (round % 4 == 1) {  // A valid header announcing a huge payload.
      service::EncodeFrameHeader(service::MessageType::kRead, 0xffffffff, junk.data());
    } else if (round % 4 == 2) {  // A read before hello, with a bad file id.
      junk = std::string(service::kFrameHeaderBytes, '\0');
      const std::string payload = service::Encode(service::ReadRequest{999999, 0, 1 << 30});
      service::EncodeFrameHeader(service::MessageType::kRead, payload.size(), junk.data());
      junk += payload;
    }
    ::send(socket->get(), junk.data(), junk.size(), MSG_NOSIGNAL);
    if (round % 4 == 3) continue;  // Hang up without waiting.
    ::shutdown(socket->get(), SHUT_WR);
    char reply[256];
    while (::recv(socket->get(), reply, sizeof(reply), 0) > 0) {
    }
  }
  // Reads with a bad id or an oversized length after a proper hello.
  auto client = Monarch::Create(config);
  REQUIRE(client.ok());
  ReadAllExact(**client, files);
  CHECK((*node)->NodeStats().node.Get("service.refused_connections") == 0);
}

// Clairvoyant prefetch through the service: the client's order reaches the
// service's prefetcher, which promotes the files before any read; the
// client's first reads (hits the service never sees) come back in batches
// and free the lookahead.
TEST_CASE("service: an announced order is prefetched for the node, clients' reads free the lookahead") {
  ScratchDir dir;
  const auto files = testing::MakeDataset(dir.Sub("data"), 150, {3000, 9000});
  Config config = SharedConfig(dir.path() + "/data", {testing::RamTier(64 << 20)}, dir.Sub("run"));
  config.prefetch.lookahead_bytes = 70 * 9000;  // About half the dataset.
  auto node = NodeService::Start(testing::Valid(config));
  REQUIRE(node.ok());
  auto client = Monarch::Create(config);
  REQUIRE(client.ok());
  std::vector<std::string> order;
  for (const TestFile& f : files) order.push_back(f.name);
  REQUIRE((*client)->AnnounceOrder(order).ok());

  auto node_stat = [&](const char* name) { return (*node)->NodeStats().node.Get(name); };
  // Every stream waits for the readers: the lookahead is full.
  REQUIRE(testing::Eventually([&] {
    return node_stat("prefetch_streams_held") == static_cast<uint64_t>(config.prefetch.streams);
  }));
  const uint64_t ahead = node_stat("prefetch_files");
  CHECK(ahead > 0);
  CHECK(ahead < files.size());  // Held back by the lookahead, not by the reader.
  CHECK(node_stat("prefetch_lookahead_bytes") <= config.prefetch.lookahead_bytes);

  // Reading in order: hits report back 64 at a time (the first at once),
  // and what they report frees lookahead, so the streams fetch further.
  // The reports are one-way messages the service reads in its own time:
  // the test waits for them (bounded), as readers that are slower than the
  // streams would.
  auto wait_for = [&](const char* name, uint64_t at_least) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (node_stat(name) < at_least && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  };
  ReadAllExact(**client, std::vector<TestFile>(files.begin(), files.begin() + 65));
  wait_for("prefetch_files", ahead + 1);
  CHECK(node_stat("prefetch_files") > ahead);
  ReadAllExact(**client, std::vector<TestFile>(files.begin() + 65, files.end()));
  (*client)->WaitForPlacement();
  // A batch goes when it holds 64 reads or has waited kConsumedDelay: the
  // last 63 at most may still be in the client (a slow run sends smaller
  // batches, so the last one can be anywhere up to that).
  wait_for("prefetch_reads", files.size() - 63);
  const Stats stats = (*client)->GetStats();
  CHECK(stats.Get("prefetch_reads") >= files.size() - 63);
  CHECK(stats.Get("prefetch_hits") >= 64);
  CHECK(SourceBytes(stats) == testing::TotalBytes(files));  // Each file once.
  CHECK(stats.Tier(0, "files") == files.size());
  // The job pays for what the streams fetched for its order and what its
  // misses read: the node's source bytes, each file once. A stream charges
  // a file just after its copy commits, so a read may hit the copy before
  // the charge lands (bounded wait; an undercharge that lasts fails).
  auto job_source_bytes = [&] {
    const std::vector<service::JobStats> jobs = (*node)->NodeStats().jobs;
    return jobs.size() == 1 ? jobs[0].source_bytes : 0;
  };
  CHECK(testing::Eventually([&] { return job_source_bytes() >= testing::TotalBytes(files); }));
  const std::vector<service::JobStats> jobs = (*node)->NodeStats().jobs;
  REQUIRE(jobs.size() == 1);
  CHECK(jobs[0].processes == 1);
  CHECK(jobs[0].source_bytes == testing::TotalBytes(files));

  // A name outside the dataset: NotFound, and the service keeps the order.
  CHECK(absl::IsNotFound((*client)->AnnounceOrder({"dir0/nope.bin"})));
  CHECK(node_stat("prefetch_order_files") > 0);
  // The client leaves: its order goes with it.
  client->reset();
  const auto gone = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (node_stat("prefetch_order_files") != 0 && std::chrono::steady_clock::now() < gone) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHECK(node_stat("prefetch_order_files") == 0);
}

TEST_CASE("service: hostile announcements are refused with a reason, and it goes on") {
  ScratchDir dir;
  const auto files = testing::MakeDataset(dir.Sub("data"), 4, {5000});
  const Config config =
      SharedConfig(dir.path() + "/data", {testing::RamTier(1 << 20)}, dir.Sub("run"));
  auto node = NodeService::Start(testing::Valid(config));
  REQUIRE(node.ok());
  auto hello = [&]() {
    auto socket = service::ConnectUnix((*node)->paths().socket);
    REQUIRE(socket.ok());
    service::Hello h;
    h.dataset_root = dir.path() + "/data";
    h.dataset_key = DatasetKey(config.dataset);
    auto reply = service::Call(socket->get(), service::MessageType::kHello, service::Encode(h),
                               service::kMaxDescriptors);
    REQUIRE(reply.ok());
    return std::move(*socket);
  };
  {  // A file id past the namespace.
    ScopedFd socket = hello();
    service::AnnounceRequest request;
    request.file_ids = {0, 1, 999999};
    auto reply =
        service::Call(socket.get(), service::MessageType::kAnnounce, service::Encode(request));
    CHECK(absl::IsInvalidArgument(reply.status()));
    CHECK(absl::StrContains(reply.status().message(), "out of range"));
  }
  {  // The same in a consumed notice (which is otherwise not answered).
    ScopedFd socket = hello();
    service::ConsumedNotice notice;
    notice.file_ids = {4};
    auto reply =
        service::Call(socket.get(), service::MessageType::kConsumed, service::Encode(notice));
    CHECK(absl::IsInvalidArgument(reply.status()));
  }
  {  // Which copies may be mapped: an entry id past the namespace; before hello.
    ScopedFd socket = hello();
    auto reply = service::Call(socket.get(), service::MessageType::kCheckedCopies,
                               service::Encode(service::CheckedCopiesRequest{{0, 999999}}));
    CHECK(absl::IsInvalidArgument(reply.status()));
    CHECK(absl::StrContains(reply.status().message(), "checked copies"));
    auto bare = service::ConnectUnix((*node)->paths().socket);
    REQUIRE(bare.ok());
    CHECK(absl::IsInvalidArgument(
        service::Call(bare->get(), service::MessageType::kCheckedCopies,
                      service::Encode(service::CheckedCopiesRequest{{0}}))
            .status()));
  }
  {  // A read-ahead notice (otherwise not answered) for a file id past the namespace.
    ScopedFd socket = hello();
    auto reply = service::Call(socket.get(), service::MessageType::kReadAhead,
                               service::Encode(service::ReadAheadNotice{999999, 4096}));
    CHECK(absl::IsInvalidArgument(reply.status()));
    CHECK(absl::StrContains(reply.status().message(), "read-ahead"));
  }
  {  // Unknown flags; and an announcement before hello.
    ScopedFd socket = hello();
    std::string payload = service::Encode(service::AnnounceRequest{});
    payload[0] = 9;
    CHECK(absl::IsInvalidArgument(
        service::Call(socket.get(), service::MessageType::kAnnounce, payload).status()));
    auto bare = service::ConnectUnix((*node)->paths().socket);
    REQUIRE(bare.ok());
    CHECK(absl::IsInvalidArgument(service::Call(bare->get(), service::MessageType::kAnnounce,
                                                service::Encode(service::AnnounceRequest{}))
                                      .status()));
  }
  {  // Endless pieces: refused past 100 epochs of the dataset.
    ScopedFd socket = hello();
    service::AnnounceRequest piece;
    piece.last = false;
    piece.file_ids.assign(service::kMaxIdsPerMessage, 0);
    absl::Status status;
    for (int i = 0; i < 3 && status.ok(); ++i) {
      status = service::Call(socket.get(), service::MessageType::kAnnounce, service::Encode(piece))
                   .status();
      piece.first = false;
    }
    CHECK(absl::IsInvalidArgument(status));
    CHECK(absl::StrContains(status.message(), "epochs"));
  }
  CHECK((*node)->NodeStats().node.Get("prefetch_announced_files") == 0);
  {  // Ranges: a piece of ranges in an order of files, a file id past the
     // namespace, and a sample past its file's end (answered; the
     // connection goes on).
    ScopedFd socket = hello();
    service::AnnounceRequest files_piece;
    files_piece.last = false;
    files_piece.file_ids = {0};
    REQUIRE(service::Call(socket.get(), service::MessageType::kAnnounce,
                          service::Encode(files_piece)).ok());
    service::AnnounceRequest ranges_piece;
    ranges_piece.first = false;
    ranges_piece.ranges = true;
    ranges_piece.samples = {{0, 0, 10}};
    auto mixed = service::Call(socket.get(), service::MessageType::kAnnounce,
                               service::Encode(ranges_piece));
    CHECK(absl::IsInvalidArgument(mixed.status()));
    CHECK(absl::StrContains(mixed.status().message(), "ranges"));
    ScopedFd again = hello();
    service::AnnounceRequest bad_id;
    bad_id.ranges = true;
    bad_id.samples = {{0, 0, 10}, {4, 0, 10}};
    auto out_of_namespace = service::Call(again.get(), service::MessageType::kAnnounce,
                                          service::Encode(bad_id));
    CHECK(absl::IsInvalidArgument(out_of_namespace.status()));
    CHECK(absl::StrContains(out_of_namespace.status().message(), "out of range"));
    ScopedFd third = hello();
    service::AnnounceRequest past_end;
    past_end.ranges = true;
    past_end.samples = {{1, 5000, 10}};
    auto refused = service::Call(third.get(), service::MessageType::kAnnounce,
                                 service::Encode(past_end));
    CHECK(absl::IsOutOfRange(refused.status()));
    past_end.samples = {{1, 4999, 0}};  // The last byte: accepted, on the same connection.
    CHECK(service::Call(third.get(), service::MessageType::kAnnounce, service::Encode(past_end))
              .ok());
  }
  auto client = Monarch::Create(config);
  REQUIRE(client.ok());
  ReadAllExact(**client, files);
}

// Ranges through the service (Monarch::AnnounceRanges in a client): the
// service turns each sample into the extents that hold it, its streams
// fetch them, and the client's reads of them (hits it makes itself) use up
// its order.
TEST_CASE("service: an order of ranges from a client prefetches the extents that hold them") {
  ScratchDir dir;
  const std::string data = dir.Sub("data");
  const TestFile big{"tokens.bin", 17, 32 * (1 << 20)};
  testing::WriteFile(data + "/" + big.name, big.seed, big.size);
  const TestFile small{"labels.bin", 18, 100000};  // Cached whole.
  testing::WriteFile(data + "/" + small.name, small.seed, small.size);
  Config config = SharedConfig(data, {testing::RamTier(256 << 20)}, dir.Sub("run"));
  config.placement.extent_bytes = 1 << 20;
  config.placement.extent_threshold = 4 << 20;
  auto node = NodeService::Start(testing::Valid(config));
  REQUIRE(node.ok());
  auto client = Monarch::Create(config);
  REQUIRE(client.ok());
  // The small file whole, and records in extents 30, 2, 17 (two), 5 and 6
  // (one across both).
  const std::vector<Monarch::SampleRange> samples = {
      {small.name, 0, 0},                        {big.name, 30 * (1 << 20) + 4096, 65536},
      {big.name, 2 * (1 << 20), 65536},          {big.name, 17 * (1 << 20), 65536},
      {big.name, 17 * (1 << 20) + 65536, 65536}, {big.name, 6 * (1 << 20) - 1000, 65536}};
  REQUIRE((*client)->AnnounceRanges(samples).ok());
  auto node_stat = [&](const char* name) { return (*node)->NodeStats().node.Get(name); };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (node_stat("prefetch_files") < 6 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  (*client)->WaitForPlacement();
  const uint64_t fetched = 5 * (1 << 20) + small.size;  // Extents 30, 2, 17, 5, 6; the small file.
  Stats stats = (*client)->GetStats();
  CHECK(stats.Get("prefetch_files") == 6);
  CHECK(SourceBytes(stats) == fetched);
  CHECK(stats.Tier(0, "files") == 6);
  const uint64_t consumed_before = node_stat("prefetch_reads");
  for (const Monarch::SampleRange& sample : samples) {
    const TestFile& f = sample.file == big.name ? big : small;
    const size_t n = sample.length != 0 ? sample.length : f.size;
    std::vector<char> bytes(n);
    absl::StatusOr<size_t> got = (*client)->Read(f.name, bytes.data(), n, sample.offset);
    REQUIRE(got.ok());
    REQUIRE(*got == n);
    CHECK(testing::BytesMatch(f, bytes.data(), sample.offset, n));
  }
  (*client)->WaitForPlacement();
  stats = (*client)->GetStats();
  CHECK(SourceBytes(stats) == fetched);  // All hits.
  // The client read every extent copy itself: no read reached the service.
  CHECK((*node)->NodeStats().clients.at(0).misses == 0);
  // It reports its first reads in batches, the first at once, the rest
  // after kConsumedDelay with the next read: a read of the small file again
  // sends the 6 extent steps and itself, 8 in all.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  {
    std::vector<char> bytes(small.size);
    REQUIRE((*client)->Read(small.name, bytes.data(), small.size, 0).ok());
  }
  const auto reported = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (node_stat("prefetch_reads") - consumed_before < 8 &&
         std::chrono::steady_clock::now() < reported) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  CHECK(node_stat("prefetch_reads") - consumed_before == 8);
  // ...in this client's order: when another process announces (a forked
  // child, whose order is merged with it), nothing of it is left to fetch.
  int ready[2], done[2];
  REQUIRE(::pipe(ready) == 0);
  REQUIRE(::pipe(done) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    const bool announced = (*client)->AnnounceOrder({small.name}).ok();
    char byte = announced ? 'y' : 'n';
    const bool told = ::write(ready[1], &byte, 1) == 1;
    const bool waited = ::read(done[0], &byte, 1) == 1;  // Its order lives while it does.
    ::_exit(told && waited ? 0 : 1);
  }
  char answer = 0;
  REQUIRE(::read(ready[0], &answer, 1) == 1);
  CHECK(answer == 'y');
  CHECK(node_stat("prefetch_order_files") == 1);  // The child's only.
  REQUIRE(::write(done[1], "x", 1) == 1);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  for (int fd : {ready[0], ready[1], done[0], done[1]}) ::close(fd);
  // Errors come back to the caller; nothing is announced.
  CHECK(absl::IsNotFound((*client)->AnnounceRanges({{"nope.bin", 0, 10}})));
  CHECK(absl::IsOutOfRange((*client)->AnnounceRanges({{big.name, big.size, 10}})));
  CHECK((*client)->AnnounceRanges({{big.name, big.size - 1, 0}}).ok());  // The last byte.
}

// `monarch stage`: several stagers start the files' promotions at once, and
// still each file is read from the source once; a glob stages only what it
// names; a client then reads nothing but hits.
TEST_CASE("service: staging starts promotions from several stagers, each file read once") {
  ScratchDir dir;
  // Sizes below, at and above a chunk (1 MiB): a stager reads one byte and
  // placement loads the rest.
  std::vector<uint64_t> sizes(20, 7000);
  sizes[3] = 1 << 20;
  sizes[11] = (2 << 20) + 4097;
  sizes[5] = 0;  // Nothing to stage, and staged all the same.
  const auto files = testing::MakeDataset(dir.Sub("data"), 200, sizes);
  uint64_t empty_files = 0;
  for (const TestFile& f : files) empty_files += f.size == 0 ? 1 : 0;
  Config config = SharedConfig(dir.path() + "/data", {testing::RamTier(256 << 20)}, dir.Sub("run"));
  auto node = NodeService::Start(testing::Valid(config));
  REQUIRE(node.ok());
  auto stage = [&](const std::vector<std::string>& globs) {
    auto socket = service::ConnectUnix((*node)->paths().socket);
    REQUIRE(socket.ok());
    service::StageRequest request;
    request.globs = globs;
    REQUIRE(service::SendFrame(socket->get(), service::MessageType::kStage,
                               service::Encode(request)).ok());
    service::StageProgress last;
    while (!last.finished) {
      auto frame = service::ReceiveFrame(socket->get());
      REQUIRE(frame.ok());
      REQUIRE(frame->type == service::MessageType::kStageProgress);
      auto progress = service::DecodeStageProgress(frame->payload);
      REQUIRE(progress.ok());
      last = *progress;
    }
    return last;
  };
  auto node_stats = [&] { return (*node)->NodeStats().node; };
  std::vector<TestFile> in_dir1;
  for (const TestFile& f : files) {
    if (absl::StartsWith(f.name, "dir1/")) in_dir1.push_back(f);
  }

  const service::StageProgress dir1 = stage({"dir1"});
  uint64_t empty_in_dir1 = 0;
  for (const TestFile& f : in_dir1) empty_in_dir1 += f.size == 0 ? 1 : 0;
  CHECK(dir1.files_total == in_dir1.size());
  CHECK(dir1.files_in_tiers == in_dir1.size());
  CHECK(dir1.files_done == in_dir1.size());
  CHECK(dir1.bytes_done == testing::TotalBytes(in_dir1));
  CHECK(node_stats().Tier(0, "files") == in_dir1.size() - empty_in_dir1);
  CHECK(SourceBytes(node_stats()) == testing::TotalBytes(in_dir1));

  const service::StageProgress all = stage({});
  CHECK(all.files_total == files.size());
  CHECK(all.files_in_tiers == files.size());
  CHECK(all.files_done == files.size());
  CHECK(all.bytes_done == testing::TotalBytes(files));
  REQUIRE(empty_files > 0);
  CHECK(node_stats().Tier(0, "files") == files.size() - empty_files);
  CHECK(SourceBytes(node_stats()) == testing::TotalBytes(files));  // Each file once.
  CHECK(node_stats().Get("promotions_started") == files.size() - empty_files);

  auto client = Monarch::Create(config);
  REQUIRE(client.ok());
  ReadAllExact(**client, files);
  CHECK(SourceBytes(node_stats()) == testing::TotalBytes(files));  // Hits only.
}

// prefetch.stage_ahead: a job that announces no order gets the top-level
// directory of each of its misses staged by the prefetch streams when the
// tiers hold it; each file still read from the source once. A directory
// larger than the tiers, or `stage_ahead: false`, is not staged.
TEST_CASE("service: with no order announced, a miss's directory is staged when it fits") {
  for (const char* arm : {"fits", "too big", "off"}) {
    CAPTURE(arm);
    ScratchDir dir;
    // dir0: 10 files of 30,000 bytes (file0, 4, ... 36); dir3: 10 of 90,000.
    const auto files = testing::MakeDataset(dir.Sub("data"), 40, {30000, 90000});
    auto bytes_in = [&files](const std::string& top) {
      uint64_t bytes = 0;
      for (const TestFile& f : files) bytes += absl::StartsWith(f.name, top + "/") ? f.size : 0;
      return bytes;
    };
    const bool fits = std::string(arm) != "too big";
    Config config = SharedConfig(dir.path() + "/data",
                                 {testing::RamTier(fits ? 16 << 20 : 600000)}, dir.Sub("run"));
    config.prefetch.stage_ahead = std::string(arm) != "off";
    auto node = NodeService::Start(testing::Valid(config));
    REQUIRE(node.ok());
    auto client = Monarch::Create(config);
    REQUIRE(client.ok());
    const bool staged = std::string(arm) == "fits";
    // A miss, then the streams: wait for them (bounded), and for their
    // counts, which a stream adds after the copy it made is published.
    auto miss_and_wait = [&](const TestFile& f, uint64_t files_wanted,
                             uint64_t prefetched_wanted = 0) {
      ReadAllExact(**client, {f});
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      Stats stats = (*client)->GetStats();
      while ((stats.Tier(0, "files") < files_wanted ||
              stats.Get("prefetch_files") < prefetched_wanted) &&
             std::chrono::steady_clock::now() < deadline) {
        (*client)->WaitForPlacement();
        stats = (*client)->GetStats();
      }
      (*client)->WaitForPlacement();
      return (*client)->GetStats();
    };
    REQUIRE(absl::StartsWith(files[7].name, "dir3/"));
    Stats stats = miss_and_wait(files[7], staged ? 10 : 1, staged ? 9 : 0);
    CHECK(stats.Get("prefetch_staged_files") == (staged ? 10 : 0));
    CHECK(stats.Tier(0, "files") == (staged ? 10 : 1));
    // Each file of dir3 once (the miss's included); nothing of dir0-2.
    CHECK(SourceBytes(stats) == (staged ? bytes_in("dir3") : files[7].size));
    if (staged) {
      CHECK(stats.Get("prefetch_files") == 9);
      // A miss in another directory stages it too.
      stats = miss_and_wait(files[0], 20);
      CHECK(stats.Get("prefetch_staged_files") == 20);
      CHECK(stats.Tier(0, "files") == 20);
      CHECK(SourceBytes(stats) == bytes_in("dir3") + bytes_in("dir0"));
    }
    ReadAllExact(**client, files);
  }
}

// What a forked guest saw, as lines of failures ("" when all held).
std::string GuestChecks(const Config& config, const std::vector<TestFile>& files) {
  std::string failures;
  auto expect = [&failures](bool held, const std::string& what) {
    if (!held) absl::StrAppend(&failures, what, "\n");
  };
  // Through the client: the files it may open, exact; the secret, refused.
  auto client = Monarch::Create(config);
  expect(client.ok(), absl::StrCat("guest client: ", client.status().ToString()));
  if (!client.ok()) return failures;
  for (size_t i = 1; i < files.size(); ++i) {
    std::string buffer(files[i].size, '\0');
    absl::StatusOr<size_t> n = (*client)->Read(files[i].name, buffer.data(), buffer.size(), 0);
    expect(n.ok() && *n == files[i].size &&
               testing::BytesMatch(files[i], buffer.data(), 0, files[i].size),
           absl::StrCat("guest read of ", files[i].name, " not exact"));
  }
  std::string secret(files[0].size, '\0');
  absl::StatusOr<size_t> denied = (*client)->Read(files[0].name, secret.data(), secret.size(), 0);
  expect(absl::IsPermissionDenied(denied.status()),
         absl::StrCat("guest read of the secret: ", denied.status().ToString()));
  expect(secret == std::string(files[0].size, '\0'), "secret bytes reached the guest's buffer");

  // By hand, as a hostile guest would: no proof, false proofs, mappings, stop.
  auto socket = service::ConnectUnix(JoinPath(config.node.runtime_dir, "monarch.sock"));
  expect(socket.ok(), "connect");
  if (!socket.ok()) return failures;
  service::Hello hello;
  hello.dataset_root = config.dataset.path;
  hello.dataset_key = DatasetKey(config.dataset);
  auto reply = service::Call(socket->get(), service::MessageType::kHello, service::Encode(hello),
                             service::kMaxDescriptors);
  expect(reply.ok(), "hello");
  if (!reply.ok()) return failures;
  auto hello_reply = service::DecodeHelloReply(reply->payload);
  expect(hello_reply.ok() && hello_reply->guest, "the service did not call the guest a guest");
  expect(reply->fds.size() == service::HelloReply::kFixedDescriptors,
         absl::StrCat("a guest got ", reply->fds.size(), " descriptors"));
  if (reply->fds.empty()) return failures;
  auto image = service::NamespaceImage::Open(reply->fds[0]);
  expect(image.ok(), "image");
  if (!image.ok()) return failures;
  const uint32_t secret_id = *(*image)->FindId(files[0].name);
  const uint32_t open_id = *(*image)->FindId(files[1].name);
  auto refused = [&](service::MessageType type, const std::string& payload,
                     const std::vector<int>& fds, const std::string& what) {
    absl::Status sent = service::SendFrame(socket->get(), type, payload, fds);
    auto answer = service::ReceiveFrame(socket->get());
    bool denied = false;
    if (sent.ok() && answer.ok() && answer->type == service::MessageType::kError) {
      auto error = service::DecodeErrorReply(answer->payload);
      denied = error.ok() && absl::IsPermissionDenied(error->ToStatus());
    }
    expect(denied, absl::StrCat(what, ": not refused (sent ", sent.ToString(), ", answer ",
                                answer.ok() ? static_cast<int>(answer->type) : -1, " ",
                                answer.ok() && service::DecodeErrorReply(answer->payload).ok()
                                    ? service::DecodeErrorReply(answer->payload)->message
                                    : "", ")"));
  };
  refused(service::MessageType::kRead, service::Encode(service::ReadRequest{secret_id, 0, 100}),
          {}, "a read with no proof");
  const std::string secret_path = JoinPath(config.dataset.path, files[0].name);
  const int path_only = ::open(secret_path.c_str(), O_PATH | O_CLOEXEC);
  expect(path_only >= 0, "O_PATH open of the secret");
  refused(service::MessageType::kProveAccess, service::Encode(service::ProveAccessRequest{secret_id}),
          {path_only}, "an O_PATH descriptor as proof");
  const int other = ::open(JoinPath(config.dataset.path, files[1].name).c_str(), O_RDONLY | O_CLOEXEC);
  refused(service::MessageType::kProveAccess, service::Encode(service::ProveAccessRequest{secret_id}),
          {other}, "another file's descriptor as proof");
  refused(service::MessageType::kRead, service::Encode(service::ReadRequest{secret_id, 0, 100}),
          {}, "a read after false proofs");
  service::CheckedCopiesRequest copies;
  copies.ids = {open_id};
  refused(service::MessageType::kCheckedCopies, service::Encode(copies), {}, "a mapping");
  refused(service::MessageType::kStop, "", {}, "a stop");
  ::close(path_only);
  ::close(other);
  return failures;
}

// node.share_with_group: another user of the group reads through the
// service (root's here) only what it can open on the source itself, in a
// forked process that became that user.
TEST_CASE("service: a guest of node.share_with_group reads only files it proved it may open") {
  if (::geteuid() != 0) MONARCH_SKIP("needs root, to become two other users");
  constexpr gid_t kGroup = 4242;
  ScratchDir dir;
  REQUIRE(::chmod(dir.path().c_str(), 0755) == 0);  // The guest reaches the dataset.
  const auto files = testing::MakeDataset(dir.Sub("data"), 6, {5000, 70000});
  const std::string secret_path = dir.path() + "/data/" + files[0].name;
  REQUIRE(::chmod(secret_path.c_str(), 0600) == 0);  // Root's alone.
  Config config = SharedConfig(dir.path() + "/data", {testing::RamTier(16 << 20)},
                               dir.path() + "/run");  // Made by the service, the group's.
  config.node.share_with_group = std::to_string(kGroup);
  auto node = NodeService::Start(testing::Valid(config));
  REQUIRE(node.ok());
  struct stat st;
  REQUIRE(::stat((dir.path() + "/run").c_str(), &st) == 0);
  CHECK(st.st_gid == kGroup);
  CHECK((st.st_mode & 07777) == 02770);
  REQUIRE(::stat((*node)->paths().socket.c_str(), &st) == 0);
  CHECK(st.st_gid == kGroup);
  CHECK((st.st_mode & 0777) == 0660);
  {
    auto owner = Monarch::Create(config);  // The service's own user reads all, the secret too.
    REQUIRE(owner.ok());
    ReadAllExact(**owner, files);
    (*owner)->WaitForPlacement();
    REQUIRE((*owner)->GetStats().Tier(0, "files") == files.size());  // The secret is in RAM.
  }

  // As uid 4241 in the group, and as uid 4244 outside it.
  for (const bool member : {true, false}) {
    CAPTURE(member);
    int pipe_fds[2];
    REQUIRE(::pipe(pipe_fds) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      const gid_t groups[] = {kGroup};
      std::string failures;
      if (::setgroups(member ? 1 : 0, groups) != 0 || ::setresgid(4243, 4243, 4243) != 0 ||
          ::setresuid(member ? 4241 : 4244, member ? 4241 : 4244, member ? 4241 : 4244) != 0) {
        failures = "could not become the other user\n";
      } else if (member) {
        failures = GuestChecks(config, files);
      } else {
        // The socket is the group's: an outsider cannot even connect.
        auto socket = service::ConnectUnix((*node)->paths().socket);
        if (socket.ok() || !absl::IsPermissionDenied(socket.status())) {
          failures = absl::StrCat("an outsider's connect: ", socket.status().ToString(), "\n");
        }
      }
      const bool sent = ::write(pipe_fds[1], failures.data(), failures.size()) ==
                        static_cast<ssize_t>(failures.size());
      ::_exit(sent ? 0 : 1);
    }
    ::close(pipe_fds[1]);
    std::string failures;
    char chunk[512];
    for (ssize_t n; (n = ::read(pipe_fds[0], chunk, sizeof(chunk))) > 0;) failures.append(chunk, n);
    ::close(pipe_fds[0]);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(failures == "");
  }
  // Refused: the client's secret read never reached the service (its own
  // open failed); the hand-made read, two false proofs, the read after
  // them. The mapping and the stop are refused without a count. The
  // guest's other reads came through the service, none from the source
  // behind its back.
  const Stats stats = (*node)->NodeStats().node;
  CHECK(stats.Get("service.guest_refusals") == 4);
  CHECK(stats.Get("service.client_source_fallbacks") == 0);
}

}  // namespace
}  // namespace monarch
