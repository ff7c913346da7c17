// Framed messages over Unix domain sockets, with descriptors (SCM_RIGHTS)
// and the peer's credentials (SO_PEERCRED).

#ifndef MONARCH_SERVICE_UNIX_SOCKET_H_
#define MONARCH_SERVICE_UNIX_SOCKET_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/file_util.h"
#include "service/protocol.h"

namespace monarch::service {

struct Frame {
  MessageType type = MessageType::kError;
  std::string payload;
  std::vector<ScopedFd> fds;
};

// A listening socket at `path` (replacing a stale one), mode 0600; with
// `group`, 0660 and that group's.
absl::StatusOr<ScopedFd> ListenUnix(const std::string& path, int backlog = 128,
                                    std::optional<gid_t> group = std::nullopt);
// NotFound/Unavailable when nothing listens at `path`. With `timeout_seconds`,
// the socket has that I/O timeout (SetIoTimeout), the connect included: a
// service that stopped accepting (its backlog full) cannot hold it up.
absl::StatusOr<ScopedFd> ConnectUnix(const std::string& path, double timeout_seconds = 0);

// Sends one frame (and `fds`, which stay the caller's). Never raises SIGPIPE.
absl::Status SendFrame(int socket, MessageType type, absl::string_view payload,
                       const std::vector<int>& fds = {});
// Receives one frame. Unavailable when the peer closed the connection
// before a frame began; InvalidArgument for a malformed header, more than
// `max_fds` descriptors, or a frame cut short.
absl::StatusOr<Frame> ReceiveFrame(int socket, size_t max_fds = 0);

// A receive, send or connect on `socket` that waits longer than `seconds`
// fails with DeadlineExceeded (SO_RCVTIMEO, SO_SNDTIMEO); 0: they wait for
// ever.
absl::Status SetIoTimeout(int socket, double seconds);

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // Supplementary (SO_PEERGROUPS), as at connect().
  bool InGroup(gid_t group) const;
};
absl::StatusOr<PeerCredentials> GetPeerCredentials(int socket);

// Sends a request and waits for its reply; an Error reply becomes its status.
absl::StatusOr<Frame> Call(int socket, MessageType type, absl::string_view payload,
                           size_t max_fds = 0);

}  // namespace monarch::service

#endif  // MONARCH_SERVICE_UNIX_SOCKET_H_
