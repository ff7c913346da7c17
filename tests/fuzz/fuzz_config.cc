// Fuzz target: the YAML config parser, monarch::ParseConfigString, on
// arbitrary bytes (the corpus holds real configs, so mutations stay close to
// YAML that reaches the deeper keys).
//
// Besides "no crash, no hang, no leak": an error is InvalidArgument with a
// bounded message that names the key it is about (or says "config:" for the
// document as a whole), and an accepted config satisfies what ValidateConfig
// promises, and validates again.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "config/config_keys.h"
#include "fuzz_check.h"
#include "monarch/config.h"

namespace monarch {
namespace {

// Values are quoted up to 200 characters, keys likewise; a message holds at
// most a few of them plus fixed text.
constexpr size_t kMaxMessageBytes = 1024;

bool StartsWithKey(absl::string_view message) {
  if (absl::StartsWith(message, "config: ")) return true;
  // The sections from the config's own table (a list written here missed
  // `prefetch`), and the tier list.
  static const absl::flat_hash_set<absl::string_view>* const sections = [] {
    auto* names = new absl::flat_hash_set<absl::string_view>{"tiers"};
    for (const config_keys::Key<Config>& key : config_keys::SectionKeys()) {
      names->insert(key.section);
    }
    return names;
  }();
  for (absl::string_view section : *sections) {
    if (absl::StartsWith(message, section) && message.size() > section.size() &&
        (message[section.size()] == '.' || message[section.size()] == '[' ||
         message[section.size()] == ':')) {
      return true;
    }
  }
  return false;
}

void CheckError(const absl::Status& status) {
  const absl::string_view message = status.message();
  FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument, status.ToString());
  FUZZ_CHECK(!message.empty(), "an error without a message");
  FUZZ_CHECK(message.size() <= kMaxMessageBytes,
             absl::StrCat(message.size(), " bytes: ", message.substr(0, 300)));
  // A key the config made up (unknown, or given twice) is named as given.
  FUZZ_CHECK(StartsWithKey(message) || absl::StrContains(message, ": unknown key; expected") ||
                 absl::StrContains(message, ": given more than once"),
             absl::StrCat("names no key: ", message.substr(0, 300)));
}

bool Absolute(const std::string& path) { return !path.empty() && path[0] == '/'; }

void CheckConfig(const Config& config) {
  FUZZ_CHECK(Absolute(config.dataset.path), config.dataset.path);
  FUZZ_CHECK(config.dataset.scan_threads >= 1 && config.dataset.scan_threads <= 256,
             absl::StrCat(config.dataset.scan_threads));
  FUZZ_CHECK(!config.tiers.empty() && config.tiers.size() <= 16,
             absl::StrCat(config.tiers.size(), " tiers"));
  FUZZ_CHECK(config.tiers.back().kind == TierKind::kSource, "the last tier is not the source");
  absl::flat_hash_set<std::string> names;
  for (size_t i = 0; i < config.tiers.size(); ++i) {
    const TierConfig& tier = config.tiers[i];
    FUZZ_CHECK(!tier.name.empty() && names.insert(tier.name).second,
               absl::StrCat("tiers[", i, "].name '", tier.name, "'"));
    FUZZ_CHECK(tier.kind != TierKind::kPeers, "a peers tier under tiers:");
    if (tier.kind == TierKind::kSource) {
      FUZZ_CHECK(i + 1 == config.tiers.size(), "a source before the last tier");
      continue;
    }
    FUZZ_CHECK(tier.capacity_bytes > 0, absl::StrCat("tiers[", i, "] has no capacity"));
    if (tier.kind == TierKind::kRam) {
      FUZZ_CHECK(tier.path.empty(), "a ram tier with a path");
    } else {
      FUZZ_CHECK(Absolute(tier.path), tier.path);
    }
  }
  const PlacementConfig& p = config.placement;
  FUZZ_CHECK(p.threads >= 0 && p.threads <= 1024, absl::StrCat(p.threads));
  FUZZ_CHECK(p.policy == PlacementPolicyKind::kFirstFit || p.policy == PlacementPolicyKind::kLru ||
                 p.policy == PlacementPolicyKind::kNone,
             NameOf(p.policy));
  FUZZ_CHECK(p.chunk_bytes >= 4096 && p.chunk_bytes <= (1ull << 30) && p.chunk_bytes % 4096 == 0,
             absl::StrCat(p.chunk_bytes));
  FUZZ_CHECK(p.max_open_files >= 4, absl::StrCat(p.max_open_files));
  const RemoteConfig& r = config.remote;
  if (r.enabled) {
    FUZZ_CHECK(r.bootstrap == BootstrapKind::kDirectory || r.bootstrap == BootstrapKind::kMpi,
               NameOf(r.bootstrap));
    FUZZ_CHECK(r.bootstrap != BootstrapKind::kDirectory || Absolute(r.rendezvous_dir),
               r.rendezvous_dir);
    FUZZ_CHECK(!r.transports.empty(), "no transports");
    FUZZ_CHECK(r.chunk_bytes >= 4096 && r.chunk_bytes <= (1ull << 30) && r.chunk_bytes % 4096 == 0,
               absl::StrCat(r.chunk_bytes));
    FUZZ_CHECK(r.buffer_bytes == 0 || (r.buffer_bytes >= 4096 && r.buffer_bytes <= (1ull << 30)),
               absl::StrCat(r.buffer_bytes));
    FUZZ_CHECK(r.request_timeout_seconds > 0 && r.retry_after_seconds > 0 &&
                   r.rendezvous_timeout_seconds > 0,
               "a duration that is not positive");
  }
  FUZZ_CHECK(std::isfinite(config.node.idle_exit_seconds) && config.node.idle_exit_seconds >= 0,
             absl::StrCat(config.node.idle_exit_seconds));
  FUZZ_CHECK(config.node.metrics_port >= 0 && config.node.metrics_port <= 65535,
             absl::StrCat(config.node.metrics_port));
  const std::string level = NameOf(config.logging.level);
  FUZZ_CHECK(level == "debug" || level == "info" || level == "warning" || level == "error", level);
  // Parsing validated it; validating the result again must agree.
  const absl::Status again = ValidateConfig(config);
  FUZZ_CHECK(again.ok(), again.ToString());
}

void CheckByteSize(std::string_view text) {
  absl::StatusOr<uint64_t> bytes = ParseByteSize(text);
  if (bytes.ok()) {
    FUZZ_CHECK(*bytes < 18000000000000000000ull, absl::StrCat(*bytes));
  } else {
    FUZZ_CHECK(bytes.status().code() == absl::StatusCode::kInvalidArgument,
               bytes.status().ToString());
    FUZZ_CHECK(bytes.status().message().size() <= kMaxMessageBytes,
               absl::StrCat(bytes.status().message().size(), " bytes"));
  }
}

}  // namespace
}  // namespace monarch

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<monarch::Config> config = monarch::ParseConfigString(text);
  if (config.ok()) {
    monarch::CheckConfig(*config);
  } else {
    monarch::CheckError(config.status());
  }
  // The sizes inside a config ("64GiB"), on the same bytes.
  if (size <= 64) monarch::CheckByteSize(text);
  return 0;
}
