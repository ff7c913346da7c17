// Config: YAML parsing and whole-config validation.
//
// Every error is one InvalidArgument message that starts with the offending
// key's path ("tiers[1].capacity: ...") and says what was expected.

#include "common/os.h"
#include "monarch/config.h"

#include <grp.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/environment.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "config/config_keys.h"
#include "config/file_regex.h"
#include "config/valid_config.h"
#include "yaml-cpp/yaml.h"

namespace monarch {

using config_keys::Describe;
using config_keys::KeyError;

namespace {

// Limits that keep a hostile or broken config from costing minutes and GiBs.
constexpr size_t kMaxConfigBytes = 1 << 20;
constexpr size_t kMaxTiers = 16;
constexpr int64_t kMaxOpenFilesLimit = 1000000;

// node.runtime_dir holds the service's socket, "<dir>/monarch.sock", and a
// Unix socket address has room for 107 characters (sun_path is 108 bytes
// with the terminating NUL). 80 leaves that suffix and some slack.
constexpr size_t kMaxRuntimeDirChars = 80;

std::string Quote(absl::string_view value) { return QuoteForError(value); }

// Refuses keys outside `allowed`, so a typo never silently means "default",
// and a key given twice (yaml-cpp keeps both and answers with the first).
absl::Status CheckKeys(const YAML::Node& map, absl::string_view where,
                       const std::vector<absl::string_view>& allowed) {
  std::vector<std::string> seen;
  for (const auto& item : map) {
    const std::string key = item.first.as<std::string>();
    std::string path = where.empty() ? key : absl::StrCat(where, ".", key);
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
      return KeyError(path, "given more than once; keep one");
    }
    seen.push_back(key);
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      return KeyError(path,
                      absl::StrCat("unknown key; expected one of: ", absl::StrJoin(allowed, ", ")));
    }
  }
  return absl::OkStatus();
}

// Reads every key of `section` present in `map` through the table.
absl::Status ParseSection(const YAML::Node& map, const std::string& section, Config* config) {
  for (const config_keys::Key<Config>& key : config_keys::SectionKeys()) {
    if (key.section != section) continue;
    if (const YAML::Node value = map[key.name]) {
      MONARCH_RETURN_IF_ERROR(key.parse(value, absl::StrCat(section, ".", key.name), config));
    }
  }
  return absl::OkStatus();
}

// The soft RLIMIT_NOFILE this process may have: the hard limit, which
// RaiseDescriptorLimit() raises the soft one to when an instance starts.
// Linux refuses a hard limit above fs.nr_open, "unlimited" included, so
// such a limit is never raised to: the soft one counts then.
uint64_t DescriptorLimit() {
  struct rlimit limit;
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 1024;
  const rlim_t reachable = limit.rlim_max != RLIM_INFINITY ? limit.rlim_max : limit.rlim_cur;
  return reachable == RLIM_INFINITY ? 1048576 : static_cast<uint64_t>(reachable);
}

// The descriptor caches a config's instance keeps: one per file tier, one
// for the source.
int DescriptorCaches(const Config& config) {
  const auto caches = std::count_if(config.tiers.begin(), config.tiers.end(), [](const auto& tier) {
    return tier.kind == TierKind::kPmem || tier.kind == TierKind::kPosix ||
           tier.kind == TierKind::kSource;
  });
  return std::max(static_cast<int>(caches), 1);
}

// Reads `tiers`: a list of mappings of the tier keys, with the keys each
// kind takes and needs.
absl::Status ParseTiers(const YAML::Node& tiers, Config* config) {
  if (!tiers)
    return KeyError("tiers", "required: a list of tiers, fastest first, ending with the source");
  if (!tiers.IsSequence())
    return KeyError("tiers", absl::StrCat("expected a list, got ", Describe(tiers)));
  if (tiers.size() > kMaxTiers) {
    return KeyError("tiers", absl::StrCat("expected at most ", kMaxTiers, " tiers, got ",
                                          tiers.size()));
  }
  for (size_t i = 0; i < tiers.size(); ++i) {
    const std::string where = absl::StrCat("tiers[", i, "]");
    const YAML::Node t = tiers[i];
    if (!t.IsMap()) return KeyError(where, absl::StrCat("expected a mapping, got ", Describe(t)));
    MONARCH_RETURN_IF_ERROR(CheckKeys(t, where, config_keys::KeyNames("tiers[i]")));
    TierConfig tier;
    for (const config_keys::Key<TierConfig>& key : config_keys::TierKeys()) {
      const std::string path = absl::StrCat(where, ".", key.name);
      if (const YAML::Node value = t[key.name]) {
        MONARCH_RETURN_IF_ERROR(key.parse(value, path, &tier));
      } else if (key.required) {
        return KeyError(path, absl::StrCat("required: ", key.expected));
      }
    }
    if (!t["name"]) tier.name = TierKindName(tier.kind);
    // Keys that only some kinds take, and those each kind needs.
    auto only = [&](const char* key, TierKind kind, const char* what) -> absl::Status {
      if (t[key] && tier.kind != kind) {
        return KeyError(absl::StrCat(where, ".", key),
                        absl::StrCat("only a ", TierKindName(kind), " tier has ", what, ", not a ",
                                     TierKindName(tier.kind), " tier; remove this key"));
      }
      return absl::OkStatus();
    };
    MONARCH_RETURN_IF_ERROR(only("write_mode", TierKind::kPosix, "a write mode"));
    MONARCH_RETURN_IF_ERROR(only("huge_pages", TierKind::kRam, "huge pages"));
    MONARCH_RETURN_IF_ERROR(only("back_ahead", TierKind::kRam, "memory backed ahead"));
    if (tier.kind == TierKind::kSource && t["path"]) {
      return KeyError(absl::StrCat(where, ".path"),
                      "a source tier reads dataset.path; remove this key");
    }
    if (tier.kind == TierKind::kSource && t["capacity"]) {
      return KeyError(absl::StrCat(where, ".capacity"),
                      "a source tier has no capacity; remove this key");
    }
    if (tier.kind == TierKind::kRam && t["path"]) {
      return KeyError(absl::StrCat(where, ".path"), "a ram tier has no path; remove this key");
    }
    if (tier.kind != TierKind::kSource && !t["capacity"]) {
      return KeyError(
          absl::StrCat(where, ".capacity"),
          absl::StrCat("required for a ", TierKindName(tier.kind), " tier: a size such as 64GiB"));
    }
    if ((tier.kind == TierKind::kPosix || tier.kind == TierKind::kPmem) && !t["path"]) {
      return KeyError(absl::StrCat(where, ".path"),
                      absl::StrCat("required for a ", TierKindName(tier.kind),
                                   " tier: the directory that holds its copies"));
    }
    config->tiers.push_back(std::move(tier));
  }
  return absl::OkStatus();
}

absl::StatusOr<Config> ParseNode(const YAML::Node& root) {
  Config config;
  const std::vector<std::string>& sections = config_keys::Sections();
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: expected a mapping with keys ", absl::StrJoin(sections, ", "),
                     "; got ", Describe(root)));
  }
  MONARCH_RETURN_IF_ERROR(
      CheckKeys(root, "", std::vector<absl::string_view>(sections.begin(), sections.end())));
  for (const std::string& section : sections) {
    if (section == "tiers") {
      MONARCH_RETURN_IF_ERROR(ParseTiers(root["tiers"], &config));
      continue;
    }
    // The other sections: mappings of the table's keys.
    const YAML::Node map = root[section];
    if (!map) {
      if (section == "dataset") return KeyError("dataset", "required (a mapping with 'path')");
      continue;
    }
    if (!map.IsMap()) {
      return KeyError(section, absl::StrCat("expected a mapping, got ", Describe(map)));
    }
    if (section == "placement" && map["idle_priority"]) {
      return KeyError("placement.idle_priority",
                      "no longer supported: placement threads run at normal priority, and "
                      "readers write the chunks they loaded themselves when staging memory is "
                      "over placement.max_staging_bytes; remove this key");
    }
    MONARCH_RETURN_IF_ERROR(CheckKeys(map, section, config_keys::KeyNames(section)));
    if (section == "dataset" && !map["path"]) {
      return KeyError("dataset.path", "required: the dataset directory on the source");
    }
    MONARCH_RETURN_IF_ERROR(ParseSection(map, section, &config));
  }
  // Derived for this config's caches (the struct's default assumes four),
  // unless given.
  const YAML::Node placement = root["placement"];
  const YAML::Node files = placement ? placement["max_open_files"] : placement;
  if (!placement || !files || (files.IsScalar() && files.Scalar() == "auto")) {
    config.placement.max_open_files = DefaultMaxOpenFiles(DescriptorCaches(config));
  }
  return config;  // Validated by the caller, after any adjustment.
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return os::Stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// True if `inner` is `outer` or lies beneath it (both canonical, absolute).
bool IsWithin(const std::string& inner, const std::string& outer) {
  if (inner == outer) return true;
  std::string prefix = outer.back() == '/' ? outer : outer + "/";
  return absl::StartsWith(inner, prefix);
}

std::string RealPath(const std::string& path) {
  char* resolved = os::RealPath(path.c_str(), nullptr);
  if (resolved == nullptr) return path;
  std::string result(resolved);
  ::free(resolved);
  return result;
}

}  // namespace

absl::StatusOr<uint64_t> ParseByteSize(std::string_view text_in) {
  const absl::string_view text(text_in.data(), text_in.size());
  absl::string_view s = absl::StripAsciiWhitespace(text);
  size_t digits = 0;
  while (digits < s.size() &&
         (std::isdigit(static_cast<unsigned char>(s[digits])) || s[digits] == '.')) {
    ++digits;
  }
  double number;
  if (digits == 0 || !absl::SimpleAtod(s.substr(0, digits), &number)) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected a size such as 64GiB, 512MB or 1048576, got ", Quote(text)));
  }
  std::string unit = absl::AsciiStrToLower(absl::StripAsciiWhitespace(s.substr(digits)));
  struct Unit {
    const char* name;
    double factor;
  };
  static constexpr Unit kUnits[] = {
      {"", 1},
      {"b", 1},
      {"k", 1024.0},
      {"kib", 1024.0},
      {"kb", 1e3},
      {"m", 1048576.0},
      {"mib", 1048576.0},
      {"mb", 1e6},
      {"g", 1073741824.0},
      {"gib", 1073741824.0},
      {"gb", 1e9},
      {"t", 1099511627776.0},
      {"tib", 1099511627776.0},
      {"tb", 1e12},
  };
  for (const Unit& u : kUnits) {
    if (unit == u.name) {
      double bytes = std::floor(number * u.factor);
      if (bytes >= 1.8e19) {
        return absl::InvalidArgumentError(absl::StrCat("size ", Quote(text), " is too large"));
      }
      if (unit.empty() && number != std::floor(number)) {
        return absl::InvalidArgumentError(
            absl::StrCat("expected a whole number of bytes, got ", Quote(text)));
      }
      return static_cast<uint64_t>(bytes);
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "expected a size such as 64GiB, 512MB or 1048576 (units B, KiB, MiB, GiB, TiB, KB, MB, GB, "
      "TB), got ",
      Quote(text)));
}

// What the table cannot check key by key: a rendezvous directory is needed
// by the directory bootstrap, and must be absolute.
static absl::Status ValidateRemote(const RemoteConfig& r) {
  if (!r.enabled || r.bootstrap != BootstrapKind::kDirectory) return absl::OkStatus();
  if (r.rendezvous_dir.empty()) {
    return KeyError("remote.rendezvous_dir",
                    "required with bootstrap 'directory': a directory on a file system every "
                    "peer sees, one per job");
  }
  if (r.rendezvous_dir[0] != '/') {
    return KeyError("remote.rendezvous_dir",
                    absl::StrCat("expected an absolute path, got ", Quote(r.rendezvous_dir)));
  }
  return absl::OkStatus();
}

// Checked whether or not `shared` is on: the keys mean the same either way,
// and a mistake should not wait until someone turns sharing on.
static absl::Status ValidateNode(const Config& config) {
  const NodeConfig& n = config.node;
  MONARCH_ASSIGN_OR_RETURN(std::string dir, NodeRuntimeDirectory(config));
  if (dir.size() > kMaxRuntimeDirChars) {
    return KeyError("node.runtime_dir",
                    absl::StrCat(Quote(dir), " is ", dir.size(), " characters",
                                 n.runtime_dir.empty() ? " (the default: set node.runtime_dir)"
                                                       : " after expansion",
                                 "; at most ", kMaxRuntimeDirChars,
                                 " fit, because the service's socket <dir>/monarch.sock must "
                                 "fit in a Unix socket address (108 bytes)"));
  }
  if (n.ram_dir != "auto" && (n.ram_dir.empty() || n.ram_dir[0] != '/')) {
    return KeyError("node.ram_dir",
                    absl::StrCat("expected `auto` or an absolute directory on a tmpfs, got ",
                                 Quote(n.ram_dir)));
  }
  return absl::OkStatus();
}

// The path `value` of `key` with its environment variables expanded, which
// must then be absolute.
static absl::StatusOr<std::string> ExpandAbsolutePath(const std::string& value,
                                                      absl::string_view key) {
  MONARCH_ASSIGN_OR_RETURN(std::string path, ExpandEnvironment(value, key));
  if (path.empty() || path[0] != '/') {
    return KeyError(key, path == value
                             ? absl::StrCat("expected an absolute path, got ", Quote(path))
                             : absl::StrCat("expected an absolute path, got ", Quote(value), " (",
                                            Quote(path), " after expansion)"));
  }
  return path;
}

absl::StatusOr<std::string> DatasetManifestPath(const DatasetConfig& dataset) {
  return ExpandAbsolutePath(dataset.manifest, "dataset.manifest");
}

namespace {

// FNV-1a over `parts`: stable across processes and builds, unlike
// absl::Hash. A separator after each part: ("ab","c") != ("a","bc").
uint64_t StableHash(std::initializer_list<absl::string_view> parts) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (absl::string_view part : parts) {
    for (char c : part) hash = (hash ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
    hash = (hash ^ 0xffu) * 0x100000001b3ull;
  }
  return hash;
}

}  // namespace

std::string DatasetKey(const DatasetConfig& dataset) {
  // The path as written, less empty and "." components and trailing
  // slashes. Not resolved: on a PFS each component would cost every
  // client process a metadata operation (a symlinked spelling of a dataset
  // gets a service of its own instead).
  std::string root;
  for (absl::string_view part : absl::StrSplit(dataset.path, '/', absl::SkipEmpty())) {
    if (part != ".") absl::StrAppend(&root, "/", part);
  }
  if (root.empty()) root = "/";
  return absl::StrFormat(
      "%016x", StableHash({root, dataset.file_regex, NameOf(dataset.symlinks), dataset.manifest}));
}

std::string CacheShape(const Config& config) {
  std::string shape;
  for (const TierConfig& tier : config.tiers) {
    if (tier.kind == TierKind::kSource) continue;
    absl::StrAppend(&shape, shape.empty() ? "" : ", ", NameOf(tier.kind));
    if (!tier.path.empty()) absl::StrAppend(&shape, " ", tier.path);
    if (tier.capacity_bytes > 0) absl::StrAppend(&shape, " ", tier.capacity_bytes, " B");
    if (tier.huge_pages) absl::StrAppend(&shape, " huge_pages");
  }
  return shape.empty() ? "no tier" : shape;
}

std::string CacheShapeKey(const Config& config) {
  return absl::StrFormat("%08x", static_cast<uint32_t>(StableHash({CacheShape(config)})));
}

BatchJob ThisBatchJob() {
  static constexpr std::pair<const char*, const char*> kSchedulers[] = {
      {"SLURM_JOB_ID", "slurm"}, {"PBS_JOBID", "pbs"}, {"LSB_JOBID", "lsf"},
      {"FLUX_JOB_ID", "flux"}};
  for (const auto& [variable, scheduler] : kSchedulers) {
    const char* id = std::getenv(variable);
    if (id != nullptr && id[0] != '\0') return BatchJob{scheduler, id};
  }
  return BatchJob{};
}

std::string BatchJobTag() {
  const BatchJob job = ThisBatchJob();
  if (job.id.empty()) return "";
  std::string tag = absl::StrCat(job.scheduler, "-");
  // A directory name: PBS ids carry the server name ("123.head"), Flux's
  // may be anything.
  for (size_t i = 0; i < job.id.size() && tag.size() < 40; ++i) {
    const char c = job.id[i];
    tag += absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' ? c : '_';
  }
  return tag;
}

namespace {

// The user's directory for runtime state: $XDG_RUNTIME_DIR/monarch, or
// /tmp/monarch-<uid>. XDG_RUNTIME_DIR is per user, 0700 and removed when the
// user's last session ends: the right home for a socket. Batch jobs often
// lack it.
std::string RuntimeBase() {
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  if (xdg == nullptr || xdg[0] != '/') return absl::StrCat("/tmp/monarch-", ::getuid());
  std::string base = xdg;
  while (!base.empty() && base.back() == '/') base.pop_back();
  return absl::StrCat(base, "/monarch");
}

}  // namespace

std::string KeptNamespacePath(const DatasetConfig& dataset) {
  return absl::StrCat(RuntimeBase(), "/namespaces/", DatasetKey(dataset), ".manifest");
}

absl::StatusOr<std::optional<gid_t>> NodeShareGroup(const NodeConfig& node) {
  if (node.share_with_group.empty()) return std::nullopt;
  std::vector<char> buffer(16384);
  group entry{};
  group* found = nullptr;
  if (::getgrnam_r(node.share_with_group.c_str(), &entry, buffer.data(), buffer.size(),
                   &found) == 0 &&
      found != nullptr) {
    return found->gr_gid;
  }
  uint32_t gid = 0;
  if (absl::SimpleAtoi(node.share_with_group, &gid) && gid != static_cast<uint32_t>(-1)) {
    return static_cast<gid_t>(gid);
  }
  return KeyError("node.share_with_group",
                  absl::StrCat("expected a group of this node (a name or a gid), got ",
                               Quote(node.share_with_group), ": no such group"));
}

absl::StatusOr<std::string> NodeRuntimeDirectory(const Config& config) {
  const NodeConfig& node = config.node;
  if (node.runtime_dir.empty()) {
    // One service per user, dataset and cache shape: every job of a user
    // that reads the dataset through the same tiers meets in it, and one
    // that caches differently gets its own (the client says so). A group
    // shares one base, so that its members find each other's services.
    MONARCH_ASSIGN_OR_RETURN(std::optional<gid_t> group, NodeShareGroup(node));
    const std::string base =
        group ? absl::StrCat("/tmp/monarch-group-", *group) : RuntimeBase();
    return absl::StrCat(base, "/", DatasetKey(config.dataset), "-", CacheShapeKey(config));
  }
  return ExpandAbsolutePath(node.runtime_dir, "node.runtime_dir");
}

absl::Status ValidateConfig(const Config& config) {
  if (config.dataset.path.empty())
    return KeyError("dataset.path", "required: the dataset directory on the source");
  // Every key's own range (a Config built in code was never parsed).
  for (const config_keys::Key<Config>& key : config_keys::SectionKeys()) {
    MONARCH_RETURN_IF_ERROR(key.check(config, absl::StrCat(key.section, ".", key.name)));
  }
  if (config.dataset.path[0] != '/') {
    return KeyError("dataset.path",
                    absl::StrCat("expected an absolute path, got ", Quote(config.dataset.path)));
  }
  // A client of a node service never touches the dataset: its start-up
  // must cost the PFS nothing (the service checks the path, and walks it).
  const bool client_of_service = config.node.shared;
  if (!client_of_service && !IsDirectory(config.dataset.path)) {
    return KeyError("dataset.path",
                    absl::StrCat(Quote(config.dataset.path), " is not an existing directory"));
  }
  if (!config.dataset.file_regex.empty()) {
    // Compiled here too, so that a bad pattern is a config error before any
    // start-up work. FileRegex's messages name the key.
    MONARCH_RETURN_IF_ERROR(FileRegex::Compile(config.dataset.file_regex).status());
  }
  const std::string dataset =
      client_of_service ? config.dataset.path : RealPath(config.dataset.path);
  if (config.tiers.empty()) return KeyError("tiers", "expected at least the source tier");

  absl::flat_hash_set<std::string> names;
  std::vector<std::pair<std::string, std::string>> tier_paths;  // (key, real path)
  int sources = 0;
  for (size_t i = 0; i < config.tiers.size(); ++i) {
    const TierConfig& tier = config.tiers[i];
    const std::string where = absl::StrCat("tiers[", i, "]");
    if (tier.kind == TierKind::kPeers) {
      return KeyError(absl::StrCat(where, ".kind"),
                      "peers are not a tier to list: enable them with the remote section");
    }
    for (const config_keys::Key<TierConfig>& key : config_keys::TierKeys()) {
      MONARCH_RETURN_IF_ERROR(key.check(tier, absl::StrCat(where, ".", key.name)));
    }
    if (tier.name.empty()) return KeyError(absl::StrCat(where, ".name"), "must not be empty");
    if (!names.insert(tier.name).second) {
      return KeyError(
          absl::StrCat(where, ".name"),
          absl::StrCat(Quote(tier.name), " is used by another tier; names must be unique"));
    }
    if (tier.kind == TierKind::kSource) {
      ++sources;
      if (sources > 1)
        return KeyError(absl::StrCat(where, ".kind"),
                        "a second source tier; expected exactly one, last");
      if (std::any_of(config.tiers.begin() + i + 1, config.tiers.end(),
                      [](const TierConfig& t) { return t.kind == TierKind::kSource; })) {
        continue;  // Reported as "a second source tier" at the next one.
      }
      if (i + 1 != config.tiers.size()) {
        return KeyError(absl::StrCat(where, ".kind"),
                        "the source tier must be the last tier (tiers are fastest first)");
      }
      continue;
    }
    if (tier.capacity_bytes == 0) {
      return KeyError(absl::StrCat(where, ".capacity"), "expected a size greater than 0");
    }
    if (tier.kind == TierKind::kRam) {
      const uint64_t memory = PhysicalMemoryBytes();
      if (tier.capacity_bytes > memory) {
        return KeyError(absl::StrCat(where, ".capacity"),
                        absl::StrCat(tier.capacity_bytes, " bytes is more than this machine's ",
                                     memory, " bytes of memory"));
      }
      continue;
    }
    const std::string path_key = absl::StrCat(where, ".path");
    if (tier.path.empty() || tier.path[0] != '/') {
      return KeyError(path_key,
                      absl::StrCat("expected an absolute directory, got ", Quote(tier.path)));
    }
    if (!IsDirectory(tier.path)) {
      return KeyError(path_key, absl::StrCat(Quote(tier.path), " is not an existing directory"));
    }
    const std::string real = RealPath(tier.path);
    if (IsWithin(real, dataset) || IsWithin(dataset, real)) {
      return KeyError(path_key, absl::StrCat(Quote(tier.path),
                                             " overlaps dataset.path; the source is read-only and "
                                             "must stay apart from tier copies"));
    }
    for (const auto& [other_key, other] : tier_paths) {
      if (IsWithin(real, other) || IsWithin(other, real)) {
        return KeyError(path_key, absl::StrCat(Quote(tier.path), " overlaps ", other_key,
                                               "; each tier needs its own directory"));
      }
    }
    tier_paths.emplace_back(path_key, real);
    struct statvfs fs;
    if (os::Statvfs(real.c_str(), &fs) == 0) {
      const uint64_t device = static_cast<uint64_t>(fs.f_blocks) * fs.f_frsize;
      if (tier.capacity_bytes > device) {
        return KeyError(absl::StrCat(where, ".capacity"),
                        absl::StrCat(tier.capacity_bytes, " bytes is more than the ", device,
                                     " bytes of the device holding ", Quote(tier.path)));
      }
    }
  }
  if (sources == 0)
    return KeyError("tiers", "expected a last tier of kind 'source' (the dataset on the PFS)");

  const PlacementConfig& p = config.placement;
  // Each peer keeps the files it is home of for the others: never evicted.
  if (p.policy == PlacementPolicyKind::kLru && config.remote.enabled) {
    return KeyError("placement.policy", "'lru' is not supported with remote.enabled (peers)");
  }
  // More descriptors than the process may open once its instance raised
  // its soft limit: reads past it would fail with EMFILE, on the source too.
  if (const uint64_t limit = DescriptorLimit(); static_cast<uint64_t>(p.max_open_files) > limit) {
    return KeyError("placement.max_open_files",
                    absl::StrCat(p.max_open_files, " is more than the ", limit,
                                 " descriptors this process may open (RLIMIT_NOFILE's hard limit, "
                                 "ulimit -Hn); leave the key out to derive it from the limit"));
  }
  // Only the path here: whether the file exists and matches the dataset is
  // checked when the namespace is built from it (`monarch manifest` writes
  // it from a config that already names it).
  if (!config.dataset.manifest.empty()) {
    MONARCH_RETURN_IF_ERROR(DatasetManifestPath(config.dataset).status());
  }
  MONARCH_RETURN_IF_ERROR(ValidateRemote(config.remote));
  MONARCH_RETURN_IF_ERROR(ValidateNode(config));
  return absl::OkStatus();
}

absl::StatusOr<ValidConfig> ValidConfig::Validate(Config config) {
  MONARCH_RETURN_IF_ERROR(ValidateConfig(config));
  return ValidConfig(std::move(config));
}

absl::StatusOr<ValidConfig> ParseValidConfigString(std::string_view yaml,
                                                   const ConfigAdjustment& adjust,
                                                   bool share_node_by_default) {
  if (yaml.size() > kMaxConfigBytes) {
    return absl::InvalidArgumentError(absl::StrCat("config: ", yaml.size(),
                                                   " bytes; a config larger than ",
                                                   kMaxConfigBytes, " bytes is refused"));
  }
  absl::StatusOr<Config> config;
  try {
    const YAML::Node root = YAML::Load(std::string(yaml));
    config = ParseNode(root);
    // Parsed: `node`, if present, is a mapping.
    if (config.ok() && share_node_by_default && !(root["node"] && root["node"]["shared"])) {
      config->node.shared = true;
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config: malformed YAML at line ",
                                                   e.mark.line + 1, ", column ", e.mark.column + 1,
                                                   ": ", e.msg));
  }
  if (!config.ok()) return config.status();
  if (adjust) adjust(*config);
  return ValidConfig::Validate(*std::move(config));
}

absl::StatusOr<ValidConfig> ParseValidConfigFile(const std::string& path,
                                                 const ConfigAdjustment& adjust,
                                                 bool share_node_by_default) {
  absl::StatusOr<std::string> text = ReadSmallFile(path);
  if (!text.ok()) {
    return absl::NotFoundError(absl::StrCat("config file ", Quote(path), " cannot be read: ",
                                            text.status().message()));
  }
  absl::StatusOr<ValidConfig> config =
      ParseValidConfigString(*text, adjust, share_node_by_default);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

absl::StatusOr<Config> ParseConfigString(std::string_view yaml) {
  MONARCH_ASSIGN_OR_RETURN(ValidConfig config, ParseValidConfigString(yaml));
  return *config;
}

absl::StatusOr<Config> ParseConfigFile(const std::string& path) {
  MONARCH_ASSIGN_OR_RETURN(ValidConfig config, ParseValidConfigFile(path));
  return *config;
}

void RaiseDescriptorLimit() {
  struct rlimit limit;
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_max == RLIM_INFINITY ||
      limit.rlim_cur >= limit.rlim_max) {
    return;
  }
  limit.rlim_cur = limit.rlim_max;
  // Refused only for a hard limit above fs.nr_open, lowered since it was set.
  (void)::setrlimit(RLIMIT_NOFILE, &limit);
}

int DefaultMaxOpenFiles(int descriptor_caches) {
  const uint64_t limit = DescriptorLimit();
  // Left to the program: its own files, sockets and pipes, its libraries'
  // (CUDA, NCCL, MPI), the peers' connections. An eighth of the limit, and
  // at least 1024 descriptors, or half of a limit under 2048 (1024 is a
  // common default).
  const uint64_t headroom = std::max<uint64_t>(limit / 8, std::min<uint64_t>(limit / 2, 1024));
  const uint64_t per_cache = (limit - headroom) / static_cast<uint64_t>(std::max(descriptor_caches, 1));
  return static_cast<int>(std::clamp<uint64_t>(per_cache, 4, kMaxOpenFilesLimit));
}

Config DefaultConfig(const std::string& dataset_dir) {
  // The same text a node service started for it runs; it always parses (the
  // path is quoted, validation comes later).
  absl::StatusOr<Config> config = ParseNode(YAML::Load(DefaultConfigYaml(dataset_dir)));
  if (config.ok()) return *std::move(config);
  Config unparsed;
  unparsed.dataset.path = dataset_dir;
  return unparsed;
}

std::string DefaultConfigYaml(const std::string& dataset_dir) {
  YAML::Emitter out;
  out << YAML::BeginMap << YAML::Key << "dataset" << YAML::Value << YAML::BeginMap
      << YAML::Key << "path" << YAML::Value << YAML::DoubleQuoted << dataset_dir << YAML::EndMap;
  // Half of the node's memory: the same figure for every job on the node,
  // so their embedded defaults have one cache shape and meet in one node
  // service (CacheShapeKey). memory.watch, on by default, lowers the tier
  // whenever the node runs short, so the training processes keep the rest.
  out << YAML::Key << "tiers" << YAML::Value << YAML::BeginSeq;
  out << YAML::Flow << YAML::BeginMap << YAML::Key << "name" << YAML::Value << "ram"
      << YAML::Key << "kind" << YAML::Value << "ram" << YAML::Key << "capacity" << YAML::Value
      << std::max<uint64_t>(PhysicalMemoryBytes() / 2, 1) << YAML::EndMap;
  out << YAML::Flow << YAML::BeginMap << YAML::Key << "name" << YAML::Value << "source"
      << YAML::Key << "kind" << YAML::Value << "source" << YAML::EndMap;
  out << YAML::EndSeq << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace monarch
