// Unix socket framing.

#include "service/unix_socket.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/os.h"
#include "common/status_macros.h"

namespace monarch::service {
namespace {

absl::StatusOr<sockaddr_un> SocketAddress(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path '", path, "' is longer than ", sizeof(address.sun_path) - 1,
                     " bytes"));
  }
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  return address;
}

// Receives exactly `n` bytes (descriptors only with the first ones).
absl::Status ReceiveAll(int socket, char* data, size_t n, std::vector<ScopedFd>* fds,
                        size_t max_fds, bool* got_nothing) {
  size_t done = 0;
  while (done < n) {
    iovec iov{data + done, n - done};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxDescriptors)];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (fds != nullptr) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
    }
    const ssize_t got = ::recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return absl::DeadlineExceededError("timed out waiting for a message");
      }
      return ErrnoToStatus(errno, "receive from the Monarch service socket");
    }
    if (fds != nullptr) {
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
          int fd;
          std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
          fds->emplace_back(fd);  // Owned now, closed if refused below.
        }
      }
      if ((msg.msg_flags & MSG_CTRUNC) != 0 || fds->size() > max_fds) {
        return absl::InvalidArgumentError("message carried more descriptors than expected");
      }
    }
    if (got == 0) {
      if (done == 0 && got_nothing != nullptr) *got_nothing = true;
      return absl::UnavailableError("the connection was closed");
    }
    done += static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ScopedFd> ListenUnix(const std::string& path, int backlog,
                                    std::optional<gid_t> group) {
  MONARCH_ASSIGN_OR_RETURN(sockaddr_un address, SocketAddress(path));
  ScopedFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoToStatus(errno, "socket");
  os::Unlink(path.c_str());  // A stale socket of a dead service; the caller holds the lock.
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("bind ", path));
  }
  if (group && os::Chown(path.c_str(), static_cast<uid_t>(-1), *group) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("give ", path, " to group ", *group));
  }
  if (os::Chmod(path.c_str(), group ? 0660 : 0600) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("chmod ", path));
  }
  if (::listen(fd.get(), backlog) != 0) return ErrnoToStatus(errno, absl::StrCat("listen ", path));
  return fd;
}

absl::StatusOr<ScopedFd> ConnectUnix(const std::string& path, double timeout_seconds) {
  MONARCH_ASSIGN_OR_RETURN(sockaddr_un address, SocketAddress(path));
  ScopedFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoToStatus(errno, "socket");
  if (timeout_seconds > 0) MONARCH_RETURN_IF_ERROR(SetIoTimeout(fd.get(), timeout_seconds));
  for (;;) {
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
      return fd;
    }
    if (errno == EINTR) continue;
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no Monarch service at ", path));
    if (errno == ECONNREFUSED) {
      return absl::UnavailableError(absl::StrCat("no Monarch service listening at ", path));
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINPROGRESS) {
      return absl::UnavailableError(absl::StrCat("the Monarch service at ", path,
                                                 " did not accept a connection within ",
                                                 timeout_seconds, " s"));
    }
    return ErrnoToStatus(errno, absl::StrCat("connect to ", path));
  }
}

absl::Status SendFrame(int socket, MessageType type, absl::string_view payload,
                       const std::vector<int>& fds) {
  if (payload.size() > kMaxPayloadBytes) return absl::InternalError("message too large to send");
  if (fds.size() > kMaxDescriptors) return absl::InternalError("too many descriptors to send");
  char header[kFrameHeaderBytes];
  EncodeFrameHeader(type, static_cast<uint32_t>(payload.size()), header);
  iovec iov[2] = {{header, sizeof(header)},
                  {const_cast<char*>(payload.data()), payload.size()}};
  size_t total = sizeof(header) + payload.size();
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxDescriptors)];
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = 2;
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  size_t sent = 0;
  while (sent < total) {
    const ssize_t n = ::sendmsg(socket, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        // SO_SNDTIMEO passed (or a non-blocking socket is full): the frame
        // may be cut short, so the connection is of no further use.
        return absl::DeadlineExceededError("timed out sending to the Monarch service socket");
      }
      return ErrnoToStatus(errno, "send to the Monarch service socket");
    }
    sent += static_cast<size_t>(n);
    // The rest, without the descriptors (they went with the first bytes).
    msg.msg_control = nullptr;
    msg.msg_controllen = 0;
    size_t skip = static_cast<size_t>(n);
    while (msg.msg_iovlen > 0 && skip >= msg.msg_iov[0].iov_len) {
      skip -= msg.msg_iov[0].iov_len;
      ++msg.msg_iov;
      --msg.msg_iovlen;
    }
    if (msg.msg_iovlen > 0) {
      msg.msg_iov[0].iov_base = static_cast<char*>(msg.msg_iov[0].iov_base) + skip;
      msg.msg_iov[0].iov_len -= skip;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Frame> ReceiveFrame(int socket, size_t max_fds) {
  Frame frame;
  char header[kFrameHeaderBytes];
  bool got_nothing = false;
  MONARCH_RETURN_IF_ERROR(
      ReceiveAll(socket, header, sizeof(header), &frame.fds, max_fds, &got_nothing));
  MONARCH_ASSIGN_OR_RETURN(FrameHeader decoded, DecodeFrameHeader(header));
  frame.type = decoded.type;
  frame.payload.resize(decoded.length);
  absl::Status body =
      ReceiveAll(socket, frame.payload.data(), decoded.length, &frame.fds, max_fds, nullptr);
  if (!body.ok()) {
    return absl::IsUnavailable(body) ? absl::InvalidArgumentError("message cut short") : body;
  }
  return frame;
}

absl::StatusOr<PeerCredentials> GetPeerCredentials(int socket) {
  ucred cred{};
  socklen_t length = sizeof(cred);
  if (::getsockopt(socket, SOL_SOCKET, SO_PEERCRED, &cred, &length) != 0) {
    return ErrnoToStatus(errno, "SO_PEERCRED");
  }
  PeerCredentials peer{cred.pid, cred.uid, cred.gid, {}};
  // The supplementary groups the peer had when it connected (Linux 4.13+).
  std::vector<gid_t> groups(64);
  for (int attempt = 0; attempt < 2; ++attempt) {
    socklen_t bytes = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (::getsockopt(socket, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &bytes) == 0) {
      groups.resize(bytes / sizeof(gid_t));
      peer.groups = std::move(groups);
      break;
    }
    if (errno != ERANGE) break;  // No groups known: only the primary counts.
    groups.resize(bytes / sizeof(gid_t) + 1);
  }
  return peer;
}

bool PeerCredentials::InGroup(gid_t group) const {
  return gid == group || std::find(groups.begin(), groups.end(), group) != groups.end();
}

absl::Status SetIoTimeout(int socket, double seconds) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(seconds);
  tv.tv_usec = static_cast<suseconds_t>((seconds - static_cast<double>(tv.tv_sec)) * 1e6);
  for (int option : {SO_RCVTIMEO, SO_SNDTIMEO}) {
    if (::setsockopt(socket, SOL_SOCKET, option, &tv, sizeof(tv)) != 0) {
      return ErrnoToStatus(errno, "setsockopt SO_RCVTIMEO/SO_SNDTIMEO");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Frame> Call(int socket, MessageType type, absl::string_view payload,
                           size_t max_fds) {
  MONARCH_RETURN_IF_ERROR(SendFrame(socket, type, payload));
  MONARCH_ASSIGN_OR_RETURN(Frame reply, ReceiveFrame(socket, max_fds));
  if (reply.type == MessageType::kError) {
    MONARCH_ASSIGN_OR_RETURN(ErrorReply error, DecodeErrorReply(reply.payload));
    return error.ToStatus();
  }
  return reply;
}

}  // namespace monarch::service
