// The public entry points (Monarch::Create*): an instance in this process
// (src/core), or with node.shared a client of the node's service
// (src/service). Above both layers, so that the service can be built on the
// in-process instance without the instance knowing about the service.

#include "monarch/monarch.h"

#include "common/status_macros.h"
#include "config/valid_config.h"
#include "core/monarch_internal.h"
#include "service/client.h"

namespace monarch {
namespace {

// With node.shared, a process is a client of its node's service
// (src/service/client.h); the service needs the config as YAML to be
// started on demand, which only the YAML entry points have.
absl::StatusOr<std::unique_ptr<Monarch>> CreateValid(const ValidConfig& config,
                                                     const service::ConfigSource& source) {
  RaiseDescriptorLimit();  // The budget of placement.max_open_files counts on it.
  if (config->node.shared) return service::ConnectToNodeService(config, source);
  MONARCH_ASSIGN_OR_RETURN(std::unique_ptr<MonarchCore> core, CreateMonarchCore(config, {}));
  return std::unique_ptr<Monarch>(std::move(core));
}

}  // namespace

// Each entry point validates once; what it builds takes the ValidConfig.
absl::StatusOr<std::unique_ptr<Monarch>> Monarch::Create(const Config& config) {
  MONARCH_ASSIGN_OR_RETURN(ValidConfig valid, ValidConfig::Validate(config));
  return CreateValid(valid, service::ConfigSource{});
}

absl::StatusOr<std::unique_ptr<Monarch>> Monarch::CreateFromYamlFile(const std::string& path,
                                                                     bool share_node_by_default) {
  MONARCH_ASSIGN_OR_RETURN(ValidConfig valid,
                           ParseValidConfigFile(path, nullptr, share_node_by_default));
  return CreateValid(valid, service::ConfigSource{path, ""});
}

absl::StatusOr<std::unique_ptr<Monarch>> Monarch::CreateFromYamlString(std::string_view yaml,
                                                                       bool share_node_by_default) {
  MONARCH_ASSIGN_OR_RETURN(ValidConfig valid,
                           ParseValidConfigString(yaml, nullptr, share_node_by_default));
  return CreateValid(valid, service::ConfigSource{"", std::string(yaml)});
}

}  // namespace monarch
