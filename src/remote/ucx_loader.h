// UcxApi: the UCX functions the peer layer calls, resolved at run time.
//
// Monarch does not link UCX. A single-node job (no `remote:` in the config)
// never touches it, so the library, the `monarch` binary and the Python
// wheel load on a node that has no UCX at all. UCX is not bundled into the
// wheel either: it loads its transports as plugins from its own module
// directory (<libdir>/ucx/libuct_*.so), matched to the node's network
// drivers, so a copy renamed into a wheel would find none or the wrong
// ones. Peers use the system's UCX, which LoadUcx() opens
// (dlopen("libucp.so.0"), found the way the dynamic loader finds any
// library: LD_LIBRARY_PATH, then the system's directories).
//
// peer_network.cc calls UCX only through this table; the UCX headers are
// still needed to compile it (libucx-dev), and the function types come from
// them, so a signature that changes in the headers changes here too.
//
// Lifetime: the table and the library it points into live until the
// process exits (UCX is never unloaded: it installs memory hooks and exit
// handlers). Thread-safe: LoadUcx may be called from any thread; the first
// call loads, every later one returns the same result, a failure included
// (the loader's search path is fixed when the process starts).

#ifndef MONARCH_REMOTE_UCX_LOADER_H_
#define MONARCH_REMOTE_UCX_LOADER_H_

#include <ucp/api/ucp.h>

#include "absl/status/statusor.h"

namespace monarch {

// Every UCX function peer_network.cc calls, once. ucp_init is not among
// them: it is an inline wrapper in ucp.h (see UcxApi::Init).
#define MONARCH_UCX_FUNCTIONS(X)    \
  X(ucp_am_recv_data_nbx)           \
  X(ucp_am_send_nbx)                \
  X(ucp_cleanup)                    \
  X(ucp_config_modify)              \
  X(ucp_config_read)                \
  X(ucp_config_release)             \
  X(ucp_ep_close_nbx)               \
  X(ucp_ep_create)                  \
  X(ucp_init_version)               \
  X(ucp_mem_map)                    \
  X(ucp_mem_unmap)                  \
  X(ucp_request_check_status)       \
  X(ucp_request_free)               \
  X(ucp_worker_arm)                 \
  X(ucp_worker_create)              \
  X(ucp_worker_destroy)             \
  X(ucp_worker_get_address)         \
  X(ucp_worker_get_efd)             \
  X(ucp_worker_progress)            \
  X(ucp_worker_release_address)     \
  X(ucp_worker_set_am_recv_handler) \
  X(ucs_status_string)

struct UcxApi {
#define MONARCH_UCX_POINTER(name) decltype(&::name) name = nullptr;
  MONARCH_UCX_FUNCTIONS(MONARCH_UCX_POINTER)
#undef MONARCH_UCX_POINTER

  // What ucp.h's inline ucp_init does: ucp_init_version with the API
  // version of the headers Monarch was compiled against.
  ucs_status_t Init(const ucp_params_t* params, const ucp_config_t* config,
                    ucp_context_h* context) const {
    return ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, params, config, context);
  }
};

// The loaded table, or FailedPrecondition naming the config key
// (remote.enabled), what could not be loaded and how to provide it: the
// system's UCX (e.g. Debian's libucx0) or LD_LIBRARY_PATH.
absl::StatusOr<const UcxApi*> LoadUcx();

}  // namespace monarch

#endif  // MONARCH_REMOTE_UCX_LOADER_H_
