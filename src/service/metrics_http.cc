// MetricsHttpServer: sockets, the request parser and the serving loop.
//
// Every socket is non-blocking and every wait is a poll() that also watches
// the stop eventfd, with a deadline: nothing a client does (or fails to do)
// can keep the thread from noticing the destructor.

#include "service/metrics_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <exception>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/log.h"

namespace monarch {
namespace {

using Clock = std::chrono::steady_clock;

// After answering, how long (and how many bytes) the thread keeps reading
// what the client still sends before it closes; see Linger().
constexpr std::chrono::milliseconds kLingerTimeout{500};
constexpr size_t kMaxLingerBytes = 64 * 1024;
// How long the thread rests when accept() fails for lack of descriptors or
// memory: the pending connection keeps the socket readable, so retrying at
// once would spin.
constexpr std::chrono::milliseconds kAcceptBackoff{100};

enum class Wait { kReady, kTimeout, kStop, kError };

// Waits until `fd` has one of `events`, `deadline` passes or `stop_fd`
// becomes readable (the stop signal wins over the rest).
Wait WaitFor(int fd, short events, int stop_fd, Clock::time_point deadline) {
  for (;;) {
    const auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return Wait::kTimeout;
    pollfd fds[2] = {{fd, events, 0}, {stop_fd, POLLIN, 0}};
    const int n = ::poll(fds, 2, left > INT_MAX ? INT_MAX : static_cast<int>(left));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Wait::kError;
    }
    if (fds[1].revents != 0) return Wait::kStop;
    // POLLERR / POLLHUP count as ready: the recv() or send() that follows
    // reports what happened.
    if (fds[0].revents != 0) return Wait::kReady;
  }
}

// Sends all of `data` by `deadline`; false if the client went away, stopped
// reading or the server is stopping.
bool SendAll(int fd, absl::string_view data, int stop_fd, Clock::time_point deadline) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (WaitFor(fd, POLLOUT, stop_fd, deadline) != Wait::kReady) return false;
    } else {
      return false;  // EPIPE, ECONNRESET...: nobody to answer.
    }
  }
  return true;
}

// Characters of an HTTP token (RFC 9110 section 5.6.2): methods and header names.
bool IsTokenChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
         absl::string_view("!#$%&'*+-.^_`|~").find(c) != absl::string_view::npos;
}

bool IsToken(absl::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), IsTokenChar);
}

// One line of the request without its "\n" or "\r\n".
absl::string_view StripCr(absl::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line;
}

struct RequestLine {
  std::string method;
  std::string target;
};

// "METHOD SP target SP HTTP/1.x", the target in origin form ("/path?query").
bool ParseRequestLine(absl::string_view line, RequestLine* out) {
  const size_t first = line.find(' ');
  if (first == absl::string_view::npos) return false;
  const size_t second = line.find(' ', first + 1);
  if (second == absl::string_view::npos) return false;
  const absl::string_view method = line.substr(0, first);
  const absl::string_view target = line.substr(first + 1, second - first - 1);
  const absl::string_view version = line.substr(second + 1);
  if (!IsToken(method) || method.size() > 32) return false;
  if (target.empty() || target[0] != '/') return false;
  for (char c : target) {
    if (c <= 0x20 || c >= 0x7f) return false;  // Controls, spaces, non-ASCII.
  }
  if (version != "HTTP/1.1" && version != "HTTP/1.0") return false;
  out->method = std::string(method);
  out->target = std::string(target);
  return true;
}

// "Name: value", without obsolete line folding; the values are not used,
// so only their characters are checked.
bool IsHeaderLine(absl::string_view line) {
  const size_t colon = line.find(':');
  if (colon == absl::string_view::npos || !IsToken(line.substr(0, colon))) return false;
  for (char c : line.substr(colon + 1)) {
    const unsigned char u = static_cast<unsigned char>(c);
    if ((u < 0x20 && u != '\t') || u == 0x7f) return false;
  }
  return true;
}

// Where the header block of `buffer` ends (just past its empty line), or
// npos while it is incomplete. Lines end with "\r\n" or a bare "\n".
size_t HeaderEnd(absl::string_view buffer) {
  size_t pos = 0;
  for (size_t eol; (eol = buffer.find('\n', pos)) != absl::string_view::npos; pos = eol + 1) {
    if (pos > 0 && StripCr(buffer.substr(pos, eol - pos)).empty()) return eol + 1;
  }
  return absl::string_view::npos;
}

std::string Response(absl::string_view status, absl::string_view content_type,
                     absl::string_view body, absl::string_view extra_headers = "",
                     bool head = false) {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(), "\r\n", extra_headers,
                      "Connection: close\r\n\r\n", head ? absl::string_view() : body);
}

std::string ErrorResponse(absl::string_view status, absl::string_view body,
                          absl::string_view extra_headers = "") {
  return Response(status, "text/plain; charset=utf-8", body, extra_headers);
}

// Closing a socket whose receive queue still holds bytes makes Linux send a
// reset, which can destroy the response before the client read it (a POST
// body we never looked at, say). So: end our side, then read and discard
// until the client closes too, within bounds.
void Linger(int fd, int stop_fd) {
  ::shutdown(fd, SHUT_WR);
  const Clock::time_point deadline = Clock::now() + kLingerTimeout;
  char sink[4096];
  for (size_t drained = 0; drained < kMaxLingerBytes;) {
    const ssize_t n = ::recv(fd, sink, sizeof(sink), 0);
    if (n > 0) {
      drained += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (WaitFor(fd, POLLIN, stop_fd, deadline) != Wait::kReady) return;
    } else {
      return;  // End of file or an error: the client is gone.
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    int port, std::function<std::string()> render) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics endpoint: port ", port, " is not in 0..65535"));
  }
  if (!render) return absl::InvalidArgumentError("metrics endpoint: no render function");
  const std::string where = absl::StrCat("metrics endpoint on 127.0.0.1:", port);
  // `call` failed with `error`.
  const auto failed = [&](absl::string_view call, int error) {
    return absl::UnavailableError(absl::StrCat(where, ": ", call, ": ", std::strerror(error)));
  };
  ScopedFd listener(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!listener.valid()) return failed("socket", errno);
  // A restarted service re-binds at once even while connections of its
  // predecessor sit in TIME_WAIT. (On Linux this does not let two listeners
  // share the port; that still fails below.)
  const int one = 1;
  ::setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(listener.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    const int error = errno;
    if (error == EADDRINUSE) {
      return absl::FailedPreconditionError(
          absl::StrCat(where, ": cannot listen: ", std::strerror(error), " (port ", port,
                       " is taken by another process; choose another node.metrics_port, or 0 "
                       "for no endpoint)"));
    }
    return failed("cannot bind", error);
  }
  if (::listen(listener.get(), 16) != 0) return failed("listen", errno);
  socklen_t length = sizeof(address);
  if (::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return failed("getsockname", errno);
  }
  ScopedFd stop(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!stop.valid()) return failed("eventfd", errno);
  return std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer(
      std::move(listener), std::move(stop), ntohs(address.sin_port), std::move(render)));
}

MetricsHttpServer::MetricsHttpServer(ScopedFd listen_fd, ScopedFd stop_fd, int port,
                                     std::function<std::string()> render)
    : listen_fd_(std::move(listen_fd)),
      stop_fd_(std::move(stop_fd)),
      port_(port),
      render_(std::move(render)) {
  thread_ = std::thread([this] { Run(); });
}

MetricsHttpServer::~MetricsHttpServer() {
  const uint64_t one = 1;
  // Cannot fail short of a counter overflow; the thread sees it whatever
  // it is waiting on. An eventfd, no file: outside the seam of common/os.h.
  while (::write(stop_fd_.get(), &one, sizeof(one)) < 0 && errno == EINTR) {
  }
  thread_.join();
  // The members then close the sockets: connects are refused from here on.
}

void MetricsHttpServer::Run() {
  bool starved = false;  // accept() is failing for lack of resources.
  for (;;) {
    pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0}, {stop_fd_.get(), POLLIN, 0}};
    // No timeout needed: the destructor writes stop_fd_.
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      MONARCH_LOG(kError, "metrics endpoint on 127.0.0.1:", port_,
                  ": poll failed, endpoint stopped: ", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    if (fds[0].revents == 0) continue;
    ScopedFd connection(
        ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!connection.valid()) {
      const int error = errno;
      if (error == EMFILE || error == ENFILE || error == ENOBUFS || error == ENOMEM) {
        if (!starved) {
          MONARCH_LOG(kWarning, "metrics endpoint on 127.0.0.1:", port_,
                      ": cannot accept a connection: ", std::strerror(error));
        }
        starved = true;
        if (WaitFor(stop_fd_.get(), POLLIN, stop_fd_.get(), Clock::now() + kAcceptBackoff) !=
            Wait::kTimeout) {
          return;
        }
      }
      continue;  // EAGAIN, ECONNABORTED, EINTR...: the client left first.
    }
    starved = false;
    Serve(connection.get());
  }
}

void MetricsHttpServer::Serve(int fd) {
  const int stop = stop_fd_.get();
  // `linger`: the client may have sent more than we read (see Linger()).
  const auto respond = [&](const std::string& response, bool linger = true) {
    if (SendAll(fd, response, stop, Clock::now() + kResponseTimeout) && linger) Linger(fd, stop);
  };

  // Read until the header block is complete, checking the request line as
  // soon as it is there so that garbage is refused without waiting.
  const Clock::time_point deadline = Clock::now() + kRequestTimeout;
  std::string buffer;
  RequestLine request;
  bool have_request_line = false;
  size_t header_end = std::string::npos;
  char chunk[4096];
  for (;;) {
    if (!have_request_line) {
      const size_t eol = buffer.find('\n');
      if (eol != std::string::npos) {
        if (!ParseRequestLine(StripCr(absl::string_view(buffer).substr(0, eol)), &request)) {
          respond(ErrorResponse("400 Bad Request",
                                "malformed request line; expected GET /metrics HTTP/1.1\n"));
          return;
        }
        have_request_line = true;
      }
    }
    if (have_request_line && (header_end = HeaderEnd(buffer)) != std::string::npos) break;
    if (buffer.size() > kMaxRequestBytes) {
      respond(ErrorResponse("400 Bad Request",
                            absl::StrCat("request over ", kMaxRequestBytes, " bytes\n")));
      return;
    }
    const size_t room = kMaxRequestBytes + 1 - buffer.size();
    const ssize_t n = ::recv(fd, chunk, std::min(sizeof(chunk), room), 0);
    if (n > 0) {
      buffer.append(chunk, static_cast<size_t>(n));
    } else if (n == 0) {
      // The client ended its side: an empty connection (a port probe) gets
      // nothing, a cut-off request a 400 it may still read.
      if (!buffer.empty()) respond(ErrorResponse("400 Bad Request", "incomplete request\n"));
      return;
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      const Wait wait = WaitFor(fd, POLLIN, stop, deadline);
      if (wait == Wait::kTimeout) {
        // No lingering: this client has already had its time, and whatever
        // it sent has been read.
        respond(ErrorResponse(
                    "408 Request Timeout",
                    absl::StrCat("no complete request within ", kRequestTimeout.count(), " ms\n")),
                /*linger=*/false);
        return;
      }
      if (wait != Wait::kReady) return;
    } else {
      return;  // ECONNRESET and the like.
    }
  }

  // Header lines: between the request line and the empty line.
  absl::string_view headers(buffer.data(), header_end);
  headers.remove_prefix(headers.find('\n') + 1);
  for (size_t pos = 0, eol; (eol = headers.find('\n', pos)) != absl::string_view::npos;
       pos = eol + 1) {
    const absl::string_view line = StripCr(headers.substr(pos, eol - pos));
    if (!line.empty() && !IsHeaderLine(line)) {
      respond(ErrorResponse("400 Bad Request", "malformed header line\n"));
      return;
    }
  }

  const absl::string_view path = absl::string_view(request.target).substr(
      0, request.target.find('?'));
  if (path != "/metrics") {
    respond(ErrorResponse("404 Not Found", "not found; the metrics are at /metrics\n"));
    return;
  }
  const bool head = request.method == "HEAD";
  if (request.method != "GET" && !head) {
    respond(ErrorResponse("405 Method Not Allowed", "only GET and HEAD are served\n",
                          "Allow: GET, HEAD\r\n"));
    return;
  }
  std::string body;
  try {
    body = render_();
  } catch (const std::exception& e) {
    MONARCH_LOG(kError, "metrics endpoint: rendering the metrics failed: ", e.what());
    respond(ErrorResponse("500 Internal Server Error", "rendering the metrics failed\n"));
    return;
  } catch (...) {
    MONARCH_LOG(kError, "metrics endpoint: rendering the metrics failed");
    respond(ErrorResponse("500 Internal Server Error", "rendering the metrics failed\n"));
    return;
  }
  respond(Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", body, "", head));
}

}  // namespace monarch
