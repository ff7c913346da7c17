// Environment variables in config values (remote.rendezvous_dir,
// dataset.manifest, node.runtime_dir): a job script names its scratch space
// through the launcher's variables, e.g. /scratch/$SLURM_JOB_ID.
//
// In common/ rather than with the peers' bootstrap: config validation
// expands the same values, and sits below every layer that uses them.

#ifndef MONARCH_COMMON_ENVIRONMENT_H_
#define MONARCH_COMMON_ENVIRONMENT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace monarch {

// Expands $NAME and ${NAME} from the environment; an unset variable is an
// error naming `key`.
absl::StatusOr<std::string> ExpandEnvironment(const std::string& text, absl::string_view key);

}  // namespace monarch

#endif  // MONARCH_COMMON_ENVIRONMENT_H_
