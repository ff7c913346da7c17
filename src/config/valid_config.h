// ValidConfig: a Config that has passed ValidateConfig().
//
// Only the parser and Validate() make one, so a constructor that takes it
// (the instance, the node service, a node-service client) knows the config
// is whole and in range without checking it again, and cannot be handed an
// unchecked one. Validation runs once, at the entry point: Monarch::Create*,
// `monarch serve`, the preload library.
//
// A value type; immutable; thread-safe to share.

#ifndef MONARCH_CONFIG_VALID_CONFIG_H_
#define MONARCH_CONFIG_VALID_CONFIG_H_

#include <functional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/statusor.h"
#include "monarch/config.h"

namespace monarch {

class ValidConfig {
 public:
  // `config` if ValidateConfig() accepts it; its error otherwise.
  static absl::StatusOr<ValidConfig> Validate(Config config);

  const Config& get() const { return config_; }
  const Config& operator*() const { return config_; }
  const Config* operator->() const { return &config_; }

 private:
  explicit ValidConfig(Config config) : config_(std::move(config)) {}
  Config config_;
};

// Raises this process's soft RLIMIT_NOFILE to its hard limit, which
// DefaultMaxOpenFiles() and ValidateConfig() count on. Called where an
// instance or a node service starts, never by building a config.
void RaiseDescriptorLimit();

// Changes a parsed config before it is validated (the preload library makes
// every config a node-service client's).
using ConfigAdjustment = std::function<void(Config&)>;

// ParseConfigString / ParseConfigFile, validated once (after `adjust`).
// `share_node_by_default`: node.shared is true unless the YAML sets it.
absl::StatusOr<ValidConfig> ParseValidConfigString(std::string_view yaml,
                                                   const ConfigAdjustment& adjust = nullptr,
                                                   bool share_node_by_default = false);
absl::StatusOr<ValidConfig> ParseValidConfigFile(const std::string& path,
                                                 const ConfigAdjustment& adjust = nullptr,
                                                 bool share_node_by_default = false);

// DefaultConfig(dataset_dir) as YAML text: what a node service started for
// a process opened on the embedded default must run.
std::string DefaultConfigYaml(const std::string& dataset_dir);

}  // namespace monarch

#endif  // MONARCH_CONFIG_VALID_CONFIG_H_
