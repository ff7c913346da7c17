// The Prometheus /metrics endpoint over real loopback sockets: what a
// scraper gets, what everything else gets, and that no client (silent,
// trickling, hostile, vanishing) can stall or crash the server.

#include <doctest/doctest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "service/metrics_http.h"

namespace monarch {
namespace {

using Clock = std::chrono::steady_clock;

// A client socket connected to 127.0.0.1:`port`, or invalid (errno set).
// Reads give up after 5 s, so a broken server fails a test, not hangs it.
ScopedFd Connect(int port) {
  ScopedFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(fd.valid());
  timeval timeout{5, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    return ScopedFd();
  }
  return fd;
}

// Connections to 127.0.0.1:`port` not accepted yet: the listening socket's
// accept queue (rx_queue of its LISTEN row in /proc/net/tcp); -1 if no
// socket listens there.
int AcceptQueue(int port) {
  std::ifstream tcp("/proc/net/tcp");
  std::string line;
  std::getline(tcp, line);  // The header.
  while (std::getline(tcp, line)) {
    // sl local_address rem_address st tx_queue:rx_queue ..., in hex.
    const std::vector<std::string> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (fields.size() < 5 || fields[3] != "0A") continue;
    const std::vector<std::string> local = absl::StrSplit(fields[1], ':');
    const std::vector<std::string> queues = absl::StrSplit(fields[4], ':');
    if (local.size() != 2 || queues.size() != 2) continue;
    if (std::stoi(local[1], nullptr, 16) == port) return std::stoi(queues[1], nullptr, 16);
  }
  return -1;
}

// Waits (10 s at most) until the server has accepted every connection made
// to it so far, so that a test knows which one it serves.
bool WaitUntilAccepted(int port) {
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(10);
  while (AcceptQueue(port) != 0) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// Sends what it can of `data`; the server may close early on hostile input.
void SendSome(int fd, const std::string& data) {
  for (size_t sent = 0; sent < data.size();) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += static_cast<size_t>(n);
  }
}

// Everything the server sends until it closes (or a read fails).
std::string ReadAll(int fd) {
  std::string out;
  char buffer[4096];
  for (ssize_t n; (n = ::recv(fd, buffer, sizeof(buffer), 0)) > 0;) out.append(buffer, n);
  return out;
}

// Sends `request` on a new connection and returns the raw response.
std::string Exchange(int port, const std::string& request) {
  ScopedFd fd = Connect(port);
  REQUIRE(fd.valid());
  SendSome(fd.get(), request);
  return ReadAll(fd.get());
}

struct HttpResponse {
  std::string status_line;
  int status = 0;
  std::map<std::string, std::string> headers;  // Lower-case names.
  std::string body;
};

HttpResponse ParseResponse(const std::string& raw) {
  HttpResponse r;
  const size_t end = raw.find("\r\n\r\n");
  REQUIRE_MESSAGE(end != std::string::npos, "no header block in: ", raw);
  std::vector<std::string> lines = absl::StrSplit(raw.substr(0, end), "\r\n");
  r.status_line = lines[0];
  std::vector<std::string> parts = absl::StrSplit(lines[0], absl::MaxSplits(' ', 2));
  REQUIRE(parts.size() == 3);
  CHECK(parts[0] == "HTTP/1.1");
  REQUIRE(absl::SimpleAtoi(parts[1], &r.status));
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    REQUIRE(colon != std::string::npos);
    r.headers[absl::AsciiStrToLower(lines[i].substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
  }
  r.body = raw.substr(end + 4);
  return r;
}

HttpResponse Get(int port, const std::string& target) {
  return ParseResponse(
      Exchange(port, absl::StrCat("GET ", target, " HTTP/1.1\r\nHost: localhost\r\n\r\n")));
}

std::unique_ptr<MetricsHttpServer> StartOrDie(std::function<std::string()> render) {
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start(0, std::move(render));
  REQUIRE_MESSAGE(server.ok(), server.status().ToString());
  REQUIRE((*server)->port() > 0);
  return std::move(*server);
}

const char kMetrics[] =
    "# HELP monarch_reads_total Reads served.\n"
    "# TYPE monarch_reads_total counter\n"
    "monarch_reads_total{tier=\"ram\"} 42\n";

TEST_CASE("GET /metrics returns 200 with render()'s text") {
  auto server = StartOrDie([] { return std::string(kMetrics); });
  HttpResponse r = Get(server->port(), "/metrics");
  CHECK(r.status_line == "HTTP/1.1 200 OK");
  CHECK(r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8");
  CHECK(r.headers["content-length"] == std::to_string(r.body.size()));
  CHECK(r.headers["connection"] == "close");
  CHECK(r.body == kMetrics);

  SUBCASE("with a query string") {
    HttpResponse q = Get(server->port(), "/metrics?name[]=monarch_reads_total");
    CHECK(q.status == 200);
    CHECK(q.body == kMetrics);
  }
  SUBCASE("HTTP/1.0 and bare-LF line ends") {
    HttpResponse q = ParseResponse(Exchange(server->port(), "GET /metrics HTTP/1.0\n\n"));
    CHECK(q.status == 200);
    CHECK(q.body == kMetrics);
  }
  SUBCASE("HEAD: the headers without the body") {
    HttpResponse q = ParseResponse(Exchange(server->port(), "HEAD /metrics HTTP/1.1\r\n\r\n"));
    CHECK(q.status == 200);
    CHECK(q.headers["content-length"] == std::to_string(strlen(kMetrics)));
    CHECK(q.body.empty());
  }
  SUBCASE("a large body arrives whole") {
    const std::string big(3 << 20, 'm');
    auto large = StartOrDie([&] { return big; });
    HttpResponse q = Get(large->port(), "/metrics");
    CHECK(q.status == 200);
    CHECK(q.headers["content-length"] == std::to_string(big.size()));
    CHECK(q.body == big);
  }
}

TEST_CASE("render() is called for every request") {
  std::atomic<int> calls{0};
  auto server = StartOrDie([&] { return absl::StrCat("monarch_scrapes ", ++calls, "\n"); });
  CHECK(Get(server->port(), "/metrics").body == "monarch_scrapes 1\n");
  CHECK(Get(server->port(), "/metrics").body == "monarch_scrapes 2\n");
  // Requests that are not a scrape do not render.
  CHECK(Get(server->port(), "/other").status == 404);
  CHECK(Get(server->port(), "/metrics").body == "monarch_scrapes 3\n");
}

TEST_CASE("other paths are 404, other methods 405") {
  auto server = StartOrDie([] { return std::string(kMetrics); });
  for (const char* target : {"/", "/other", "/metrics/", "/metricsx", "/Metrics"}) {
    HttpResponse r = Get(server->port(), target);
    CHECK_MESSAGE(r.status == 404, target);
    CHECK(r.headers["connection"] == "close");
    CHECK(r.headers["content-length"] == std::to_string(r.body.size()));
  }
  // A POST with a body the server never reads: the response must still
  // arrive (not be lost to a reset when the server closes).
  HttpResponse post = ParseResponse(Exchange(
      server->port(), "POST /metrics HTTP/1.1\r\nContent-Length: 11\r\n\r\nhello=world"));
  CHECK(post.status_line == "HTTP/1.1 405 Method Not Allowed");
  CHECK(post.headers["allow"] == "GET, HEAD");
  CHECK(ParseResponse(Exchange(server->port(), "DELETE /metrics HTTP/1.1\r\n\r\n")).status == 405);
}

TEST_CASE("malformed requests get 400 or a closed connection, and the server keeps serving") {
  std::atomic<int> calls{0};
  auto server = StartOrDie([&] {
    ++calls;
    return std::string(kMetrics);
  });
  const std::string requests[] = {
      "garbage\r\n\r\n",
      "GET\r\n\r\n",
      "GET /metrics\r\n\r\n",
      "GET /metrics HTTP/9.9\r\n\r\n",
      "GET metrics HTTP/1.1\r\n\r\n",
      "GET  /metrics HTTP/1.1\r\n\r\n",
      "\r\nGET /metrics HTTP/1.1\r\n\r\n",
      std::string("GET /met\0rics HTTP/1.1\r\n\r\n", 27),
      "GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n",
      "GET /metrics HTTP/1.1\r\n: empty name\r\n\r\n",
      "GET /metrics HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n",
      "GET /metrics HTTP/1.1\r\nX-Bad: a\x01" "b\r\n\r\n",
      "GET /metrics HTTP/1.1\r\nX-Big: " + std::string(9000, 'a') + "\r\n\r\n",
      std::string(100000, 'x'),
      std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 15),  // TLS-ish.
  };
  for (const std::string& request : requests) {
    const std::string raw = Exchange(server->port(), request);
    CHECK_MESSAGE((raw.empty() || absl::StartsWith(raw, "HTTP/1.1 400 Bad Request\r\n")),
                  absl::CEscape(request.substr(0, 60)), " -> ", raw.substr(0, 60));
  }
  CHECK(calls == 0);
  SUBCASE("a header block over 8 KiB is 400") {
    const std::string raw = Exchange(
        server->port(), "GET /metrics HTTP/1.1\r\nX-Big: " + std::string(9000, 'a') + "\r\n\r\n");
    CHECK(absl::StartsWith(raw, "HTTP/1.1 400 "));
  }
  SUBCASE("a request cut off by the client is 400") {
    ScopedFd fd = Connect(server->port());
    REQUIRE(fd.valid());
    SendSome(fd.get(), "GET /metrics HTTP/1.1\r\nHost: a\r\n");
    ::shutdown(fd.get(), SHUT_WR);
    CHECK(absl::StartsWith(ReadAll(fd.get()), "HTTP/1.1 400 "));
  }
  SUBCASE("clients that vanish") {
    for (int i = 0; i < 20; ++i) {
      ScopedFd fd = Connect(server->port());
      REQUIRE(fd.valid());
      if (i % 2 == 1) SendSome(fd.get(), "GET /metr");
      // Closed without reading: a reset for the server to shrug off.
      linger hard{1, 0};
      ::setsockopt(fd.get(), SOL_SOCKET, SO_LINGER, &hard, sizeof(hard));
    }
  }
  // Still serving.
  HttpResponse r = Get(server->port(), "/metrics");
  CHECK(r.status == 200);
  CHECK(r.body == kMetrics);
}

TEST_CASE("a render() that throws is a 500, not a crash") {
  std::atomic<bool> fail{true};
  auto server = StartOrDie([&]() -> std::string {
    if (fail) throw std::runtime_error("stats unavailable");
    return "ok\n";
  });
  CHECK(Get(server->port(), "/metrics").status == 500);
  fail = false;  // The server thread is idle between requests.
  CHECK(Get(server->port(), "/metrics").body == "ok\n");
}

TEST_CASE("a silent or trickling client holds the server for the request timeout at most") {
  auto server = StartOrDie([] { return std::string(kMetrics); });
  const auto limit = MetricsHttpServer::kRequestTimeout + std::chrono::milliseconds(1500);

  SUBCASE("silent") {
    ScopedFd silent = Connect(server->port());
    REQUIRE(silent.valid());
    REQUIRE(WaitUntilAccepted(server->port()));  // Served first.
    const Clock::time_point start = Clock::now();
    HttpResponse r = Get(server->port(), "/metrics");
    CHECK(r.status == 200);
    CHECK(Clock::now() - start < limit);
    // The silent client was told why it was dropped.
    CHECK(absl::StartsWith(ReadAll(silent.get()), "HTTP/1.1 408 Request Timeout\r\n"));
  }
  SUBCASE("trickling a byte at a time") {
    // A per-read timeout would let this client hold the server for hours;
    // the deadline is for the whole request.
    ScopedFd slow = Connect(server->port());
    REQUIRE(slow.valid());
    std::atomic<bool> done{false};
    std::thread trickle([&] {
      const std::string request = "GET /metrics HTTP/1.1\r\nX-Slow: " + std::string(100, 'a');
      for (size_t i = 0; i < request.size() && !done; ++i) {
        if (::send(slow.get(), &request[i], 1, MSG_NOSIGNAL) != 1) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
    REQUIRE(WaitUntilAccepted(server->port()));  // Served first.
    const Clock::time_point start = Clock::now();
    HttpResponse r = Get(server->port(), "/metrics");
    CHECK(r.status == 200);
    CHECK(Clock::now() - start < limit);
    done = true;
    trickle.join();
  }
}

TEST_CASE("destroying the server is prompt even with a client connected") {
  auto server = StartOrDie([] { return std::string(kMetrics); });
  ScopedFd silent = Connect(server->port());
  REQUIRE(silent.valid());
  REQUIRE(WaitUntilAccepted(server->port()));  // The server thread serves it.
  const Clock::time_point start = Clock::now();
  server.reset();
  CHECK(Clock::now() - start < std::chrono::milliseconds(500));
}

TEST_CASE("a second server on a taken port fails naming the port") {
  auto first = StartOrDie([] { return std::string(kMetrics); });
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> second =
      MetricsHttpServer::Start(first->port(), [] { return std::string(); });
  REQUIRE_FALSE(second.ok());
  CHECK(second.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(second.status().message(), absl::StrCat("127.0.0.1:", first->port())));
  CHECK(absl::StrContains(second.status().message(), "in use"));
  // The first is unaffected.
  CHECK(Get(first->port(), "/metrics").status == 200);
}

TEST_CASE("destroying the server closes the port") {
  auto server = StartOrDie([] { return std::string(kMetrics); });
  const int port = server->port();
  CHECK(Get(port, "/metrics").status == 200);
  server.reset();
  ScopedFd fd = Connect(port);
  CHECK_FALSE(fd.valid());
  CHECK(errno == ECONNREFUSED);
}

TEST_CASE("Start refuses bad arguments") {
  for (int port : {-1, 65536}) {
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
        MetricsHttpServer::Start(port, [] { return std::string(); });
    REQUIRE_FALSE(server.ok());
    CHECK(server.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(server.status().message(), std::to_string(port)));
  }
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start(0, nullptr);
  REQUIRE_FALSE(server.ok());
  CHECK(server.status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace monarch
