// The client side of the node service: a Monarch that reads through it.
//
// Monarch::Create* return one of these when the config says node.shared:
// the same public API, served by the node's service (node_service.h).
//
//   - Hits cost no message: the client looks the name up in the shared
//     namespace image, loads the file's tier slot, and reads the copy
//     itself: from the service's RAM arena (mapped read-only), or by
//     opening the posix/pmem copy (bounded descriptor caches, as in the
//     service).
//   - Misses go to the service over the socket, in pieces of the
//     connection's transfer buffer; the service's read path promotes.
//   - A dead service costs no read: its mappings stay valid, complete
//     copies are still read, and the rest comes from the source directly.
//     The client reconnects (at most once a second, starting the service
//     again if node.autostart) and moves to the new service's regions; the
//     old ones stay mapped until the client is destroyed, as readers may
//     still be in them.
//   - fork(): a child starts afresh on its first call (new connections, its
//     own descriptor caches); nothing a parent's thread held is used.
//
// Thread-safe, like every Monarch.

#ifndef MONARCH_SERVICE_CLIENT_H_
#define MONARCH_SERVICE_CLIENT_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "config/valid_config.h"
#include "monarch/config.h"
#include "monarch/monarch.h"

namespace monarch::service {

// Where the config came from: what an auto-started service is given. Both
// empty (a Config built in code): the service must already be running.
struct ConfigSource {
  std::string file;  // A YAML file.
  std::string yaml;  // YAML text.
};

// Connects to the node's service (starting it if node.autostart says so and
// none is running). Errors: FailedPrecondition when no service runs and none
// may be started, or when the running one serves another dataset.
absl::StatusOr<std::unique_ptr<Monarch>> ConnectToNodeService(const ValidConfig& config,
                                                             const ConfigSource& source);

// Whether `monarch` is a node-service client. Such a handle keeps working in
// a child made by fork(): it has no threads, and the child remaps the
// service's shared tables from the inherited descriptors and opens its own
// connections (no config parsing, no handshake). An in-process instance
// does not survive fork (its placement threads stay in the parent).
bool IsServiceClient(const Monarch& monarch);

// For a guest of another user's service (node.share_with_group), proves
// that this process may read dataset file `name`, as its first read would:
// opens it on the source (the kernel's check; its error is returned) and
// passes the descriptor to the service. OK at once for any other Monarch.
// The preload calls it when a program opens a file, so that an open the
// kernel would refuse is refused then, by the kernel, not at a read.
absl::Status ProveAccess(Monarch& monarch, std::string_view name);

}  // namespace monarch::service

#endif  // MONARCH_SERVICE_CLIENT_H_
