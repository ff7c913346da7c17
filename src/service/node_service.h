// NodeService: one Monarch per node, serving every process of the job.
//
// The service owns the instance (namespace, tiers, placement, peers) and
// publishes what clients need to serve hits themselves, without a message:
//   - the namespace image (service/namespace_image.h), read-only;
//   - the tier slots: per file, the index of the tier holding it, written
//     only by the service, mapped read-only by clients;
//   - the RAM tier's slot table and arena memfds, mapped read-only.
// Misses come over the Unix socket, one connection per client thread at a
// time: the client sends (file id, offset, length), the service reads
// through the instance's read path into that connection's transfer buffer
// (shared memory) and answers the byte count. So concurrent first reads of
// a file from any process share one promotion and one source read.
//
// Threads: one accepting connections (and watching the idle timer), one per
// connection. A connection's thread ends when its client goes away; what a
// dead client had asked for completes normally (nothing is reserved on a
// client's behalf), and its counters are folded into the departed totals.
//
// Only this user's processes get in: every connection's SO_PEERCRED uid
// must be the service's, others are refused and logged. With
// node.share_with_group, the group's members get in too, as guests, who
// read only files they proved they may open (guest_access.h).

#ifndef MONARCH_SERVICE_NODE_SERVICE_H_
#define MONARCH_SERVICE_NODE_SERVICE_H_

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/file_util.h"
#include "common/mutex.h"
#include "common/shutdown.h"
#include "common/shared_memory.h"
#include "monarch/config.h"
#include "core/monarch_internal.h"
#include "service/client_ledger.h"
#include "service/guest_access.h"
#include "service/protocol.h"
#include "service/runtime.h"
#include "service/unix_socket.h"

namespace monarch {
class MetricsHttpServer;
}

namespace monarch::service {

struct ServeOptions {
  // Bytes of each connection's transfer buffer: the largest piece of a miss
  // answered in one round trip. Sparse: untouched pages cost nothing.
  uint64_t buffer_bytes = 8u << 20;
  // Test hook: wrap the tiers' drivers (fault injection).
  DriverWrapper wrap;
};

class NodeService {
 public:
  // Takes the runtime directory's lock, builds the instance, publishes the
  // shared regions and starts listening. FailedPrecondition if a service
  // already runs there.
  static absl::StatusOr<std::unique_ptr<NodeService>> Start(const ValidConfig& config,
                                                            const ServeOptions& options = {});
  // Stops if Stop() was not called. A service that did not stop cleanly
  // (stopped_cleanly()) must be abandoned (common/shutdown.h) instead:
  // destroying it would join a thread that may never return.
  ~NodeService();

  // Returns once the service was asked to stop (a Stop message, Stop(), or
  // node.idle_exit after the last client) and has stopped. Bounded: the
  // instance's shutdown (Monarch::Shutdown), then a few seconds for the
  // connections' threads; one still inside a read that has not returned is
  // logged and left behind.
  void Wait();
  // Whether the service has stopped with no thread left behind.
  bool stopped_cleanly();
  // Asks the service to stop; async-signal-safe (a write to an eventfd).
  void RequestStop();

  const ServicePaths& paths() const { return paths_; }
  int metrics_port() const;
  // The node's counters: the instance's plus what clients served themselves.
  StatsReply NodeStats();

 private:
  struct Connection;

  NodeService(const ValidConfig& config, const ServeOptions& options, ServicePaths paths);
  absl::Status Init(ScopedFd lock);
  void AcceptLoop();
  void Serve(Connection* connection);
  absl::Status Handshake(Connection* connection, const Frame& hello);
  StatusReply Status();
  ClientLedger::Tally Tally();
  void Shutdown();
  void ReapFinished() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ValidConfig config_;
  const ServeOptions options_;
  const ServicePaths paths_;
  const std::chrono::steady_clock::time_point started_;
  uint64_t instance_id_ = 0;
  std::string dataset_key_;  // DatasetKey() of config_: what clients must have.

  ScopedFd lock_;
  ScopedFd listen_;
  ScopedFd stop_event_;  // eventfd: RequestStop() writes, the accept loop polls.
  ScopedFd image_fd_;
  ScopedFd tier_slots_fd_;
  MappedRegion tier_slots_;
  std::unique_ptr<MonarchCore> core_;  // After the regions it points into.
  std::unique_ptr<GuestAccess> guests_;  // With node.share_with_group; after core_.
  std::unique_ptr<MetricsHttpServer> metrics_;

  Mutex mu_;
  CondVar stopped_cv_;
  std::list<std::unique_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
  // Open connections per client process, and the processes that announced a
  // read order: it is withdrawn when the last of their connections closes.
  absl::flat_hash_map<pid_t, int> connections_per_pid_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<pid_t> announced_pids_ ABSL_GUARDED_BY(mu_);
  // What clients read, those gone included, so node totals never go down.
  ClientLedger ledger_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool left_behind_ ABSL_GUARDED_BY(mu_) = false;  // A connection's thread did not end.
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> refused_{0};
  std::thread accept_thread_;
};

}  // namespace monarch::service

#endif  // MONARCH_SERVICE_NODE_SERVICE_H_
