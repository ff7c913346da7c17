// PeerServer: serving peers' requests. See peer_server.h.

#include "remote/peer_server.h"

#include <algorithm>
#include <optional>

#include "common/crc32c.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace monarch {

using peer_wire::ReplyHeader;
using peer_wire::RequestHeader;

// A reply being sent, kept alive until UCX is done with its header and buffer.
class PeerServer::Reply final : public UcxWorker::Transfer {
 public:
  Reply(PeerServer& server, const ReplyHeader& header, int send_buffer, const char* data)
      : server(server), header(header), send_buffer(send_buffer), data(data) {}
  void Done(absl::Status status) override { server.FinishReply(this, status.ok()); }

  PeerServer& server;
  const ReplyHeader header;
  const int send_buffer;    // Staging buffer the data is in, or -1.
  const char* const data;   // The bytes of an OK reply.
};

PeerServer::PeerServer(UcxWorker& worker, const PeerNetwork::Options& options,
                       const std::string& secret, PeerNetwork::ServeFn serve)
    : worker_(worker),
      options_(options),
      secret_(secret),
      serve_(std::move(serve)),
      send_bytes_(std::max(options.buffer_bytes, options.chunk_bytes)),
      serve_pool_(options.serve_threads) {}

absl::Status PeerServer::RegisterBuffers() {
  const size_t send_buffers = 2 * static_cast<size_t>(options_.serve_threads);
  MONARCH_ASSIGN_OR_RETURN(send_region_, worker_.RegisterRegion(send_buffers, send_bytes_));
  MutexLock lock(&worker_.mu());
  for (size_t i = send_buffers; i-- > 0;) free_send_buffers_.push_back(i);
  return absl::OkStatus();
}

void PeerServer::StartServing() {
  MutexLock lock(&worker_.mu());
  if (serving_ != Serving::kHeld) return;
  serving_ = Serving::kOn;
  for (auto& [request, name] : held_) {
    serve_pool_.detach_task(
        [this, request = request, name = std::move(name)] { Serve(request, name); });
  }
  held_.clear();
}

bool PeerServer::StopServing(Deadline deadline) {
  {
    MutexLock lock(&worker_.mu());
    serving_ = Serving::kOff;
    for (const auto& [request, name] : held_) {
      QueueReplyLocked(request, absl::StatusCode::kUnavailable, nullptr, -1, 0);
    }
    held_.clear();
  }
  // Requests already accepted are answered; new ones are refused. Each
  // ends within its read (a Serve waiting for a send buffer gives up at the
  // request timeout).
  const bool served = serve_pool_.wait_until(deadline);
  if (!served) {
    MONARCH_LOG(kWarning, "remote: gave up waiting at shutdown for ",
                serve_pool_.get_tasks_running(),
                " peer requests still being read (a file system that stopped answering?)");
  }
  return served;
}

bool PeerServer::WaitForServes(Deadline deadline) {
  MutexLock lock(&worker_.mu());
  return serve_pool_.wait_until(deadline);
}

PeerServer::Counters PeerServer::counters() const {
  MutexLock lock(&worker_.mu());
  return Counters{requests_served_.load(), bytes_served_.load(), requests_refused_.load(),
                  requests_unauthenticated_.load(), held_.size()};
}

void PeerServer::OnMessage(const UcxWorker::Message& message) {
  const absl::StatusOr<RequestHeader> decoded =
      peer_wire::DecodeRequestHeader(message.header, options_.rank, options_.size);
  if (!decoded.ok()) return;
  const RequestHeader& request = *decoded;
  if (!peer_wire::CarriesSecret(request, secret_)) {
    // Answered (not dropped), so that a peer of another job, or of an
    // earlier run, reads the source at once instead of timing out.
    if (requests_unauthenticated_.fetch_add(1, std::memory_order_relaxed) == 0) {
      MONARCH_LOG(kWarning, "remote: refused a request claiming to be from rank ",
                  request.from_rank,
                  " without this job's secret (a process of another job, or of an earlier "
                  "run?); later ones are only counted in remote.requests_unauthenticated");
    }
    QueueRefusal(request, absl::StatusCode::kUnauthenticated);
    return;
  }
  if (message.rendezvous) {  // A name this long is not ours.
    QueueRefusal(request, absl::StatusCode::kInvalidArgument);
    return;
  }
  const absl::string_view name(static_cast<const char*>(message.data), message.length);
  if (ServeFromMemory(request, name)) return;
  // Queued under the lock that StopServing() takes to stop serving, so no
  // task can slip into the pool after StopServing() has waited for it.
  MutexLock lock(&worker_.mu());
  switch (serving_) {
    case Serving::kHeld:
      held_.emplace_back(request, std::string(name));
      break;
    case Serving::kOn:
      serve_pool_.detach_task([this, request, name = std::string(name)] { Serve(request, name); });
      break;
    case Serving::kOff:
      QueueReplyLocked(request, absl::StatusCode::kUnavailable, nullptr, -1, 0);
      break;
  }
}

// Answered right here, saving the two thread hand-offs of the serve pool,
// which is what a transfer's time goes to once the bytes are not read: their
// CRC comes from the copy's block sums. Only a range that is not whole
// blocks (a reader's odd piece) is checksummed here.
bool PeerServer::ServeFromMemory(const RequestHeader& request, absl::string_view name) {
  if (request.length > send_bytes_) return false;
  {
    MutexLock lock(&worker_.mu());
    if (serving_ != Serving::kOn) return false;
  }
  const char* data = nullptr;
  uint64_t checksum = 0;
  const absl::Status served =
      serve_(peer_wire::ToFileRequest(request, name), nullptr,
             [&](const char* bytes, std::optional<uint32_t> known_crc32c) {
               data = bytes;
               checksum = known_crc32c ? *known_crc32c : Crc32c(bytes, request.length);
             });
  if (!served.ok() || data == nullptr) return false;  // The pool reads it, or says why not.
  MutexLock lock(&worker_.mu());
  QueueReplyLocked(request, absl::StatusCode::kOk, data, -1, checksum);
  return true;
}

void PeerServer::Serve(const RequestHeader& request, const std::string& name) {
  int buffer_index;
  {
    MutexLock lock(&worker_.mu());
    // Send buffers come back as replies complete; a requester that died
    // mid-transfer may hold one until its endpoint fails. The requester
    // gives up at the request timeout, and so does this wait: it is then
    // refused (and reads the source).
    const Clock::time_point give_up =
        Clock::now() + SecondsToDuration(options_.request_timeout_seconds);
    while (free_send_buffers_.empty()) {
      if (!send_buffer_freed_.WaitUntil(&worker_.mu(), give_up) && free_send_buffers_.empty()) {
        QueueReplyLocked(request, absl::StatusCode::kUnavailable, nullptr, -1, 0);
        return;
      }
    }
    buffer_index = free_send_buffers_.back();
    free_send_buffers_.pop_back();
  }
  char* staging = send_region_->buffer(buffer_index);
  absl::StatusCode code = absl::StatusCode::kOk;
  const char* data = nullptr;
  uint64_t checksum = 0;
  if (request.length > send_bytes_) {
    code = absl::StatusCode::kInvalidArgument;  // remote.buffer_size differs between peers.
  } else {
    const PeerNetwork::FileRequest file = peer_wire::ToFileRequest(request, name);
    const absl::Status served =
        serve_(file, staging, [&](const char* bytes, std::optional<uint32_t> known_crc32c) {
          data = bytes;
          checksum = known_crc32c ? *known_crc32c : Crc32c(bytes, request.length);
        });
    if (!served.ok()) code = served.code();
    if (served.ok() && data == nullptr) code = absl::StatusCode::kInternal;
  }
  MutexLock lock(&worker_.mu());
  const bool staged = code == absl::StatusCode::kOk && data == staging;
  if (!staged) {  // Not needed: an error, or sent from where the bytes rest.
    free_send_buffers_.push_back(buffer_index);
    send_buffer_freed_.Signal();
  }
  QueueReplyLocked(request, code, code == absl::StatusCode::kOk ? data : nullptr,
                   staged ? buffer_index : -1, checksum);
}

void PeerServer::QueueRefusal(const RequestHeader& request, absl::StatusCode code) {
  MutexLock lock(&worker_.mu());
  QueueReplyLocked(request, code, nullptr, -1, 0);
}

void PeerServer::QueueReplyLocked(const RequestHeader& request, absl::StatusCode code,
                                  const char* data, int send_buffer, uint64_t checksum) {
  worker_.SendQueuedLocked();
  auto* reply = new Reply(*this,
                          ReplyHeader{peer_wire::kProtocol, static_cast<int32_t>(code),
                                      request.request_id,
                                      code == absl::StatusCode::kOk ? request.length : 0, checksum},
                          send_buffer, data);
  const int to = request.from_rank;
  worker_.PostLocked([this, reply, to] { SendReply(reply, to); });
  worker_.Wake();
}

void PeerServer::SendReply(Reply* reply, int to) {
  // No endpoint: the requester failed; it reads the source (or has already
  // timed out).
  const absl::StatusOr<UcxWorker::Started> started = worker_.Send(
      to, PeerMessage::kReply, &reply->header, sizeof(ReplyHeader), reply->data,
      reply->header.length, reply->send_buffer >= 0 ? send_region_ : nullptr, reply);
  if (!started.ok()) {
    FinishReply(reply, false);
  } else if (*started == UcxWorker::Started::kDone) {
    FinishReply(reply, true);
  }
}

void PeerServer::FinishReply(Reply* reply, bool sent) {
  if (sent && reply->data != nullptr) {
    requests_served_.fetch_add(1, std::memory_order_relaxed);
    bytes_served_.fetch_add(reply->header.length, std::memory_order_relaxed);
  } else if (reply->header.status_code != 0) {
    requests_refused_.fetch_add(1, std::memory_order_relaxed);
  }
  {
    MutexLock lock(&worker_.mu());
    if (reply->send_buffer >= 0) {
      free_send_buffers_.push_back(reply->send_buffer);
      send_buffer_freed_.Signal();
    }
    worker_.SendFinishedLocked();
  }
  delete reply;
}

}  // namespace monarch
