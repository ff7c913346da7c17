// Config parsing and validation: good configs parse into the expected
// structs; every bad config is refused with one message naming the key.

#include <doctest/doctest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "config/config_keys.h"
#include "monarch/config.h"
#include "monarch/monarch.h"
#include "test_util.h"

namespace monarch {
namespace {

using testing::ScratchDir;

// Returns the error message of parsing `yaml`; fails the test if it parsed.
std::string ErrorOf(const std::string& yaml) {
  absl::StatusOr<Config> config = ParseConfigString(yaml);
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(config.status().message());
}

struct Dirs {
  ScratchDir scratch;
  std::string dataset = scratch.Sub("dataset");
  std::string nvme = scratch.Sub("nvme");
  std::string pmem = scratch.Sub("pmem");
};

TEST_CASE("a full config parses into the expected structs") {
  Dirs d;
  absl::StatusOr<Config> config = ParseConfigString(absl::StrCat(R"(
dataset:
  path: )",
                                                                 d.dataset, R"(
  file_regex: '.*\.jpg'
  scan_threads: 16
tiers:
  - {name: mem, kind: ram, capacity: 1GiB, huge_pages: true}
  - {name: pm, kind: pmem, path: )",
                                                                 d.pmem, R"(, capacity: 64MiB}
  - {name: nvme, kind: posix, path: )",
                                                                 d.nvme, R"(, capacity: 100MB, write_mode: direct}
  - {name: lustre, kind: source}
placement:
  threads: 3
  policy: first-fit
  max_staging_bytes: 256MiB
  chunk_bytes: 512KiB
  max_open_files: 64
logging:
  level: info
)"));
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  CHECK(config->dataset.path == d.dataset);
  CHECK(config->dataset.file_regex == ".*\\.jpg");
  CHECK(config->dataset.scan_threads == 16);
  REQUIRE(config->tiers.size() == 4);
  CHECK(config->tiers[0].kind == TierKind::kRam);
  CHECK(config->tiers[0].capacity_bytes == (1ull << 30));
  CHECK(config->tiers[0].huge_pages);
  CHECK_FALSE(config->tiers[1].huge_pages);
  CHECK(config->tiers[1].kind == TierKind::kPmem);
  CHECK(config->tiers[1].path == d.pmem);
  CHECK(config->tiers[2].capacity_bytes == 100000000);
  CHECK(config->tiers[2].write_mode == WriteMode::kDirect);
  CHECK(config->tiers[1].write_mode == WriteMode::kAuto);
  CHECK(config->tiers[3].kind == TierKind::kSource);
  CHECK(config->tiers[3].name == "lustre");
  CHECK(config->placement.threads == 3);
  CHECK(config->placement.max_staging_bytes == (256ull << 20));
  CHECK(config->placement.chunk_bytes == (512ull << 10));
  CHECK(config->placement.max_open_files == 64);
  CHECK(config->logging.level == LogLevel::kInfo);
}

// Runs `checks` in a child process whose RLIMIT_NOFILE is (`soft`, `hard`)
// (a hard limit lowered cannot be raised again: not in this process), and
// returns what they reported: empty when every one held.
std::string InChildWithLimit(rlim_t soft, rlim_t hard, const std::function<std::string()>& checks) {
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(pipe_fds[0]);
    const struct rlimit limit = {soft, hard};
    const std::string report = ::setrlimit(RLIMIT_NOFILE, &limit) == 0
                                   ? checks()
                                   : absl::StrCat("setrlimit(", soft, ", ", hard, ") failed");
    const bool written = ::write(pipe_fds[1], report.data(), report.size()) ==
                         static_cast<ssize_t>(report.size());
    ::_exit(written ? 0 : 1);
  }
  ::close(pipe_fds[1]);
  std::string report;
  char buffer[4096];
  for (ssize_t n; (n = ::read(pipe_fds[0], buffer, sizeof(buffer))) > 0;) report.append(buffer, n);
  ::close(pipe_fds[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK_MESSAGE((WIFEXITED(status) && WEXITSTATUS(status) == 0), "the child died: ", status);
  return report;
}

// The descriptor budget: derived from RLIMIT_NOFILE's hard limit unless
// given, and an explicit value kept and checked.
TEST_CASE("placement.max_open_files: derived from the descriptor limit unless given") {
  Dirs d;
  auto parse = [&](const std::string& placement) {
    return ParseConfigString(absl::StrCat(
        "dataset: {path: ", d.dataset, "}\ntiers:\n  - {kind: posix, path: ", d.nvme,
        ", capacity: 1MiB}\n  - {kind: pmem, path: ", d.pmem,
        ", capacity: 1MiB}\n  - {kind: ram, capacity: 1MiB}\n  - {kind: source}\n",
        placement));
  };
  // Not given, or auto: shared by the source and the two file tiers.
  absl::StatusOr<Config> config = parse("");
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  struct rlimit limit;
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &limit) == 0);
  CHECK(config->placement.max_open_files == DefaultMaxOpenFiles(3));
  if (limit.rlim_max != RLIM_INFINITY) {
    CHECK(static_cast<uint64_t>(config->placement.max_open_files) * 3 < limit.rlim_max);
  }
  config = parse("placement: {max_open_files: auto}\n");
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  CHECK(config->placement.max_open_files == DefaultMaxOpenFiles(3));
  CHECK(Config().placement.max_open_files == DefaultMaxOpenFiles(4));
  CHECK(DefaultConfig(d.dataset).placement.max_open_files == DefaultMaxOpenFiles(1));
  // Given: kept as it is, and checked.
  config = parse("placement: {max_open_files: 64}\n");
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  CHECK(config->placement.max_open_files == 64);
  for (const std::string bad : {"3", "lots", "2000000", "[8]"}) {
    CAPTURE(bad);
    config = parse(absl::StrCat("placement: {max_open_files: ", bad, "}\n"));
    REQUIRE_FALSE(config.ok());
    CHECK(absl::StartsWith(config.status().message(), "placement.max_open_files: "));
  }
  // A hard limit of 1024 (ulimit -Hn 1024): half of it is left to the
  // program, the rest shared; more than the limit itself is refused.
  CHECK(InChildWithLimit(1024, 1024, [&]() -> std::string {
          std::string failed;
          if (DefaultMaxOpenFiles(2) != 256) failed += "DefaultMaxOpenFiles(2); ";
          if (DefaultMaxOpenFiles(4) != 128) failed += "DefaultMaxOpenFiles(4); ";
          absl::StatusOr<Config> derived = parse("");
          if (!derived.ok() || derived->placement.max_open_files != 170) failed += "derived; ";
          absl::StatusOr<Config> refused = parse("placement: {max_open_files: 1025}\n");
          if (refused.ok() ||
              !absl::StartsWith(refused.status().message(),
                                "placement.max_open_files: 1025 is more than the 1024")) {
            failed += "1025 not refused; ";
          }
          Config in_code = testing::MakeConfig(d.dataset, {});
          in_code.placement.max_open_files = 4096;
          if (!absl::StartsWith(ValidateConfig(in_code).message(), "placement.max_open_files: ")) {
            failed += "4096 in code not refused; ";
          }
          return failed;
        }) == "");
  // A soft limit of 1024 under a higher hard one (a shell's ulimit -Sn): the
  // budget is the hard limit's, which the instance raises the soft one to.
  if (limit.rlim_max != RLIM_INFINITY && limit.rlim_max > 2048) {
    const int at_hard = DefaultMaxOpenFiles(2);
    CHECK(InChildWithLimit(1024, limit.rlim_max, [&]() -> std::string {
            std::string failed;
            if (DefaultMaxOpenFiles(2) != at_hard) failed += "DefaultMaxOpenFiles(2); ";
            if (!parse("placement: {max_open_files: 1025}\n").ok()) failed += "1025 refused; ";
            return failed;
          }) == "");
  }
}

// Building, parsing or validating a config changes nothing in the process;
// the instance raises the soft descriptor limit to the hard one when it
// starts.
TEST_CASE("a config leaves RLIMIT_NOFILE alone, and starting an instance raises it") {
  Dirs d;
  struct rlimit limit;
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &limit) == 0);
  if (limit.rlim_max == RLIM_INFINITY || limit.rlim_max < 256) {
    MONARCH_SKIP("needs a finite hard RLIMIT_NOFILE of at least 256");
  }
  const rlim_t soft = limit.rlim_max / 2;
  testing::WriteFile(d.dataset + "/a", 1, 4096);  // An instance over no file pins nothing.
  CHECK(InChildWithLimit(soft, limit.rlim_max, [&]() -> std::string {
          std::string failed;
          auto soft_now = [] {
            struct rlimit now;
            return ::getrlimit(RLIMIT_NOFILE, &now) == 0 ? now.rlim_cur : 0;
          };
          const Config built;
          const PlacementConfig placement;
          const Config defaults = DefaultConfig(d.dataset);
          const absl::StatusOr<Config> parsed = ParseConfigString(
              absl::StrCat("dataset: {path: ", d.dataset, "}\ntiers:\n  - {kind: source}\n"));
          Config config = testing::MakeConfig(d.dataset, {testing::RamTier(1 << 20)});
          if (!parsed.ok() || !ValidateConfig(config).ok() || built.placement.max_open_files < 4 ||
              placement.max_open_files < 4 || defaults.placement.max_open_files < 4) {
            failed += "a config did not build; ";
          }
          if (soft_now() != soft) {
            failed += absl::StrCat("a config set the soft limit to ", soft_now(), "; ");
          }
          absl::StatusOr<std::unique_ptr<Monarch>> instance = Monarch::Create(config);
          if (!instance.ok()) return failed + instance.status().ToString();
          if (soft_now() != limit.rlim_max) failed += "starting an instance did not raise it; ";
          return failed;
        }) == "");
}

TEST_CASE("tier names default to the kind") {
  Dirs d;
  absl::StatusOr<Config> config = ParseConfigString(
      absl::StrCat("dataset: {path: ", d.dataset,
                   "}\ntiers:\n  - {kind: ram, capacity: 1MiB}\n  - {kind: source}\n"));
  REQUIRE(config.ok());
  CHECK(config->tiers[0].name == "ram");
  CHECK(config->tiers[1].name == "source");
}

TEST_CASE("sizes accept binary and decimal units") {
  CHECK(*ParseByteSize("1048576") == 1048576);
  CHECK(*ParseByteSize("64GiB") == (64ull << 30));
  CHECK(*ParseByteSize("64 GiB") == (64ull << 30));
  CHECK(*ParseByteSize("1.5KiB") == 1536);
  CHECK(*ParseByteSize("2MB") == 2000000);
  CHECK(*ParseByteSize("512k") == 524288);
  CHECK(*ParseByteSize("3g") == (3ull << 30));
  CHECK_FALSE(ParseByteSize("12 parsecs").ok());
  CHECK_FALSE(ParseByteSize("-5").ok());
  CHECK_FALSE(ParseByteSize("").ok());
  CHECK_FALSE(ParseByteSize("GiB").ok());
  CHECK_FALSE(ParseByteSize("1.5").ok());
  CHECK_FALSE(ParseByteSize("99999999TiB").ok());
}

TEST_CASE("bad configs are refused with the key named") {
  Dirs d;
  const std::string ds = absl::StrCat("dataset: {path: ", d.dataset, "}\n");
  const std::string src = "  - {kind: source}\n";

  SUBCASE("malformed YAML") {
    std::string e = ErrorOf("dataset: {path: [unclosed\n");
    CHECK(absl::StrContains(e, "malformed YAML at line"));
  }
  SUBCASE("not a mapping") {
    CHECK(absl::StrContains(ErrorOf("- a\n- b\n"), "expected a mapping"));
  }
  SUBCASE("unknown top-level key") {
    std::string e = ErrorOf(ds + "tiers:\n" + src + "cache: yes\n");
    CHECK(absl::StrContains(
        e, "cache: unknown key; expected one of: dataset, tiers, placement, prefetch, remote, node, "
           "memory, logging"));
  }
  SUBCASE("unknown tier key") {
    std::string e = ErrorOf(ds + "tiers:\n  - {kind: ram, capacity: 1MiB, size: 2}\n" + src);
    CHECK(absl::StrContains(e, "tiers[0].size: unknown key"));
  }
  SUBCASE("unknown placement key") {
    std::string e = ErrorOf(ds + "tiers:\n" + src + "placement: {thread: 2}\n");
    CHECK(absl::StrContains(e, "placement.thread: unknown key"));
  }
  SUBCASE("prefetch keys") {
    CHECK(absl::StrContains(ErrorOf(ds + "tiers:\n" + src + "prefetch: {stream: 2}\n"),
                            "prefetch.stream: unknown key"));
    CHECK(absl::StrContains(ErrorOf(ds + "tiers:\n" + src + "prefetch: {streams: -1}\n"),
                            "prefetch.streams: expected 0 to 256"));
    CHECK(absl::StrContains(ErrorOf(ds + "tiers:\n" + src + "prefetch: {lookahead: lots}\n"),
                            "prefetch.lookahead: expected a size"));
    CHECK(absl::StrContains(ErrorOf(ds + "tiers:\n" + src + "prefetch: {lookahead: 0}\n"),
                            "prefetch.lookahead: expected a size of at least one byte"));
    CHECK(absl::StrContains(ErrorOf(ds + "tiers:\n" + src + "prefetch: 4\n"),
                            "prefetch: expected a mapping"));
    absl::StatusOr<Config> good =
        ParseConfigString(ds + "tiers:\n" + src + "prefetch: {streams: 16, lookahead: 2GiB}\n");
    REQUIRE(good.ok());
    CHECK(good->prefetch.streams == 16);
    CHECK(good->prefetch.lookahead_bytes == (2ull << 30));
    absl::StatusOr<Config> defaults = ParseConfigString(ds + "tiers:\n" + src);
    REQUIRE(defaults.ok());
    CHECK(defaults->prefetch.streams == 8);
    CHECK(defaults->prefetch.lookahead_bytes == (1ull << 30));
    // Files above 256 MiB are cached by extents of 4 MiB unless told otherwise.
    CHECK(defaults->placement.extent_bytes == (4ull << 20));
    CHECK(defaults->placement.extent_threshold == (256ull << 20));
    absl::StatusOr<Config> whole =
        ParseConfigString(ds + "tiers:\n" + src + "placement: {extent_bytes: 0}\n");
    REQUIRE(whole.ok());
    CHECK(whole->placement.extent_bytes == 0);
  }
  SUBCASE("missing dataset") {
    CHECK(absl::StrContains(ErrorOf("tiers:\n" + src), "dataset: required"));
  }
  SUBCASE("missing dataset path") {
    CHECK(absl::StrContains(ErrorOf("dataset: {file_regex: x}\ntiers:\n" + src),
                            "dataset.path: required"));
  }
  SUBCASE("dataset path that does not exist") {
    std::string e = ErrorOf("dataset: {path: /nonexistent/monarch}\ntiers:\n" + src);
    CHECK(
        absl::StrContains(e, "dataset.path: '/nonexistent/monarch' is not an existing directory"));
  }
  SUBCASE("relative dataset path") {
    CHECK(absl::StrContains(ErrorOf("dataset: {path: data}\ntiers:\n" + src),
                            "dataset.path: expected an absolute path"));
  }
  SUBCASE("invalid regex") {
    std::string e = ErrorOf(
        absl::StrCat("dataset: {path: ", d.dataset, ", file_regex: '(unclosed'}\ntiers:\n", src));
    CHECK(absl::StrContains(e, "dataset.file_regex: invalid regular expression"));
  }
  SUBCASE("regex whose nested bounded repetitions would take GBs to compile") {
    // glibc's regcomp copies X{m,n} out n times: this one took 4 GiB and 14 s.
    std::string e = ErrorOf(absl::StrCat("dataset: {path: ", d.dataset,
                                         ", file_regex: '(.{1,255}){1,255}'}\ntiers:\n", src));
    CHECK(absl::StrContains(e, "dataset.file_regex: '(.{1,255}){1,255}' is too large to compile"));
    CHECK(absl::StrContains(e, "65025 positions, more than 4096"));
    e = ErrorOf(absl::StrCat("dataset: {path: ", d.dataset,
                             ", file_regex: '((((a{100}){100}){100}){100})'}\ntiers:\n", src));
    CHECK(absl::StrContains(e, "is too large to compile"));
  }
  SUBCASE("scan_threads out of range") {
    std::string e =
        ErrorOf(absl::StrCat("dataset: {path: ", d.dataset, ", scan_threads: 0}\ntiers:\n", src));
    CHECK(absl::StrContains(e, "dataset.scan_threads: expected 1 to 256, got 0"));
  }
  SUBCASE("tiers is not a list") {
    CHECK(absl::StrContains(ErrorOf(ds + "tiers: ram\n"), "tiers: expected a list, got 'ram'"));
  }
  SUBCASE("missing tiers") { CHECK(absl::StrContains(ErrorOf(ds), "tiers: required")); }
  SUBCASE("unknown kind") {
    std::string e = ErrorOf(ds + "tiers:\n  - {kind: tape, capacity: 1MiB}\n" + src);
    CHECK(absl::StrContains(
        e, "tiers[0].kind: expected 'ram', 'pmem', 'posix' or 'source', got 'tape'"));
  }
  SUBCASE("wrong type for capacity") {
    std::string e = ErrorOf(ds + "tiers:\n  - {kind: ram, capacity: [1, 2]}\n" + src);
    CHECK(absl::StrContains(
        e, "tiers[0].capacity: expected a size such as 64GiB or 1048576, got a list"));
  }
  SUBCASE("bad unit") {
    std::string e = ErrorOf(ds + "tiers:\n  - {kind: ram, capacity: 12 parsecs}\n" + src);
    CHECK(absl::StrContains(e, "tiers[0].capacity: expected a size such as 64GiB"));
    CHECK(absl::StrContains(e, "12 parsecs"));
  }
  SUBCASE("zero capacity") {
    CHECK(absl::StrContains(ErrorOf(ds + "tiers:\n  - {kind: ram, capacity: 0}\n" + src),
                            "tiers[0].capacity: expected a size greater than 0"));
  }
  SUBCASE("missing capacity") {
    CHECK(absl::StrContains(ErrorOf(ds + "tiers:\n  - {kind: ram}\n" + src),
                            "tiers[0].capacity: required for a ram tier"));
  }
  SUBCASE("missing path for a posix tier") {
    std::string e = ErrorOf(ds + "tiers:\n  - {kind: posix, capacity: 1MiB}\n" + src);
    CHECK(absl::StrContains(e, "tiers[0].path: required for a posix tier"));
  }
  SUBCASE("path that does not exist") {
    std::string e =
        ErrorOf(ds + "tiers:\n  - {kind: posix, path: /nonexistent/nvme, capacity: 1MiB}\n" + src);
    CHECK(absl::StrContains(e, "tiers[0].path: '/nonexistent/nvme' is not an existing directory"));
  }
  SUBCASE("a tier inside the dataset") {
    std::string inner = d.scratch.Sub("dataset/cache");
    std::string e = ErrorOf(
        ds + absl::StrCat("tiers:\n  - {kind: posix, path: ", inner, ", capacity: 1MiB}\n") + src);
    CHECK(absl::StrContains(e, "tiers[0].path:"));
    CHECK(absl::StrContains(e, "overlaps dataset.path"));
  }
  SUBCASE("two tiers sharing a directory") {
    std::string e =
        ErrorOf(ds +
                absl::StrCat("tiers:\n  - {name: a, kind: posix, path: ", d.nvme,
                             ", capacity: 1MiB}\n  - {name: b, kind: pmem, path: ", d.nvme,
                             ", capacity: 1MiB}\n") +
                src);
    CHECK(absl::StrContains(e, "tiers[1].path:"));
    CHECK(absl::StrContains(e, "overlaps tiers[0].path"));
  }
  SUBCASE("source not last") {
    std::string e = ErrorOf(ds + "tiers:\n" + src + "  - {kind: ram, capacity: 1MiB}\n");
    CHECK(absl::StrContains(e, "tiers[0].kind: the source tier must be the last tier"));
  }
  SUBCASE("two sources") {
    std::string e =
        ErrorOf(ds + "tiers:\n  - {name: a, kind: source}\n  - {name: b, kind: source}\n");
    CHECK(absl::StrContains(e, "tiers[1].kind: a second source tier"));
  }
  SUBCASE("no source") {
    std::string e = ErrorOf(ds + "tiers:\n  - {kind: ram, capacity: 1MiB}\n");
    CHECK(absl::StrContains(e, "tiers: expected a last tier of kind 'source'"));
  }
  SUBCASE("a path on the source tier") {
    std::string e = ErrorOf(ds + "tiers:\n  - {kind: source, path: /lustre}\n");
    CHECK(absl::StrContains(e, "tiers[0].path: a source tier reads dataset.path"));
  }
  SUBCASE("duplicate names") {
    std::string e = ErrorOf(
        ds + "tiers:\n  - {name: x, kind: ram, capacity: 1MiB}\n  - {name: x, kind: source}\n");
    CHECK(absl::StrContains(e, "tiers[1].name: 'x' is used by another tier"));
  }
  SUBCASE("capacity larger than the device") {
    std::string e = ErrorOf(
        ds + absl::StrCat("tiers:\n  - {kind: posix, path: ", d.nvme, ", capacity: 1000TiB}\n") +
        src);
    CHECK(absl::StrContains(e, "tiers[0].capacity:"));
    CHECK(absl::StrContains(e, "more than the"));
    CHECK(absl::StrContains(e, "bytes of the device holding"));
  }
  SUBCASE("ram capacity larger than memory") {
    std::string e = ErrorOf(ds + "tiers:\n  - {kind: ram, capacity: 1000TiB}\n" + src);
    CHECK(absl::StrContains(e, "tiers[0].capacity:"));
    CHECK(absl::StrContains(e, "bytes of memory"));
  }
  SUBCASE("threads of the wrong type") {
    std::string e = ErrorOf(ds + "tiers:\n" + src + "placement: {threads: many}\n");
    CHECK(absl::StrContains(e, "placement.threads: expected an integer, got 'many'"));
  }
  SUBCASE("negative threads") {
    CHECK(absl::StrContains(ErrorOf(ds + "tiers:\n" + src + "placement: {threads: -1}\n"),
                            "placement.threads: expected 0"));
  }
  SUBCASE("unknown policy") {
    std::string e = ErrorOf(ds + "tiers:\n" + src + "placement: {policy: lfu}\n");
    CHECK(absl::StrContains(e, "placement.policy: expected 'first-fit', 'lru' or 'none', got 'lfu'"));
    absl::StatusOr<Config> lru = ParseConfigString(ds + "tiers:\n" + src + "placement: {policy: lru}\n");
    REQUIRE(lru.ok());
    CHECK(lru->placement.policy == PlacementPolicyKind::kLru);
  }
  SUBCASE("eviction with peers") {
    std::string e = ErrorOf(ds + "tiers:\n" + src +
                            "placement: {policy: lru}\nremote: {enabled: true, rank: 0, size: 1, "
                            "rendezvous_dir: /tmp}\n");
    CHECK(absl::StrContains(e, "placement.policy: 'lru' is not supported with remote.enabled"));
  }
  SUBCASE("tiny chunk size") {
    CHECK(absl::StrContains(ErrorOf(ds + "tiers:\n" + src + "placement: {chunk_bytes: 100}\n"),
                            "placement.chunk_bytes"));
  }
  SUBCASE("the retired idle_priority says what replaced it") {
    std::string e = ErrorOf(ds + "tiers:\n" + src + "placement: {idle_priority: true}\n");
    CHECK(absl::StrContains(e, "placement.idle_priority: no longer supported"));
    CHECK(absl::StrContains(e, "placement.max_staging_bytes"));
  }
  SUBCASE("a write mode that is not auto, buffered or direct") {
    std::string e = ErrorOf(ds + "tiers:\n  - {kind: posix, path: " + d.nvme +
                            ", capacity: 1MiB, write_mode: sometimes}\n" + src);
    CHECK(absl::StrContains(e, "tiers[0].write_mode: expected 'auto', 'buffered' or 'direct', "
                               "got 'sometimes'"));
  }
  SUBCASE("a write mode on a tier that is not posix") {
    std::string e = ErrorOf(ds + "tiers:\n  - {kind: ram, capacity: 1MiB, write_mode: direct}\n" +
                            src);
    CHECK(absl::StrContains(e, "tiers[0].write_mode: only a posix tier has a write mode"));
  }
  SUBCASE("huge pages on a tier that is not ram, or not a boolean") {
    std::string e = ErrorOf(ds + "tiers:\n  - {kind: posix, path: " + d.nvme +
                            ", capacity: 1MiB, huge_pages: true}\n" + src);
    CHECK(absl::StrContains(e, "tiers[0].huge_pages: only a ram tier has huge pages"));
    e = ErrorOf(ds + "tiers:\n  - {kind: ram, capacity: 1MiB, huge_pages: lots}\n" + src);
    CHECK(absl::StrContains(e, "tiers[0].huge_pages"));
  }
  SUBCASE("bad log level") {
    std::string e = ErrorOf(ds + "tiers:\n" + src + "logging: {level: loud}\n");
    CHECK(absl::StrContains(
        e, "logging.level: expected 'debug', 'info', 'warning' or 'error', got 'loud'"));
  }
}

// Every enum key: each of its YAML names parses to a value that NameOf()
// names the same way, and a bad value is refused by the key's path with all
// of the names listed.
TEST_CASE("each enum's YAML names: parsed, printed by NameOf, listed when wrong") {
  Dirs d;
  struct Case {
    std::string key;
    std::vector<std::string> names;
    std::function<std::string(const Config&)> name_of;
  };
  const std::vector<Case> cases = {
      {"dataset.symlinks", {"follow", "inside", "skip"},
       [](const Config& c) { return NameOf(c.dataset.symlinks); }},
      {"tiers[0].kind", {"ram", "pmem", "posix", "source"},
       [](const Config& c) { return NameOf(c.tiers[0].kind); }},
      {"tiers[0].write_mode", {"auto", "buffered", "direct"},
       [](const Config& c) { return NameOf(c.tiers[0].write_mode); }},
      {"placement.policy", {"first-fit", "lru", "none"},
       [](const Config& c) { return NameOf(c.placement.policy); }},
      {"placement.verify", {"first-read", "every-read", "off"},
       [](const Config& c) { return NameOf(c.placement.verify); }},
      {"placement.cached_source", {"defer", "promote"},
       [](const Config& c) { return NameOf(c.placement.cached_source); }},
      {"remote.bootstrap", {"directory", "mpi"},
       [](const Config& c) { return NameOf(c.remote.bootstrap); }},
      {"logging.level", {"debug", "info", "warning", "error"},
       [](const Config& c) { return NameOf(c.logging.level); }},
  };
  // A config whose `key` is `value`.
  auto yaml = [&](const std::string& key, const std::string& value) {
    const std::string section = key.substr(0, key.find('.'));
    const std::string name = key.substr(key.find('.') + 1);
    std::string dataset = absl::StrCat("dataset: {path: ", d.dataset, "}\n");
    std::string tiers = "tiers:\n  - {kind: source}\n";
    if (section == "dataset") {
      dataset = absl::StrCat("dataset: {path: ", d.dataset, ", ", name, ": ", value, "}\n");
    } else if (name == "kind") {
      const std::string where = value == "pmem" ? d.pmem : d.nvme;
      tiers = value == "source" ? "tiers:\n  - {kind: source}\n"
              : value == "ram"  ? "tiers:\n  - {kind: ram, capacity: 1MiB}\n  - {kind: source}\n"
                                : absl::StrCat("tiers:\n  - {kind: ", value, ", path: ", where,
                                               ", capacity: 1MiB}\n  - {kind: source}\n");
    } else if (name == "write_mode") {
      tiers = absl::StrCat("tiers:\n  - {kind: posix, path: ", d.nvme,
                           ", capacity: 1MiB, write_mode: ", value, "}\n  - {kind: source}\n");
    } else {
      tiers += absl::StrCat(section, ": {", name, ": ", value, "}\n");
    }
    return dataset + tiers;
  };
  for (const Case& c : cases) {
    CAPTURE(c.key);
    std::string expected;  // "'a', 'b' or 'c'"
    for (size_t i = 0; i < c.names.size(); ++i) {
      absl::StrAppend(&expected, i == 0 ? "" : i + 1 == c.names.size() ? " or " : ", ", "'",
                      c.names[i], "'");
    }
    for (const std::string& name : c.names) {
      absl::StatusOr<Config> config = ParseConfigString(yaml(c.key, name));
      REQUIRE_MESSAGE(config.ok(), config.status().ToString());
      CHECK(c.name_of(*config) == name);
    }
    CHECK(ErrorOf(yaml(c.key, "bogus")) ==
          absl::StrCat(c.key, ": expected ", expected, ", got 'bogus'"));
  }
  // A kind is required, and named as the key names its values; `peers` is
  // a tier's name in stats, not a kind to list.
  CHECK(ErrorOf(absl::StrCat("dataset: {path: ", d.dataset, "}\ntiers:\n  - {name: x}\n")) ==
        "tiers[0].kind: required: 'ram', 'pmem', 'posix' or 'source'");
  CHECK(std::string(NameOf(TierKind::kPeers)) == "peers");
  CHECK(std::string(TierKindName(TierKind::kPosix)) == "posix");
  CHECK(ErrorOf(yaml("tiers[0].kind", "peers")) ==
        "tiers[0].kind: expected 'ram', 'pmem', 'posix' or 'source', got 'peers'");
}

// Sets (or, with nullopt, unsets) an environment variable for one scope and
// restores what was there before.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST_CASE("a full node section parses into NodeConfig") {
  Dirs d;
  absl::StatusOr<Config> config = ParseConfigString(absl::StrCat("dataset: {path: ", d.dataset, R"(}
tiers:
  - {kind: source}
node:
  shared: true
  runtime_dir: /run/monarch-test
  autostart: false
  idle_exit: 2m
  metrics_port: 9100
)"));
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  CHECK(config->node.shared);
  CHECK(config->node.runtime_dir == "/run/monarch-test");
  CHECK_FALSE(config->node.autostart);
  CHECK(config->node.idle_exit_seconds == 120);
  CHECK(config->node.metrics_port == 9100);
}

TEST_CASE("the memory section parses into MemoryConfig, and bad values name their key") {
  Dirs d;
  const std::string base = absl::StrCat("dataset: {path: ", d.dataset, "}\ntiers:\n  - {kind: source}\n");
  absl::StatusOr<Config> config = ParseConfigString(
      base + "memory: {watch: false, headroom: 512MiB, psi_stall: 100ms, interval: 50ms, "
             "grow_after: 1m}\n");
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  CHECK_FALSE(config->memory.watch);
  CHECK(config->memory.headroom_bytes == 512ull << 20);
  CHECK(config->memory.psi_stall_seconds == doctest::Approx(0.1));
  CHECK(config->memory.interval_seconds == doctest::Approx(0.05));
  CHECK(config->memory.grow_after_seconds == 60);
  absl::StatusOr<Config> defaults = ParseConfigString(base);
  REQUIRE(defaults.ok());
  CHECK(defaults->memory.watch);
  CHECK(defaults->memory.headroom_bytes == 256ull << 20);
  auto error = [&](const std::string& memory) {
    absl::StatusOr<Config> bad = ParseConfigString(base + "memory: " + memory + "\n");
    return bad.ok() ? std::string("ok") : std::string(bad.status().message());
  };
  CHECK(absl::StrContains(error("{watch: maybe}"), "memory.watch: expected true or false"));
  CHECK(absl::StrContains(error("{headroom: 1KiB}"),
                          "memory.headroom: expected a size of at least 1MiB"));
  CHECK(absl::StrContains(error("{psi_stall: 2s}"),
                          "memory.psi_stall: expected a duration from 0 to 1s"));
  CHECK(absl::StrContains(error("{interval: 1ms}"),
                          "memory.interval: expected a duration from 10ms to 60s"));
  CHECK(absl::StrContains(error("{grow_after: soon}"), "memory.grow_after: expected a duration"));
  CHECK(absl::StrContains(error("{limit: 1GiB}"), "memory.limit: unknown key"));
}

TEST_CASE("node defaults: not shared, autostart, 300 s idle exit, no metrics endpoint") {
  Dirs d;
  const std::string base = absl::StrCat("dataset: {path: ", d.dataset, "}\ntiers:\n  - {kind: source}\n");
  SUBCASE("no node section") {
    absl::StatusOr<Config> config = ParseConfigString(base);
    REQUIRE_MESSAGE(config.ok(), config.status().ToString());
    CHECK_FALSE(config->node.shared);
    CHECK(config->node.runtime_dir.empty());
    CHECK(config->node.autostart);
    CHECK(config->node.idle_exit_seconds == 300);
    CHECK(config->node.metrics_port == 0);
  }
  SUBCASE("a node section with only shared") {
    absl::StatusOr<Config> config = ParseConfigString(base + "node: {shared: true}\n");
    REQUIRE_MESSAGE(config.ok(), config.status().ToString());
    CHECK(config->node.shared);
    CHECK(config->node.autostart);
    CHECK(config->node.idle_exit_seconds == 300);
    CHECK(config->node.metrics_port == 0);
  }
  SUBCASE("idle_exit 0 means never and is allowed") {
    absl::StatusOr<Config> config = ParseConfigString(base + "node: {idle_exit: 0}\n");
    REQUIRE_MESSAGE(config.ok(), config.status().ToString());
    CHECK(config->node.idle_exit_seconds == 0);
  }
  SUBCASE("a runtime_dir with a variable is expanded when validated, kept as written") {
    ScopedEnv home("HOME", "/home/monarch-test");
    absl::StatusOr<Config> config = ParseConfigString(base + "node: {runtime_dir: '${HOME}/rt'}\n");
    REQUIRE_MESSAGE(config.ok(), config.status().ToString());
    CHECK(config->node.runtime_dir == "${HOME}/rt");
  }
}

TEST_CASE("bad node values are refused with the key named") {
  Dirs d;
  const std::string base = absl::StrCat("dataset: {path: ", d.dataset, "}\ntiers:\n  - {kind: source}\n");
  SUBCASE("shared that is not a boolean") {
    CHECK(absl::StrContains(ErrorOf(base + "node: {shared: maybe}\n"),
                            "node.shared: expected true or false, got 'maybe'"));
  }
  SUBCASE("autostart that is not a boolean") {
    CHECK(absl::StrContains(ErrorOf(base + "node: {autostart: 1}\n"), "node.autostart:"));
  }
  SUBCASE("metrics_port above 65535") {
    CHECK(absl::StrContains(ErrorOf(base + "node: {metrics_port: 70000}\n"),
                            "node.metrics_port: expected 0 (no endpoint) to 65535, got 70000"));
  }
  SUBCASE("negative metrics_port") {
    CHECK(absl::StrContains(ErrorOf(base + "node: {metrics_port: -1}\n"),
                            "node.metrics_port: expected 0 (no endpoint) to 65535, got -1"));
  }
  SUBCASE("metrics_port that is not an integer") {
    CHECK(absl::StrContains(ErrorOf(base + "node: {metrics_port: http}\n"),
                            "node.metrics_port: expected an integer, got 'http'"));
  }
  SUBCASE("negative idle_exit") {
    std::string e = ErrorOf(base + "node: {idle_exit: -1s}\n");
    CHECK(absl::StrContains(e, "node.idle_exit: expected a duration"));
    CHECK(absl::StrContains(e, "'-1s'"));
  }
  SUBCASE("idle_exit that is not a duration") {
    std::string e = ErrorOf(base + "node: {idle_exit: forever}\n");
    CHECK(absl::StrContains(e, "node.idle_exit: expected a duration"));
    CHECK(absl::StrContains(e, "0 for never"));
  }
  SUBCASE("relative runtime_dir") {
    CHECK(absl::StrContains(ErrorOf(base + "node: {runtime_dir: relative/path}\n"),
                            "node.runtime_dir: expected an absolute path, got 'relative/path'"));
  }
  SUBCASE("runtime_dir that is relative only after expansion") {
    ScopedEnv var("MONARCH_TEST_RUNTIME", "relative");
    std::string e = ErrorOf(base + "node: {runtime_dir: '${MONARCH_TEST_RUNTIME}/x'}\n");
    CHECK(absl::StrContains(e, "node.runtime_dir: expected an absolute path"));
    CHECK(absl::StrContains(e, "'relative/x' after expansion"));
  }
  SUBCASE("runtime_dir naming an unset variable") {
    ScopedEnv var("MONARCH_TEST_UNSET", std::nullopt);
    std::string e = ErrorOf(base + "node: {runtime_dir: '/run/${MONARCH_TEST_UNSET}'}\n");
    CHECK(absl::StrContains(e, "node.runtime_dir: environment variable 'MONARCH_TEST_UNSET'"));
  }
  SUBCASE("runtime_dir too long for a Unix socket path") {
    ScopedEnv var("MONARCH_TEST_LONG", std::string(80, 'x'));
    std::string e = ErrorOf(base + "node: {runtime_dir: '/${MONARCH_TEST_LONG}'}\n");
    CHECK(absl::StrContains(e, "node.runtime_dir:"));
    CHECK(absl::StrContains(e, "81 characters after expansion; at most 80"));
    CHECK(absl::StrContains(e, "Unix socket"));
  }
  SUBCASE("unknown node key") {
    CHECK(absl::StrContains(ErrorOf(base + "node: {sharde: true}\n"),
                            "node.sharde: unknown key; expected one of: shared, runtime_dir, "
                            "autostart, idle_exit, keep_ram, ram_dir, share_with_group, request_timeout, "
                            "start_timeout, metrics_port"));
  }
  SUBCASE("ram_dir not absolute") {
    std::string e = ErrorOf(base + "node: {ram_dir: shm}\n");
    CHECK(absl::StrContains(e, "node.ram_dir: expected `auto` or an absolute directory on a "
                               "tmpfs, got 'shm'"));
  }
  SUBCASE("share_with_group naming no group") {
    std::string e = ErrorOf(base + "node: {share_with_group: no-such-group-of-monarch}\n");
    CHECK(absl::StrContains(e, "node.share_with_group:"));
    CHECK(absl::StrContains(e, "no such group"));
  }
  SUBCASE("share_with_group: the group's runtime base") {
    absl::StatusOr<Config> config = ParseConfigString(base + "node: {share_with_group: '0'}\n");
    REQUIRE_MESSAGE(config.ok(), config.status().ToString());
    absl::StatusOr<std::string> dir = NodeRuntimeDirectory(*config);
    REQUIRE(dir.ok());
    CHECK(absl::StartsWith(*dir, "/tmp/monarch-group-0/"));
  }
  SUBCASE("node that is not a mapping") {
    CHECK(absl::StrContains(ErrorOf(base + "node: shared\n"),
                            "node: expected a mapping, got 'shared'"));
  }
  SUBCASE("ValidateConfig checks a NodeConfig built in code") {
    Config config = testing::MakeConfig(d.dataset, {});
    REQUIRE(ValidateConfig(config).ok());
    config.node.metrics_port = 65536;
    CHECK(absl::StrContains(ValidateConfig(config).message(), "node.metrics_port:"));
    config.node.metrics_port = 0;
    config.node.idle_exit_seconds = -5;
    CHECK(absl::StrContains(ValidateConfig(config).message(), "node.idle_exit:"));
    config.node.idle_exit_seconds = std::numeric_limits<double>::infinity();
    CHECK(absl::StrContains(ValidateConfig(config).message(), "node.idle_exit:"));
    config.node.idle_exit_seconds = 0;
    config.node.runtime_dir = "run/monarch";
    CHECK(ValidateConfig(config).code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(ValidateConfig(config).message(), "node.runtime_dir:"));
  }
}

TEST_CASE("NodeRuntimeDirectory applies the default and expands variables") {
  ScratchDir scratch;
  Config config;
  config.dataset.path = scratch.Sub("imagenet");
  NodeConfig& node = config.node;
  const std::string key = DatasetKey(config.dataset);
  ScopedEnv slurm("SLURM_JOB_ID", std::nullopt);
  ScopedEnv pbs("PBS_JOBID", std::nullopt);
  ScopedEnv lsf("LSB_JOBID", std::nullopt);
  ScopedEnv flux("FLUX_JOB_ID", std::nullopt);
  const std::string dir_name = key + "-" + CacheShapeKey(config);
  SUBCASE("default under XDG_RUNTIME_DIR when it is set, one per dataset and cache shape") {
    ScopedEnv xdg("XDG_RUNTIME_DIR", "/run/user/4242");
    absl::StatusOr<std::string> dir = NodeRuntimeDirectory(config);
    REQUIRE_MESSAGE(dir.ok(), dir.status().ToString());
    CHECK(*dir == "/run/user/4242/monarch/" + dir_name);
  }
  SUBCASE("default in /tmp per user when XDG_RUNTIME_DIR is unset") {
    ScopedEnv xdg("XDG_RUNTIME_DIR", std::nullopt);
    absl::StatusOr<std::string> dir = NodeRuntimeDirectory(config);
    REQUIRE_MESSAGE(dir.ok(), dir.status().ToString());
    CHECK(*dir == absl::StrCat("/tmp/monarch-", ::getuid(), "/", dir_name));
  }
  SUBCASE("an empty or relative XDG_RUNTIME_DIR is ignored") {
    for (const char* value : {"", "run/user/1"}) {
      ScopedEnv xdg("XDG_RUNTIME_DIR", std::string(value));
      absl::StatusOr<std::string> dir = NodeRuntimeDirectory(config);
      REQUIRE_MESSAGE(dir.ok(), dir.status().ToString());
      CHECK(*dir == absl::StrCat("/tmp/monarch-", ::getuid(), "/", dir_name));
    }
  }
  SUBCASE("every batch job of the user meets in the dataset's directory") {
    ScopedEnv xdg("XDG_RUNTIME_DIR", "/run/user/4242");
    {
      ScopedEnv job("SLURM_JOB_ID", "81234");
      CHECK(NodeRuntimeDirectory(config).value_or("") == "/run/user/4242/monarch/" + dir_name);
      CHECK(BatchJobTag() == "slurm-81234");
    }
    ScopedEnv job("PBS_JOBID", "77.head node/../x");  // Made a safe name.
    CHECK(BatchJobTag() == "pbs-77.head_node_.._x");
    CHECK(NodeRuntimeDirectory(config).value_or("") == "/run/user/4242/monarch/" + dir_name);
  }
  SUBCASE("configs that cache differently get directories of their own") {
    ScopedEnv xdg("XDG_RUNTIME_DIR", "/run/user/4242");
    Config cached = config;
    cached.tiers = {TierConfig{"ram", TierKind::kRam, "", 1 << 30},
                    TierConfig{"source", TierKind::kSource}};
    Config same = cached;
    same.tiers[0].name = "memory";  // A name caches nothing.
    same.placement.threads = 7;     // Nor do other sections.
    CHECK(CacheShapeKey(same) == CacheShapeKey(cached));
    CHECK(CacheShape(cached) == "ram 1073741824 B");
    Config larger = cached;
    larger.tiers[0].capacity_bytes = uint64_t{2} << 30;
    Config disk = cached;
    disk.tiers.insert(disk.tiers.begin() + 1,
                      TierConfig{"nvme", TierKind::kPosix, scratch.Sub("nvme"), 1 << 30});
    const std::string base = "/run/user/4242/monarch/" + key + "-";
    for (const Config* c : {&cached, &larger, &disk}) {
      CHECK(absl::StartsWith(NodeRuntimeDirectory(*c).value_or(""), base));
      CHECK(CacheShapeKey(*c).size() == 8);
    }
    CHECK(CacheShapeKey(larger) != CacheShapeKey(cached));
    CHECK(CacheShapeKey(disk) != CacheShapeKey(cached));
    CHECK(CacheShapeKey(disk) != CacheShapeKey(larger));
  }
  SUBCASE("the dataset key tells datasets apart, not spellings of one path") {
    DatasetConfig same = config.dataset;
    same.path += "/";
    CHECK(DatasetKey(same) == key);
    same.path = absl::StrCat("/", config.dataset.path, "/./");
    CHECK(DatasetKey(same) == key);
    DatasetConfig other = config.dataset;
    other.path = scratch.Sub("other");
    CHECK(DatasetKey(other) != key);
    other = config.dataset;
    other.file_regex = "train/.*";
    CHECK(DatasetKey(other) != key);
    other = config.dataset;
    other.symlinks = SymlinkPolicy::kSkip;
    CHECK(DatasetKey(other) != key);
    CHECK(key.size() == 16);
    CHECK(key.find_first_not_of("0123456789abcdef") == std::string::npos);
  }
  SUBCASE("an explicit directory expands ${VAR} and $VAR") {
    ScopedEnv home("HOME", "/home/monarch-test");
    node.runtime_dir = "${HOME}/x";
    absl::StatusOr<std::string> dir = NodeRuntimeDirectory(config);
    REQUIRE_MESSAGE(dir.ok(), dir.status().ToString());
    CHECK(*dir == "/home/monarch-test/x");
    node.runtime_dir = "$HOME/y";
    CHECK(NodeRuntimeDirectory(config).value_or("") == "/home/monarch-test/y");
  }
  SUBCASE("an explicit directory ignores XDG_RUNTIME_DIR and the job") {
    ScopedEnv xdg("XDG_RUNTIME_DIR", "/run/user/4242");
    ScopedEnv job("SLURM_JOB_ID", "81234");
    node.runtime_dir = "/scratch/monarch";
    CHECK(NodeRuntimeDirectory(config).value_or("") == "/scratch/monarch");
  }
  SUBCASE("a relative result is InvalidArgument naming node.runtime_dir") {
    node.runtime_dir = "monarch";
    absl::StatusOr<std::string> dir = NodeRuntimeDirectory(config);
    REQUIRE_FALSE(dir.ok());
    CHECK(dir.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(dir.status().message(), "node.runtime_dir"));
  }
  SUBCASE("an unset variable is InvalidArgument naming node.runtime_dir") {
    ScopedEnv var("MONARCH_TEST_UNSET", std::nullopt);
    node.runtime_dir = "/run/$MONARCH_TEST_UNSET";
    absl::StatusOr<std::string> dir = NodeRuntimeDirectory(config);
    REQUIRE_FALSE(dir.ok());
    CHECK(dir.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(dir.status().message(), "node.runtime_dir"));
  }
}

TEST_CASE("hostile configs: duplicate keys, huge files, too many tiers, huge values") {
  Dirs d;
  const std::string ds = absl::StrCat("dataset: {path: ", d.dataset, "}\n");
  const std::string src = "  - {kind: source}\n";
  SUBCASE("a key given twice is an error naming it, wherever it is") {
    CHECK(absl::StrContains(
        ErrorOf(ds + "tiers:\n  - {kind: ram, capacity: 1MiB, capacity: 2MiB}\n" + src),
        "tiers[0].capacity: given more than once"));
    CHECK(absl::StrContains(ErrorOf(absl::StrCat("dataset: {path: ", d.dataset, ", path: /tmp}\n",
                                                 "tiers:\n", src)),
                            "dataset.path: given more than once"));
    CHECK(absl::StrContains(ErrorOf(ds + "tiers:\n" + src + "tiers:\n" + src),
                            "tiers: given more than once"));
  }
  SUBCASE("a config over 1 MiB is refused before parsing") {
    std::string big = ds + "tiers:\n" + src + "#" + std::string(1 << 20, 'x') + "\n";
    CHECK(absl::StrContains(ErrorOf(big), "larger than 1048576 bytes is refused"));
  }
  SUBCASE("more than 16 tiers") {
    std::string tiers = "tiers:\n";
    for (int i = 0; i < 17; ++i) tiers += absl::StrCat("  - {kind: ram, name: r", i, ", capacity: 1MiB}\n");
    CHECK(absl::StrContains(ErrorOf(ds + tiers + src), "tiers: expected at most 16 tiers, got 18"));
  }
  SUBCASE("a huge value is quoted in 200 characters at most") {
    const std::string huge(100000, 'a');
    std::string e = ErrorOf(absl::StrCat("dataset: {path: /", huge, "}\ntiers:\n", src));
    CHECK(absl::StrContains(e, "dataset.path: "));
    CHECK(absl::StrContains(e, "(100001 bytes)"));
    CHECK(e.size() < 400);
    e = ErrorOf(ds + "tiers:\n  - {kind: ram, capacity: " + huge + "}\n" + src);
    CHECK(absl::StrContains(e, "tiers[0].capacity"));
    CHECK(e.size() < 500);
    // An unknown key of 1000 characters (YAML's limit for a plain key is 1024).
    e = ErrorOf(ds + "tiers:\n" + src + std::string(1000, 'k') + ": 1\n");
    CHECK(absl::StrContains(e, "unknown key"));
    CHECK(absl::StrContains(e, "(1000 bytes)"));
    CHECK(e.size() < 500);
  }
}

TEST_CASE("a missing config file is NotFound and names the file") {
  absl::StatusOr<Config> config = ParseConfigFile("/nonexistent/monarch.yaml");
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().code() == absl::StatusCode::kNotFound);
  CHECK(absl::StrContains(config.status().message(), "/nonexistent/monarch.yaml"));
}

TEST_CASE("ValidateConfig checks configs built in code the same way") {
  Dirs d;
  Config config = testing::MakeConfig(d.dataset, {testing::RamTier(1 << 20)});
  CHECK(ValidateConfig(config).ok());
  config.tiers.push_back(testing::RamTier(1 << 20, "late"));
  absl::Status status = ValidateConfig(config);
  CHECK(
      absl::StrContains(status.message(), "tiers[1].kind: the source tier must be the last tier"));
}

TEST_CASE("the embedded default is a RAM tier over the source") {
  Dirs d;
  Config config = DefaultConfig(d.dataset);
  REQUIRE(config.tiers.size() == 2);
  CHECK(config.tiers[0].kind == TierKind::kRam);
  CHECK(config.tiers[0].capacity_bytes > 0);
  CHECK(config.tiers[1].kind == TierKind::kSource);
  CHECK(ValidateConfig(config).ok());
}

TEST_CASE("the shipped example configs parse once their paths exist") {
  // config/*.yaml use example cluster paths; check their structure by pointing
  // the paths at scratch directories.
  Dirs d;
  for (const char* name :
       {"ram-source.yaml", "ram-pmem-nvme-source.yaml", "nvme-pfs.yaml", "peers-tcp.yaml"}) {
    std::ifstream in(std::string(MONARCH_SOURCE_DIR) + "/config/" + name);
    REQUIRE_MESSAGE(in.good(), name);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (auto [from, to] :
         {std::pair<std::string, std::string>{"/lustre/datasets/imagenet", d.dataset},
          {"/mnt/nvme/monarch", d.nvme},
          {"/mnt/pmem0/monarch", d.pmem}}) {
      for (size_t at; (at = text.find(from)) != std::string::npos;)
        text.replace(at, from.size(), to);
    }
    absl::StatusOr<Config> config = ParseConfigString(text);
    CHECK_MESSAGE(config.ok(), name, ": ", config.status().ToString());
  }
}

TEST_CASE("dataset.manifest: an absolute path, variables expanded, checked when it is used") {
  Dirs d;
  const std::string head = "dataset:\n  path: " + d.dataset + "\n";
  const std::string tiers = "tiers:\n  - {kind: source}\n";
  SUBCASE("parsed, and optional") {
    absl::StatusOr<Config> config =
        ParseConfigString(head + "  manifest: /scratch/imagenet.manifest\n" + tiers);
    REQUIRE_MESSAGE(config.ok(), config.status().ToString());
    CHECK(config->dataset.manifest == "/scratch/imagenet.manifest");
    // Not read here: `monarch manifest` writes it from a config naming it.
    CHECK(DatasetManifestPath(config->dataset).value_or("") == "/scratch/imagenet.manifest");
    CHECK(ParseConfigString(head + tiers)->dataset.manifest.empty());
  }
  SUBCASE("variables are expanded") {
    ScopedEnv job("MONARCH_TEST_JOB", "4242");
    absl::StatusOr<Config> config =
        ParseConfigString(head + "  manifest: /scratch/${MONARCH_TEST_JOB}/ds.manifest\n" + tiers);
    REQUIRE_MESSAGE(config.ok(), config.status().ToString());
    CHECK(DatasetManifestPath(config->dataset).value_or("") == "/scratch/4242/ds.manifest");
  }
  SUBCASE("a relative path is refused, naming the key") {
    const std::string error = ErrorOf(head + "  manifest: ds.manifest\n" + tiers);
    CHECK(absl::StartsWith(error, "dataset.manifest: expected an absolute path"));
  }
  SUBCASE("an unset variable is refused, naming the key") {
    ScopedEnv var("MONARCH_TEST_UNSET", std::nullopt);
    const std::string error = ErrorOf(head + "  manifest: /x/$MONARCH_TEST_UNSET/m\n" + tiers);
    CHECK(absl::StartsWith(error, "dataset.manifest: "));
    CHECK(absl::StrContains(error, "MONARCH_TEST_UNSET"));
  }
  SUBCASE("not a string") {
    CHECK(absl::StartsWith(ErrorOf(head + "  manifest: [a]\n" + tiers), "dataset.manifest: "));
  }
  SUBCASE("ValidateConfig checks a config built in code the same way") {
    Config config = testing::MakeConfig(d.dataset, {});
    config.dataset.manifest = "relative";
    const absl::Status status = ValidateConfig(config);
    CHECK(absl::StartsWith(status.message(), "dataset.manifest: "));
  }
}

}  // namespace
}  // namespace monarch

namespace monarch {
namespace {

TEST_CASE("config/README.md holds the reference the table of keys makes") {
  absl::StatusOr<std::string> readme = ReadSmallFile(MONARCH_SOURCE_DIR "/config/README.md");
  REQUIRE_MESSAGE(readme.ok(), readme.status().ToString());
  absl::StatusOr<std::string> checked_in = config_keys::ReferenceIn(*readme);
  REQUIRE_MESSAGE(checked_in.ok(), checked_in.status().ToString());
  CHECK_MESSAGE(*checked_in == config_keys::ConfigReference(),
                "config/README.md's reference differs from the table of keys "
                "(src/config/config_keys.cc): run `build/monarch config-reference --update "
                "config/README.md`");
}

TEST_CASE("every key of the table is read by the parser and named in its errors") {
  ScratchDir scratch;
  const std::string dataset = scratch.Sub("ds");
  const std::string head = "dataset: {path: " + dataset + "}\n";
  const std::string source = "  - {kind: source}\n";
  int keys = 0;
  for (const config_keys::Key<Config>& key : config_keys::SectionKeys()) {
    const std::string path = key.section + "." + key.name;
    std::string yaml = key.section == "dataset"
                           ? absl::StrCat("dataset: {path: ", dataset, ", ", key.name, ": [1, 2]}\n")
                           : absl::StrCat(head, key.section, ": {", key.name, ": [1, 2]}\n");
    absl::StrAppend(&yaml, "tiers:\n", source);
    // A list suits no key: every one refuses it, by its full name.
    absl::StatusOr<Config> parsed = ParseConfigString(yaml);
    REQUIRE_FALSE_MESSAGE(parsed.ok(), path);
    CHECK_MESSAGE(absl::StartsWith(parsed.status().message(), path + ": "),
                  parsed.status().message());
    ++keys;
  }
  for (const config_keys::Key<TierConfig>& key : config_keys::TierKeys()) {
    const std::string yaml = absl::StrCat(head, "tiers:\n  - {kind: ram, capacity: 1MiB, ",
                                          key.name, ": [1, 2]}\n", source);
    absl::StatusOr<Config> parsed = ParseConfigString(yaml);
    REQUIRE_FALSE_MESSAGE(parsed.ok(), key.name);
    CHECK_MESSAGE(absl::StartsWith(parsed.status().message(), "tiers[0]." + key.name + ": "),
                  parsed.status().message());
    ++keys;
  }
  CHECK(keys >= 40);
}

TEST_CASE("a Config built in code is held to the table's ranges") {
  ScratchDir scratch;
  Config base = DefaultConfig(scratch.Sub("ds"));
  REQUIRE(ValidateConfig(base).ok());
  struct Case {
    std::function<void(Config&)> change;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](Config& c) { c.placement.chunk_bytes = 100; },
       "placement.chunk_bytes: expected a multiple of 4KiB"},
      {[](Config& c) { c.placement.threads = 5000; },
       "placement.threads: expected 0 (half the cores) to 1024, got 5000"},
      {[](Config& c) { c.prefetch.streams = -1; }, "prefetch.streams: expected 0 to 256, got -1"},
      {[](Config& c) { c.dataset.scan_threads = 0; }, "dataset.scan_threads: expected 1 to 256"},
      {[](Config& c) { c.placement.shutdown_timeout_seconds = -1; },
       "placement.shutdown_timeout: expected a duration from 0 to 24h"},
      {[](Config& c) { c.node.metrics_port = 70000; }, "node.metrics_port: expected 0"},
      {[](Config& c) { c.logging.level = static_cast<LogLevel>(9); }, "logging.level: expected"},
      {[](Config& c) { c.memory.headroom_bytes = 4096; },
       "memory.headroom: expected a size of at least 1MiB"},
      {[](Config& c) { c.memory.psi_stall_seconds = 2; },
       "memory.psi_stall: expected a duration from 0 to 1s"},
      {[](Config& c) { c.memory.interval_seconds = 0; },
       "memory.interval: expected a duration from 10ms to 60s"},
      {[](Config& c) { c.tiers[0].write_mode = static_cast<WriteMode>(9); },
       "tiers[0].write_mode: expected 'auto', 'buffered' or 'direct'"},
      // remote.* are checked only with peers enabled.
      {[](Config& c) {
         c.remote.enabled = true;
         c.remote.rendezvous_dir = "/tmp/rdv";
         c.remote.replicas = 0;
       },
       "remote.replicas: expected 1 to 8"},
  };
  for (const Case& c : cases) {
    Config config = base;
    c.change(config);
    const absl::Status status = ValidateConfig(config);
    CHECK_MESSAGE(absl::StrContains(status.message(), c.message), status.ToString());
  }
  Config off = base;
  off.remote.replicas = 0;  // Peers off: the key means nothing, and is not checked.
  CHECK(ValidateConfig(off).ok());
}

}  // namespace
}  // namespace monarch
