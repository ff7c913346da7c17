// Manifest: a namespace rebuilt from one equals the walked one; a changed
// dataset, a damaged or lying manifest, or one of another config is
// refused naming dataset.manifest; peers meeting in a directory walk the
// dataset once per job (rank 0), the others build from its manifest.

#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/file_util.h"
#include "common/os.h"
#include "metadata/manifest.h"
#include "metadata/namespace.h"
#include "monarch/monarch.h"
#include "core/monarch_internal.h"
#include "test_util.h"

namespace monarch {
namespace {

using testing::ScratchDir;
using testing::TestFile;

// Counts the directory listings and path stats under one directory: a walk
// opens every directory, checking a manifest opens none.
class CountingEnv final : public os::Env {
 public:
  explicit CountingEnv(std::string under) : under_(std::move(under)) {}
  DIR* OpenDir(const char* path) override {
    if (absl::StartsWith(path, under_)) opendirs.fetch_add(1);
    return os::Env::OpenDir(path);
  }
  int FstatAt(int dir_fd, const char* path, struct stat* st, int flags) override {
    if (absl::StartsWith(path, under_)) path_stats.fetch_add(1);
    return os::Env::FstatAt(dir_fd, path, st, flags);
  }
  std::atomic<int> opendirs{0};
  std::atomic<int> path_stats{0};  // stat() by path (not the walk's fstatat by name).

 private:
  const std::string under_;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size());
}
// Recomputes the trailer, so that a patched manifest reaches the parser's
// structure checks instead of failing its checksum.
void FixChecksum(std::string* bytes) {
  const uint32_t crc = Crc32c(bytes->data(), bytes->size() - 4);
  for (int i = 0; i < 4; ++i) (*bytes)[bytes->size() - 4 + i] = static_cast<char>(crc >> (8 * i));
}
void Put32At(std::string* bytes, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) (*bytes)[at + i] = static_cast<char>(v >> (8 * i));
}

// Mtimes come from a coarse clock (a scheduler tick): a change made in the
// same tick as the walk would keep the directory's mtime.
void NextTick() { std::this_thread::sleep_for(std::chrono::milliseconds(30)); }

// 4 top-level directories, one nested one, an empty one, a file at the
// root and a symlink to a file.
std::vector<TestFile> MakeTree(const std::string& root) {
  std::vector<TestFile> files = testing::MakeDataset(root, 40, {0, 1, 4096, 70000});
  for (auto [name, seed, size] : std::vector<TestFile>{
           {"dir1/deep/er/x.bin", 7, 333}, {"top.bin", 8, 12}, {"dir2/ab", 9, 5},
           {"dir2/ac", 10, 6}}) {
    testing::WriteFile(root + "/" + name, seed, size);
    files.push_back({name, seed, size});
  }
  ::mkdir((root + "/empty").c_str(), 0755);
  REQUIRE(::symlink((root + "/top.bin").c_str(), (root + "/link.bin").c_str()) == 0);
  files.push_back({"link.bin", 8, 12});
  return files;
}

void CheckSameNamespace(const Namespace& walked, const Namespace& built) {
  REQUIRE(built.file_count() == walked.file_count());
  CHECK(built.total_bytes() == walked.total_bytes());
  CHECK(built.root() == walked.root());
  for (uint32_t id = 0; id < walked.file_count(); ++id) {
    const FileRef& a = walked.entry(id).ref;
    const FileRef& b = built.entry(id).ref;
    CHECK(a.name == b.name);
    CHECK(b.id == id);
    CHECK(a.size == b.size);
    CHECK(a.mtime_ns == b.mtime_ns);
    CHECK(walked.identity(id) == built.identity(id));
    const FileAttributes x = walked.attributes(id);
    const FileAttributes y = built.attributes(id);
    CHECK((x.atime_ns == y.atime_ns && x.blocks == y.blocks && x.mode == y.mode &&
           x.link_count == y.link_count && x.uid == y.uid && x.gid == y.gid &&
           x.block_size == y.block_size && x.via_symlink == y.via_symlink));
    CHECK(built.Find(a.name)->ref.id == id);
    CHECK(built.entry(id).tier->load() == walked.entry(id).tier->load());
  }
  REQUIRE(built.directory_count() == walked.directory_count());
  for (uint32_t d = 0; d < walked.directory_count(); ++d) {
    const std::string& name = walked.directory_name(d);
    CHECK(built.directory_name(d) == name);
    CHECK(built.directory_parent(d) == walked.directory_parent(d));
    CHECK(built.IsDirectory(name) == walked.IsDirectory(name));
    absl::StatusOr<std::vector<std::string>> a = walked.List(name);
    absl::StatusOr<std::vector<std::string>> b = built.List(name);
    CHECK(a.status() == b.status());
    if (a.ok() && b.ok()) CHECK(*a == *b);
  }
  CHECK(built.stamps().size() == walked.stamps().size());
}

absl::StatusOr<std::unique_ptr<Monarch>> CreateWithManifest(const std::string& dataset,
                                                            const std::string& manifest) {
  Config config = testing::MakeConfig(dataset, {testing::RamTier(64 << 20)});
  config.dataset.manifest = manifest;
  return CreateMonarchWithDriverWrapper(config, nullptr);
}

int ReadAndCheck(Monarch& m, const std::vector<TestFile>& files) {
  int bad = 0;
  for (const TestFile& f : files) {
    std::vector<char> buffer(f.size + 1);
    absl::StatusOr<size_t> got = m.Read(f.name, buffer.data(), buffer.size(), 0);
    if (!got.ok() || *got != f.size || !testing::BytesMatch(f, buffer.data(), 0, f.size)) ++bad;
  }
  return bad;
}

TEST_CASE("a namespace built from a manifest is the one the walk found") {
  ScratchDir dir;
  const std::string dataset = dir.Sub("dataset");
  MakeTree(dataset);
  auto walked = *Namespace::Build(dataset + "/", "", 2, 4);
  CHECK(walked->stamps().size() == 1 + 5 + 2);  // The root, dir0-3, empty, dir1/deep, its er.
  const ManifestOrigin origin = ManifestOriginOf(dataset + "/", "", SymlinkPolicy::kFollow);
  CHECK(origin.root == dataset);
  const std::string path = dir.path() + "/ds.manifest";
  REQUIRE(WriteManifest(*walked, origin, path).ok());

  absl::StatusOr<std::unique_ptr<Manifest>> manifest = ReadManifest(path);
  REQUIRE_MESSAGE(manifest.ok(), manifest.status().ToString());
  CHECK((*manifest)->origin().root == dataset);
  absl::StatusOr<std::unique_ptr<Namespace>> built =
      NamespaceFromManifest(**manifest, origin, 2, {}, 4, {});
  REQUIRE_MESSAGE(built.ok(), built.status().ToString());
  CheckSameNamespace(*walked, **built);
  // "empty" holds no dataset file: the manifest keeps it (its stamp), the
  // listing does not show it.
  CHECK(*(*built)->List("") ==
        std::vector<std::string>{"dir0", "dir1", "dir2", "dir3", "link.bin", "top.bin"});
  CHECK_FALSE((*built)->IsDirectory("empty"));
  CHECK(*(*built)->List("dir1/deep") == std::vector<std::string>{"er"});
  // Written again from the rebuilt namespace: the same bytes.
  CHECK(EncodeManifest(**built, origin) == ReadAll(path));
}

TEST_CASE("a manifest of a dataset that changed is refused, naming the key and the directory") {
  ScratchDir dir;
  const std::string dataset = dir.Sub("dataset");
  std::vector<TestFile> files = MakeTree(dataset);
  const std::string path = dir.path() + "/ds.manifest";
  auto write = [&] {
    auto ns = *Namespace::Build(dataset, "", 1);
    REQUIRE(WriteManifest(*ns, ManifestOriginOf(dataset, "", SymlinkPolicy::kFollow), path).ok());
    NextTick();
  };
  auto refused = [&](const std::string& directory) {
    absl::StatusOr<std::unique_ptr<Monarch>> m = CreateWithManifest(dataset, path);
    REQUIRE_FALSE(m.ok());
    const std::string message(m.status().message());
    INFO(message);
    CHECK(m.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(absl::StartsWith(message, "dataset.manifest: " + path));
    CHECK(absl::StrContains(message, "changed since the manifest was written"));
    CHECK(absl::StrContains(message, directory));
    CHECK(absl::StrContains(message, "monarch manifest"));
  };

  write();
  {
    absl::StatusOr<std::unique_ptr<Monarch>> m = CreateWithManifest(dataset, path);
    REQUIRE_MESSAGE(m.ok(), m.status().ToString());
    CHECK(ReadAndCheck(**m, files) == 0);
  }
  SUBCASE("a file added to a top-level directory") {
    testing::WriteFile(dataset + "/dir2/new.bin", 1, 10);
    refused("directory 'dir2'");
  }
  SUBCASE("a file removed from a top-level directory") {
    REQUIRE(::unlink((dataset + "/dir3/file3.bin").c_str()) == 0);
    refused("directory 'dir3'");
  }
  SUBCASE("a top-level directory renamed") {
    REQUIRE(::rename((dataset + "/dir1").c_str(), (dataset + "/dir9").c_str()) == 0);
    refused("the dataset root");
  }
  SUBCASE("a top-level directory added") {
    ::mkdir((dataset + "/dir4").c_str(), 0755);
    refused("the dataset root");
  }
  SUBCASE("a file added at the root") {
    testing::WriteFile(dataset + "/new.bin", 1, 10);
    refused("the dataset root");
  }
}

TEST_CASE("checking a manifest stats the top-level directories, not the files") {
  ScratchDir dir;
  const std::string dataset = dir.Sub("dataset");
  std::vector<TestFile> files = testing::MakeDataset(dataset, 400, {100, 5000});
  const std::string path = dir.path() + "/ds.manifest";
  {
    auto ns = *Namespace::Build(dataset, "", 1);
    REQUIRE(WriteManifest(*ns, ManifestOriginOf(dataset, "", SymlinkPolicy::kFollow), path).ok());
  }
  CountingEnv env(dataset);
  {
    os::ScopedEnvForTesting scoped(&env);
    absl::StatusOr<std::unique_ptr<Monarch>> m = CreateWithManifest(dataset, path);
    REQUIRE_MESSAGE(m.ok(), m.status().ToString());
    CHECK((*m)->GetStats().Get("namespace_built_from_manifest") == 1);
    CHECK(ReadAndCheck(**m, files) == 0);
  }
  INFO("stats by path: ", env.path_stats.load());
  CHECK(env.opendirs.load() == 0);  // Not walked.
  // The root and dir0..dir3 (5), plus the config's own check of the path
  // and what the source driver resolves: a handful, not 400.
  CHECK(env.path_stats.load() >= 5);
  CHECK(env.path_stats.load() <= 8);
}

TEST_CASE("a damaged, truncated or lying manifest is refused with a message") {
  ScratchDir dir;
  const std::string dataset = dir.Sub("dataset");
  MakeTree(dataset);
  auto ns = *Namespace::Build(dataset, "", 1);
  const std::string good = EncodeManifest(*ns, ManifestOriginOf(dataset, "", SymlinkPolicy::kFollow));
  REQUIRE(ParseManifest(good).ok());
  auto refusal = [](std::string bytes) {
    absl::StatusOr<std::unique_ptr<Manifest>> m = ParseManifest(bytes);
    REQUIRE_FALSE(m.ok());
    CHECK(m.status().code() == absl::StatusCode::kDataLoss);
    return std::string(m.status().message());
  };
  // The same checks after the checksum: a listing the parser let through
  // must fail as a namespace.
  auto built = [](std::string bytes) -> absl::Status {
    absl::StatusOr<std::unique_ptr<Manifest>> m = ParseManifest(bytes);
    if (!m.ok()) return m.status();
    return Namespace::FromListing((*m)->origin().root, (*m)->listing(), 1).status();
  };

  CHECK(absl::StrContains(refusal(""), "shorter than a header"));
  CHECK(absl::StrContains(refusal(std::string(200, 'x')), "magic"));
  CHECK(absl::StrContains(refusal(good.substr(0, good.size() / 2)), "truncated"));
  CHECK(absl::StrContains(refusal(good.substr(0, good.size() - 1)), "truncated"));
  CHECK(absl::StrContains(refusal(good + "junk"), "where the header says"));
  std::string flipped = good;
  flipped[good.size() / 2] ^= 0x10;
  CHECK(absl::StrContains(refusal(flipped), "checksum"));

  // Checksums fixed: the structure's own checks.
  std::string version = good;
  Put32At(&version, 8, 2);
  FixChecksum(&version);
  CHECK(absl::StrContains(refusal(version), "version 2"));
  for (size_t count_at : {40, 44, 48}) {  // directories, stamps, files
    std::string lying = good;
    Put32At(&lying, count_at, 0xFFFFFFF0u);
    FixChecksum(&lying);
    CHECK(absl::StrContains(refusal(lying), "need more than"));
  }
  std::string one_more = good;  // One file more than there are records for.
  Put32At(&one_more, 48, ns->file_count() + 1);
  FixChecksum(&one_more);
  CHECK(absl::StrContains(refusal(one_more), "runs past the end"));

  // Names. The bytes of a name are found by what the parser reads, not by a
  // search alone: a record's times, inode or the checksum can hold the same
  // bytes ("ac" is 0x61 0x63), and patching those instead made this flaky.
  auto listed = [](const std::string& bytes, const std::string& name) {
    absl::StatusOr<std::unique_ptr<Manifest>> m = ParseManifest(bytes);
    if (!m.ok()) return false;
    for (const ListedDirectory& d : (*m)->listing().directories) {
      if (d.name == name) return true;
    }
    for (const ListedFile& f : (*m)->listing().files) {
      if (f.name == name) return true;
    }
    return false;
  };
  // `full` is a file's or directory's name; its last component becomes `to`.
  auto patched = [&](const std::string& full, absl::string_view to) {
    const std::string from = full.substr(full.rfind('/') + 1);  // npos + 1 == 0
    const std::string probe_name = full.substr(0, full.size() - from.size()) +
                                   std::string(from.size(), 'q');
    for (size_t at = good.find(from); at != std::string::npos; at = good.find(from, at + 1)) {
      std::string probe = good;
      probe.replace(at, from.size(), std::string(from.size(), 'q'));
      FixChecksum(&probe);
      if (!listed(probe, probe_name)) continue;
      std::string bytes = good;
      bytes.replace(at, from.size(), std::string(to));
      FixChecksum(&bytes);
      return bytes;
    }
    FAIL("no record names ", full);
    return std::string();
  };
  CHECK(absl::StrContains(refusal(patched("dir2/ac", "..")), "named '..'"));
  CHECK(absl::StrContains(refusal(patched("dir2/ac", "a/")), "named 'a/'"));
  CHECK(absl::StrContains(refusal(patched("dir2/ac", "/c")), "named '/c'"));
  CHECK(absl::StrContains(refusal(patched("dir2/ac", std::string("a\0", 2))), "named"));
  const absl::Status duplicate = built(patched("dir2/ac", "ab"));
  CHECK(duplicate.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(duplicate.message(), "'dir2/ab' is listed twice"));
  // A directory renamed to its sibling's name.
  const absl::Status twin = built(patched("dir3", "dir2"));
  CHECK(absl::StrContains(twin.message(), "listed twice"));

  // Through the config: the key and the file are named.
  const std::string path = dir.path() + "/ds.manifest";
  WriteAll(path, flipped);
  absl::StatusOr<std::unique_ptr<Monarch>> m = CreateWithManifest(dataset, path);
  REQUIRE_FALSE(m.ok());
  CHECK(absl::StartsWith(m.status().message(), "dataset.manifest: " + path));
  CHECK(absl::StrContains(m.status().message(), "checksum"));
  // Missing.
  m = CreateWithManifest(dataset, dir.path() + "/none.manifest");
  REQUIRE_FALSE(m.ok());
  CHECK(m.status().code() == absl::StatusCode::kNotFound);
  CHECK(absl::StartsWith(m.status().message(), "dataset.manifest: "));
  // Oversized: refused from its size, before anything is allocated.
  const std::string huge = dir.path() + "/huge.manifest";
  const int fd = ::open(huge.c_str(), O_CREAT | O_WRONLY, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, static_cast<off_t>(kMaxManifestBytes + 1)) == 0);
  ::close(fd);
  m = CreateWithManifest(dataset, huge);
  REQUIRE_FALSE(m.ok());
  CHECK(m.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(absl::StrContains(m.status().message(), "are refused"));
}

TEST_CASE("a manifest whose directory paths would dwarf it is refused") {
  // Directories are stored as (parent, name): a chain of one-letter ones
  // spells ever longer paths. A chain of 300 is a dataset; 1800 is not
  // (its paths' 3.2 MB against 64 times its manifest's 45 KB).
  for (const int depth : {300, 1800}) {
    ScratchDir dir;
    std::string path = dir.Sub("dataset");
    for (int i = 0; i < depth; ++i) {
      path += "/d";  // One level at a time: libstdc++'s create_directories gives up sooner.
      REQUIRE(::mkdir(path.c_str(), 0755) == 0);
    }
    testing::WriteFile(path + "/f.bin", 1, 10);
    auto ns = Namespace::Build(dir.path() + "/dataset", "", 1);
    REQUIRE(ns.ok());
    const std::string manifest = dir.path() + "/chain.manifest";
    REQUIRE(WriteManifest(**ns,
                          ManifestOriginOf(dir.path() + "/dataset", "", SymlinkPolicy::kFollow),
                          manifest)
                .ok());
    absl::StatusOr<std::unique_ptr<Manifest>> read = ReadManifest(manifest);
    if (depth == 300) {
      CHECK(read.ok());
    } else {
      REQUIRE_FALSE(read.ok());
      CHECK(absl::StrContains(read.status().message(), "far longer than the file itself"));
    }
  }
}

TEST_CASE("a listing that is not a tree is refused by FromListing") {
  NamespaceListing listing;
  listing.directories = {{"", 0}, {"a", 0}, {"a/b", 1}};
  const std::string names = "a/b/x" "a/y" "c/z";
  listing.files = {{absl::string_view(names).substr(0, 5), 2, 1, 0, {}},
                   {absl::string_view(names).substr(5, 3), 1, 1, 0, {}}};
  REQUIRE(Namespace::FromListing("/d", listing, 0).ok());
  NamespaceListing bad = listing;
  bad.files.push_back({absl::string_view(names).substr(8, 3), 1, 1, 0, {}});  // "c/z" in "a".
  CHECK(absl::StrContains(Namespace::FromListing("/d", bad, 0).status().message(),
                          "is not in directory 'a'"));
  bad = listing;
  bad.directories[2].parent = 2;
  CHECK(absl::StrContains(Namespace::FromListing("/d", bad, 0).status().message(),
                          "is not before it"));
  bad = listing;
  bad.files[0].directory = 7;
  CHECK_FALSE(Namespace::FromListing("/d", bad, 0).ok());
  bad = listing;
  bad.directories[0].name = "r";
  CHECK_FALSE(Namespace::FromListing("/d", bad, 0).ok());
}

TEST_CASE("a manifest of another root, file_regex or symlink policy is refused") {
  ScratchDir dir;
  const std::string dataset = dir.Sub("dataset");
  MakeTree(dataset);
  const std::string path = dir.path() + "/ds.manifest";
  auto ns = *Namespace::Build(dataset, "dir[0-3]/.*", 1);
  REQUIRE(WriteManifest(*ns, ManifestOriginOf(dataset, "dir[0-3]/.*", SymlinkPolicy::kFollow),
                        path)
              .ok());
  auto refusal = [&](Config config) {
    config.dataset.manifest = path;
    absl::StatusOr<std::unique_ptr<Monarch>> m = CreateMonarchWithDriverWrapper(config, nullptr);
    REQUIRE_FALSE(m.ok());
    CHECK(m.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(absl::StartsWith(m.status().message(), "dataset.manifest: " + path));
    return std::string(m.status().message());
  };
  Config config = testing::MakeConfig(dataset, {testing::RamTier(64 << 20)});
  config.dataset.file_regex = "dir[0-3]/.*";
  {
    config.dataset.manifest = path;
    absl::StatusOr<std::unique_ptr<Monarch>> m = CreateMonarchWithDriverWrapper(config, nullptr);
    REQUIRE_MESSAGE(m.ok(), m.status().ToString());
    CHECK((*m)->ListFiles().size() == 40 + 3);
  }
  Config other = config;
  other.dataset.file_regex = ".*";
  CHECK(absl::StrContains(refusal(other), "file_regex 'dir[0-3]/.*', expected '.*' "
                                          "(dataset.file_regex)"));
  other = config;
  other.dataset.symlinks = SymlinkPolicy::kSkip;
  CHECK(absl::StrContains(refusal(other), "symlinks 'follow', expected 'skip' (dataset.symlinks)"));
  other = config;
  other.dataset.path = dir.Sub("elsewhere");
  CHECK(absl::StrContains(refusal(other), "expected '" + other.dataset.path + "' (dataset.path)"));
}

// Sets every directory under `root` (itself included) to one mtime in 2023,
// the same each time: a namespace is kept on the node only when no
// directory changed within 2 s before its walk, and a test puts a
// directory's mtime back to what a manifest stamped.
void AgeDirectories(const std::string& root) {
  struct timespec times[2];
  times[0].tv_sec = 1'700'000'000;
  times[0].tv_nsec = 0;
  times[1] = times[0];
  std::vector<std::string> pending = {root};
  while (!pending.empty()) {
    const std::string d = pending.back();
    pending.pop_back();
    REQUIRE(::utimensat(AT_FDCWD, d.c_str(), times, AT_SYMLINK_NOFOLLOW) == 0);
    for (const auto& entry : std::filesystem::directory_iterator(d)) {
      if (entry.is_directory() && !entry.is_symlink()) pending.push_back(entry.path());
    }
  }
}

uint64_t BuiltFromManifest(Monarch& m) { return m.GetStats().Get("namespace_built_from_manifest"); }

TEST_CASE("a walk's namespace is kept on the node, and the next start builds from it while it holds") {
  ScratchDir dir;
  const std::string dataset = dir.Sub("dataset");
  std::vector<TestFile> files = MakeTree(dataset);
  Config config = testing::MakeConfig(dataset, {testing::RamTier(64 << 20)});
  const std::string kept = KeptNamespacePath(config.dataset);
  ::unlink(kept.c_str());
  auto start = [&] {
    absl::StatusOr<std::unique_ptr<Monarch>> m = CreateMonarchWithDriverWrapper(config, nullptr);
    REQUIRE_MESSAGE(m.ok(), m.status().ToString());
    return std::move(*m);
  };
  {
    // Just written: a change later in the same second could go unseen, so
    // the walk is not kept.
    auto m = start();
    CHECK(BuiltFromManifest(*m) == 0);
  }
  CHECK(::access(kept.c_str(), F_OK) != 0);
  AgeDirectories(dataset);
  CHECK(BuiltFromManifest(*start()) == 0);  // Walked, and kept.
  REQUIRE(::access(kept.c_str(), R_OK) == 0);
  struct stat parent;
  REQUIRE(::stat(kept.substr(0, kept.rfind('/')).c_str(), &parent) == 0);
  CHECK((parent.st_mode & 077) == 0);  // Names of the user's files: the user's alone.
  {
    CountingEnv env(dataset);
    std::unique_ptr<Monarch> m;
    {
      os::ScopedEnvForTesting scoped(&env);
      m = start();
    }
    CHECK(BuiltFromManifest(*m) == 1);
    CHECK(env.opendirs.load() == 0);  // Not walked.
    CHECK(ReadAndCheck(*m, files) == 0);
  }
  SUBCASE("a file added deep down") {
    testing::WriteFile(dataset + "/dir1/deep/er/new.bin", 3, 100);
    auto m = start();
    CHECK(BuiltFromManifest(*m) == 0);
    CHECK(m->FileExists("dir1/deep/er/new.bin"));
  }
  SUBCASE("a file rewritten in place, its directory's mtime put back") {
    testing::WriteFile(dataset + "/dir2/ab", 11, 50);  // 5 bytes before.
    AgeDirectories(dataset);
    auto m = start();  // 45 files: the sample is all of them.
    CHECK(BuiltFromManifest(*m) == 0);
    CHECK(*m->FileSize("dir2/ab") == 50);
  }
  SUBCASE("dataset.keep_namespace: false walks every time") {
    config.dataset.keep_namespace = false;
    CHECK(BuiltFromManifest(*start()) == 0);
    CHECK(BuiltFromManifest(*start()) == 0);
  }
  SUBCASE("a damaged kept namespace is walked past") {
    std::string bytes = ReadAll(kept);
    bytes[bytes.size() / 2] ^= 1;
    std::ofstream(kept, std::ios::binary | std::ios::trunc) << bytes;
    auto m = start();
    CHECK(BuiltFromManifest(*m) == 0);
    CHECK(ReadAndCheck(*m, files) == 0);
  }
}

TEST_CASE("a copy is adopted from a manifest's namespace only if its source still stats the same") {
  ScratchDir dir;
  const std::string dataset = dir.Sub("dataset");
  std::vector<TestFile> files = testing::MakeDataset(dataset, 8, {4096});
  AgeDirectories(dataset);
  const std::string path = dir.path() + "/ds.manifest";
  {
    auto ns = *Namespace::Build(dataset, "", 1);
    REQUIRE(WriteManifest(*ns, ManifestOriginOf(dataset, "", SymlinkPolicy::kFollow), path).ok());
  }
  Config config = testing::MakeConfig(
      dataset, {testing::FileTier(TierKind::kPosix, dir.Sub("tier"), 64 << 20, "nvme")});
  config.dataset.manifest = path;
  {
    auto m = *CreateMonarchWithDriverWrapper(config, nullptr);
    CHECK(ReadAndCheck(*m, files) == 0);
    m->WaitForPlacement();
    REQUIRE(m->GetStats().Tier(0, "files") == files.size());
  }
  // files[3] rewritten in place: same size, other bytes; no directory changes.
  testing::WriteFile(dataset + "/" + files[3].name, 99, files[3].size);
  files[3].seed = 99;
  AgeDirectories(dataset);
  auto m = *CreateMonarchWithDriverWrapper(config, nullptr);
  CHECK(BuiltFromManifest(*m) == 1);
  CHECK(m->GetStats().Tier(0, "files") == files.size() - 1);  // Its copy was not adopted.
  CHECK(ReadAndCheck(*m, files) == 0);  // The new bytes, from the source.
}

Config PeerConfig(const std::string& dataset, const std::string& rendezvous, int rank, int size,
                  double timeout_seconds = 30) {
  Config c = testing::MakeConfig(dataset, {testing::RamTier(256 << 20)});
  c.remote.enabled = true;
  c.remote.rank = std::to_string(rank);
  c.remote.size = std::to_string(size);
  c.remote.rendezvous_dir = rendezvous;
  c.remote.rendezvous_timeout_seconds = timeout_seconds;
  c.remote.request_timeout_seconds = 60;  // As test_remote: a loaded sanitizer run is slow.
  return c;
}

// Starts the instances together (each waits at the rendezvous for the others).
std::vector<std::unique_ptr<MonarchCore>> StartPeers(const std::vector<Config>& configs) {
  std::vector<absl::StatusOr<std::unique_ptr<MonarchCore>>> made(configs.size());
  std::vector<ValidConfig> valid;
  for (const Config& config : configs) valid.push_back(testing::Valid(config));
  std::vector<std::thread> threads;
  for (size_t r = 0; r < configs.size(); ++r) {
    threads.emplace_back([&, r] { made[r] = CreateMonarchCore(valid[r], CoreOptions{}); });
  }
  for (auto& t : threads) t.join();
  std::vector<std::unique_ptr<MonarchCore>> peers;
  for (auto& m : made) {
    REQUIRE_MESSAGE(m.ok(), m.status().ToString());
    peers.push_back(std::move(*m));
  }
  return peers;
}

TEST_CASE("peers meeting in a directory walk the dataset once: rank 0, the others build from its manifest") {
  ScratchDir dir;
  const std::string dataset = dir.Sub("dataset");
  std::vector<TestFile> files = MakeTree(dataset);
  const std::string rendezvous = dir.path() + "/rdv";
  const std::string shared = rendezvous + "/namespace.manifest";
  CountingEnv env(dataset);
  os::ScopedEnvForTesting scoped(&env);
  // What one walk costs, counted the same way.
  { auto ns = *Namespace::Build(dataset, "", 1); }
  const int one_walk = env.opendirs.exchange(0);
  CHECK(one_walk == 1 + 8);  // The root's check, then the root and its 7 directories.

  bool rank0_kept = false;  // Rank 0 builds from the namespace kept on the node.
  SUBCASE("a fresh rendezvous directory") {}
  SUBCASE("rank 0 builds from the namespace kept on the node, and still publishes it") {
    AgeDirectories(dataset);
    auto walker = CreateMonarchWithDriverWrapper(
        testing::MakeConfig(dataset, {testing::RamTier(64 << 20)}), nullptr);
    REQUIRE(walker.ok());  // Walked, and kept.
    rank0_kept = true;
  }
  SUBCASE("a manifest of another file_regex left there by an earlier job is not adopted") {
    auto other = *Namespace::Build(dataset, "dir1/.*", 1);
    env.opendirs = 0;
    REQUIRE(::mkdir(rendezvous.c_str(), 0700) == 0);
    REQUIRE(WriteManifest(*other, ManifestOriginOf(dataset, "dir1/.*", SymlinkPolicy::kFollow),
                          shared)
                .ok());
  }
  const int size = 3;
  std::vector<Config> configs;
  for (int r = 0; r < size; ++r) configs.push_back(PeerConfig(dataset, rendezvous, r, size));
  {
    env.opendirs = 0;
    std::vector<std::unique_ptr<MonarchCore>> peers = StartPeers(configs);
    CHECK(env.opendirs.load() == (rank0_kept ? 0 : one_walk));  // Cluster-wide: one walk at most.
    struct stat st;
    CHECK(::stat(shared.c_str(), &st) == 0);
    for (int r = 0; r < size; ++r) {
      const Stats stats = peers[r]->GetStats();
      CHECK(stats.Get("namespace_built_from_manifest") == (r == 0 && !rank0_kept ? 0 : 1));
      const Namespace& ns = peers[r]->name_space();
      CHECK(ns.file_count() == files.size());
      if (r > 0) CheckSameNamespace(peers[0]->name_space(), ns);
    }
    // Each reads everything, bytes exact, served across the peers.
    std::vector<std::thread> readers;
    std::atomic<int> bad{0};
    for (int r = 0; r < size; ++r) {
      readers.emplace_back([&, r] { bad += ReadAndCheck(*peers[r], files); });
    }
    for (auto& t : readers) t.join();
    CHECK(bad.load() == 0);
  }
  // Rank 0 removed it at shutdown: a later job in this directory waits for
  // its own rank 0.
  struct stat st;
  CHECK(::stat(shared.c_str(), &st) != 0);
}

TEST_CASE("a rank waiting for rank 0's manifest: a stale one is used only if it still matches") {
  ScratchDir dir;
  const std::string dataset = dir.Sub("dataset");
  MakeTree(dataset);
  const std::string rendezvous = dir.path() + "/rdv";
  REQUIRE(::mkdir(rendezvous.c_str(), 0700) == 0);
  const std::string shared = rendezvous + "/namespace.manifest";
  const ManifestOrigin origin = ManifestOriginOf(dataset, "", SymlinkPolicy::kFollow);
  auto await = [&] { return AwaitSharedManifest(shared, origin, 1, 1, {}, 1); };

  SUBCASE("none at all") {
    absl::StatusOr<std::unique_ptr<Namespace>> ns = await();
    REQUIRE_FALSE(ns.ok());
    CHECK(ns.status().code() == absl::StatusCode::kDeadlineExceeded);
    CHECK(absl::StrContains(ns.status().message(), "remote.rendezvous_timeout"));
    CHECK(absl::StrContains(ns.status().message(), "namespace manifest '" + shared + "'"));
    CHECK(absl::StrContains(ns.status().message(), "none was written"));
  }
  SUBCASE("one of another file_regex: waited past") {
    auto other = *Namespace::Build(dataset, "dir1/.*", 1);
    REQUIRE(WriteManifest(*other, ManifestOriginOf(dataset, "dir1/.*", SymlinkPolicy::kFollow),
                          shared)
                .ok());
    absl::StatusOr<std::unique_ptr<Namespace>> ns = await();
    REQUIRE_FALSE(ns.ok());
    CHECK(absl::StrContains(ns.status().message(), "remote.rendezvous_timeout"));
    CHECK(absl::StrContains(ns.status().message(), "expected '' (dataset.file_regex)"));
  }
  SUBCASE("one of this dataset that has changed since: waited past") {
    auto stale = *Namespace::Build(dataset, "", 1);
    REQUIRE(WriteManifest(*stale, origin, shared).ok());
    NextTick();
    testing::WriteFile(dataset + "/dir0/late.bin", 1, 1);
    absl::StatusOr<std::unique_ptr<Namespace>> ns = await();
    REQUIRE_FALSE(ns.ok());
    CHECK(absl::StrContains(ns.status().message(), "remote.rendezvous_timeout"));
    CHECK(absl::StrContains(ns.status().message(), "directory 'dir0' has a new mtime"));
  }
  SUBCASE("one of this dataset, unchanged: used") {
    auto stale = *Namespace::Build(dataset, "", 1);
    REQUIRE(WriteManifest(*stale, origin, shared).ok());
    absl::StatusOr<std::unique_ptr<Namespace>> ns = await();
    REQUIRE(ns.ok());
    CHECK((*ns)->file_count() == stale->file_count());
  }
  SUBCASE("a rank whose wait times out walks the dataset itself, then meets the others") {
    // Rank 1 of 2, alone: rank 0 never comes. Past its own walk, it is the
    // address exchange that waits for rank 0, not the manifest.
    Config config = PeerConfig(dataset, rendezvous, 1, 2, /*timeout_seconds=*/1);
    absl::StatusOr<std::unique_ptr<MonarchCore>> m =
        CreateMonarchCore(testing::Valid(config), CoreOptions{});
    REQUIRE_FALSE(m.ok());
    CHECK_FALSE(absl::StrContains(m.status().message(), "manifest"));
    CHECK(absl::StrContains(m.status().message(), "rank 0 never arrived"));
  }
}

}  // namespace
}  // namespace monarch
