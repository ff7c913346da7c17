// Failures of Monarch's own file calls, injected through the OS seam
// (common/os.h, tests/fault_env.h): the namespace walk, the warm-start scan
// of tier directories, temporaries and the rename that publishes a copy,
// short reads of the source, the rendezvous directory, the posix tier's
// direct writes and the node service's runtime directory, socket and config
// file. Whatever fails, reads return the source's bytes or a clear error,
// never wrong bytes, and capacity is given back.
//
// Each test installs its FaultInjectingEnv before creating the instance and
// removes it after the instance is destroyed (the ScopedEnvForTesting is
// declared first), as os.h requires.

#include <doctest/doctest.h>
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/os.h"
#include "drivers/copy_integrity.h"
#include "drivers/storage_driver.h"
#include "fault_env.h"
#include "instance_util.h"
#include "monarch/monarch.h"
#include "core/monarch_internal.h"
#include "remote/bootstrap.h"
#include "service/runtime.h"
#include "service/unix_socket.h"
#include "test_util.h"

namespace monarch {
namespace {

using testing::FaultInjectingDriver;
using testing::FaultInjectingEnv;
using testing::MustCreate;
using testing::OnDisk;
using testing::ReadWholeAndCheck;
using testing::ScratchDir;
using testing::TestFile;
using Op = FaultInjectingEnv::Op;

// Regular files under `dir`, recursively (names relative to it).
std::vector<std::string> FilesUnder(const std::string& dir, const std::string& prefix = "") {
  std::vector<std::string> found;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return found;
  while (struct dirent* e = ::readdir(d)) {
    const std::string base = e->d_name;
    if (base == "." || base == "..") continue;
    const std::string path = dir + "/" + base;
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      for (std::string& f : FilesUnder(path, prefix + base + "/")) found.push_back(std::move(f));
    } else {
      found.push_back(prefix + base);
    }
  }
  ::closedir(d);
  return found;
}

// What the process writes to stderr (Monarch's log) while it lives.
class StderrCapture {
 public:
  StderrCapture() {
    std::fflush(stderr);
    saved_ = ::dup(2);
    std::FILE* file = std::tmpfile();
    REQUIRE(file != nullptr);
    file_ = file;
    ::dup2(::fileno(file_), 2);
  }
  ~StderrCapture() { Restore(); }
  std::string Restore() {
    if (saved_ >= 0) {
      std::fflush(stderr);
      ::dup2(saved_, 2);
      ::close(saved_);
      saved_ = -1;
      std::rewind(file_);
      char buffer[4096];
      size_t n;
      while ((n = std::fread(buffer, 1, sizeof(buffer), file_)) > 0) text_.append(buffer, n);
      std::fclose(file_);
    }
    return text_;
  }

 private:
  int saved_ = -1;
  std::FILE* file_ = nullptr;
  std::string text_;
};

TEST_CASE("env: the seam dispatches to the installed Env and restores the default") {
  ScratchDir dir;
  const std::string path = dir.path() + "/f";
  testing::WriteFile(path, 1, 100);
  FaultInjectingEnv env;
  env.Fail(Op::kOpen, "/f", EACCES, /*times=*/1);
  {
    os::ScopedEnvForTesting installed(&env);
    errno = 0;
    CHECK(os::Open(path.c_str(), O_RDONLY) == -1);
    CHECK(errno == EACCES);
    const int fd = os::Open(path.c_str(), O_RDONLY);  // The rule was for one call.
    REQUIRE(fd >= 0);
    env.ShortenReads("/f", 7);
    char buffer[100];
    CHECK(os::Pread(fd, buffer, sizeof(buffer), 0) == 7);
    CHECK(testing::BytesMatch({"f", 1, 100}, buffer, 0, 7));
    os::Close(fd);
    CHECK(env.calls(Op::kOpen) == 2);
    CHECK(env.injected(Op::kOpen) == 1);
    CHECK(env.injected(Op::kRead) == 1);
    {
      os::Env plain;  // The base class: the direct calls.
      os::ScopedEnvForTesting nested(&plain);
      CHECK(os::SetEnvForTesting(&plain) == &plain);
    }
    CHECK(os::SetEnvForTesting(&env) == &env);  // The nested scope restored ours.
  }
  // Ours is gone: the direct calls again.
  const int fd = os::Open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  char buffer[100];
  CHECK(os::Pread(fd, buffer, sizeof(buffer), 0) == 100);
  os::Close(fd);
  CHECK(env.calls(Op::kOpen) == 2);
  CHECK(os::SetEnvForTesting(nullptr) == nullptr);
}

TEST_CASE("walk: an unreadable subdirectory is skipped with a warning, the rest is served") {
  for (int error : {EACCES, EIO}) {
    CAPTURE(error);
    ScratchDir dir;
    const std::string ds = dir.Sub("ds");
    auto files = testing::MakeDataset(ds, 12, {1000, 70000});
    FaultInjectingEnv env;
    os::ScopedEnvForTesting installed(&env);
    env.FailIf(Op::kOpenDir, [&](const std::string& p) { return p == ds + "/dir1"; }, error);
    StderrCapture log;
    auto m = MustCreate(testing::MakeConfig(ds, {testing::RamTier(1 << 20)}));
    const std::string warnings = log.Restore();
    CHECK(env.injected(Op::kOpenDir) == 1);
    CHECK_MESSAGE(absl::StrContains(warnings, "skipping unreadable directory " + ds + "/dir1"),
                  warnings);
    CHECK(absl::StrContains(warnings, std::strerror(error)));
    CHECK(m->ListFiles().size() == 9);  // dir1 held files 1, 5 and 9.
    char byte;
    for (const TestFile& f : files) {
      CAPTURE(f.name);
      if (absl::StartsWith(f.name, "dir1/")) {
        CHECK_FALSE(m->FileExists(f.name));
        CHECK(absl::IsNotFound(m->Read(f.name, &byte, 1, 0).status()));
      } else {
        ReadWholeAndCheck(*m, f);
      }
    }
  }
}

TEST_CASE("walk: ENOENT on the dataset root is a clear error naming dataset.path") {
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  testing::MakeDataset(ds, 4, {100});
  FaultInjectingEnv env;
  os::ScopedEnvForTesting installed(&env);
  env.FailIf(Op::kOpenDir, [&](const std::string& p) { return p == ds; }, ENOENT);
  absl::StatusOr<std::unique_ptr<Monarch>> m =
      testing::CreateWithFaults(testing::MakeConfig(ds, {testing::RamTier(1 << 20)}));
  REQUIRE_FALSE(m.ok());
  CHECK(absl::IsNotFound(m.status()));
  CHECK_MESSAGE(absl::StrContains(m.status().message(), "dataset.path"), m.status());
  CHECK(absl::StrContains(m.status().message(), ds));
  CHECK(absl::StrContains(m.status().message(), std::strerror(ENOENT)));
}

TEST_CASE("walk: a file whose stat fails with EIO is left out, the rest is served") {
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  auto files = testing::MakeDataset(ds, 8, {5000});
  FaultInjectingEnv env;
  os::ScopedEnvForTesting installed(&env);
  env.Fail(Op::kStat, "/file3.bin", EIO);
  auto m = MustCreate(testing::MakeConfig(ds, {testing::RamTier(1 << 20)}));
  CHECK(env.injected(Op::kStat) >= 1);
  CHECK(m->ListFiles().size() == 7);
  CHECK_FALSE(m->FileExists(files[3].name));
  CHECK(*m->ListDirectory("dir3") == std::vector<std::string>{"file7.bin"});
  for (const TestFile& f : files) {
    if (f.name != files[3].name) ReadWholeAndCheck(*m, f);
  }
  m->WaitForPlacement();
  CHECK(m->GetStats().Get("promotions_completed") == 7);
}

// Fills a posix tier at `nvme` with copies of every file, then destroys the
// instance.
void StageAll(const Config& config, const std::vector<TestFile>& files) {
  auto m = MustCreate(config);
  for (const TestFile& f : files) ReadWholeAndCheck(*m, f);
  m->Shutdown(Monarch::ShutdownMode::kDrain);
  REQUIRE(m->GetStats().Tier(0, "files") == files.size());
}

TEST_CASE("tier scan: EIO listing a tier directory fails start-up with an error naming it") {
  // Start-up fails rather than going on without reuse: copies the scan could
  // not see would still take room on the device without being counted, and
  // the tier could overflow its capacity.
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  const std::string nvme = dir.Sub("nvme");
  auto files = testing::MakeDataset(ds, 8, {30000});
  const Config config = testing::MakeConfig(
      ds, {testing::FileTier(TierKind::kPosix, nvme, 1 << 30, "nvme")});
  StageAll(config, files);
  for (const std::string& where : {nvme, nvme + "/dir2"}) {
    CAPTURE(where);
    FaultInjectingEnv env;
    os::ScopedEnvForTesting installed(&env);
    env.FailIf(Op::kOpenDir, [&](const std::string& p) { return p == where; }, EIO);
    absl::StatusOr<std::unique_ptr<Monarch>> m = testing::CreateWithFaults(config);
    REQUIRE_FALSE(m.ok());
    CHECK(env.injected(Op::kOpenDir) == 1);
    CHECK(absl::IsDataLoss(m.status()));
    CHECK_MESSAGE(absl::StrContains(m.status().message(), "opendir " + where), m.status());
    CHECK(absl::StrContains(m.status().message(), std::strerror(EIO)));
  }
  // Nothing was lost: without the fault every copy is reused.
  auto m = MustCreate(config);
  CHECK(m->GetStats().Get("warm_files_reused") == files.size());
}

TEST_CASE("tier scan: a copy whose trailer cannot be read (EACCES) is not reused") {
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  const std::string nvme = dir.Sub("nvme");
  auto files = testing::MakeDataset(ds, 8, {30000, 200000});
  const Config config = testing::MakeConfig(
      ds, {testing::FileTier(TierKind::kPosix, nvme, 1 << 30, "nvme")});
  StageAll(config, files);
  FaultInjectingEnv env;
  os::ScopedEnvForTesting installed(&env);
  {
    FaultInjectingDriver::Faults source;
    // The scan's first read of the copy is its trailer's footer.
    env.Fail(Op::kRead, nvme + "/" + files[5].name, EACCES, /*times=*/1);
    auto m = MustCreate(config, &source);
    CHECK(env.injected(Op::kRead) == 1);
    Stats stats = m->GetStats();
    CHECK(stats.Get("warm_files_reused") == 7);
    CHECK(stats.Get("warm_files_discarded") == 1);
    CHECK(stats.Tier(0, "files") == 7);
    uint64_t kept_bytes = 0;
    for (const TestFile& f : files) kept_bytes += f.name == files[5].name ? 0 : OnDisk(f.size);
    CHECK(stats.Tier(0, "bytes_used") == kept_bytes);
    CHECK(FilesUnder(nvme + "/" + files[5].name.substr(0, 4)).size() == 1);  // Its copy is gone.
    for (const TestFile& f : files) ReadWholeAndCheck(*m, f);
    CHECK(source.BytesOf(files[5].name) == files[5].size);  // Only it came from the source.
    CHECK(source.bytes.load() == files[5].size);
    m->WaitForPlacement();
    CHECK(m->GetStats().Tier(0, "files") == 8);  // Promoted again.
  }
  // The new copy is reused at the next start.
  auto m = MustCreate(config);
  CHECK(m->GetStats().Get("warm_files_reused") == 8);
}

TEST_CASE("publish: a rename failing with ENOSPC or EIO fails the promotion cleanly") {
  for (int error : {EIO, ENOSPC}) {
    CAPTURE(error);
    ScratchDir dir;
    const std::string ds = dir.Sub("ds");
    const std::string nvme = dir.Sub("nvme");
    auto files = testing::MakeDataset(ds, 6, {1000, 300000});
    FaultInjectingEnv env;
    os::ScopedEnvForTesting installed(&env);
    env.Fail(Op::kRename, nvme + "/.monarch/tmp/", error);
    Config config = testing::MakeConfig(
        ds, {testing::FileTier(TierKind::kPosix, nvme, 1 << 30, "nvme")});
    config.placement.threads = 1;
    // Every byte through the source's reads (counted below): promoted at
    // the miss, not copied later from its page cache.
    config.placement.cached_source = CachedSourcePolicy::kPromote;
    auto m = MustCreate(config);
    for (int epoch = 0; epoch < 2; ++epoch) {
      for (const TestFile& f : files) ReadWholeAndCheck(*m, f, 65536);
      m->WaitForPlacement();
    }
    Stats stats = m->GetStats();
    CHECK(env.injected(Op::kRename) >= 1);
    CHECK(stats.Get("promotions_completed") == 0);
    CHECK(stats.Get("promotions_failed") == env.injected(Op::kRename));
    if (error == EIO) CHECK(stats.Get("promotions_failed") == files.size());
    CHECK(stats.Tier(0, "files") == 0);
    CHECK(stats.Tier(0, "bytes_used") == 0);
    CHECK(stats.Source("bytes_read") >= 2 * testing::TotalBytes(files));
    // No temporary and no copy is left in the tier. Checked once the
    // instance is gone: a failed commit's temporary is deleted when its
    // writer is destroyed, which Promotion::Commit does just after reporting
    // the failure, so WaitForPlacement() can return a moment before that.
    m.reset();
    const std::vector<std::string> left = FilesUnder(nvme);
    CHECK_MESSAGE(left.empty(), absl::StrJoin(left, ", "));
  }
}

TEST_CASE("temporaries: mkdir failing with EACCES in a tier fails promotions, reads stay exact") {
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  const std::string nvme = dir.Sub("nvme");
  auto files = testing::MakeDataset(ds, 8, {4096, 100000});
  FaultInjectingEnv env;
  os::ScopedEnvForTesting installed(&env);
  env.Fail(Op::kMkdir, nvme, EACCES);
  auto m = MustCreate(
      testing::MakeConfig(ds, {testing::FileTier(TierKind::kPosix, nvme, 1 << 30, "nvme")}));
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (const TestFile& f : files) ReadWholeAndCheck(*m, f);
    m->WaitForPlacement();
  }
  Stats stats = m->GetStats();
  CHECK(env.injected(Op::kMkdir) >= 1);
  CHECK(stats.Get("promotions_completed") == 0);
  CHECK(stats.Get("promotions_failed") == files.size());
  CHECK(stats.Tier(0, "files") == 0);
  CHECK(stats.Tier(0, "bytes_used") == 0);
  CHECK(FilesUnder(nvme) == std::vector<std::string>{});
}

TEST_CASE("source: short reads give the right bytes, into the tiers as well") {
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  const std::string nvme = dir.Sub("nvme");
  auto files = testing::MakeDataset(ds, 8, {1, 5000, 300000, 1 << 20});
  FaultInjectingEnv env;
  os::ScopedEnvForTesting installed(&env);
  env.ShortenReads(ds + "/", 777);  // Every source read returns at most 777 bytes.
  Config config = testing::MakeConfig(
      ds, {testing::RamTier(1 << 20), testing::FileTier(TierKind::kPosix, nvme, 1 << 30, "nvme")});
  config.placement.chunk_bytes = 64 << 10;
  auto m = MustCreate(config);
  for (const TestFile& f : files) ReadWholeAndCheck(*m, f, 100000);
  m->WaitForPlacement();
  CHECK(env.injected(Op::kRead) > 0);
  Stats stats = m->GetStats();
  CHECK(stats.Get("promotions_completed") == files.size());
  CHECK(stats.Tier(0, "files") + stats.Tier(1, "files") == files.size());
  env.Clear();
  for (const TestFile& f : files) ReadWholeAndCheck(*m, f, 4096);  // From the tiers now.
  CHECK(m->GetStats().Source("bytes_read") == stats.Source("bytes_read"));
}

TEST_CASE("source: a file that reads as empty gives short reads or errors, never wrong bytes") {
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  const std::string nvme = dir.Sub("nvme");
  auto files = testing::MakeDataset(ds, 4, {200000});
  FaultInjectingEnv env;
  os::ScopedEnvForTesting installed(&env);
  env.ShortenReads("/" + files[2].name, 0);  // As if truncated after the walk.
  auto m = MustCreate(
      testing::MakeConfig(ds, {testing::FileTier(TierKind::kPosix, nvme, 1 << 30, "nvme")}));
  std::vector<char> buffer(65536);
  for (uint64_t offset = 0; offset < files[2].size; offset += buffer.size()) {
    absl::StatusOr<size_t> n = m->Read(files[2].name, buffer.data(), buffer.size(), offset);
    if (n.ok()) CHECK(testing::BytesMatch(files[2], buffer.data(), offset, *n));
  }
  for (const TestFile& f : files) {
    if (f.name != files[2].name) ReadWholeAndCheck(*m, f);
  }
  m->WaitForPlacement();
  // No copy of the missing bytes was published: once the source reads
  // again, the file is served whole and right.
  env.Clear();
  ReadWholeAndCheck(*m, files[2]);
  m->WaitForPlacement();
  ReadWholeAndCheck(*m, files[2]);
  CHECK(m->GetStats().Tier(0, "files") >= 3);
}

TEST_CASE("rendezvous directory: failures to create, write or publish are clear errors") {
  ScratchDir dir;
  struct Case {
    Op op;
    std::string where;
    int error;
    std::string expected;
  };
  const std::string rendezvous = dir.path() + "/job/rdv";
  const std::vector<Case> cases = {
      {Op::kMkdir, rendezvous, EACCES, "cannot create '" + rendezvous + "'"},
      {Op::kMkdir, rendezvous, ENOSPC, "cannot create '" + rendezvous + "'"},
      {Op::kOpen, rendezvous + "/rank-0.addr.tmp", EACCES, "cannot write '" + rendezvous},
      {Op::kWrite, rendezvous + "/rank-0.addr.tmp", ENOSPC, "cannot write '" + rendezvous},
      {Op::kRename, rendezvous + "/rank-0.addr", EIO, "cannot publish '" + rendezvous},
  };
  for (const Case& c : cases) {
    CAPTURE(c.expected);
    CAPTURE(c.error);
    FaultInjectingEnv env;
    os::ScopedEnvForTesting installed(&env);
    env.Fail(c.op, c.where, c.error);
    absl::StatusOr<std::vector<std::string>> got =
        ExchangeThroughDirectory(rendezvous, 0, 1, "my-address", 1.0);
    REQUIRE_FALSE(got.ok());
    CHECK(env.injected(c.op) >= 1);
    CHECK(absl::IsFailedPrecondition(got.status()));
    CHECK_MESSAGE(absl::StrContains(got.status().message(), "remote.rendezvous_dir: "),
                  got.status());
    CHECK_MESSAGE(absl::StrContains(got.status().message(), c.expected), got.status());
    CHECK(absl::StrContains(got.status().message(), std::strerror(c.error)));
    // Nothing half-written is left for a peer to read.
    CHECK(FilesUnder(rendezvous) == std::vector<std::string>{});
  }
  // Without faults the same call succeeds.
  absl::StatusOr<std::vector<std::string>> got =
      ExchangeThroughDirectory(rendezvous, 0, 1, "my-address", 1.0);
  REQUIRE_MESSAGE(got.ok(), got.status());
  CHECK(*got == std::vector<std::string>{"my-address"});
  CHECK(FilesUnder(rendezvous) == std::vector<std::string>{"rank-0.addr"});
  WithdrawFromDirectory(rendezvous, 0);
  CHECK(FilesUnder(rendezvous) == std::vector<std::string>{});
}

// The calls below once bypassed the seam (plain libc calls): each test fails
// a call of its kind through the FaultInjectingEnv and checks that the caller
// saw the failure, so a call that goes around the seam again fails here.

TEST_CASE("posix tier: a direct copy's allocation, truncation and clean-up go through the seam") {
  ScratchDir dir;
  {
    // Only direct writes allocate ahead and cut their padding off at commit.
    int probe = ::open((dir.path() + "/probe").c_str(), O_WRONLY | O_CREAT | O_DIRECT, 0644);
    if (probe < 0) {
      MONARCH_SKIP("no O_DIRECT on " << dir.path() << "; set TMPDIR to a disk to run this test");
    }
    ::close(probe);
    ::unlink((dir.path() + "/probe").c_str());
  }
  const std::string tier = dir.Sub("nvme");
  const TestFile source{"big.bin", 7, (2 << 20) + 100};  // Not whole pages: padded, then cut.
  const uint64_t rounded = (source.size + 4095) / 4096 * 4096;
  std::unique_ptr<char, decltype(&std::free)> image(
      static_cast<char*>(std::aligned_alloc(4096, rounded)), &std::free);
  REQUIRE(image != nullptr);
  for (uint64_t i = 0; i < source.size; ++i) image.get()[i] = testing::ExpectedByte(source.seed, i);
  FileRef file;
  file.id = 1;
  file.name = source.name;
  file.size = source.size;
  file.mtime_ns = 1234567890123456789;

  FaultInjectingEnv env;
  os::ScopedEnvForTesting installed(&env);
  PosixWriteOptions options;
  options.mode = PosixWriteOptions::Mode::kDirect;
  std::unique_ptr<StorageDriver> driver = NewPosixDriver(tier, 8, options);

  // A full device fails the new copy at once, and its temporary is unlinked.
  env.Fail(Op::kAllocate, "/.monarch/tmp/", ENOSPC, /*times=*/1);
  const uint64_t unlinks = env.calls(Op::kUnlink);
  absl::StatusOr<std::unique_ptr<CopyWriter>> writer = driver->NewWriter(file);
  REQUIRE_FALSE(writer.ok());
  CHECK(absl::IsResourceExhausted(writer.status()));
  CHECK_MESSAGE(absl::StrContains(writer.status().message(), "allocate "), writer.status());
  CHECK(env.injected(Op::kAllocate) == 1);
  CHECK(env.calls(Op::kUnlink) == unlinks + 1);
  CHECK(FilesUnder(tier) == std::vector<std::string>{});

  // Cutting the padding off fails the commit; nothing is published.
  env.Fail(Op::kTruncate, "/.monarch/tmp/", EIO, /*times=*/1);
  absl::Status stored = StoreCopy(*driver, file, image.get(), file.size);
  CHECK(absl::IsDataLoss(stored));
  CHECK_MESSAGE(absl::StrContains(stored.message(), "truncate "), stored);
  CHECK(env.injected(Op::kTruncate) == 1);
  CHECK(FilesUnder(tier) == std::vector<std::string>{});
  char byte;
  CHECK(absl::IsNotFound(driver->Read(file, 0, &byte, 1).status()));

  // Without faults the same copy is stored and reads back exactly.
  REQUIRE(StoreCopy(*driver, file, image.get(), file.size).ok());
  std::vector<char> whole(source.size + 1);
  absl::StatusOr<size_t> n = driver->Read(file, 0, whole.data(), whole.size());
  REQUIRE(n.ok());
  CHECK(*n == source.size);
  CHECK(testing::BytesMatch(source, whole.data(), 0, source.size));
  CHECK(env.calls(Op::kAllocate) == 3);  // One per copy begun.
  CHECK(env.calls(Op::kTruncate) == 2);  // One per copy committed.
}

TEST_CASE("node service: the runtime directory, socket and config file go through the seam") {
  ScratchDir dir;
  // A runtime directory open to others is closed (chmod 0700), or refused.
  const std::string run = dir.Sub("run");  // 0755: mkdir -p under the usual umask.
  {
    FaultInjectingEnv env;
    os::ScopedEnvForTesting installed(&env);
    env.Fail(Op::kChmod, run, EPERM);
    absl::Status prepared = service::PrepareRuntimeDirectory(service::ServicePathsIn(run));
    CHECK(absl::IsPermissionDenied(prepared));
    CHECK_MESSAGE(absl::StrContains(prepared.message(), "chmod 0700 " + run), prepared);
    CHECK(env.injected(Op::kChmod) == 1);

    // The socket is made the user's own the same way.
    const std::string socket = run + "/test.sock";
    absl::StatusOr<ScopedFd> listening = service::ListenUnix(socket, 4);
    REQUIRE_FALSE(listening.ok());
    CHECK_MESSAGE(absl::StrContains(listening.status().message(), "chmod " + socket),
                  listening.status());
    CHECK(env.injected(Op::kChmod) == 2);

    env.Clear();
    REQUIRE(service::PrepareRuntimeDirectory(service::ServicePathsIn(run)).ok());
    struct stat st;
    REQUIRE(::stat(run.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0700);
  }

  // A client about to start the service writes the config it was given as
  // YAML into the runtime directory, and renames it into place: a failed
  // rename fails the client, and no service is started.
  const std::string ds = dir.Sub("ds");
  testing::MakeDataset(ds, 2, {1000});
  const std::string yaml = "dataset: {path: " + ds +
                           "}\ntiers:\n  - {kind: ram, capacity: 1MiB}\n  - {kind: source}\n"
                           "node: {shared: true, autostart: true, idle_exit: 1s, runtime_dir: " +
                           run + "}\n";
  FaultInjectingEnv env;
  os::ScopedEnvForTesting installed(&env);
  env.Fail(Op::kRename, run + "/config-", EIO);
  absl::StatusOr<std::unique_ptr<Monarch>> client = Monarch::CreateFromYamlString(yaml);
  REQUIRE_FALSE(client.ok());
  CHECK(absl::IsDataLoss(client.status()));
  CHECK_MESSAGE(absl::StrContains(client.status().message(), "rename " + run + "/config-"),
                client.status());
  CHECK(absl::StrContains(client.status().message(), std::strerror(EIO)));
  CHECK(env.injected(Op::kRename) == 1);
  CHECK_FALSE(service::ServiceLockHeld(service::ServicePathsIn(run)));
}

}  // namespace
}  // namespace monarch
