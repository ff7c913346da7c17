// PeerNetwork over UCP active messages. See peer_network.h and DESIGN.md.
//
// The network is four parts, each in its own file:
//   UcxWorker      (ucx_worker.h)      UCX's context, worker, registered regions and
//                                      endpoints, and the progress thread with its
//                                      command queue: the only thread that calls into
//                                      UCX after start-up.
//   PeerRequester  (peer_requester.h)  fetches: receive buffers, the ring of pieces,
//                                      deadlines, checksums, CancelFetches.
//   PeerServer     (peer_server.h)     requests from peers: the secret, serving from
//                                      memory or through the serve pool, replies.
//   PeerTable      (peer_table.h)      peer state (down, lost, left) and the one lock
//                                      the parts share.
// Callers of Fetch and the serve pool hand the progress thread work as
// commands (closures) through the worker's queue; it hands results back
// through the requester's Requests under the lock. This file puts the parts
// together (start-up in steps, the bounded shutdown, the counters) and holds
// the wire format's decoders.

#include "remote/peer_network.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "remote/peer_requester.h"
#include "remote/peer_server.h"
#include "remote/peer_table.h"
#include "remote/ucx_loader.h"
#include "remote/ucx_worker.h"

namespace monarch {

class PeerNetwork::Impl {
 public:
  Impl(const UcxApi& ucx, const Options& options, ServeFn serve)
      : options_(options),
        peers_(options_.size, options_.retry_after_seconds),
        worker_(ucx, options_, peers_),
        requester_(worker_, options_, secret_),
        server_(worker_, options_, secret_, std::move(serve)) {
    peers_.SetListener(&requester_);
    worker_.SetHandler(PeerMessage::kRequest, &server_);
    worker_.SetHandler(PeerMessage::kReply, &requester_);
  }

  // An owner whose Shutdown() gave up must abandon the network instead.
  ~Impl() {
    Shutdown(DeadlineIn(kCancelGraceSeconds));
    // Before the requester and server go: UCX may still call them back
    // while it destroys the worker.
    worker_.Close();
  }

  // Start-up, in steps. Peers' requests are held until StartServing().
  absl::Status Init(const AddressExchange& exchange) {
    MONARCH_RETURN_IF_ERROR(worker_.Open());
    // The buffers are registered once, here; the per-file path never registers.
    MONARCH_RETURN_IF_ERROR(requester_.RegisterBuffers());
    MONARCH_RETURN_IF_ERROR(server_.RegisterBuffers());
    MONARCH_ASSIGN_OR_RETURN(std::vector<std::string> addresses, ExchangeAddresses(exchange));
    // Before the progress thread starts: it only reads secret_ from then on.
    MONARCH_ASSIGN_OR_RETURN(secret_, ReadSecret());
    return worker_.Start(std::move(addresses));
  }

  bool Shutdown(Deadline deadline) {
    requester_.CancelFetches();
    // Shut down already, or Start failed: nothing left to stop but the wait
    // for the serve pool.
    if (!worker_.Running()) return server_.WaitForServes(deadline);
    const bool served = server_.StopServing(deadline);
    worker_.Stop(deadline);
    return served;
  }

  void ReportCounters(CounterSink& sink) const {
    const PeerServer::Counters served = server_.counters();
    sink.Counter("remote.requests_served", served.requests_served,
                 "Requests this process answered for peers, with data.");
    sink.Gauge("remote.requests_held", served.requests_held,
               "Peer requests waiting for this process to start serving.");
    sink.Counter("remote.bytes_served", served.bytes_served, "Bytes sent to peers.");
    sink.Counter("remote.requests_refused", served.requests_refused,
                 "Peer requests answered with an error (wrong version, shutting down...).");
    sink.Counter("remote.timeouts", requester_.timeouts(),
                 "Fetches a peer did not answer in time.");
    sink.Counter("remote.peer_failures", peers_.failures(), "Times a peer was marked down.");
    sink.Counter("remote.requests_unauthenticated", served.requests_unauthenticated,
                 "Peer requests refused for want of this job's secret (also counted in "
                 "remote.requests_refused).");
    sink.Counter("remote.checksum_failures", requester_.checksum_failures(),
                 "Transfers whose length or checksum did not match.");
  }

 private:
  friend class PeerNetwork;  // Its calls go straight to the parts.

  // Publishes this worker's address; every rank's, by rank.
  absl::StatusOr<std::vector<std::string>> ExchangeAddresses(const AddressExchange& exchange) {
    MONARCH_ASSIGN_OR_RETURN(const std::string mine, worker_.LocalAddress());
    absl::StatusOr<std::vector<std::string>> addresses = exchange(mine);
    if (!addresses.ok()) return addresses.status();
    if (static_cast<int>(addresses->size()) != options_.size) {
      return absl::InternalError("remote: address exchange returned the wrong number of peers");
    }
    return addresses;
  }

  // The job's secret, once the exchange is complete (Options::secret).
  absl::StatusOr<std::string> ReadSecret() const {
    absl::StatusOr<std::string> secret =
        options_.secret ? options_.secret()
                        : absl::InvalidArgumentError("remote: no job secret was given");
    if (!secret.ok()) return secret.status();
    if (secret->size() != peer_wire::kSecretBytes) {
      return absl::InvalidArgumentError(absl::StrCat("remote: the job secret has ", secret->size(),
                                                     " bytes, not ", peer_wire::kSecretBytes));
    }
    return secret;
  }

  // In the order they are built; each part keeps references to those before it.
  const Options options_;
  std::string secret_;  // Set by Init before the progress thread starts; read-only after.
  PeerTable peers_;
  UcxWorker worker_;
  PeerRequester requester_;
  PeerServer server_;
};

namespace peer_wire {

absl::StatusOr<RequestHeader> DecodeRequestHeader(absl::string_view header, int my_rank, int size) {
  if (header.size() != sizeof(RequestHeader)) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote: request header of ", header.size(), " bytes"));
  }
  RequestHeader request;
  std::memcpy(&request, header.data(), sizeof(request));
  if (request.protocol != kProtocol) {
    return absl::InvalidArgumentError("remote: request of another protocol");
  }
  if (request.from_rank < 0 || request.from_rank >= size || request.from_rank == my_rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote: request from rank ", request.from_rank, ", not a peer"));
  }
  return request;
}

bool CarriesSecret(const RequestHeader& header, absl::string_view secret) {
  if (secret.size() != sizeof(header.secret)) return false;
  // No early exit: every byte is compared, whichever differs.
  uint8_t difference = 0;
  for (size_t i = 0; i < sizeof(header.secret); ++i) {
    difference |= header.secret[i] ^ static_cast<uint8_t>(secret[i]);
  }
  return difference == 0;
}

PeerNetwork::FileRequest ToFileRequest(const RequestHeader& header, absl::string_view name) {
  return PeerNetwork::FileRequest{name,          header.file_size,
                                  header.file_mtime_ns, header.offset,
                                  static_cast<size_t>(header.length), header.from_rank};
}

absl::StatusOr<ReplyHeader> DecodeReplyHeader(absl::string_view header) {
  if (header.size() != sizeof(ReplyHeader)) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote: reply header of ", header.size(), " bytes"));
  }
  ReplyHeader reply;
  std::memcpy(&reply, header.data(), sizeof(reply));
  return reply;
}

absl::Status CheckReply(const ReplyHeader& reply, size_t data_length, size_t expected_length,
                        int rank) {
  if (reply.protocol != kProtocol) return absl::DataLossError("remote: reply of another protocol");
  if (reply.status_code != 0) {
    return absl::UnavailableError(absl::StrCat(
        "remote: peer ", rank,
        " refused: ", absl::StatusCodeToString(static_cast<absl::StatusCode>(reply.status_code))));
  }
  if (reply.length != expected_length || data_length != expected_length) {
    return absl::DataLossError(absl::StrCat("remote: peer ", rank, " sent ", data_length,
                                            " bytes for a request of ", expected_length));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> DecodeGoodbye(absl::string_view header, int my_rank, int size) {
  int32_t rank;
  if (header.size() != sizeof(rank)) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote: goodbye header of ", header.size(), " bytes"));
  }
  std::memcpy(&rank, header.data(), sizeof(rank));
  if (rank < 0 || rank >= size || rank == my_rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote: goodbye from rank ", rank, ", not a peer"));
  }
  return rank;
}

}  // namespace peer_wire

PeerNetwork::PeerNetwork(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PeerNetwork::~PeerNetwork() = default;

absl::StatusOr<std::unique_ptr<PeerNetwork>> PeerNetwork::Start(const Options& options,
                                                                const AddressExchange& exchange,
                                                                ServeFn serve) {
  MONARCH_ASSIGN_OR_RETURN(const UcxApi* ucx, LoadUcx());
  auto impl = std::make_unique<Impl>(*ucx, options, std::move(serve));
  if (absl::Status s = impl->Init(exchange); !s.ok()) return s;
  return std::unique_ptr<PeerNetwork>(new PeerNetwork(std::move(impl)));
}

absl::StatusOr<size_t> PeerNetwork::Fetch(int rank, const FileRef& file, uint64_t offset, char* dst,
                                          size_t n) {
  return impl_->requester_.Fetch(rank, file, offset, dst, n);
}
bool PeerNetwork::IsUp(int rank) const { return impl_->peers_.IsUp(rank); }
bool PeerNetwork::IsLost(int rank) const { return impl_->peers_.IsLost(rank); }
bool PeerNetwork::HasLeft(int rank) const { return impl_->peers_.HasLeft(rank); }
void PeerNetwork::StartServing() { impl_->server_.StartServing(); }
void PeerNetwork::CancelFetches() { impl_->requester_.CancelFetches(); }
bool PeerNetwork::Shutdown(Deadline deadline) { return impl_->Shutdown(deadline); }
void PeerNetwork::ReportCounters(CounterSink& sink) const { impl_->ReportCounters(sink); }

}  // namespace monarch
