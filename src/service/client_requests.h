// ClientRequests: what a node service does for one client connection's
// requests on the instance (its misses, its read order, its hints), and
// `monarch stage`. NodeService (node_service.h) accepts the connection,
// says hello and passes each request here.

#ifndef MONARCH_SERVICE_CLIENT_REQUESTS_H_
#define MONARCH_SERVICE_CLIENT_REQUESTS_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "core/monarch_internal.h"
#include "service/guest_access.h"
#include "service/protocol.h"
#include "service/unix_socket.h"

namespace monarch::service {

// Answers a request with `status` as an error frame.
absl::Status SendError(int socket, const absl::Status& status);

// A client's requests on the instance, on one connection: its misses, its
// read order and its hints (first reads, scans, which copies to map).
class ClientRequests {
 public:
  // `guest`: the grants of the service's guests when this connection is
  // one's (its reads then need them), else null.
  ClientRequests(MonarchCore& core, uint64_t buffer_bytes, GuestAccess* guest)
      : core_(core), buffer_bytes_(buffer_bytes), guest_(guest) {}

  static bool Handles(MessageType type) {
    return type == MessageType::kRead || type == MessageType::kAnnounce ||
           type == MessageType::kConsumed || type == MessageType::kReadAhead ||
           type == MessageType::kCheckedCopies || type == MessageType::kProveAccess;
  }
  // One of them. `transfer` is null before the hello: reads, orders and copy
  // checks need its session; hints come on bare connections too.
  absl::Status Handle(int socket, char* transfer, pid_t pid, const Frame& frame,
                      absl::FunctionRef<void()> mark_announced);

 private:
  // A miss: the bytes go into `transfer`, the connection's buffer.
  absl::Status Read(int socket, char* transfer, pid_t pid, const Frame& frame);

  // A guest's proof that it may read a file; the service's own user needs
  // none, and is answered yes.
  absl::Status ProveAccess(int socket, pid_t pid, const Frame& frame);

  // A piece of the read order; `mark` is called once it is complete, before
  // it is announced (the order is withdrawn when the process leaves).
  absl::Status Announce(int socket, pid_t pid, const Frame& frame,
                        absl::FunctionRef<void()> mark);

  // Files the client started reading.
  absl::Status Consumed(pid_t pid, const Frame& frame);

  absl::Status ReadAhead(const Frame& frame);

  absl::Status CheckedCopies(int socket, const Frame& frame);

  // The longest read order a client may announce, in epochs of the dataset.
  static constexpr uint64_t kMaxAnnouncedEpochs = 100;

  MonarchCore& core_;
  const uint64_t buffer_bytes_;
  GuestAccess* const guest_;
  // The read order this client is sending in pieces (kAnnounce): file ids,
  // or samples inside files.
  std::vector<uint32_t> pending_order_;
  std::vector<FileRange> pending_ranges_;
  bool pending_is_ranges_ = false;

 public:
  std::atomic<uint64_t> misses{0};
  std::atomic<uint64_t> miss_bytes{0};
  std::atomic<uint64_t> source_bytes{0};  // What its misses made the source read.
  // What the prefetch streams fetched for its read order.
  const SourcePayer prefetched = std::make_shared<std::atomic<uint64_t>>(0);
};

// `monarch stage`: promotes the files the request's globs name (all when
// none), answering with progress until every promotion has landed or
// `stopping`.
absl::Status Stage(MonarchCore& core, const std::atomic<bool>& stopping, int socket,
                   const Frame& frame);

}  // namespace monarch::service

#endif  // MONARCH_SERVICE_CLIENT_REQUESTS_H_
