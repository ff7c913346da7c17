// MetricsHttpServer: the Prometheus text endpoint, GET /metrics on loopback.
//
// Just enough HTTP/1.1 for a scraper (Prometheus, curl, a node exporter's
// textfile collector): one request per connection, answered with
// "Connection: close" and closed. GET (and HEAD) /metrics, with or without a
// query string, returns 200 and render()'s text; any other path is 404,
// another method on /metrics 405, and a malformed request line, malformed
// headers or a request over 8 KiB 400.
//
// Why a hand-written server and not a library: the endpoint is one path,
// loopback only, scraped every few seconds; a dependency would outweigh it.
// Why loopback only: the numbers say which files a job reads; anything that
// wants them off the node goes through a local agent that chooses to
// forward them.
//
// One background thread polls the listening socket and an eventfd the
// destructor signals, and serves connections one at a time. Since one slow
// client would then hold up every other, each connection gets a deadline:
// kRequestTimeout to deliver its request (a total, not per read, so a client
// trickling a byte at a time cannot stretch it) and kResponseTimeout to take
// the response. The stop signal is watched while serving too, so the
// destructor never waits on a client. Sends use MSG_NOSIGNAL: a client that
// hangs up early costs an EPIPE, not the process.
//
// render() runs on the server thread, once per request; it must be safe to
// call concurrently with whatever else the process does. The server thread
// and its owner share nothing after Start() but the eventfd, so there is
// nothing to lock.

#ifndef MONARCH_SERVICE_METRICS_HTTP_H_
#define MONARCH_SERVICE_METRICS_HTTP_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/file_util.h"

namespace monarch {

class MetricsHttpServer {
 public:
  static constexpr std::chrono::milliseconds kRequestTimeout{2000};
  static constexpr std::chrono::milliseconds kResponseTimeout{5000};
  static constexpr size_t kMaxRequestBytes = 8192;

  // Listens on 127.0.0.1:`port` and serves until destroyed. `port` 0 picks a
  // free port (see port()); "no endpoint" is the caller's business.
  // InvalidArgument for a port outside 0..65535 or an empty `render`,
  // FailedPrecondition if the port is taken, Unavailable for other socket
  // errors; each message names the port.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      int port, std::function<std::string()> render);

  // Stops the thread (promptly, even mid-connection) and closes the port.
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // The port listened on: the one asked for, or the one picked for 0.
  int port() const { return port_; }

 private:
  MetricsHttpServer(ScopedFd listen_fd, ScopedFd stop_fd, int port,
                    std::function<std::string()> render);

  void Run();
  // Reads one request from `fd`, answers it and returns; the caller closes.
  void Serve(int fd);

  const ScopedFd listen_fd_;
  const ScopedFd stop_fd_;  // eventfd; readable once the destructor asks to stop.
  const int port_;
  const std::function<std::string()> render_;
  std::thread thread_;
};

}  // namespace monarch

#endif  // MONARCH_SERVICE_METRICS_HTTP_H_
