// The table of config keys (config_keys.h): each row says what a key takes
// and does, once, and the parser, the range checks and the reference are
// made from it.

#include "config/config_keys.h"

#include <cmath>
#include <cstring>
#include <iterator>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/types/span.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace monarch::config_keys {
namespace {

constexpr size_t kMaxQuotedChars = 200;
constexpr int64_t kMaxOpenFilesLimit = 1000000;
constexpr uint64_t kKiB = 1024, kMiB = kKiB << 10, kGiB = kMiB << 10;
constexpr double kDay = 86400;

std::string Quote(absl::string_view value) { return QuoteForError(value); }

// ---- Reading a scalar: the error names the key and quotes what was given.

absl::StatusOr<std::string> GetString(const YAML::Node& node, absl::string_view key) {
  if (!node.IsScalar())
    return KeyError(key, absl::StrCat("expected a string, got ", Describe(node)));
  return node.Scalar();
}

absl::StatusOr<uint64_t> GetSize(const YAML::Node& node, absl::string_view key) {
  if (!node.IsScalar()) {
    return KeyError(key,
                    absl::StrCat("expected a size such as 64GiB or 1048576, got ", Describe(node)));
  }
  absl::StatusOr<uint64_t> size = ParseByteSize(node.Scalar());
  if (!size.ok()) return KeyError(key, size.status().message());
  return *size;
}

absl::StatusOr<int64_t> GetInt(const YAML::Node& node, absl::string_view key) {
  int64_t value;
  if (!node.IsScalar() || !absl::SimpleAtoi(node.Scalar(), &value)) {
    return KeyError(key, absl::StrCat("expected an integer, got ", Describe(node)));
  }
  return value;
}

absl::StatusOr<bool> GetBool(const YAML::Node& node, absl::string_view key) {
  if (!node.IsScalar() || (node.Scalar() != "true" && node.Scalar() != "false")) {
    return KeyError(key, absl::StrCat("expected true or false, got ", Describe(node)));
  }
  return node.Scalar() == "true";
}

// "30s", "500ms", "2m", or a bare number of seconds; `expected` is what the
// error says the key takes.
absl::StatusOr<double> GetDuration(const YAML::Node& node, absl::string_view key,
                                   absl::string_view expected) {
  if (!node.IsScalar()) return KeyError(key, absl::StrCat(expected, ", got ", Describe(node)));
  std::string text(absl::StripAsciiWhitespace(node.Scalar()));
  double scale = 1;
  for (auto [suffix, factor] : {std::pair<const char*, double>{"ms", 1e-3}, {"s", 1}, {"m", 60}}) {
    if (absl::EndsWith(text, suffix)) {
      text.resize(text.size() - std::strlen(suffix));
      scale = factor;
      break;
    }
  }
  double value;
  if (!absl::SimpleAtod(absl::StripAsciiWhitespace(text), &value) || !std::isfinite(value)) {
    return KeyError(key, absl::StrCat(expected, ", got ", Describe(node)));
  }
  return value * scale;
}

// ---- How defaults and values read in the reference.

std::string SizeName(uint64_t bytes) {
  for (auto [unit, factor] : {std::pair<const char*, uint64_t>{"GiB", kGiB}, {"MiB", kMiB},
                              {"KiB", kKiB}}) {
    if (bytes != 0 && bytes % factor == 0) return absl::StrCat(bytes / factor, unit);
  }
  return absl::StrCat(bytes);
}

std::string DurationName(double seconds) { return absl::StrFormat("%gs", seconds); }

std::string Code(absl::string_view text) { return absl::StrCat("`", text, "`"); }

// ---- The YAML names of the enums: one table each, one row per value, in
// the order the reference and the errors list them. NameOf(), the parser,
// the range check, the reference and the error messages all read them.

template <typename E>
struct Named {
  const char* name;
  E value;
};

// `peers` names a tier in stats, and is never listed under `tiers`: the
// last row, which the kind key leaves out.
constexpr Named<TierKind> kTierKinds[] = {{"ram", TierKind::kRam},
                                          {"pmem", TierKind::kPmem},
                                          {"posix", TierKind::kPosix},
                                          {"source", TierKind::kSource},
                                          {"peers", TierKind::kPeers}};
constexpr Named<WriteMode> kWriteModes[] = {
    {"auto", WriteMode::kAuto}, {"buffered", WriteMode::kBuffered}, {"direct", WriteMode::kDirect}};
constexpr Named<SymlinkPolicy> kSymlinkPolicies[] = {
    {"follow", SymlinkPolicy::kFollow}, {"inside", SymlinkPolicy::kInside},
    {"skip", SymlinkPolicy::kSkip}};
constexpr Named<PlacementPolicyKind> kPlacementPolicies[] = {
    {"first-fit", PlacementPolicyKind::kFirstFit},
    {"lru", PlacementPolicyKind::kLru},
    {"none", PlacementPolicyKind::kNone}};
constexpr Named<VerifyPolicy> kVerifyPolicies[] = {{"first-read", VerifyPolicy::kFirstRead},
                                                   {"every-read", VerifyPolicy::kEveryRead},
                                                   {"off", VerifyPolicy::kOff}};
constexpr Named<CachedSourcePolicy> kCachedSourcePolicies[] = {
    {"defer", CachedSourcePolicy::kDefer}, {"promote", CachedSourcePolicy::kPromote}};
constexpr Named<BootstrapKind> kBootstrapKinds[] = {{"directory", BootstrapKind::kDirectory},
                                                    {"mpi", BootstrapKind::kMpi}};
constexpr Named<LogLevel> kLogLevels[] = {{"debug", LogLevel::kDebug},
                                          {"info", LogLevel::kInfo},
                                          {"warning", LogLevel::kWarning},
                                          {"error", LogLevel::kError}};

template <typename E>
const char* NameIn(absl::Span<const Named<E>> names, E value) {
  for (const Named<E>& row : names) {
    if (row.value == value) return row.name;
  }
  return "unknown";
}

// "'a', 'b' or 'c'": what an enum key expects.
template <typename E>
std::string Expected(absl::Span<const Named<E>> names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    absl::StrAppend(&out, i == 0 ? "" : i + 1 == names.size() ? " or " : ", ", "'",
                    names[i].name, "'");
  }
  return out;
}

// ---- Row builders. `get` maps a root (const or not) to the field: a
// generic lambda, so one expression serves the parser and the check.

// A default-constructed root: where the reference reads defaults from.
template <typename Root>
const Root& Defaults() {
  static const Root* defaults = new Root();
  return *defaults;
}

template <typename Root>
Key<Root> Row(std::string section, std::string name, std::string values, std::string default_doc,
              std::string help) {
  Key<Root> key;
  key.section = std::move(section);
  key.name = std::move(name);
  key.values = std::move(values);
  key.default_doc = std::move(default_doc);
  key.help = std::move(help);
  key.check = [](const Root&, absl::string_view) { return absl::OkStatus(); };
  return key;
}

template <typename Root, typename Get>
Key<Root> BoolKey(std::string section, std::string name, Get get, std::string help) {
  Key<Root> key = Row<Root>(std::move(section), std::move(name), "`true`, `false`",
                            Code(get(Defaults<Root>()) ? "true" : "false"), std::move(help));
  key.parse = [get](const YAML::Node& node, absl::string_view path, Root* root) {
    MONARCH_ASSIGN_OR_RETURN(get(*root), GetBool(node, path));
    return absl::OkStatus();
  };
  return key;
}

// An integer in [min, max]; `range` says so in words ("1 to 256").
template <typename Root, typename Get>
Key<Root> IntKey(std::string section, std::string name, Get get, int64_t min, int64_t max,
                 std::string range, std::string help, std::string default_doc = "") {
  if (default_doc.empty()) default_doc = Code(absl::StrCat(get(Defaults<Root>())));
  Key<Root> key = Row<Root>(std::move(section), std::move(name),
                            absl::StrCat("integer ", min, "..", max), std::move(default_doc),
                            std::move(help));
  auto in_range = [min, max, range](int64_t value, absl::string_view path) {
    if (value < min || value > max) {
      return KeyError(path, absl::StrCat("expected ", range, ", got ", value));
    }
    return absl::OkStatus();
  };
  key.parse = [get, in_range](const YAML::Node& node, absl::string_view path, Root* root) {
    MONARCH_ASSIGN_OR_RETURN(int64_t value, GetInt(node, path));
    MONARCH_RETURN_IF_ERROR(in_range(value, path));
    get(*root) = static_cast<std::remove_reference_t<decltype(get(*root))>>(value);
    return absl::OkStatus();
  };
  key.check = [get, in_range](const Root& root, absl::string_view path) {
    return in_range(get(root), path);
  };
  return key;
}

// A size in [min, max], a multiple of `multiple`; `range` says so in words.
template <typename Root, typename Get>
Key<Root> SizeKey(std::string section, std::string name, Get get, uint64_t min, uint64_t max,
                  uint64_t multiple, std::string values, std::string range, std::string help,
                  std::string default_doc = "") {
  if (default_doc.empty()) default_doc = Code(SizeName(get(Defaults<Root>())));
  Key<Root> key = Row<Root>(std::move(section), std::move(name), std::move(values),
                            std::move(default_doc), std::move(help));
  auto in_range = [min, max, multiple, range](uint64_t value, absl::string_view path) {
    if (value < min || value > max || value % multiple != 0) {
      return KeyError(path, absl::StrCat("expected ", range));
    }
    return absl::OkStatus();
  };
  key.parse = [get, in_range](const YAML::Node& node, absl::string_view path, Root* root) {
    MONARCH_ASSIGN_OR_RETURN(uint64_t value, GetSize(node, path));
    MONARCH_RETURN_IF_ERROR(in_range(value, path));
    get(*root) = value;
    return absl::OkStatus();
  };
  key.check = [get, in_range](const Root& root, absl::string_view path) {
    return in_range(get(root), path);
  };
  return key;
}

// A duration in seconds within [min, max] (min may be exclusive: a
// positive duration); `expected` is what errors say the key takes.
template <typename Root, typename Get>
Key<Root> DurationKey(std::string section, std::string name, Get get, double min,
                      bool min_exclusive, double max, std::string values, std::string expected,
                      std::string help) {
  Key<Root> key = Row<Root>(std::move(section), std::move(name), std::move(values),
                            Code(DurationName(get(Defaults<Root>()))), std::move(help));
  auto in_range = [min, min_exclusive, max, expected](double value, absl::string_view path,
                                                      absl::string_view given) {
    const bool low = min_exclusive ? !(value > min) : !(value >= min);
    if (!std::isfinite(value) || low || value > max) {
      return KeyError(path, absl::StrCat("expected ", expected, given.empty() ? "" : ", got ",
                                         given));
    }
    return absl::OkStatus();
  };
  key.parse = [get, in_range, expected](const YAML::Node& node, absl::string_view path,
                                        Root* root) {
    MONARCH_ASSIGN_OR_RETURN(double value,
                             GetDuration(node, path, absl::StrCat("expected ", expected)));
    MONARCH_RETURN_IF_ERROR(in_range(value, path, Describe(node)));
    get(*root) = value;
    return absl::OkStatus();
  };
  key.check = [get, in_range](const Root& root, absl::string_view path) {
    return in_range(get(root), path, "");
  };
  return key;
}

// One of `choices`: a table above, or its first rows.
template <typename Root, typename E, typename Get>
Key<Root> EnumKey(std::string section, std::string name, Get get,
                  absl::Span<const Named<E>> choices, std::string help) {
  std::vector<std::string> coded;
  for (const Named<E>& choice : choices) coded.push_back(Code(choice.name));
  const std::string expected = Expected(choices);
  Key<Root> key = Row<Root>(std::move(section), std::move(name), absl::StrJoin(coded, ", "),
                            Code(NameIn(choices, get(Defaults<Root>()))), std::move(help));
  key.expected = expected;
  key.parse = [get, choices, expected](const YAML::Node& node, absl::string_view path, Root* root) {
    MONARCH_ASSIGN_OR_RETURN(std::string text, GetString(node, path));
    for (const Named<E>& choice : choices) {
      if (text == choice.name) {
        get(*root) = choice.value;
        return absl::OkStatus();
      }
    }
    return KeyError(path, absl::StrCat("expected ", expected, ", got ", Quote(text)));
  };
  key.check = [get, choices, expected](const Root& root, absl::string_view path) {
    for (const Named<E>& choice : choices) {
      if (get(root) == choice.value) return absl::OkStatus();
    }
    return KeyError(path, absl::StrCat("expected ", expected));
  };
  return key;
}

template <typename Root, typename Get>
Key<Root> StringKey(std::string section, std::string name, Get get, std::string values,
                    std::string default_doc, std::string help) {
  Key<Root> key = Row<Root>(std::move(section), std::move(name), std::move(values),
                            std::move(default_doc), std::move(help));
  key.parse = [get](const YAML::Node& node, absl::string_view path, Root* root) {
    MONARCH_ASSIGN_OR_RETURN(get(*root), GetString(node, path));
    return absl::OkStatus();
  };
  return key;
}

// The remote section's keys other than `enabled` are checked only when
// peers are enabled: without them, they mean nothing.
Key<Config> WhenRemote(Key<Config> key) {
  auto check = std::move(key.check);
  key.check = [check](const Config& config, absl::string_view path) {
    return config.remote.enabled ? check(config, path) : absl::OkStatus();
  };
  return key;
}

// "auto", "env:NAME" or a non-negative integer.
bool IsRankSpec(const std::string& spec) {
  int64_t value;
  if (spec == "auto") return true;
  if (absl::StartsWith(spec, "env:")) return spec.size() > 4;
  return absl::SimpleAtoi(spec, &value) && value >= 0;
}

Key<Config> RankKey(std::string name, std::string help) {
  auto get = [name](auto& c) -> auto& { return name == "rank" ? c.remote.rank : c.remote.size; };
  Key<Config> key = StringKey<Config>("remote", name, get, "integer, `env:NAME`, `auto`",
                                      Code("auto"), std::move(help));
  key.check = [get, name](const Config& c, absl::string_view path) {
    const std::string& spec = get(c);
    if (!IsRankSpec(spec)) {
      return KeyError(path,
                      absl::StrCat("expected an integer, 'auto' or 'env:VARIABLE', got ", Quote(spec)));
    }
    int64_t size;
    if (name == "size" && absl::SimpleAtoi(spec, &size) && size < 1) {
      return KeyError(path, "expected at least 1");
    }
    return absl::OkStatus();
  };
  return WhenRemote(std::move(key));
}

// ---- The table.

std::vector<Key<Config>> MakeSectionKeys() {
  std::vector<Key<Config>> keys;
  // dataset
  keys.push_back(StringKey<Config>(
      "dataset", "path", [](auto& c) -> auto& { return c.dataset.path; }, "absolute directory",
      "required",
      "The dataset on the source (the PFS). Walked once at start-up. A `.monarch` entry at its "
      "root is skipped: that name is reserved in file-backed tiers for temporaries "
      "(`<tier>/.monarch/tmp/`)."));
  keys.back().required = true;
  keys.push_back(StringKey<Config>(
      "dataset", "file_regex", [](auto& c) -> auto& { return c.dataset.file_regex; },
      "POSIX extended regex", "all files",
      "Only dataset-relative names that fully match are served."));
  keys.push_back(IntKey<Config>(
      "dataset", "scan_threads", [](auto& c) -> auto& { return c.dataset.scan_threads; }, 1, 256,
      "1 to 256",
      "Threads that walk the dataset at start-up (each readdir/stat on a PFS is a metadata round "
      "trip)."));
  keys.push_back(BoolKey<Config>(
      "dataset", "keep_namespace", [](auto& c) -> auto& { return c.dataset.keep_namespace; },
      "After a walk, the namespace is kept on the node as a manifest (in the user's runtime "
      "directory: `$XDG_RUNTIME_DIR/monarch/namespaces/`, or `/tmp/monarch-<uid>/namespaces/`), "
      "and the next start on the node, this job's or another's, builds from it instead of "
      "walking when it passes the checks: every directory of the dataset has the mtime it had "
      "(an entry added, removed or renamed anywhere changes its directory's), and a sample of "
      "64 files stat as they did. Copies kept in file tiers are adopted only after a stat of "
      "their source file. A file rewritten in place (its directory untouched) and missed by "
      "the sample keeps the size and times the namespace had; its bytes are still read from "
      "the source, never from a copy of the old version. Not used with `dataset.manifest`, "
      "nor by ranks that build from rank 0's manifest. `false`: every start walks. Stats: "
      "`namespace_built_from_manifest`, `namespace_build_ms`."));
  keys.push_back(EnumKey<Config, SymlinkPolicy>(
      "dataset", "symlinks", [](auto& c) -> auto& { return c.dataset.symlinks; },
      kSymlinkPolicies,
      "Symlinks to files found by the walk. `follow`: served wherever they point, as reading the "
      "directory directly would (a job reads nothing through Monarch it could not read itself: "
      "Monarch runs as the job's user). `inside`: only those whose target lies inside "
      "`dataset.path` (checked at the walk); the others are left out, logged at `info`. `skip`: "
      "none. Symlinked directories are never entered, so a link cycle cannot trap the walk."));
  keys.push_back(StringKey<Config>(
      "dataset", "manifest", [](auto& c) -> auto& { return c.dataset.manifest; }, "absolute file",
      "none (walk)",
      "A manifest of the dataset written by `monarch manifest --config FILE` (the output defaults "
      "to this path). The namespace is built from it instead of walking the dataset: the start-up "
      "costs one stat per directory instead of a metadata operation or two per file. Refused, "
      "with the reason, when it was written for another `dataset.path`, `file_regex` or "
      "`symlinks`, when a directory changed since (an entry added, removed or renamed in it "
      "changes its mtime; a file rewritten in place is not seen), or when it is damaged "
      "(checksummed). `$VAR` and `${VAR}` are expanded. Without "
      "it, peers meeting in a directory (`remote.bootstrap: directory`) still walk once per job: "
      "rank 0 walks and writes `namespace.manifest` to `remote.rendezvous_dir`, the other ranks "
      "wait for it (up to `remote.rendezvous_timeout`) and build from it after the same checks. "
      "Stats: `namespace_built_from_manifest`, `namespace_build_ms`."));
  // placement
  keys.push_back(IntKey<Config>(
      "placement", "threads", [](auto& c) -> auto& { return c.placement.threads; }, 0, 1024,
      "0 (half the cores) to 1024",
      "Placement threads: they write the chunks readers loaded into the tiers, and load and "
      "write the rest of files readers read only part of. They run at normal priority, so copies "
      "make progress on a busy CPU. Commits (a stat of the source file each, then the tier's "
      "commit) run on 8 threads of their own, which mostly wait on the PFS.",
      "0 = half the cores, at least 1"));
  keys.push_back(EnumKey<Config, PlacementPolicyKind>(
      "placement", "policy", [](auto& c) -> auto& { return c.placement.policy; },
      kPlacementPolicies,
      "`first-fit`: top-down into the first tier with room, no eviction (the paper's policy): "
      "when the tiers are full, the files not in them stay on the source. With peers, a file this "
      "node keeps for the others (its home share, its replicas, a failed peer's files it took "
      "over) that finds no room evicts copies of files other nodes keep. `lru`: the same, and "
      "when no tier has room, copies are evicted from the fastest tier large enough for the file "
      "in CLOCK order (least recently used, approximately: a copy read since the hand last passed "
      "gets a second chance); a copy a reader of this process is inside is never evicted (readers "
      "of the node service's other processes may find a RAM copy gone mid-read and are served "
      "from the service instead; never a wrong byte), nor is a RAM copy that a process may have "
      "mapped in place (`Monarch::MapCopies`: the transparent mode's `mmap`, Python's "
      "`Monarch.mmap`) until a walk of the node's `/proc/<pid>/maps` finds nobody mapping it "
      "(a copy removed all the same is held, counted against the capacity, as gauge "
      "`held_bytes`). When a read order is announced (see "
      "`prefetch`), eviction goes by next use instead: the copy (of a sample of 32) read again "
      "last is evicted, and a file read again later than all of them is not placed (Belady's "
      "choice). With several cache tiers, files read sooner get the faster tiers: a file read "
      "sooner than the last-read copy of a full faster tier takes its place even when a slower "
      "tier has room, and the displaced copy moves down a tier (copied tier to tier, not read "
      "from the source again) if it is read sooner than that tier's last-read copy, else it is "
      "evicted. Counters `evictions`, `evicted_bytes`, `eviction_failures`, "
      "`admissions_declined`, `demotions`, `demoted_bytes`. Not with `remote.enabled`. Which to "
      "choose: [bench/results/eviction.md](../bench/results/eviction.md). `none`: never "
      "promote."));
  keys.push_back(SizeKey<Config>(
      "placement", "max_staging_bytes", [](auto& c) -> auto& { return c.placement.max_staging_bytes; },
      0, ~uint64_t{0}, 1, "size", "a size",
      "Staging memory: chunks read from the source and not yet written into a tier. Never "
      "exceeded: a chunk's buffer is reserved against the budget before it is loaded. Chunks "
      "readers leave for the placement threads may fill at most 3/4 of it (beyond that a reader "
      "writes its chunks into the tier itself), one chunk per placement thread is kept for them, "
      "and a reader finding no room waits (`staging_waits`) for a load or write in progress to "
      "finish. Raised to one chunk if smaller (`staging_budget_bytes` says what is in force).",
      "256 MiB, or 1/16 of RAM if less"));
  keys.push_back(SizeKey<Config>(
      "placement", "chunk_bytes", [](auto& c) -> auto& { return c.placement.chunk_bytes; },
      4 * kKiB, kGiB, 4 * kKiB, "size, a multiple of 4KiB up to 1GiB",
      "a multiple of 4KiB from 4KiB to 1GiB",
      "Granularity at which readers share a promotion's bytes and at which it streams them into "
      "the tier."));
  keys.push_back(SizeKey<Config>(
      "placement", "extent_bytes", [](auto& c) -> auto& { return c.placement.extent_bytes; }, 0,
      kGiB, 4 * kKiB, "size, 0 or a multiple of 4KiB up to 1GiB",
      "0 or a multiple of 4KiB up to 1GiB",
      "Files larger than `placement.extent_threshold` are cached by extents of this size: "
      "aligned ranges, each promoted on its first read, evicted and counted as a file of its own "
      "(a tier's `files` counts them). A reader of a few records of a huge file then copies "
      "those records' extents, not the file, and a file larger than every tier is cached in "
      "part; with peers, each extent has a home, so a few big files spread over every node. "
      "`0`: every file is cached whole. The default, 4MiB: from 256KiB to 64MiB the size made "
      "no difference to the time of random 8 KB samples ([bench/results/extents.md]"
      "(../bench/results/extents.md)), below 1MiB the source reads more often, and each "
      "extent costs the node about 300 bytes of namespace (its entry and name, in the service "
      "and in its shared image: some 80 MB per TiB of such files at 4MiB), while a reader of "
      "one record copies at most its extent."));
  keys.push_back(SizeKey<Config>(
      "placement", "extent_threshold",
      [](auto& c) -> auto& { return c.placement.extent_threshold; }, 0, ~uint64_t{0}, 1, "size",
      "a size",
      "Files larger than this are cached by extents (unless `placement.extent_bytes` is 0); "
      "smaller ones whole. The default keeps shards of up to 256MiB whole, as every "
      "shard benchmark measured them; a bigger file's first read would otherwise promote all "
      "of it."));
  {
    Key<Config> files = IntKey<Config>(
        "placement", "max_open_files", [](auto& c) -> auto& { return c.placement.max_open_files; },
        4, kMaxOpenFilesLimit, absl::StrCat("auto or 4 to ", kMaxOpenFilesLimit),
        "Descriptors (or pmem mappings) each file tier, and the source, keep open between reads. "
        "`auto` (or the key left out): derived from the process's descriptor limit, "
        "`RLIMIT_NOFILE`: its hard value, to which the instance (or node service) raises the "
        "soft one when it starts (what any process may do): the limit less what is left to the "
        "program (an eighth of it, and at least 1024, or half of a limit under 2048), shared by "
        "the source and the `pmem`/`posix` tiers. With a limit of 20000 and one `posix` tier over "
        "the source, 8750 each; with a hard limit of 1024 (`ulimit -Hn`), 256 each. Built in "
        "code (`monarch::Config`), the default assumes four caches (`DefaultMaxOpenFiles()` in "
        "`include/monarch/config.h`). A value above the hard limit is refused (reads would fail "
        "with `EMFILE`). An open that still runs out of descriptors (the process's, or a FUSE or "
        "network file system server's, shared by every service on the mount) halves that cache "
        "and is tried again, so reads go on. A `pmem` tier keeps at most a "
        "quarter of `vm.max_map_count` mappings, whatever this says. A copy whose descriptor was "
        "closed is opened again at its next read (`copy_opens`), at the cost of an `open` and an "
        "`fstat`: what was read and checked of it is kept apart (see `placement.verify`). Raising "
        "the soft limit lets this process hold descriptors above 1024, which `select()` cannot "
        "watch; a program still using `select()` can set an explicit value.",
        "`auto`");
    files.values = absl::StrCat("integer 4..", kMaxOpenFilesLimit, ", or `auto`");
    // "auto" leaves the value to the parser, which derives it from the
    // config's own descriptor caches.
    auto integer = std::move(files.parse);
    files.parse = [integer](const YAML::Node& node, absl::string_view path, Config* config) {
      if (node.IsScalar() && node.Scalar() == "auto") return absl::OkStatus();
      return integer(node, path, config);
    };
    keys.push_back(std::move(files));
  }
  keys.push_back(EnumKey<Config, VerifyPolicy>(
      "placement", "verify", [](auto& c) -> auto& { return c.placement.verify; },
      kVerifyPolicies,
      "When `pmem` and `posix` copies are checked against the CRC32C of each 4 KiB block, stored "
      "with them (see \"Tier copies\" below). `first-read`: each block the first time a process "
      "reads it, and every read then checks that the copy was not modified since it was opened: "
      "under a read lease, by a mark the kernel's notice leaves before any writer goes on (no "
      "system call per read; `copy_leases`), else with one `fstat`. The tier itself opens and checks each copy it writes soon after "
      "writing it (a background thread at the lowest CPU priority, `SCHED_IDLE`, once the copy's "
      "ctime has settled; `copies_readied_ahead`), so the first epoch to read the copies finds "
      "them open and checked; `WaitForPlacement` waits for it. Copies an earlier run left are "
      "readied the same way when they are reused at start. A `posix` copy written with "
      "`O_DIRECT`, or reused at start, is only opened ahead, not checked: its bytes may not be in "
      "memory, and its first read checks them as it reads them from the device. What was checked "
      "outlives the copy's descriptor: opened again, a copy whose inode is unchanged (same "
      "device, inode, size, mtime and ctime) is neither read for its trailer nor checked again "
      "(`trailer_reads`, `blocks_verified`); any write, truncation or `touch -r`, or another file "
      "in its place, changes one of them. Checks made within a few clock ticks of the copy's last "
      "change are not remembered (its ctime might not show a change made in the same tick). The "
      "checksums and checked blocks kept take about 0.1% of the bytes of the copies read plus "
      "~230 bytes per file, at most 64 MiB per tier besides those of open copies "
      "(`verified_state_bytes`); past that, the least recently opened are dropped and checked "
      "again at their next open. `every-read`: every block of every read. `off`: no checksum at "
      "read; copies are still reused after a restart only when they name the source file as the "
      "walk found it. The cost of each is in "
      "[bench/results/integrity.md](../bench/results/integrity.md)."));
  keys.push_back(EnumKey<Config, CachedSourcePolicy>(
      "placement", "cached_source", [](auto& c) -> auto& { return c.placement.cached_source; },
      kCachedSourcePolicies,
      "What a miss does when the source holds the bytes asked for in memory already (the page "
      "cache of a local file system, or of a PFS client), as a read with `RWF_NOWAIT` tells "
      "where the file system takes it (a local disk), else `cachestat(2)` (`mincore(2)` on a "
      "mapping before Linux 6.5), which reads nothing. `defer`: the reader takes them from "
      "there, at the cost of a plain read, and the file is copied into a tier later by a "
      "thread at the lowest CPU priority "
      "(`SCHED_IDLE`), once a core is free: at once with fewer readers than cores, between "
      "epochs when every core reads (`deferred_copies_queued`). That copy takes only bytes "
      "still in memory, so a slow source is still read once per byte; if they were dropped "
      "meanwhile it gives up (`promotions_not_in_memory`) and the file's next miss promotes it. "
      "Sources that cannot tell (files that cannot be mapped and a file system that refuses "
      "`RWF_NOWAIT`, as FUSE's `direct_io`) and misses on bytes not all in memory are "
      "promoted at once, as with `promote`, which does so for every miss. "
      "`WaitForPlacement` waits for deferred copies too. With peers (`remote.enabled`), "
      "`promote`; so too while prefetch streams copy an announced order, which they do "
      "whatever the source holds in memory (a reader deferring its copy then would read the "
      "source a second time)."));
  keys.push_back(BoolKey<Config>(
      "placement", "route_by_speed", [](auto& c) -> auto& { return c.placement.route_by_speed; },
      "A hit on a `posix` or `pmem` copy is served from the source's page cache instead when "
      "that is faster now, as a model measured while reading says (NoPFS's performance model "
      "in kind): each such hit is timed, and the source is asked as for `cached_source`, "
      "which never reads the device or the network, so the source is still read once per byte. It "
      "pays where a copy's pages are not cached (large copies written with `O_DIRECT`, "
      "`write_mode`) while the source's are. One hit in 64 asks the source anyway to keep the "
      "model measured. Off with peers (`remote.enabled`), and for a source that cannot tell "
      "(as for `cached_source`). Counters `speed_source_cache_reads`, "
      "`speed_source_cache_misses`, `speed_source_first_chosen`; gauges per tier "
      "`speed_ns_per_mib`. Measured: [bench/results/route_by_speed.md]"
      "(../bench/results/route_by_speed.md)."));
  keys.push_back(DurationKey<Config>(
      "placement", "shutdown_timeout",
      [](auto& c) -> auto& { return c.placement.shutdown_timeout_seconds; }, 0, false, kDay,
      "duration, 0 to 24h", "a duration from 0 to 24h",
      "How long `Shutdown(kDrain)` (e.g. `monarch-epochs` at its end) lets the promotions in "
      "flight finish; the rest are then cancelled. Whatever the mode, a shutdown then waits at "
      "most 5 s more for the threads still inside a read or write to notice (each is a chunk "
      "away); one blocked in a file system that stopped answering is logged with what it was "
      "doing, and left behind with what it uses, so the process still exits. `0`: cancel at "
      "once."));
  // prefetch
  keys.push_back(IntKey<Config>(
      "prefetch", "streams", [](auto& c) -> auto& { return c.prefetch.streams; }, 0, 256,
      "0 to 256",
      "Clairvoyant prefetch: once a front end announces the order in which it will read files "
      "(`Monarch::AnnounceOrder`, `monarch_announce_order`, `--announce` in `monarch epochs`), "
      "this many streams read ahead of the readers in that order and promote the files, each "
      "still read from the source once. A reader's own miss takes one stream's turn while it "
      "lasts (one stream always goes on), and a read the streams have not reached is served at "
      "once, not queued behind them. 8 matches Lustre's default `max_rpcs_in_flight`. `0`: no "
      "read-ahead; an announced order only informs eviction (`placement.policy: lru`). With the "
      "node service, each process announces its own share (a rank, a DataLoader's main process) "
      "and the service merges them round-robin. Files no tier has room for are left alone. "
      "Samples that are records inside big files are announced as ranges "
      "(`Monarch::AnnounceRanges`, `monarch_announce_ranges`, `announce_ranges` in Python): the "
      "streams then fetch the extents that hold them (`placement.extent_bytes`). "
      "Counters: `prefetch_*` (see [src/placement/prefetcher.h](../src/placement/prefetcher.h))."));
  keys.push_back(SizeKey<Config>(
      "prefetch", "lookahead", [](auto& c) -> auto& { return c.prefetch.lookahead_bytes; }, 1,
      ~uint64_t{0}, 1, "size", "a size of at least one byte, such as 1GiB",
      "How far ahead of the readers the streams may go: bytes of files they fetched that no "
      "reader has started yet. A new announcement starts it afresh. With `placement.policy: "
      "lru`, at most half of the cache tiers' capacity (further ahead, fetched copies would be "
      "evicted before they are read)."));
  keys.push_back(BoolKey<Config>(
      "prefetch", "stage_ahead", [](auto& c) -> auto& { return c.prefetch.stage_ahead; },
      "A node service whose readers announced no order stages what they read from: at the "
      "first miss in a top-level directory of the dataset (`train/`, `val/`, a class "
      "directory; the root's own files are one more), the `prefetch.streams` fetch the whole "
      "directory in the walk's order, if it fits in the cache tiers beside what was staged "
      "before. Epoch 1 of a job that announces nothing (the preload, a custom sampler) is then "
      "not bounded by its readers' own misses, and a job reading `val/` never stages `train/`. "
      "Each file is still read from the source once, and the first order a reader announces "
      "replaces the staging. `false`: only announced orders are prefetched. (An in-process "
      "instance never stages.)"));
  // remote
  keys.push_back(BoolKey<Config>(
      "remote", "enabled", [](auto& c) -> auto& { return c.remote.enabled; },
      "Serve misses from peers over UCX (see [src/remote/DESIGN.md](../src/remote/DESIGN.md)). "
      "The other `remote.*` keys are checked only when enabled. UCX is the node's own "
      "(`libucp.so.0`, opened when the instance is created; nothing else loads it): without it "
      "the instance is refused with FailedPrecondition naming this key and what to install."));
  keys.push_back(RankKey(
      "rank",
      "This process's rank (0..size-1). `auto` reads the launcher's variables: `MONARCH_RANK`, "
      "Slurm (`SLURM_PROCID`), Flux, Open MPI, PMIx, PMI. `env:NAME`: that variable."));
  keys.push_back(RankKey(
      "size",
      "The number of peers. `auto` reads the launcher's variables: `MONARCH_SIZE`, Slurm "
      "(`SLURM_NTASKS`), Flux, Open MPI, PMIx, PMI. `env:NAME`: that variable."));
  keys.push_back(WhenRemote(EnumKey<Config, BootstrapKind>(
      "remote", "bootstrap", [](auto& c) -> auto& { return c.remote.bootstrap; },
      kBootstrapKinds,
      "How peers exchange UCX addresses: files in `rendezvous_dir`, or an MPI allgather (builds "
      "with `-DMONARCH_WITH_MPI=ON`).")));
  keys.push_back(WhenRemote(StringKey<Config>(
      "remote", "rendezvous_dir", [](auto& c) -> auto& { return c.remote.rendezvous_dir; },
      "absolute directory", "required for `directory`",
      "On a file system all peers see; one per job. `$VAR` and `${VAR}` are expanded (e.g. "
      "`${SLURM_JOB_ID}`). Created if missing.")));
  keys.push_back(WhenRemote(DurationKey<Config>(
      "remote", "rendezvous_timeout",
      [](auto& c) -> auto& { return c.remote.rendezvous_timeout_seconds; }, 0, true, kDay,
      "duration", "a duration such as 30s, 500ms or 2m, above 0",
      "How long start-up waits for all peers; then it fails naming the ranks that never "
      "arrived.")));
  {
    Key<Config> transports = StringKey<Config>(
        "remote", "transports", [](auto& c) -> auto& { return c.remote.transports; },
        "UCX transport list", Code("tcp"), "`UCX_TLS` syntax: `tcp`, `rc,ud,self`, `all`...");
    transports.check = [](const Config& c, absl::string_view path) {
      const std::string& t = c.remote.transports;
      if (t.empty() ||
          t.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_,^") != std::string::npos) {
        return KeyError(path, absl::StrCat("expected a UCX transport list such as 'tcp' or "
                                           "'rc,ud,sm', got ",
                                           Quote(t)));
      }
      return absl::OkStatus();
    };
    keys.push_back(WhenRemote(std::move(transports)));
  }
  {
    Key<Config> buffer = Row<Config>(
        "remote", "buffer_size", "`auto` or size", Code("auto"),
        "Each pre-registered receive buffer (8 of them). `auto`: the dataset's 95th-percentile "
        "file size, within 64KiB..4MiB. Larger transfers stream through a buffer in `chunk_size` "
        "pieces. Peers must agree.");
    buffer.parse = [](const YAML::Node& node, absl::string_view path, Config* c) {
      if (node.IsScalar() && node.Scalar() == "auto") {
        c->remote.buffer_bytes = 0;
        return absl::OkStatus();
      }
      absl::StatusOr<uint64_t> bytes = GetSize(node, path);
      if (!bytes.ok()) {
        return KeyError(path, absl::StrCat("expected 'auto' or a size such as 4MiB, got ",
                                           Describe(node)));
      }
      if (*bytes == 0) return KeyError(path, "expected 'auto' or a non-zero size");
      c->remote.buffer_bytes = *bytes;
      return absl::OkStatus();
    };
    buffer.check = [](const Config& c, absl::string_view path) {
      const uint64_t b = c.remote.buffer_bytes;
      if (b != 0 && (b < 4 * kKiB || b > kGiB)) {
        return KeyError(path, "expected 'auto' or a size from 4KiB to 1GiB");
      }
      return absl::OkStatus();
    };
    keys.push_back(WhenRemote(std::move(buffer)));
  }
  keys.push_back(WhenRemote(SizeKey<Config>(
      "remote", "chunk_size", [](auto& c) -> auto& { return c.remote.chunk_bytes; }, 4 * kKiB, kGiB,
      4 * kKiB, "size, a multiple of 4KiB", "a multiple of 4KiB from 4KiB to 1GiB",
      "Piece size for transfers larger than a buffer.")));
  keys.push_back(WhenRemote(DurationKey<Config>(
      "remote", "request_timeout",
      [](auto& c) -> auto& { return c.remote.request_timeout_seconds; }, 0, true, kDay,
      "duration", "a duration such as 30s, 500ms or 2m, above 0",
      "A peer that does not answer within it is marked down; the read goes to the next rank of "
      "the file's rendezvous order (the source when that is this process).")));
  keys.push_back(WhenRemote(DurationKey<Config>(
      "remote", "retry_after", [](auto& c) -> auto& { return c.remote.retry_after_seconds; }, 0,
      true, kDay, "duration", "a duration such as 30s, 500ms or 2m, above 0",
      "How long a peer stays marked down before it is tried again, at the address it publishes "
      "then (a restarted peer rejoins). While it is down, its files are kept by the next rank of "
      "their order, which fetches each once (`remote.adopted_files`, `remote.fills`).")));
  keys.push_back(WhenRemote(IntKey<Config>(
      "remote", "replicas", [](auto& c) -> auto& { return c.remote.replicas; }, 1,
      RemoteConfig::kMaxReplicas, absl::StrCat("1 to ", RemoteConfig::kMaxReplicas),
      "How many peers keep each file: its home and the next ranks of its rendezvous order. With "
      "`2`, each file's second holder fetches it from the home in the background from start-up "
      "(`remote.replica_files`; `WaitForPlacement` and `--settle` wait for it), so losing one "
      "peer costs no source read; the tiers must hold twice the home shares. Capped at the "
      "number of peers.")));
  // node
  keys.push_back(BoolKey<Config>(
      "node", "shared", [](auto& c) -> auto& { return c.node.shared; },
      "One Monarch service per node: every process that opens this config becomes a client of "
      "the node's single `monarch serve`, which owns the namespace, the tiers, placement and the "
      "peers, so processes on a node share one set of copies (see "
      "[src/service/DESIGN.md](../src/service/DESIGN.md)). `false`: each process runs Monarch in "
      "process. Without the key, in process too, except for front ends whose readers are other "
      "processes, which share the node unless the key says `false`: `monarch.torch`'s datasets "
      "(DataLoader workers), `Monarch(share_node=True)` in Python, `monarch_open_sharing_node` "
      "in C, and the preload library (always). The other `node.*` keys are checked either way."));
  keys.push_back(StringKey<Config>(
      "node", "runtime_dir", [](auto& c) -> auto& { return c.node.runtime_dir; },
      "absolute directory",
      "one per user, dataset and cache shape: `<base>/<key>-<shape>`, where `<base>` is "
      "`$XDG_RUNTIME_DIR/monarch` (or `/tmp/monarch-<uid>` when `XDG_RUNTIME_DIR` is unset), "
      "`<key>` 16 hex digits hashed from `dataset.path`, `file_regex`, `symlinks` and "
      "`manifest`, and `<shape>` 8 hex digits hashed from the tiers' kinds, paths, capacities and "
      "`huge_pages` (the source's aside)",
      "Holds the service's socket (`monarch.sock`), lock and log; created `0700` (and so is "
      "`<base>`). By default every job of a user on a node that reads one dataset through the "
      "same tiers is a client of one service, which holds one copy of the dataset for them all, "
      "counts each job apart (`monarch status`; a job is `$MONARCH_JOB`, else the batch job's id, "
      "else the process group) and outlives their ends by `node.idle_exit`. A config with other "
      "tiers gets a service of its own, and its first client says why; two datasets, or two "
      "users, never share one. Every `monarch` command given a config reaches only that "
      "config's service. Two configs that name the same directory share it only if they name "
      "the same dataset: a client, `monarch stop`, `status`, `stats` and `stage` of another "
      "dataset are refused with a message naming both (and a client whose tiers differ is told "
      "that the service's are used). `$VAR` and `${VAR}` are expanded. At most 80 characters after "
      "expansion: the socket path must fit in a Unix socket address (108 bytes)."));
  keys.push_back(BoolKey<Config>(
      "node", "autostart", [](auto& c) -> auto& { return c.node.autostart; },
      "A client that finds no service running starts one (`monarch serve`, detached) and "
      "connects to it. `false`: the service is started by hand or by a Slurm prolog."));
  keys.push_back(DurationKey<Config>(
      "node", "idle_exit", [](auto& c) -> auto& { return c.node.idle_exit_seconds; }, 0, false,
      1e15, "duration, or `0`", "a duration such as 300s or 10m, or 0 for never",
      "The service exits this long after its last client disconnected, freeing its memory: "
      "until then it keeps its copies for the next job on the node, whose epoch 1 then reads "
      "nothing from the source. "
      "`0`: never."));
  keys.push_back(BoolKey<Config>(
      "node", "keep_ram", [](auto& c) -> auto& { return c.node.keep_ram; },
      "The service's RAM tiers are files on a tmpfs (`node.ram_dir`), kept when the service is "
      "stopped or killed: the next service on the same runtime directory adopts the copies "
      "whose source is unchanged and whose bytes still match their CRC32C, so the next job's "
      "first epoch reads them from memory. An idle exit (`node.idle_exit`) frees them. `false`: "
      "the RAM tiers are memfds and die with the service. Without a tmpfs at `node.ram_dir` "
      "they are not kept (logged)."));
  keys.push_back(StringKey<Config>(
      "node", "ram_dir", [](auto& c) -> auto& { return c.node.ram_dir; },
      "`auto`, or an absolute directory", Code("auto"),
      "The tmpfs where a kept RAM tier's files live (`node.keep_ram`), under "
      "`monarch-<uid>/`. Its page size sets what a new process pays to read a copy: on 4 KiB "
      "pages it faults once per 64 KiB it first touches, so a fresh job's or DataLoader worker's "
      "first epoch from RAM takes about twice a hot one. A tmpfs mounted with `huge=within_size` "
      "(or `huge=always`; with `huge=advise`, also the tier's `huge_pages: true`) gives 2 MiB "
      "pages, one fault per 2 MiB. `auto`: a tmpfs of 2 MiB pages of this user's own, which "
      "the service mounts in a user and mount namespace of a small keeper process (`monarch "
      "ram-keeper`) and reaches through `/proc/<keeper>/root/dev/shm`; the keeper outlives the "
      "service (the next one adopts the copies) and ends with its idle exit or `monarch "
      "purge`. Its tmpfs dies with it, so where the service is in a cgroup of its batch job "
      "(Slurm's `job_<SLURM_JOB_ID>`; PBS, LSF and Flux ids too), which the job's end kills "
      "whole, `auto` is `/dev/shm`, whose files outlive the job; so it is when `/dev/shm` has "
      "2 MiB pages or holds the copies an earlier service kept, and where user namespaces are "
      "refused (logged). The service logs which it got (`logging.level: info`)."));
  Key<Config> share_with_group = StringKey<Config>(
      "node", "share_with_group", [](auto& c) -> auto& { return c.node.share_with_group; },
      "a group name or gid", "empty: nobody but this user",
      "Users of this group share one service per dataset and cache shape, whoever started it: "
      "its runtime directory defaults to `/tmp/monarch-group-<gid>/<key>-<shape>` (`02770`, "
      "the group's), its socket is the group's (`0660`), and the service lets in the group's "
      "members. A member other than the service's own user is a guest: it never maps the "
      "service's memory or opens its copies, and it reads a file through the service only "
      "after opening it on the source itself and passing the descriptor, which the service "
      "checks is that file, opened for reading: so nobody reads a byte of a file they could "
      "not open (permissions, ACLs, the file system's own checks). File names and sizes are "
      "visible to the whole group. Members trust each other's services to serve the right bytes, "
      "as they trust each other with the cache.");
  share_with_group.check = [](const Config& config, absl::string_view) {
    return NodeShareGroup(config.node).status();
  };
  keys.push_back(std::move(share_with_group));
  keys.push_back(DurationKey<Config>(
      "node", "request_timeout", [](auto& c) -> auto& { return c.node.request_timeout_seconds; },
      0.001, false, kDay, "duration, 1ms to 24h", "a duration from 1ms to 24h",
      "A client whose request the service has not answered in this time (a service stopped, or "
      "stuck in a read) reads the source itself and treats the service as gone until it answers "
      "again (it tries at most once a second). A miss is one source read of at most 8 MiB."));
  keys.push_back(DurationKey<Config>(
      "node", "start_timeout", [](auto& c) -> auto& { return c.node.start_timeout_seconds; }, 0.001,
      false, kDay, "duration, 1ms to 24h", "a duration from 1ms to 24h",
      "How long a client waits for a service that is starting (walking the dataset) before it "
      "fails with an error naming this key."));
  keys.push_back(IntKey<Config>(
      "node", "metrics_port", [](auto& c) -> auto& { return c.node.metrics_port; }, 0, 65535,
      "0 (no endpoint) to 65535",
      "Prometheus text at `http://127.0.0.1:<port>/metrics` (loopback only).",
      "`0` (no endpoint)"));
  // memory
  keys.push_back(BoolKey<Config>(
      "memory", "watch", [](auto& c) -> auto& { return c.memory.watch; },
      "RAM tiers yield to memory pressure, so that neither the job nor Monarch is OOM-killed: a "
      "thread watches the memory cgroup this process is in (v1: `memory.limit_in_bytes`, "
      "`memory.usage_in_bytes` less inactive page cache, and a usage threshold event; v2: "
      "`memory.max`, `memory.high`, `memory.current`), the memory the system has available "
      "(`MemAvailable`), and the kernel's pressure stall triggers (`/proc/pressure/memory`, or "
      "the cgroup's `memory.pressure`). When less than `memory.headroom` is left, or a trigger "
      "fires, the RAM tiers' capacity in force (`effective_capacity`) is lowered, their copies "
      "are moved down to the next `pmem`/`posix` tier with room or dropped (read from the "
      "source again later), a copy a reader is inside is left until it is done, and the freed "
      "memory is given back to the kernel. The capacity grows back, an eighth at a time, once "
      "there was no pressure for `memory.grow_after`. A node service with no client (keeping its "
      "copies for the next job) counts the headroom four times, so kept copies yield before any "
      "running job's memory. Counters `memory_shrinks`, "
      "`memory_grows`, `memory_shed_bytes`, `memory_demoted_bytes`, `memory_dropped_bytes`, "
      "`memory_released_bytes`, `memory_headroom_bytes`; each shrink and grow is logged (info). "
      "The cost: to give memory back, a RAM tier's memory is not sealed against writes from "
      "other processes (its clients still map it read-only; a process of the same user could "
      "reopen it writable through `/proc`). `false`: the tier takes the capacity it is given, "
      "and its memory is sealed. Measured: [bench/results/memory_pressure.md]"
      "(../bench/results/memory_pressure.md)."));
  keys.push_back(SizeKey<Config>(
      "memory", "headroom", [](auto& c) -> auto& { return c.memory.headroom_bytes; }, kMiB,
      ~uint64_t{0}, 1, "size, at least 1MiB", "a size of at least 1MiB",
      "Memory kept free: the RAM tiers shrink when less than this is left below the cgroup's "
      "limit (or available to the system), by enough to leave twice this, and grow back only "
      "while more than twice this would stay free. Larger leaves the job more room to allocate "
      "in a burst faster than the tier can shrink."));
  keys.push_back(DurationKey<Config>(
      "memory", "psi_stall", [](auto& c) -> auto& { return c.memory.psi_stall_seconds; }, 0,
      false, 1, "duration, 0 to 1s", "a duration from 0 to 1s, such as 150ms",
      "Time per second that some task stalled on memory (`some` in `/proc/pressure/memory`) "
      "that counts as pressure: a PSI trigger over a 1 s window (2 s where the process lacks "
      "`CAP_SYS_RESOURCE`, which the kernel demands then), polled with `POLLPRI`. Where "
      "triggers cannot be set, the `avg10` figure is sampled instead. The system's PSI shrinks "
      "the tier only when no cgroup limit holds and less than four times `memory.headroom` is "
      "available: other cgroups' stalls (one reclaiming at its own limit) show there too, so "
      "otherwise it is only counted (`memory_psi_events`) and the headroom decides. "
      "`0`: PSI is not watched."));
  keys.push_back(DurationKey<Config>(
      "memory", "interval", [](auto& c) -> auto& { return c.memory.interval_seconds; }, 0.01,
      false, 60, "duration, 10ms to 60s", "a duration from 10ms to 60s",
      "How often the watcher samples the cgroup between events (a v1 usage threshold or a PSI "
      "trigger wakes it at once)."));
  keys.push_back(DurationKey<Config>(
      "memory", "grow_after", [](auto& c) -> auto& { return c.memory.grow_after_seconds; }, 0,
      false, kDay, "duration", "a duration such as 30s or 2m",
      "Time without pressure before a shrunk RAM tier grows back; then an eighth of its "
      "capacity at most once a second, while it leaves twice `memory.headroom` free."));
  // logging
  keys.push_back(EnumKey<Config, LogLevel>(
      "logging", "level", [](auto& c) -> auto& { return c.logging.level; },
      kLogLevels,
      "Messages to stderr."));
  return keys;
}

std::vector<Key<TierConfig>> MakeTierKeys() {
  std::vector<Key<TierConfig>> keys;
  keys.push_back(EnumKey<TierConfig, TierKind>(
      "tiers[i]", "kind", [](auto& t) -> auto& { return t.kind; },
      absl::MakeConstSpan(kTierKinds, std::size(kTierKinds) - 1),
      "The driver."));
  keys.back().required = true;
  keys.back().default_doc = "required";
  keys.push_back(StringKey<TierConfig>(
      "tiers[i]", "name", [](auto& t) -> auto& { return t.name; }, "string", "the kind",
      "Unique; used in stats."));
  keys.push_back(StringKey<TierConfig>(
      "tiers[i]", "path", [](auto& t) -> auto& { return t.path; }, "absolute directory",
      "required for `pmem`, `posix`",
      "Where copies live. Must exist, must not overlap the dataset or another tier. Not allowed "
      "on `ram` and `source` (the source reads `dataset.path`)."));
  keys.push_back(SizeKey<TierConfig>(
      "tiers[i]", "capacity", [](auto& t) -> auto& { return t.capacity_bytes; }, 0, ~uint64_t{0},
      1, "size", "a size", "Bytes the tier may hold; at most the device size (`pmem`, `posix`) or "
      "physical memory (`ram`).",
      "required except for `source`"));
  keys.push_back(EnumKey<TierConfig, WriteMode>(
      "tiers[i]", "write_mode", [](auto& t) -> auto& { return t.write_mode; },
      kWriteModes,
      "`posix` only. `buffered`: copies are written through the page cache, so the epoch after "
      "a copy was written reads it from memory. `direct`: files of 1 MiB and more are written "
      "with `O_DIRECT` (smaller ones are always buffered), leaving the page cache alone; the next "
      "read of such a copy goes to the device. `auto`: buffered while the copies written so far "
      "fit in half of the memory available at start-up (less the RAM tiers), direct beyond that, "
      "for data that could not stay cached anyway."));
  keys.push_back(BoolKey<TierConfig>(
      "tiers[i]", "huge_pages", [](auto& t) -> auto& { return t.huge_pages; },
      "`ram` only. Backs the tier with 2 MiB pages where the kernel allows it. A node "
      "service's kept tier (`node.keep_ram`) lives on the tmpfs at `node.ram_dir`, which gives "
      "2 MiB pages when mounted `huge=advise` with this key, or `huge=always` or "
      "`huge=within_size` without it. Memfds (an in-process tier, or `node.keep_ram: false`) "
      "need `/sys/kernel/mm/transparent_hugepage/shmem_enabled` at `advise` (or `always`, "
      "`within_size`); at the kernel's default, `never`, the key changes nothing. A process that "
      "maps the tier afresh (a node service client; a DataLoader worker, which PyTorch starts "
      "anew each epoch) then takes a page fault per 2 MiB instead of per 4 KiB: a fresh client "
      "read the tier at 0.96x the speed of a warm one, against 0.35x with 4 KiB pages "
      "(`bench_client_hit --huge-pages`). The costs: a process that keeps its mapping (a "
      "persistent worker, a long-lived client) read the tier at 28 GiB/s against 33 GiB/s with 4 "
      "KiB pages on the test VM; the cold epoch took 5-18% longer there, which is the hypervisor "
      "backing guest memory nothing had touched yet (with that memory touched just before, the "
      "cold epoch was even); and each of the tier's 8 stripes may end in a partly used 2 MiB "
      "page. Without the key, a forked client (a DataLoader worker) copies its hits with "
      "`pread()` until it reads a file again, which costs it less than faulting 4 KiB pages in "
      "(in `bench/torch_epochs.py --files 6000`, 4 fresh workers through the node service, hot "
      "epochs took 0.99x a local copy's time against 1.10x before, and 0.86-0.90x with "
      "`huge_pages`: [bench/results/python.md](../bench/results/python.md)), and maps from then "
      "on. That is not the rule: in the paper suite's DataLoader, 4 fresh workers through the "
      "service over 20,000 small files on a quiet machine, hot epochs took 1.34x and 1.42x the "
      "local copy's time (1.41x and 1.53x with an announced order; "
      "[bench/results/suite/ANALYSIS.md](../bench/results/suite/ANALYSIS.md)). So the key may "
      "still pay for fresh DataLoader workers; not for persistent workers or one long-lived "
      "process."));
  keys.push_back(SizeKey<TierConfig>(
      "tiers[i]", "back_ahead", [](auto& t) -> auto& { return t.back_ahead_bytes; }, 0,
      ~uint64_t{0}, 1, "size", "a size",
      "`ram` only. Memory the tier allocates ahead of its copies, in a background thread at the "
      "lowest CPU priority (`SCHED_IDLE`): the first store into a page the tier never used "
      "costs the kernel allocating and zeroing it (and a VM's hypervisor backing it), 0.77-0.89 "
      "ms per MiB against 0.21-0.23 ms for a store into a page already there "
      "(`bench_fill_memory`). Never more than the capacity, nor the dataset's size, in all; "
      "under `memory.watch`, only what stays free above four times `memory.headroom`, and it "
      "stops for good once memory pressure shrinks the tier or the kernel refuses it memory. "
      "Counter `backed_ahead_bytes`. Measured, 2,000 files of 110 KiB, 4 readers on 2 cores: "
      "from a cold source epoch 1 took 0.93-0.94x the time without it; from a page-cached one "
      "1.01x with 2.2x as many copies made during epoch 1 when the job paused 1 s before it "
      "(as one building its model does), and 1.07x when epoch 1 started at once (the zeroing "
      "competes with the readers for memory bandwidth) ([bench/results/back_ahead.md]"
      "(../bench/results/back_ahead.md)). `0`: copies allocate their own pages."));
  return keys;
}

}  // namespace

absl::Status KeyError(absl::string_view key, absl::string_view what) {
  // Keys come from the config too: an unknown one is quoted as a value is.
  const std::string shown = key.size() <= kMaxQuotedChars ? std::string(key) : Quote(key);
  return absl::InvalidArgumentError(absl::StrCat(shown, ": ", what));
}

std::string Describe(const YAML::Node& node) {
  if (node.IsScalar()) return Quote(node.Scalar());
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  return "nothing";
}

const std::vector<Key<Config>>& SectionKeys() {
  static const auto* keys = new std::vector<Key<Config>>(MakeSectionKeys());
  return *keys;
}

const std::vector<Key<TierConfig>>& TierKeys() {
  static const auto* keys = new std::vector<Key<TierConfig>>(MakeTierKeys());
  return *keys;
}

const std::vector<std::string>& Sections() {
  static const auto* sections = new std::vector<std::string>{
      "dataset", "tiers", "placement", "prefetch", "remote", "node", "memory", "logging"};
  return *sections;
}

std::vector<absl::string_view> KeyNames(absl::string_view section) {
  std::vector<absl::string_view> names;
  if (section == "tiers[i]") {
    for (const Key<TierConfig>& key : TierKeys()) names.push_back(key.name);
    return names;
  }
  for (const Key<Config>& key : SectionKeys()) {
    if (key.section == section) names.push_back(key.name);
  }
  return names;
}

std::string ConfigReference() {
  std::string out = "| key | type | default | meaning |\n|---|---|---|---|\n";
  auto row = [&out](const std::string& path, const std::string& values,
                    const std::string& default_doc, const std::string& help) {
    // A '|' would end a cell: none of the table's texts may hold one.
    absl::StrAppend(&out, "| `", path, "` | ", values, " | ", default_doc, " | ",
                    absl::StrReplaceAll(help, {{"|", "\\|"}}), " |\n");
  };
  for (const Key<Config>& key : SectionKeys()) {
    if (key.section != "dataset") continue;
    row(key.section + "." + key.name, key.values, key.default_doc, key.help);
  }
  row("tiers", "list", "required", "Fastest first. Exactly one `source` tier, and it is last.");
  for (const Key<TierConfig>& key : TierKeys()) {
    row(key.section + "." + key.name, key.values, key.default_doc, key.help);
  }
  for (const Key<Config>& key : SectionKeys()) {
    if (key.section == "dataset") continue;
    row(key.section + "." + key.name, key.values, key.default_doc, key.help);
  }
  return out;
}

absl::StatusOr<std::string> ReferenceIn(absl::string_view document) {
  const size_t begin = document.find(kReferenceBegin);
  const size_t end = document.find(kReferenceEnd);
  if (begin == absl::string_view::npos || end == absl::string_view::npos || end < begin) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the config reference's markers are missing: expected a line '", kReferenceBegin,
        "' and, after it, a line '", kReferenceEnd, "'"));
  }
  const size_t from = document.find('\n', begin);
  return std::string(document.substr(from + 1, end - from - 1));
}

absl::StatusOr<std::string> WithReference(absl::string_view document,
                                          absl::string_view reference) {
  MONARCH_ASSIGN_OR_RETURN(std::string old, ReferenceIn(document));
  const size_t from = document.find('\n', document.find(kReferenceBegin)) + 1;
  return absl::StrCat(document.substr(0, from), reference, document.substr(from + old.size()));
}

}  // namespace monarch::config_keys

namespace monarch {

using config_keys::NameIn;

const char* NameOf(TierKind value) { return NameIn<TierKind>(config_keys::kTierKinds, value); }
const char* NameOf(WriteMode value) { return NameIn<WriteMode>(config_keys::kWriteModes, value); }
const char* NameOf(SymlinkPolicy value) {
  return NameIn<SymlinkPolicy>(config_keys::kSymlinkPolicies, value);
}
const char* NameOf(PlacementPolicyKind value) {
  return NameIn<PlacementPolicyKind>(config_keys::kPlacementPolicies, value);
}
const char* NameOf(VerifyPolicy value) {
  return NameIn<VerifyPolicy>(config_keys::kVerifyPolicies, value);
}
const char* NameOf(CachedSourcePolicy value) {
  return NameIn<CachedSourcePolicy>(config_keys::kCachedSourcePolicies, value);
}
const char* NameOf(BootstrapKind value) {
  return NameIn<BootstrapKind>(config_keys::kBootstrapKinds, value);
}
const char* NameOf(LogLevel value) { return NameIn<LogLevel>(config_keys::kLogLevels, value); }
const char* TierKindName(TierKind kind) { return NameOf(kind); }

}  // namespace monarch
