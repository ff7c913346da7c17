// Config: YAML parsing and whole-config validation.
//
// Every error is one InvalidArgument message that starts with the offending
// key's path ("tiers[1].capacity: ...") and says what was expected.

#include "common/os.h"
#include "monarch/config.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
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
#include "common/file_util.h"
#include "common/status_macros.h"
#include "metadata/file_regex.h"
#include "remote/bootstrap.h"
#include "yaml-cpp/yaml.h"

namespace monarch {
namespace {

// Limits that keep a hostile or broken config from costing minutes and GiBs.
constexpr size_t kMaxConfigBytes = 1 << 20;
constexpr size_t kMaxTiers = 16;
constexpr size_t kMaxQuotedChars = 200;
constexpr int64_t kMaxOpenFilesLimit = 1000000;

// node.runtime_dir holds the service's socket, "<dir>/monarch.sock", and a
// Unix socket address has room for 107 characters (sun_path is 108 bytes
// with the terminating NUL). 80 leaves that suffix and some slack.
constexpr size_t kMaxRuntimeDirChars = 80;

std::string Quote(absl::string_view value) { return QuoteForError(value); }

absl::Status KeyError(absl::string_view key, absl::string_view what) {
  // Keys come from the config too: an unknown one is quoted as a value is.
  const std::string shown =
      key.size() <= kMaxQuotedChars ? std::string(key) : Quote(key);
  return absl::InvalidArgumentError(absl::StrCat(shown, ": ", what));
}

std::string Describe(const YAML::Node& node) {
  if (node.IsScalar()) return Quote(node.Scalar());
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  return "nothing";
}

// Refuses keys outside `allowed`, so a typo never silently means "default".
absl::Status CheckKeys(const YAML::Node& map, absl::string_view where,
                       std::initializer_list<absl::string_view> allowed) {
  std::vector<std::string> seen;
  for (const auto& item : map) {
    const std::string key = item.first.as<std::string>();
    std::string path = where.empty() ? key : absl::StrCat(where, ".", key);
    // yaml-cpp keeps every duplicate and answers lookups with the first: a
    // second value would be silently ignored.
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
      return KeyError(path, "given more than once; keep one");
    }
    seen.push_back(key);
    bool known = false;
    for (absl::string_view a : allowed) known = known || key == a;
    if (!known) {
      return KeyError(path,
                      absl::StrCat("unknown key; expected one of: ", absl::StrJoin(allowed, ", ")));
    }
  }
  return absl::OkStatus();
}

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

// "30s", "500ms", "2m", or a bare number of seconds. Zero only where
// `allow_zero` says it means something (e.g. node.idle_exit: never).
absl::StatusOr<double> GetDuration(const YAML::Node& node, absl::string_view key,
                                   bool allow_zero = false) {
  const std::string expected = "expected a duration such as 30s, 500ms or 2m";
  if (!node.IsScalar()) return KeyError(key, absl::StrCat(expected, ", got ", Describe(node)));
  std::string text(absl::StripAsciiWhitespace(node.Scalar()));
  double scale = 1;
  for (auto [suffix, factor] : {std::pair<const char*, double>{"ms", 1e-3}, {"s", 1}, {"m", 60}}) {
    if (absl::EndsWith(text, suffix)) {
      text.resize(text.size() - strlen(suffix));
      scale = factor;
      break;
    }
  }
  double value;
  if (!absl::SimpleAtod(absl::StripAsciiWhitespace(text), &value) || !std::isfinite(value) ||
      value < 0 || (value == 0 && !allow_zero)) {
    return KeyError(key, absl::StrCat(expected, ", got ", Describe(node)));
  }
  return value * scale;
}

absl::Status ParseRemote(const YAML::Node& remote, RemoteConfig* out) {
  if (!remote.IsMap())
    return KeyError("remote", absl::StrCat("expected a mapping, got ", Describe(remote)));
  MONARCH_RETURN_IF_ERROR(
      CheckKeys(remote, "remote",
                {"enabled", "rank", "size", "bootstrap", "rendezvous_dir", "rendezvous_timeout",
                 "transports", "buffer_size", "chunk_size", "request_timeout", "retry_after",
                 "replicas"}));
  if (remote["enabled"]) {
    MONARCH_ASSIGN_OR_RETURN(out->enabled, GetBool(remote["enabled"], "remote.enabled"));
  }
  if (remote["rank"]) {
    MONARCH_ASSIGN_OR_RETURN(out->rank, GetString(remote["rank"], "remote.rank"));
  }
  if (remote["size"]) {
    MONARCH_ASSIGN_OR_RETURN(out->size, GetString(remote["size"], "remote.size"));
  }
  if (remote["bootstrap"]) {
    MONARCH_ASSIGN_OR_RETURN(out->bootstrap, GetString(remote["bootstrap"], "remote.bootstrap"));
  }
  if (remote["rendezvous_dir"]) {
    MONARCH_ASSIGN_OR_RETURN(out->rendezvous_dir,
                             GetString(remote["rendezvous_dir"], "remote.rendezvous_dir"));
  }
  if (remote["rendezvous_timeout"]) {
    MONARCH_ASSIGN_OR_RETURN(
        out->rendezvous_timeout_seconds,
        GetDuration(remote["rendezvous_timeout"], "remote.rendezvous_timeout"));
  }
  if (remote["transports"]) {
    MONARCH_ASSIGN_OR_RETURN(out->transports, GetString(remote["transports"], "remote.transports"));
  }
  if (const YAML::Node buffer = remote["buffer_size"]) {
    if (buffer.IsScalar() && buffer.Scalar() == "auto") {
      out->buffer_bytes = 0;
    } else {
      absl::StatusOr<uint64_t> bytes = GetSize(buffer, "remote.buffer_size");
      if (!bytes.ok()) {
        return KeyError(
            "remote.buffer_size",
            absl::StrCat("expected 'auto' or a size such as 4MiB, got ", Describe(buffer)));
      }
      if (*bytes == 0) return KeyError("remote.buffer_size", "expected 'auto' or a non-zero size");
      out->buffer_bytes = *bytes;
    }
  }
  if (remote["chunk_size"]) {
    MONARCH_ASSIGN_OR_RETURN(out->chunk_bytes, GetSize(remote["chunk_size"], "remote.chunk_size"));
  }
  if (remote["request_timeout"]) {
    MONARCH_ASSIGN_OR_RETURN(out->request_timeout_seconds,
                             GetDuration(remote["request_timeout"], "remote.request_timeout"));
  }
  if (remote["retry_after"]) {
    MONARCH_ASSIGN_OR_RETURN(out->retry_after_seconds,
                             GetDuration(remote["retry_after"], "remote.retry_after"));
  }
  if (remote["replicas"]) {
    MONARCH_ASSIGN_OR_RETURN(int64_t replicas, GetInt(remote["replicas"], "remote.replicas"));
    if (replicas < 1 || replicas > RemoteConfig::kMaxReplicas) {
      return KeyError("remote.replicas", absl::StrCat("expected 1 to ", RemoteConfig::kMaxReplicas,
                                                      ", got ", replicas));
    }
    out->replicas = static_cast<int>(replicas);
  }
  return absl::OkStatus();
}

absl::Status ParseNodeSection(const YAML::Node& node, NodeConfig* out) {
  if (!node.IsMap())
    return KeyError("node", absl::StrCat("expected a mapping, got ", Describe(node)));
  MONARCH_RETURN_IF_ERROR(CheckKeys(node, "node",
                                    {"shared", "runtime_dir", "autostart", "idle_exit",
                                     "request_timeout", "start_timeout", "metrics_port"}));
  if (node["shared"]) {
    MONARCH_ASSIGN_OR_RETURN(out->shared, GetBool(node["shared"], "node.shared"));
  }
  if (node["runtime_dir"]) {
    MONARCH_ASSIGN_OR_RETURN(out->runtime_dir, GetString(node["runtime_dir"], "node.runtime_dir"));
  }
  if (node["autostart"]) {
    MONARCH_ASSIGN_OR_RETURN(out->autostart, GetBool(node["autostart"], "node.autostart"));
  }
  if (const YAML::Node idle = node["idle_exit"]) {
    absl::StatusOr<double> seconds = GetDuration(idle, "node.idle_exit", /*allow_zero=*/true);
    if (!seconds.ok()) {
      return KeyError("node.idle_exit",
                      absl::StrCat("expected a duration such as 300s or 10m, or 0 for never; got ",
                                   Describe(idle)));
    }
    out->idle_exit_seconds = *seconds;
  }
  if (node["request_timeout"]) {
    MONARCH_ASSIGN_OR_RETURN(out->request_timeout_seconds,
                             GetDuration(node["request_timeout"], "node.request_timeout"));
  }
  if (node["start_timeout"]) {
    MONARCH_ASSIGN_OR_RETURN(out->start_timeout_seconds,
                             GetDuration(node["start_timeout"], "node.start_timeout"));
  }
  if (node["metrics_port"]) {
    MONARCH_ASSIGN_OR_RETURN(int64_t port, GetInt(node["metrics_port"], "node.metrics_port"));
    if (port < 0 || port > 65535) {
      return KeyError("node.metrics_port",
                      absl::StrCat("expected 0 (no endpoint) to 65535, got ", port));
    }
    out->metrics_port = static_cast<int>(port);
  }
  return absl::OkStatus();
}

// "auto", "env:NAME" or a non-negative integer.
bool IsRankSpec(const std::string& spec) {
  int64_t value;
  if (spec == "auto") return true;
  if (absl::StartsWith(spec, "env:")) return spec.size() > 4;
  return absl::SimpleAtoi(spec, &value) && value >= 0;
}

absl::StatusOr<TierKind> ParseTierKind(const YAML::Node& node, absl::string_view key) {
  MONARCH_ASSIGN_OR_RETURN(std::string kind, GetString(node, key));
  if (kind == "ram") return TierKind::kRam;
  if (kind == "pmem") return TierKind::kPmem;
  if (kind == "posix") return TierKind::kPosix;
  if (kind == "source") return TierKind::kSource;
  return KeyError(key, absl::StrCat("expected one of ram, pmem, posix, source; got ", Quote(kind)));
}

// The soft RLIMIT_NOFILE, raised to the hard limit the first time. A hard
// limit of "unlimited" is capped by the kernel at fs.nr_open, which a
// soft limit may not exceed either.
uint64_t RaisedDescriptorLimit() {
  static std::once_flag raised;
  std::call_once(raised, [] {
    struct rlimit limit;
    if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
    rlim_t target = limit.rlim_max;
    if (target == RLIM_INFINITY) {
      target = 1048576;  // The kernel's default fs.nr_open.
      absl::StatusOr<std::string> text = ReadSmallFile("/proc/sys/fs/nr_open");
      uint64_t nr_open = 0;
      if (text.ok() && absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &nr_open) &&
          nr_open > 0) {
        target = static_cast<rlim_t>(nr_open);
      }
    }
    if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur >= target) return;
    limit.rlim_cur = target;
    // Refused (a hard limit above fs.nr_open): the budget then fits the
    // soft limit as it is.
    (void)::setrlimit(RLIMIT_NOFILE, &limit);
  });
  struct rlimit limit;
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 1024;
  return limit.rlim_cur == RLIM_INFINITY ? 1048576 : static_cast<uint64_t>(limit.rlim_cur);
}

// The descriptor caches a config's instance keeps: one per file tier, one
// for the source.
int DescriptorCaches(const Config& config) {
  int caches = 0;
  for (const TierConfig& tier : config.tiers) {
    if (tier.kind == TierKind::kPmem || tier.kind == TierKind::kPosix ||
        tier.kind == TierKind::kSource) {
      ++caches;
    }
  }
  return std::max(caches, 1);
}

absl::StatusOr<Config> ParseNode(const YAML::Node& root) {
  Config config;
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: expected a mapping with keys dataset, tiers, placement, prefetch, "
                     "remote, node, logging; got ",
                     Describe(root)));
  }
  MONARCH_RETURN_IF_ERROR(
      CheckKeys(root, "", {"dataset", "tiers", "placement", "prefetch", "remote", "node", "logging"}));

  const YAML::Node dataset = root["dataset"];
  if (!dataset) return KeyError("dataset", "required (a mapping with 'path')");
  if (!dataset.IsMap())
    return KeyError("dataset", absl::StrCat("expected a mapping, got ", Describe(dataset)));
  MONARCH_RETURN_IF_ERROR(
      CheckKeys(dataset, "dataset", {"path", "file_regex", "scan_threads", "symlinks", "manifest"}));
  if (!dataset["path"])
    return KeyError("dataset.path", "required: the dataset directory on the source");
  MONARCH_ASSIGN_OR_RETURN(config.dataset.path, GetString(dataset["path"], "dataset.path"));
  if (dataset["file_regex"]) {
    MONARCH_ASSIGN_OR_RETURN(config.dataset.file_regex,
                             GetString(dataset["file_regex"], "dataset.file_regex"));
  }
  if (dataset["scan_threads"]) {
    MONARCH_ASSIGN_OR_RETURN(int64_t threads,
                             GetInt(dataset["scan_threads"], "dataset.scan_threads"));
    if (threads < 1 || threads > 256) {
      return KeyError("dataset.scan_threads", absl::StrCat("expected 1 to 256, got ", threads));
    }
    config.dataset.scan_threads = static_cast<int>(threads);
  }
  if (dataset["symlinks"]) {
    MONARCH_ASSIGN_OR_RETURN(config.dataset.symlinks,
                             GetString(dataset["symlinks"], "dataset.symlinks"));
  }
  if (dataset["manifest"]) {
    MONARCH_ASSIGN_OR_RETURN(config.dataset.manifest,
                             GetString(dataset["manifest"], "dataset.manifest"));
  }

  const YAML::Node tiers = root["tiers"];
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
    MONARCH_RETURN_IF_ERROR(CheckKeys(
        t, where, {"name", "kind", "path", "capacity", "write_mode", "huge_pages"}));
    TierConfig tier;
    if (!t["kind"])
      return KeyError(absl::StrCat(where, ".kind"), "required: ram, pmem, posix or source");
    MONARCH_ASSIGN_OR_RETURN(tier.kind, ParseTierKind(t["kind"], absl::StrCat(where, ".kind")));
    tier.name = TierKindName(tier.kind);
    if (t["name"]) {
      MONARCH_ASSIGN_OR_RETURN(tier.name, GetString(t["name"], absl::StrCat(where, ".name")));
    }
    if (t["path"]) {
      MONARCH_ASSIGN_OR_RETURN(tier.path, GetString(t["path"], absl::StrCat(where, ".path")));
    }
    if (t["capacity"]) {
      MONARCH_ASSIGN_OR_RETURN(tier.capacity_bytes,
                               GetSize(t["capacity"], absl::StrCat(where, ".capacity")));
    }
    if (const YAML::Node mode = t["write_mode"]) {
      const std::string key = absl::StrCat(where, ".write_mode");
      if (tier.kind != TierKind::kPosix) {
        return KeyError(key, absl::StrCat("only a posix tier has a write mode, not a ",
                                          TierKindName(tier.kind), " tier; remove this key"));
      }
      MONARCH_ASSIGN_OR_RETURN(std::string text, GetString(mode, key));
      if (text == "auto") {
        tier.write_mode = WriteMode::kAuto;
      } else if (text == "buffered") {
        tier.write_mode = WriteMode::kBuffered;
      } else if (text == "direct") {
        tier.write_mode = WriteMode::kDirect;
      } else {
        return KeyError(key, absl::StrCat("expected auto, buffered or direct, got ", Quote(text)));
      }
    }
    if (const YAML::Node huge = t["huge_pages"]) {
      const std::string key = absl::StrCat(where, ".huge_pages");
      if (tier.kind != TierKind::kRam) {
        return KeyError(key, absl::StrCat("only a ram tier has huge pages, not a ",
                                          TierKindName(tier.kind), " tier; remove this key"));
      }
      MONARCH_ASSIGN_OR_RETURN(tier.huge_pages, GetBool(huge, key));
    }
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
    config.tiers.push_back(std::move(tier));
  }

  bool max_open_files_given = false;
  if (const YAML::Node placement = root["placement"]) {
    if (!placement.IsMap())
      return KeyError("placement", absl::StrCat("expected a mapping, got ", Describe(placement)));
    if (placement["idle_priority"]) {
      return KeyError("placement.idle_priority",
                      "no longer supported: placement threads run at normal priority, and "
                      "readers write the chunks they loaded themselves when staging memory is "
                      "over placement.max_staging_bytes; remove this key");
    }
    MONARCH_RETURN_IF_ERROR(CheckKeys(placement, "placement",
                                      {"threads", "policy", "max_staging_bytes", "chunk_bytes",
                                       "max_open_files", "verify", "shutdown_timeout"}));
    if (placement["threads"]) {
      MONARCH_ASSIGN_OR_RETURN(int64_t threads, GetInt(placement["threads"], "placement.threads"));
      if (threads < 0 || threads > 1024) {
        return KeyError("placement.threads",
                        absl::StrCat("expected 0 (half the cores) to 1024, got ", threads));
      }
      config.placement.threads = static_cast<int>(threads);
    }
    if (placement["policy"]) {
      MONARCH_ASSIGN_OR_RETURN(config.placement.policy,
                               GetString(placement["policy"], "placement.policy"));
    }
    if (placement["max_staging_bytes"]) {
      MONARCH_ASSIGN_OR_RETURN(
          config.placement.max_staging_bytes,
          GetSize(placement["max_staging_bytes"], "placement.max_staging_bytes"));
    }
    if (placement["chunk_bytes"]) {
      MONARCH_ASSIGN_OR_RETURN(config.placement.chunk_bytes,
                               GetSize(placement["chunk_bytes"], "placement.chunk_bytes"));
    }
    if (const YAML::Node files = placement["max_open_files"];
        files && !(files.IsScalar() && files.Scalar() == "auto")) {
      MONARCH_ASSIGN_OR_RETURN(int64_t value, GetInt(files, "placement.max_open_files"));
      if (value < 4 || value > kMaxOpenFilesLimit) {
        return KeyError("placement.max_open_files",
                        absl::StrCat("expected auto or 4 to ", kMaxOpenFilesLimit, ", got ", value));
      }
      config.placement.max_open_files = static_cast<int>(value);
      max_open_files_given = true;
    }
    if (placement["shutdown_timeout"]) {
      MONARCH_ASSIGN_OR_RETURN(
          config.placement.shutdown_timeout_seconds,
          GetDuration(placement["shutdown_timeout"], "placement.shutdown_timeout",
                      /*allow_zero=*/true));
    }
    if (placement["verify"]) {
      MONARCH_ASSIGN_OR_RETURN(config.placement.verify,
                               GetString(placement["verify"], "placement.verify"));
    }
  }
  // Derived for this config's caches: the struct's default assumes four.
  if (!max_open_files_given) {
    config.placement.max_open_files = DefaultMaxOpenFiles(DescriptorCaches(config));
  }
  if (const YAML::Node prefetch = root["prefetch"]) {
    if (!prefetch.IsMap())
      return KeyError("prefetch", absl::StrCat("expected a mapping, got ", Describe(prefetch)));
    MONARCH_RETURN_IF_ERROR(CheckKeys(prefetch, "prefetch", {"streams", "lookahead"}));
    if (prefetch["streams"]) {
      MONARCH_ASSIGN_OR_RETURN(int64_t streams, GetInt(prefetch["streams"], "prefetch.streams"));
      if (streams < 0 || streams > 256) return KeyError("prefetch.streams", "expected 0 to 256");
      config.prefetch.streams = static_cast<int>(streams);
    }
    if (prefetch["lookahead"]) {
      MONARCH_ASSIGN_OR_RETURN(config.prefetch.lookahead_bytes,
                               GetSize(prefetch["lookahead"], "prefetch.lookahead"));
    }
  }
  if (const YAML::Node remote = root["remote"]) {
    MONARCH_RETURN_IF_ERROR(ParseRemote(remote, &config.remote));
  }
  if (const YAML::Node node = root["node"]) {
    MONARCH_RETURN_IF_ERROR(ParseNodeSection(node, &config.node));
  }
  if (const YAML::Node logging = root["logging"]) {
    if (!logging.IsMap())
      return KeyError("logging", absl::StrCat("expected a mapping, got ", Describe(logging)));
    MONARCH_RETURN_IF_ERROR(CheckKeys(logging, "logging", {"level"}));
    if (logging["level"]) {
      MONARCH_ASSIGN_OR_RETURN(config.logging.level, GetString(logging["level"], "logging.level"));
    }
  }
  MONARCH_RETURN_IF_ERROR(ValidateConfig(config));
  return config;
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

const char* TierKindName(TierKind kind) {
  switch (kind) {
    case TierKind::kRam:
      return "ram";
    case TierKind::kPmem:
      return "pmem";
    case TierKind::kPosix:
      return "posix";
    case TierKind::kSource:
      return "source";
    case TierKind::kPeers:
      return "peers";
  }
  return "unknown";
}

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

static absl::Status ValidateRemote(const RemoteConfig& r) {
  if (!r.enabled) return absl::OkStatus();
  for (auto [key, spec] : {std::pair<const char*, const std::string*>{"remote.rank", &r.rank},
                           {"remote.size", &r.size}}) {
    if (!IsRankSpec(*spec)) {
      return KeyError(
          key, absl::StrCat("expected an integer, 'auto' or 'env:VARIABLE', got ", Quote(*spec)));
    }
  }
  int64_t size;
  if (absl::SimpleAtoi(r.size, &size) && size < 1)
    return KeyError("remote.size", "expected at least 1");
  if (r.bootstrap != "directory" && r.bootstrap != "mpi") {
    return KeyError("remote.bootstrap",
                    absl::StrCat("expected 'directory' or 'mpi', got ", Quote(r.bootstrap)));
  }
  if (r.bootstrap == "directory") {
    if (r.rendezvous_dir.empty()) {
      return KeyError("remote.rendezvous_dir",
                      "required with bootstrap 'directory': a directory on a file system every "
                      "peer sees, one per job");
    }
    if (r.rendezvous_dir[0] != '/') {
      return KeyError("remote.rendezvous_dir",
                      absl::StrCat("expected an absolute path, got ", Quote(r.rendezvous_dir)));
    }
  }
  if (r.transports.empty() || r.transports.find_first_not_of(
                                  "abcdefghijklmnopqrstuvwxyz0123456789_,^") != std::string::npos) {
    return KeyError("remote.transports",
                    absl::StrCat("expected a UCX transport list such as 'tcp' or 'rc,ud,sm', got ",
                                 Quote(r.transports)));
  }
  if (r.chunk_bytes < 4096 || r.chunk_bytes > (1ull << 30) || r.chunk_bytes % 4096 != 0) {
    return KeyError("remote.chunk_size", "expected a multiple of 4KiB from 4KiB to 1GiB");
  }
  if (r.buffer_bytes != 0 && (r.buffer_bytes < 4096 || r.buffer_bytes > (1ull << 30))) {
    return KeyError("remote.buffer_size", "expected 'auto' or a size from 4KiB to 1GiB");
  }
  if (!(r.rendezvous_timeout_seconds > 0))
    return KeyError("remote.rendezvous_timeout", "expected a positive duration");
  if (!(r.request_timeout_seconds > 0))
    return KeyError("remote.request_timeout", "expected a positive duration");
  if (!(r.retry_after_seconds > 0))
    return KeyError("remote.retry_after", "expected a positive duration");
  if (r.replicas < 1 || r.replicas > RemoteConfig::kMaxReplicas)
    return KeyError("remote.replicas",
                    absl::StrCat("expected 1 to ", RemoteConfig::kMaxReplicas));
  return absl::OkStatus();
}

// Checked whether or not `shared` is on: the keys mean the same either way,
// and a mistake should not wait until someone turns sharing on.
static absl::Status ValidateNode(const Config& config) {
  const NodeConfig& n = config.node;
  if (!std::isfinite(n.idle_exit_seconds) || n.idle_exit_seconds < 0) {
    return KeyError("node.idle_exit", "expected a finite duration, or 0 for never");
  }
  if (!std::isfinite(n.request_timeout_seconds) || n.request_timeout_seconds < 0.001 ||
      n.request_timeout_seconds > 86400) {
    return KeyError("node.request_timeout", "expected a duration from 1ms to 24h");
  }
  if (!std::isfinite(n.start_timeout_seconds) || n.start_timeout_seconds < 0.001 ||
      n.start_timeout_seconds > 86400) {
    return KeyError("node.start_timeout", "expected a duration from 1ms to 24h");
  }
  if (n.metrics_port < 0 || n.metrics_port > 65535) {
    return KeyError("node.metrics_port",
                    absl::StrCat("expected 0 (no endpoint) to 65535, got ", n.metrics_port));
  }
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
  return absl::OkStatus();
}

absl::StatusOr<std::string> DatasetManifestPath(const DatasetConfig& dataset) {
  MONARCH_ASSIGN_OR_RETURN(std::string path,
                           ExpandEnvironment(dataset.manifest, "dataset.manifest"));
  if (path.empty() || path[0] != '/') {
    return KeyError("dataset.manifest",
                    path == dataset.manifest
                        ? absl::StrCat("expected an absolute path, got ", Quote(path))
                        : absl::StrCat("expected an absolute path, got ", Quote(dataset.manifest),
                                       " (", Quote(path), " after expansion)"));
  }
  return path;
}

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
  // FNV-1a: stable across processes and builds, unlike absl::Hash.
  uint64_t hash = 0xcbf29ce484222325ull;
  for (const std::string* part : std::initializer_list<const std::string*>{
           &root, &dataset.file_regex, &dataset.symlinks, &dataset.manifest}) {
    for (char c : *part) hash = (hash ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
    hash = (hash ^ 0xffu) * 0x100000001b3ull;  // Separator: ("ab","c") != ("a","bc").
  }
  return absl::StrFormat("%016x", hash);
}

std::string BatchJobTag() {
  static constexpr std::pair<const char*, const char*> kSchedulers[] = {
      {"SLURM_JOB_ID", "slurm"}, {"PBS_JOBID", "pbs"}, {"LSB_JOBID", "lsf"},
      {"FLUX_JOB_ID", "flux"}};
  for (const auto& [variable, scheduler] : kSchedulers) {
    const char* id = std::getenv(variable);
    if (id == nullptr || id[0] == '\0') continue;
    std::string tag = absl::StrCat(scheduler, "-");
    // A directory name: PBS ids carry the server name ("123.head"), Flux's
    // may be anything.
    for (const char* c = id; *c != '\0' && tag.size() < 40; ++c) {
      tag += absl::ascii_isalnum(static_cast<unsigned char>(*c)) || *c == '.' || *c == '-'
                 ? *c
                 : '_';
    }
    return tag;
  }
  return "";
}

absl::StatusOr<std::string> NodeRuntimeDirectory(const Config& config) {
  const NodeConfig& node = config.node;
  if (node.runtime_dir.empty()) {
    // XDG_RUNTIME_DIR is per user, 0700 and removed when the user's last
    // session ends: the right home for a socket. Batch jobs often lack it.
    const char* xdg = std::getenv("XDG_RUNTIME_DIR");
    std::string base = absl::StrCat("/tmp/monarch-", ::getuid());
    if (xdg != nullptr && xdg[0] == '/') {
      base = xdg;
      while (!base.empty() && base.back() == '/') base.pop_back();
      absl::StrAppend(&base, "/monarch");
    }
    // One service per job and dataset: two jobs on a node, or two datasets
    // of one user, never share (or stop) each other's service.
    const std::string job = BatchJobTag();
    return absl::StrCat(base, "/", job, job.empty() ? "" : "-", DatasetKey(config.dataset));
  }
  MONARCH_ASSIGN_OR_RETURN(std::string dir, ExpandEnvironment(node.runtime_dir, "node.runtime_dir"));
  if (dir.empty() || dir[0] != '/') {
    return KeyError("node.runtime_dir",
                    dir == node.runtime_dir
                        ? absl::StrCat("expected an absolute path, got ", Quote(dir))
                        : absl::StrCat("expected an absolute path, got ", Quote(node.runtime_dir),
                                       " (", Quote(dir), " after expansion)"));
  }
  return dir;
}

absl::Status ValidateConfig(const Config& config) {
  if (config.dataset.path.empty())
    return KeyError("dataset.path", "required: the dataset directory on the source");
  if (config.dataset.scan_threads < 1 || config.dataset.scan_threads > 256) {
    return KeyError("dataset.scan_threads", "expected 1 to 256");
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
      bool another_follows = false;
      for (size_t j = i + 1; j < config.tiers.size(); ++j) {
        another_follows = another_follows || config.tiers[j].kind == TierKind::kSource;
      }
      if (another_follows) {
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
  if (p.threads < 0 || p.threads > 1024)
    return KeyError("placement.threads", "expected 0 (half the cores) to 1024");
  if (p.policy != "first-fit" && p.policy != "lru" && p.policy != "none") {
    return KeyError("placement.policy",
                    absl::StrCat("expected 'first-fit', 'lru' or 'none', got ", Quote(p.policy)));
  }
  // Each peer keeps the files it is home of for the others: never evicted.
  if (p.policy == "lru" && config.remote.enabled) {
    return KeyError("placement.policy", "'lru' is not supported with remote.enabled (peers)");
  }
  if (!std::isfinite(p.shutdown_timeout_seconds) || p.shutdown_timeout_seconds < 0 ||
      p.shutdown_timeout_seconds > 86400) {
    return KeyError("placement.shutdown_timeout", "expected a duration from 0 to 24h");
  }
  if (p.chunk_bytes < 4096 || p.chunk_bytes > (1ull << 30) || p.chunk_bytes % 4096 != 0) {
    return KeyError("placement.chunk_bytes", "expected a multiple of 4KiB from 4KiB to 1GiB");
  }
  if (p.max_open_files < 4 || p.max_open_files > kMaxOpenFilesLimit) {
    return KeyError("placement.max_open_files",
                    absl::StrCat("expected 4 to ", kMaxOpenFilesLimit, ", got ", p.max_open_files));
  }
  // More descriptors than the process may open: reads past the limit would
  // fail with EMFILE, on the source too.
  if (struct rlimit limit; ::getrlimit(RLIMIT_NOFILE, &limit) == 0 &&
                           limit.rlim_cur != RLIM_INFINITY &&
                           static_cast<uint64_t>(p.max_open_files) > limit.rlim_cur) {
    return KeyError("placement.max_open_files",
                    absl::StrCat(p.max_open_files, " is more than the ", limit.rlim_cur,
                                 " descriptors this process may open (RLIMIT_NOFILE, ulimit -n); "
                                 "leave the key out to derive it from the limit"));
  }
  if (config.prefetch.streams < 0 || config.prefetch.streams > 256)
    return KeyError("prefetch.streams", "expected 0 to 256");
  if (config.prefetch.lookahead_bytes == 0)
    return KeyError("prefetch.lookahead", "expected a size of at least one byte, such as 1GiB");
  if (p.verify != "first-read" && p.verify != "every-read" && p.verify != "off") {
    return KeyError("placement.verify", absl::StrCat("expected 'first-read', 'every-read' or "
                                                     "'off', got ",
                                                     Quote(p.verify)));
  }
  const std::string& symlinks = config.dataset.symlinks;
  if (symlinks != "follow" && symlinks != "inside" && symlinks != "skip") {
    return KeyError("dataset.symlinks",
                    absl::StrCat("expected 'follow', 'inside' or 'skip', got ", Quote(symlinks)));
  }
  // Only the path here: whether the file exists and matches the dataset is
  // checked when the namespace is built from it (`monarch manifest` writes
  // it from a config that already names it).
  if (!config.dataset.manifest.empty()) {
    MONARCH_RETURN_IF_ERROR(DatasetManifestPath(config.dataset).status());
  }
  MONARCH_RETURN_IF_ERROR(ValidateRemote(config.remote));
  MONARCH_RETURN_IF_ERROR(ValidateNode(config));
  const std::string& level = config.logging.level;
  if (level != "debug" && level != "info" && level != "warning" && level != "error") {
    return KeyError("logging.level",
                    absl::StrCat("expected debug, info, warning or error; got ", Quote(level)));
  }
  return absl::OkStatus();
}

absl::StatusOr<Config> ParseConfigString(std::string_view yaml) {
  if (yaml.size() > kMaxConfigBytes) {
    return absl::InvalidArgumentError(absl::StrCat("config: ", yaml.size(),
                                                   " bytes; a config larger than ",
                                                   kMaxConfigBytes, " bytes is refused"));
  }
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
    return ParseNode(root);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config: malformed YAML at line ",
                                                   e.mark.line + 1, ", column ", e.mark.column + 1,
                                                   ": ", e.msg));
  }
}

absl::StatusOr<Config> ParseConfigFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadSmallFile(path);
  if (!text.ok()) {
    return absl::NotFoundError(absl::StrCat("config file ", Quote(path), " cannot be read: ",
                                            text.status().message()));
  }
  absl::StatusOr<Config> config = ParseConfigString(*text);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

int DefaultMaxOpenFiles(int descriptor_caches) {
  const uint64_t limit = RaisedDescriptorLimit();
  // Left to the program: its own files, sockets and pipes, its libraries'
  // (CUDA, NCCL, MPI), the peers' connections. An eighth of the limit, and
  // at least 1024 descriptors, or half of a limit under 2048 (1024 is a
  // common default).
  const uint64_t headroom = std::max<uint64_t>(limit / 8, std::min<uint64_t>(limit / 2, 1024));
  const uint64_t per_cache = (limit - headroom) / static_cast<uint64_t>(std::max(descriptor_caches, 1));
  return static_cast<int>(std::clamp<uint64_t>(per_cache, 4, kMaxOpenFilesLimit));
}

Config DefaultConfig(const std::string& dataset_dir) {
  Config config;
  config.dataset.path = dataset_dir;
  TierConfig ram;
  ram.name = "ram";
  ram.kind = TierKind::kRam;
  // Half of what is free now: the training process needs the rest.
  ram.capacity_bytes = std::max<uint64_t>(AvailableMemoryBytes() / 2, 1);
  TierConfig source;
  source.name = "source";
  source.kind = TierKind::kSource;
  config.tiers = {ram, source};
  config.placement.max_open_files = DefaultMaxOpenFiles(DescriptorCaches(config));
  return config;
}

}  // namespace monarch
