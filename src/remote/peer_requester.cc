// PeerRequester: fetches from peers. See peer_requester.h.

#include "remote/peer_requester.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/status_macros.h"

namespace monarch {
namespace {

constexpr uint64_t kMinRing = 4;  // Pieces in flight at least, when a transfer streams.

using peer_wire::ReplyHeader;
using peer_wire::RequestHeader;

}  // namespace

// Keeps a request (its header and name) alive while UCX sends its message.
class PeerRequester::Sending final : public UcxWorker::Transfer {
 public:
  explicit Sending(std::shared_ptr<Request> request) : request_(std::move(request)) {}
  // A failed send needs no handling here: the endpoint's error callback
  // marks the peer down and fails its requests.
  void Done(absl::Status) override { delete this; }

 private:
  std::shared_ptr<Request> request_;
};

// Keeps a request alive while its reply's data is received into its
// buffer; then completes it, or retires it if its fetch gave up meanwhile.
class PeerRequester::Receiving final : public UcxWorker::Transfer {
 public:
  Receiving(PeerRequester& requester, std::shared_ptr<Request> request)
      : requester_(requester), request_(std::move(request)) {}
  void Done(absl::Status status) override {
    PeerRequester& requester = requester_;
    std::shared_ptr<Request> request = std::move(request_);
    delete this;
    requester.FinishReceive(std::move(request), status);
  }

 private:
  PeerRequester& requester_;
  std::shared_ptr<Request> request_;
};

PeerRequester::PeerRequester(UcxWorker& worker, const PeerNetwork::Options& options,
                             const std::string& secret)
    : worker_(worker),
      options_(options),
      secret_(secret),
      timeout_(SecondsToDuration(options.request_timeout_seconds)) {}

absl::Status PeerRequester::RegisterBuffers() {
  MONARCH_ASSIGN_OR_RETURN(receive_region_, worker_.RegisterRegion(options_.receive_buffers,
                                                                   options_.buffer_bytes));
  MutexLock lock(&worker_.mu());
  slots_.resize(options_.receive_buffers);
  for (int i = options_.receive_buffers - 1; i >= 0; --i) free_slots_.push_back(i);
  return absl::OkStatus();
}

absl::StatusOr<size_t> PeerRequester::Fetch(int rank, const FileRef& file, uint64_t offset,
                                            char* dst, size_t n) {
  if (n == 0) return 0;
  const std::string address = AddressToRetry(rank);
  MONARCH_ASSIGN_OR_RETURN(const int slot, TakeSlot(rank));
  char* const buffer = receive_region_->buffer(slot);
  // Fits one buffer: one piece. Larger: a ring of chunk-sized pieces, at
  // least kMinRing of them, so several are always in flight.
  const size_t piece =
      n <= options_.buffer_bytes
          ? n
          : static_cast<size_t>(std::min<uint64_t>(
                options_.chunk_bytes,
                std::max<uint64_t>(4096, options_.buffer_bytes / kMinRing / 4096 * 4096)));
  const size_t depth = std::max<size_t>(1, options_.buffer_bytes / piece);
  const size_t pieces = (n + piece - 1) / piece;
  std::vector<std::shared_ptr<Request>> ring(std::min(depth, pieces));

  auto issue = [&](size_t k) {
    auto request = std::make_shared<Request>();
    request->rank = rank;
    request->slot = slot;
    request->buffer = buffer + (k % depth) * piece;
    request->destination = dst + k * piece;
    request->length = std::min(piece, n - k * piece);
    request->name = std::string(file.name);
    request->address = address;
    request->header =
        RequestHeader{peer_wire::kProtocol, options_.rank, 0, offset + k * piece, request->length,
                      file.size, file.mtime_ns, {}};
    std::memcpy(request->header.secret, secret_.data(), sizeof(request->header.secret));
    request->deadline = Clock::now() + timeout_;
    {
      MutexLock lock(&worker_.mu());
      request->header.request_id = request->id = next_request_id_++;
      pending_.emplace(request->id, request);
      worker_.PostLocked([this, request] { SendRequest(request); });
    }
    worker_.Wake();
    ring[k % depth] = request;
  };

  absl::Status status;
  for (size_t k = 0; k < ring.size(); ++k) issue(k);
  for (size_t k = 0; k < pieces && status.ok(); ++k) {
    status = Await(*ring[k % depth], file);
    if (!status.ok()) break;
    ring[k % depth] = nullptr;
    if (k + depth < pieces) issue(k + depth);
  }
  Retire(ring, slot);
  if (!status.ok()) return status;
  return n;
}

// A peer tried again after a failure may have restarted elsewhere: its
// address is looked up here, not on the progress thread, which every peer's
// transfers wait on while it reads the rendezvous directory. Empty: the
// endpoint's address stays.
std::string PeerRequester::AddressToRetry(int rank) {
  if (!options_.lookup_address) return std::string();
  bool retry;
  {
    MutexLock lock(&worker_.mu());
    retry = worker_.peers().LostLocked(rank) && worker_.peers().UpLocked(rank);
  }
  if (!retry) return std::string();
  absl::StatusOr<std::string> found = options_.lookup_address(rank);
  return found.ok() ? *std::move(found) : std::string();
}

// A free receive buffer, waiting for one until the request timeout.
absl::StatusOr<int> PeerRequester::TakeSlot(int rank) {
  MutexLock lock(&worker_.mu());
  if (worker_.StoppingLocked() || fetches_cancelled_) {
    return absl::UnavailableError("remote: shutting down");
  }
  if (!worker_.peers().UpLocked(rank)) return PeerDown(rank);
  const Clock::time_point give_up = Clock::now() + timeout_;
  while (free_slots_.empty()) {
    if (fetches_cancelled_) return absl::UnavailableError("remote: shutting down");
    if (!slot_freed_.WaitUntil(&worker_.mu(), give_up) && free_slots_.empty()) {
      return absl::UnavailableError("remote: no receive buffer became free");
    }
  }
  const int slot = free_slots_.back();
  free_slots_.pop_back();
  slots_[slot].fetch_active = true;
  return slot;
}

// Waits for `request`'s reply, then checks its bytes.
absl::Status PeerRequester::Await(Request& request, const FileRef& file) {
  absl::Status status;
  {
    MutexLock lock(&worker_.mu());
    // Ends when the reply is in, at the request's deadline, or when
    // shutdown cancels the fetches (CancelFetches signals `done`).
    while (request.state != Request::kDone && !fetches_cancelled_) {
      if (!request.done.WaitUntil(&worker_.mu(), request.deadline) &&
          request.state != Request::kDone) {
        timeouts_.fetch_add(1, std::memory_order_relaxed);
        worker_.peers().MarkDownLocked(request.rank,
                                       "did not answer within remote.request_timeout");
        break;
      }
    }
    if (request.state != Request::kDone) {
      return fetches_cancelled_
                 ? absl::UnavailableError("remote: shutting down")
                 : absl::DeadlineExceededError(absl::StrCat("remote: peer ", request.rank,
                                                            " did not answer within ",
                                                            options_.request_timeout_seconds, " s"));
    }
    // Taken, not copied: a refusal's message was made on the progress
    // thread, which may drop the Request last; this way the caller frees it.
    // (Abseil's reference count is not instrumented, so TSan would see that
    // free racing with the caller's reads.)
    status = std::move(request.status);
    pending_.erase(request.id);
  }
  if (!status.ok()) return status;
  // Copy out first, then verify the copy: a late message landing in the
  // buffer afterwards cannot change bytes already checked. An eager reply is
  // already in place (copied under the lock while this fetch was waiting for
  // it, so never after it gave up).
  const uint64_t sum = request.in_place
                           ? Crc32c(request.destination, request.length)
                           : Crc32cCopy(request.destination, request.buffer, request.length);
  if (sum != request.checksum) {
    checksum_failures_.fetch_add(1, std::memory_order_relaxed);
    return absl::DataLossError(
        absl::StrCat("remote: checksum mismatch for ", file.name, " from peer ", request.rank));
  }
  return absl::OkStatus();
}

// Gives up the fetch's requests still in `ring` and its receive buffer
// (once no receive writes into it).
void PeerRequester::Retire(const std::vector<std::shared_ptr<Request>>& ring, int slot) {
  MutexLock lock(&worker_.mu());
  for (const std::shared_ptr<Request>& request : ring) {
    if (request == nullptr) continue;
    if (request->state == Request::kReceiving) {
      request->abandoned = true;  // Its receive callback retires it.
    } else {
      pending_.erase(request->id);
    }
  }
  slots_[slot].fetch_active = false;
  ReleaseSlotIfIdleLocked(slot);
}

void PeerRequester::CancelFetches() {
  MutexLock lock(&worker_.mu());
  fetches_cancelled_ = true;
  for (auto& [id, request] : pending_) {
    // A request whose data is arriving completes when it is in (its fetch
    // no longer waits for it); the others complete now.
    if (request->state == Request::kSent) {
      CompleteLocked(*request, absl::UnavailableError("remote: shutting down"));
    } else {
      request->done.SignalAll();
    }
  }
  slot_freed_.SignalAll();
}

void PeerRequester::CompleteLocked(Request& request, absl::Status status) {
  request.state = Request::kDone;
  request.status = std::move(status);
  request.done.SignalAll();
}

void PeerRequester::ReleaseSlotIfIdleLocked(int slot) {
  if (!slots_[slot].fetch_active && slots_[slot].receives == 0) {
    free_slots_.push_back(slot);
    slot_freed_.Signal();
  }
}

void PeerRequester::OnPeerDownLocked(int rank) {
  for (auto& [id, request] : pending_) {
    if (request->rank == rank && request->state == Request::kSent) {
      CompleteLocked(*request, PeerDown(rank));
    }
  }
}

absl::Status PeerRequester::PeerDown(int rank) {
  return absl::UnavailableError(absl::StrCat("remote: peer ", rank, " is marked down"));
}

// ---- Progress thread ----

void PeerRequester::SendRequest(const std::shared_ptr<Request>& request) {
  {
    MutexLock lock(&worker_.mu());
    if (request->state != Request::kSent || request->abandoned) return;
  }
  if (absl::Status s = worker_.Reconnect(request->rank, request->address); !s.ok()) {
    MutexLock lock(&worker_.mu());
    worker_.peers().MarkDownLocked(request->rank, s.message());
    return;
  }
  auto* sending = new Sending(request);
  const absl::StatusOr<UcxWorker::Started> started =
      worker_.Send(request->rank, PeerMessage::kRequest, &request->header, sizeof(RequestHeader),
                   request->name.data(), request->name.size(), nullptr, sending);
  if (!started.ok()) {
    delete sending;
    MutexLock lock(&worker_.mu());
    worker_.peers().MarkDownLocked(request->rank, started.status().message());
  } else if (*started == UcxWorker::Started::kDone) {
    delete sending;
  }
}

void PeerRequester::OnMessage(const UcxWorker::Message& message) {
  const absl::StatusOr<ReplyHeader> decoded = peer_wire::DecodeReplyHeader(message.header);
  if (!decoded.ok()) return;
  const ReplyHeader& reply = *decoded;
  std::shared_ptr<Request> request;
  {
    MutexLock lock(&worker_.mu());
    auto it = pending_.find(reply.request_id);
    // Unknown: the fetch gave up on it. Returning drops the data.
    if (it == pending_.end() || it->second->state != Request::kSent) return;
    request = it->second;
    worker_.peers().HeardFromLocked(request->rank);
    if (absl::Status verdict =
            peer_wire::CheckReply(reply, message.length, request->length, request->rank);
        !verdict.ok()) {
      CompleteLocked(*request, std::move(verdict));
    } else if (message.rendezvous) {
      request->state = Request::kReceiving;
      request->checksum = reply.checksum;
      ++slots_[request->slot].receives;
    } else {
      std::memcpy(request->destination, message.data, message.length);
      request->in_place = true;
      request->checksum = reply.checksum;
      CompleteLocked(*request, absl::OkStatus());
    }
    if (request->state == Request::kDone) return;
  }
  // Rendezvous: pull the data into the pre-registered receive buffer.
  auto* receiving = new Receiving(*this, request);
  const absl::StatusOr<UcxWorker::Started> started = worker_.Receive(
      message.data, request->buffer, message.length, *receive_region_, receiving);
  if (!started.ok()) {
    receiving->Done(started.status());
  } else if (*started == UcxWorker::Started::kDone) {
    receiving->Done(absl::OkStatus());
  }
}

void PeerRequester::FinishReceive(std::shared_ptr<Request> request, const absl::Status& status) {
  MutexLock lock(&worker_.mu());
  --slots_[request->slot].receives;
  if (request->abandoned) {
    pending_.erase(request->id);
    ReleaseSlotIfIdleLocked(request->slot);
  } else {
    CompleteLocked(*request, status.ok() ? absl::OkStatus()
                                         : absl::UnavailableError(absl::StrCat(
                                               "remote: transfer from peer ", request->rank,
                                               " failed: ", status.message())));
  }
}

}  // namespace monarch
