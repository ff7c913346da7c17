// Namespace: the walk, the regex filter, lookups by relative and absolute
// names, directory queries.

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <limits>
#include <string>

#include "absl/strings/match.h"
#include "config/file_regex.h"
#include "metadata/namespace.h"
#include "test_util.h"

namespace monarch {
namespace {

using testing::ScratchDir;

TEST_CASE("the walk records every file with its size") {
  ScratchDir dir;
  testing::WriteFile(dir.path() + "/top.bin", 1, 10);
  testing::WriteFile(dir.path() + "/a/b/deep.bin", 2, 2000);
  testing::WriteFile(dir.path() + "/a/with space.jpg", 3, 0);
  dir.Sub("emptydir");
  REQUIRE(::symlink((dir.path() + "/a").c_str(), (dir.path() + "/loop").c_str()) == 0);
  REQUIRE(::symlink((dir.path() + "/top.bin").c_str(), (dir.path() + "/link.bin").c_str()) == 0);

  absl::StatusOr<std::unique_ptr<Namespace>> ns = Namespace::Build(dir.path(), "", 3);
  REQUIRE(ns.ok());
  CHECK((*ns)->file_count() == 4);  // The symlinked directory is not followed.
  CHECK((*ns)->total_bytes() == 10 + 2000 + 0 + 10);
  std::optional<FileEntry> deep = (*ns)->Find("a/b/deep.bin");
  REQUIRE(deep.has_value());
  CHECK(deep->ref.size == 2000);
  CHECK(deep->ref.mtime_ns > 0);
  struct stat st;
  REQUIRE(::stat((dir.path() + "/a/b/deep.bin").c_str(), &st) == 0);
  const FileAttributes attributes = (*ns)->attributes(deep->ref.id);
  CHECK(attributes.inode == st.st_ino);
  CHECK(attributes.mode == st.st_mode);
  CHECK(attributes.gid == st.st_gid);
  CHECK(attributes.block_size == st.st_blksize);
  CHECK(attributes.atime_ns == st.st_atim.tv_sec * 1000000000 + st.st_atim.tv_nsec);
  CHECK(attributes.via_symlink == 0);
  CHECK((*ns)->attributes((*ns)->Find("link.bin")->ref.id).via_symlink == 1);
  CHECK(deep->tier->load() == 3);
  CHECK(deep->state->load() == PlacementState::kOnSource);
  CHECK((*ns)->Find(dir.path() + "/a/b/deep.bin")->ref.id == deep->ref.id);
  CHECK((*ns)->Find("./a//b/deep.bin")->ref.id == deep->ref.id);
  CHECK((*ns)->Find("a/with space.jpg") != std::nullopt);
  CHECK((*ns)->Find("link.bin") != std::nullopt);
  CHECK((*ns)->Find("a/b/missing.bin") == std::nullopt);
  CHECK((*ns)->Find("a/b") == std::nullopt);
  CHECK((*ns)->Find("../" + dir.path().substr(dir.path().rfind('/') + 1) + "/top.bin") == std::nullopt);
  CHECK((*ns)->Find(dir.path() + "x/top.bin") == std::nullopt);
  CHECK((*ns)->Find("/elsewhere/top.bin") == std::nullopt);
}

// A directory without a dataset file is not the dataset's, in process and
// in a client alike (NamespaceView lists from the file names).
TEST_CASE("directories are listed sorted, with files and subdirectories") {
  ScratchDir dir;
  testing::WriteFile(dir.path() + "/b.bin", 1, 1);
  testing::WriteFile(dir.path() + "/a/x.bin", 1, 1);
  testing::WriteFile(dir.path() + "/a/c/y.bin", 1, 1);
  dir.Sub("empty");
  auto ns = *Namespace::Build(dir.path(), "", 1);
  CHECK(*ns->List("") == std::vector<std::string>{"a", "b.bin"});
  CHECK(*ns->List("/") == std::vector<std::string>{"a", "b.bin"});
  CHECK(*ns->List(dir.path()) == std::vector<std::string>{"a", "b.bin"});
  CHECK(*ns->List("a") == std::vector<std::string>{"c", "x.bin"});
  CHECK(*ns->List("a/") == std::vector<std::string>{"c", "x.bin"});
  CHECK(ns->List("empty").status().code() == absl::StatusCode::kNotFound);
  CHECK_FALSE(ns->IsDirectory("empty"));
  CHECK(ns->List("nope").status().code() == absl::StatusCode::kNotFound);
  CHECK(ns->List("b.bin").status().code() == absl::StatusCode::kNotFound);
  CHECK(ns->IsDirectory("a/c"));
  CHECK(ns->IsDirectory(""));
  CHECK_FALSE(ns->IsDirectory("b.bin"));
}

TEST_CASE("the regex keeps only matching relative names") {
  ScratchDir dir;
  testing::WriteFile(dir.path() + "/train/a.jpg", 1, 1);
  testing::WriteFile(dir.path() + "/train/a.txt", 1, 1);
  testing::WriteFile(dir.path() + "/val/b.jpg", 1, 1);
  auto ns = *Namespace::Build(dir.path(), "train/.*\\.jpg", 1);
  CHECK(ns->file_count() == 1);
  CHECK(ns->Find("train/a.jpg") != std::nullopt);
  CHECK(ns->Find("train/a.txt") == std::nullopt);
  CHECK(ns->Find("val/b.jpg") == std::nullopt);
  CHECK(*ns->List("train") == std::vector<std::string>{"a.jpg"});
}

TEST_CASE("walks with 1 and 8 threads find the same files and directories") {
  ScratchDir dir;
  for (int d = 0; d < 20; ++d) {
    for (int f = 0; f < 30; ++f) {
      testing::WriteFile(dir.path() + "/d" + std::to_string(d % 5) + "/e" + std::to_string(d) +
                             "/f" + std::to_string(f),
                         static_cast<uint32_t>(f), static_cast<uint64_t>(f));
    }
  }
  auto one = *Namespace::Build(dir.path(), "", 1, 1);
  auto eight = *Namespace::Build(dir.path(), "", 1, 8);
  CHECK(one->file_count() == 600);
  CHECK(eight->file_count() == 600);
  CHECK(one->total_bytes() == eight->total_bytes());
  for (int d = 0; d < 5; ++d) {
    std::string sub = "d" + std::to_string(d);
    CHECK(*one->List(sub) == *eight->List(sub));
  }
  CHECK(*one->List("") == *eight->List(""));
  for (uint32_t id = 0; id < one->file_count(); ++id) {
    const std::optional<FileEntry> other = eight->Find(one->entry(id).ref.name);
    REQUIRE(other.has_value());
    CHECK(other->ref.size == one->entry(id).ref.size);
  }
}

TEST_CASE("a missing dataset directory is an error, not a crash") {
  auto ns = Namespace::Build("/nonexistent/monarch/dataset", "", 1);
  CHECK(ns.status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("file_regex: the expanded size of bounded repetitions, as regcomp copies them out") {
  CHECK(RegexExpandedPositions("") == 0);
  CHECK(RegexExpandedPositions(".*\\.jpg") == 5);         // . \. j p g
  CHECK(RegexExpandedPositions("a{10}") == 10);
  CHECK(RegexExpandedPositions("a{2,7}") == 7);
  CHECK(RegexExpandedPositions("a{3,}") == 4);              // 3 copies and a starred one.
  CHECK(RegexExpandedPositions("(ab){3}c") == 7);
  CHECK(RegexExpandedPositions("(.{0,255}){0,255}") == 65025);
  CHECK(RegexExpandedPositions("(.{,0255}){0,255}") == 65025);  // glibc's "{,n}": m = 0.
  CHECK(RegexExpandedPositions("a{,}") == 1);
  CHECK(RegexExpandedPositions("[]{}]{4}") == 4);           // ']' and braces inside a bracket.
  CHECK(RegexExpandedPositions("[[:digit:]]{8}") == 8);
  CHECK(RegexExpandedPositions("a|b{5}") == 6);
  CHECK(RegexExpandedPositions("x+") == 2);
  CHECK(RegexExpandedPositions("\\{{3}") == 3);             // An escaped brace repeated.
  CHECK(RegexExpandedPositions("((((a{100}){100}){100}){100})") == 100000000);
  CHECK(RegexExpandedPositions("a{99999999999999999999}{99999999999999999999}") ==
        std::numeric_limits<uint64_t>::max());              // Saturates, never wraps.
  // A realistic pattern stays well under the bound.
  CHECK(RegexExpandedPositions("([^/]{1,64}/){0,8}[^/]{1,255}\\.(jpg|png)") < kMaxRegexPositions);

  auto too_large = FileRegex::Compile("(.{0,255}){0,255}");
  REQUIRE_FALSE(too_large.ok());
  CHECK_FALSE(FileRegex::Compile("(.{,0255}){0,255}").ok());  // Found by the config fuzzer.
  CHECK(absl::StrContains(too_large.status().message(), "dataset.file_regex"));
  // A ')' with no '(' would close the "^(...)$" the pattern is compiled in:
  // refused (found by the config fuzzer: "x?{100}){300}" repeated the whole
  // pattern 300 times past the size bound, and took 2 GB).
  auto unopened = FileRegex::Compile("pfs(a)?{100}){300}");
  REQUIRE_FALSE(unopened.ok());
  CHECK(absl::StrContains(unopened.status().message(), "closes no '('"));
  CHECK_FALSE(FileRegex::Compile("a)|(b").ok());
  CHECK(FileRegex::Compile("a\\)|[)]b").ok());  // Escaped, or in a bracket: a parenthesis.
  // A repetition of something that can already match nothing: refused
  // (found by the config fuzzer; glibc's regcomp took minutes or all memory).
  for (const char* stacked : {"p?????????????{200}9{300}", "p??", "(p?)?", "((p*)*){100}",
                              "((p|)|){200}", "(p?){2}", "(a|)*", "(x*)+", "a*{,3}"}) {
    auto refused = FileRegex::Compile(stacked);
    CHECK_MESSAGE(!refused.ok(), stacked);
    CHECK_MESSAGE(absl::StrContains(refused.status().message(), "can already match nothing"),
                  stacked);
  }
  // Repetitions of things that cannot match nothing are fine.
  for (const char* fine : {"([^/]*/)*[^/]*\\.jpg", "(a|b)?c", ".*", "(ab?)+", "x{0,3}y",
                           "(dir/){2}f", "a{2}b*", "[?*]+", "\\?+", "(a?b){3}"}) {
    CHECK_MESSAGE(FileRegex::Compile(fine).ok(), fine);
  }
  auto bad = FileRegex::Compile(std::string(5000, '('));
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().size() < 400);  // The pattern is quoted in part only.
  auto jpg = FileRegex::Compile("train/.*\\.jpg");
  REQUIRE(jpg.ok());
  CHECK((*jpg)->Matches("train/a/b.jpg"));
  CHECK_FALSE((*jpg)->Matches("train/a/b.jpgx"));
  CHECK_FALSE((*jpg)->Matches("val/b.jpg"));
}

}  // namespace
}  // namespace monarch
