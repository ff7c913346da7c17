// PeerNetwork: the UCX layer between the Monarch processes of one job.
//
// Each process has one UCP worker, driven by one progress thread that sleeps
// on the worker's event descriptor (no busy polling: the cores belong to the
// training job). Two active messages make up the protocol (DESIGN.md):
//
//   request  requester -> home   header {id, offset, length, size, mtime, job secret},
//                                data = file name
//   reply    home -> requester   header {id, status, length, CRC32C}, data = the bytes
//
// The requester receives reply data into receive buffers registered once at
// start-up (ucp_mem_map), or, for a reply small enough to come eagerly,
// straight into the caller's buffer. The home sends a RAM copy from where it
// rests, with a CRC combined from the copy's block sums, on the progress
// thread (no thread hand-off, no pass over the bytes), and anything else
// from staging buffers registered once, checksummed by the serve pool. A
// transfer larger than a receive buffer streams through it as a ring
// of chunk-sized pieces with several in flight. Nothing is registered per
// file; endpoints are created once per peer (again only after a failure).
//
// Failure: endpoints use UCX's peer error handling, so a dead peer fails its
// requests at once; a silent one fails them at the request timeout. Either
// way the peer is marked down for `retry_after_seconds` and Fetch returns
// Unavailable / DeadlineExceeded: the caller asks the next rank of the
// file's order, or reads the source. A peer that said goodbye is marked
// down the same way, without counting a failure. After `retry_after` the
// next request reconnects, to the address the peer publishes then, so a
// restarted peer rejoins without a restart of the others. Every
// piece is checked for length and CRC32C as it is copied out of the receive
// buffer, so the bytes returned are the bytes the home sent.
//
// Thread-safe: Fetch may be called from any number of threads.

#ifndef MONARCH_REMOTE_PEER_NETWORK_H_
#define MONARCH_REMOTE_PEER_NETWORK_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/counters.h"
#include "common/shutdown.h"
#include "drivers/storage_driver.h"

namespace monarch {

class PeerNetwork {
 public:
  struct Options {
    int rank = 0;
    int size = 1;
    std::string transports = "tcp";   // UCX_TLS syntax; "all" lets UCX choose.
    uint64_t buffer_bytes = 1 << 20;  // One receive buffer.
    uint64_t chunk_bytes = 1 << 20;   // Piece size when a transfer streams.
    int receive_buffers = 8;          // Fetches in flight at once.
    int serve_threads = 4;            // Requests from peers served at once.
    double request_timeout_seconds = 10;
    double retry_after_seconds = 30;
    // Where a peer's current address is looked up before it is tried again
    // after a failure (a restarted peer has a new one); empty: the address
    // from the exchange is kept. Called by the fetching thread, never the
    // progress thread: it may read a slow shared file system.
    std::function<absl::StatusOr<std::string>(int rank)> lookup_address;
    // The job's secret (peer_wire::kSecretBytes): every request carries it
    // and a request without it is refused. Called once, after the address
    // exchange, because ranks other than 0 can only trust a secret once
    // they have rank 0's address file (bootstrap.h, ReadJobSecret). Start
    // fails with its error, or InvalidArgument if it is unset or of another size.
    std::function<absl::StatusOr<std::string>()> secret;
  };

  // What a peer asks its home for.
  struct FileRequest {
    absl::string_view name;
    uint64_t size;     // The requester's view of the file: the home refuses
    int64_t mtime_ns;  // to serve a different version.
    uint64_t offset;
    size_t length;
    int from_rank;  // Who asks: a home serves only ranks after it in the file's order.
  };
  // Answers a request: calls `take` once with the requested bytes (exactly
  // `length` of them), either in `staging`, filled, or where they rest (a
  // RAM copy), with no staging copy, and with their CRC32C if it is known
  // already (the RAM copy's block sums); otherwise `take` computes it. The
  // reply is sent from there with that CRC, which the requester checks, so
  // bytes that change after `take` (a copy removed, its memory reused) are
  // never accepted. With `staging` null (the progress thread asking first),
  // only bytes in memory may be given, without blocking; otherwise an error.
  using TakeFn =
      absl::FunctionRef<void(const char* bytes, std::optional<uint32_t> known_crc32c)>;
  using ServeFn = std::function<absl::Status(const FileRequest&, char* staging, TakeFn take)>;
  // Publishes this process's address and returns every rank's.
  using AddressExchange =
      std::function<absl::StatusOr<std::vector<std::string>>(const std::string& mine)>;


  // Creates the worker, registers the buffers and exchanges addresses
  // (blocks until every peer has published, or fails). Peers' requests are
  // held until StartServing().
  static absl::StatusOr<std::unique_ptr<PeerNetwork>> Start(const Options& options,
                                                            const AddressExchange& exchange,
                                                            ServeFn serve);
  ~PeerNetwork();

  // Reads [offset, offset + n) of `file` from peer `rank` into `dst`. The
  // range must lie within the file. Returns n, or an error after which the
  // caller reads the source: Unavailable (peer down or refused),
  // DeadlineExceeded, DataLoss (length or checksum mismatch).
  absl::StatusOr<size_t> Fetch(int rank, const FileRef& file, uint64_t offset, char* dst, size_t n);

  // False while `rank` is marked down (until its retry time).
  bool IsUp(int rank) const;
  // True from when `rank` is marked down until it answers again: unlike
  // IsUp, not reset when its retry time comes.
  bool IsLost(int rank) const;
  // Whether the last time `rank` was lost it had said goodbye (shut down
  // cleanly, as every peer does at the end of a job) rather than failed.
  bool HasLeft(int rank) const;

  // Serves the requests held so far and every later one. Called once the
  // owner's state that `serve` reads is complete.
  void StartServing();

  // Fetches fail from now on, and those waiting for a reply give up at
  // once (Unavailable): the caller reads the source. Requests from peers
  // are still served. The first step of a shutdown. Idempotent.
  void CancelFetches();
  // Cancels the fetches, refuses new requests, finishes the ones being
  // served until `deadline`, closes the endpoints and stops the progress
  // thread (bounded: a goodbye of at most 1 s and an endpoint close of at
  // most 5 s after the deadline). False if a request was still being read
  // then (a file system that stopped answering): the network must then be
  // abandoned (common/shutdown.h), not destroyed. Idempotent.
  bool Shutdown(Deadline deadline);

  void ReportCounters(CounterSink& sink) const;

  class Impl;

 private:
  explicit PeerNetwork(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The messages' wire format, and their decoders: pure functions of the bytes
// a peer sent, which the progress thread applies to every message before it
// acts on one (and which tests/fuzz feeds hostile bytes). Both ends are one
// build: fixed-width fields in the host's byte order, no padding.
namespace peer_wire {

constexpr uint32_t kProtocol = 0x4d4f4e32;  // "MON2": requests carry the job secret.
constexpr size_t kSecretBytes = 32;

// The request's header; its data is the file name.
struct RequestHeader {
  uint32_t protocol;
  int32_t from_rank;
  uint64_t request_id;
  uint64_t offset;
  uint64_t length;
  uint64_t file_size;
  int64_t file_mtime_ns;
  uint8_t secret[kSecretBytes];  // The job's; in clear (DESIGN.md, trust model).
};
static_assert(sizeof(RequestHeader) == 80, "RequestHeader must have no padding");

// The reply's header; its data is `length` bytes of the file.
struct ReplyHeader {
  uint32_t protocol;
  int32_t status_code;  // absl::StatusCode; 0 = OK and `length` bytes follow.
  uint64_t request_id;
  uint64_t length;
  uint64_t checksum;  // The CRC32C of the bytes (common/crc32c.h).
};
static_assert(sizeof(ReplyHeader) == 32, "ReplyHeader must have no padding");

// A request header from another rank of a job of `size` (this process is
// `my_rank`). InvalidArgument for a header of another size or protocol, or
// from a rank outside the job or this process's own: such a message is
// dropped unanswered, as there is no one to answer.
absl::StatusOr<RequestHeader> DecodeRequestHeader(absl::string_view header, int my_rank, int size);

// Whether `header` carries `secret` (kSecretBytes; any other size never
// matches). Takes the same time whichever byte differs, so that a stranger
// cannot find the secret a byte at a time by timing refusals.
bool CarriesSecret(const RequestHeader& header, absl::string_view secret);

// What the home is asked for. `name` is the request's data, and the result
// points into it.
PeerNetwork::FileRequest ToFileRequest(const RequestHeader& header, absl::string_view name);

// InvalidArgument for a header of another size; the other fields are judged
// by CheckReply once the request it answers is known.
absl::StatusOr<ReplyHeader> DecodeReplyHeader(absl::string_view header);

// Whether `reply`, with `data_length` bytes of data, answers a request of
// `expected_length` bytes sent to peer `rank`: OK, or the error that request
// fails with (DataLoss for another protocol or a length mismatch,
// Unavailable when the home refused).
absl::Status CheckReply(const ReplyHeader& reply, size_t data_length, size_t expected_length,
                        int rank);

// The header of "I am shutting down": the sender's rank, which must be
// another rank of the job.
absl::StatusOr<int> DecodeGoodbye(absl::string_view header, int my_rank, int size);

}  // namespace peer_wire

}  // namespace monarch

#endif  // MONARCH_REMOTE_PEER_NETWORK_H_
