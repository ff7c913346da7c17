// PeerRequester: the requester side of the peer network, fetching file
// ranges from peers.
//
// A fetch takes one of the receive buffers (remote.receive_buffers of them,
// registered once with the worker) and sends a request per piece: a range
// that fits the buffer is one piece; a larger one streams through the
// buffer as a ring of chunk-sized pieces, several in flight. A reply small
// enough to come eagerly is copied from UCX's buffer straight into the
// caller's; a larger one is received into the piece's place in the buffer
// and copied out as it is checked. Every piece is checked for length and
// CRC32C, so the bytes returned are the bytes the home sent. A piece not
// answered by the request timeout marks the peer down. A reply whose fetch
// gave up is dropped; a buffer with a receive still writing into it is not
// reused until that receive ends.
//
// Lifetime: created by PeerNetwork::Impl after the worker, which it uses,
// and before the worker is closed; RegisterBuffers() once before the
// progress thread starts.
//
// Threads: Fetch may be called from any number of threads (it blocks until
// its pieces are in, it gives up, or the fetches are cancelled), as may
// CancelFetches and the counters. The requests are sent, and replies
// received, on the progress thread (SendRequest, OnMessage, FinishReceive).
// A fetch and the progress thread meet in the Requests, under the network's
// lock (worker.mu()).

#ifndef MONARCH_REMOTE_PEER_REQUESTER_H_
#define MONARCH_REMOTE_PEER_REQUESTER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "drivers/storage_driver.h"
#include "remote/peer_network.h"
#include "remote/peer_table.h"
#include "remote/ucx_worker.h"

namespace monarch {

class PeerRequester final : public UcxWorker::MessageHandler, public PeerTable::Listener {
 public:
  // `options` (rank, buffer and chunk sizes, receive buffers, the request
  // timeout, lookup_address) and `secret` must outlive the requester;
  // `secret` is set before the progress thread starts, read-only after.
  PeerRequester(UcxWorker& worker, const PeerNetwork::Options& options, const std::string& secret);
  PeerRequester(const PeerRequester&) = delete;
  PeerRequester& operator=(const PeerRequester&) = delete;

  // Registers the receive buffers (UcxWorker::RegisterRegion's errors).
  absl::Status RegisterBuffers();

  // PeerNetwork::Fetch: reads [offset, offset + n) of `file` from peer
  // `rank` into `dst`. Returns n, or Unavailable (peer down or refused,
  // fetches cancelled, no receive buffer freed within the request timeout),
  // DeadlineExceeded (a piece not answered in time: the peer is marked
  // down) or DataLoss (length or checksum mismatch).
  absl::StatusOr<size_t> Fetch(int rank, const FileRef& file, uint64_t offset, char* dst, size_t n);

  // Fetches fail from now on (Unavailable), and those waiting for a reply
  // or a receive buffer give up at once. Idempotent.
  void CancelFetches();

  uint64_t timeouts() const { return timeouts_.load(); }
  uint64_t checksum_failures() const { return checksum_failures_.load(); }

 private:
  // One piece of a Fetch in flight.
  struct Request {
    enum State { kSent, kReceiving, kDone };
    uint64_t id = 0;
    int rank = 0;
    int slot = 0;
    char* buffer = nullptr;       // Where rendezvous reply data lands (inside the slot).
    char* destination = nullptr;  // The caller's bytes for this piece.
    size_t length = 0;
    std::string name;     // Kept alive until the request message is sent.
    std::string address;  // The peer's, looked up again: it is being retried.
    peer_wire::RequestHeader header;
    Clock::time_point deadline;
    // Guarded by the network's lock:
    State state = kSent;
    absl::Status status;
    uint64_t checksum = 0;
    bool in_place = false;   // The data was copied to `destination` (an eager reply).
    bool abandoned = false;  // The fetch gave up while data was arriving.
    CondVar done;            // Signalled when state becomes kDone.
  };

  // A receive buffer.
  struct Slot {
    bool fetch_active = false;
    int receives = 0;  // Receives still writing into it.
  };

  class Sending;    // A request's message, while UCX sends it.
  class Receiving;  // A reply's data, while UCX receives it.

  // Fetch's steps.
  std::string AddressToRetry(int rank);
  absl::StatusOr<int> TakeSlot(int rank);
  absl::Status Await(Request& request, const FileRef& file);
  void Retire(const std::vector<std::shared_ptr<Request>>& ring, int slot);

  // Wakes exactly the thread waiting for this request.
  void CompleteLocked(Request& request, absl::Status status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(worker_.mu());
  void ReleaseSlotIfIdleLocked(int slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(worker_.mu());
  // PeerTable::Listener: fails `rank`'s requests still waiting for an answer.
  void OnPeerDownLocked(int rank) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(worker_.mu());

  // ---- Progress thread ----
  void SendRequest(const std::shared_ptr<Request>& request);
  // A reply (UcxWorker::MessageHandler).
  void OnMessage(const UcxWorker::Message& reply) override;
  void FinishReceive(std::shared_ptr<Request> request, const absl::Status& status);

  static absl::Status PeerDown(int rank);

  UcxWorker& worker_;
  const PeerNetwork::Options& options_;
  const std::string& secret_;
  const Clock::duration timeout_;
  const UcxWorker::Region* receive_region_ = nullptr;  // Set by RegisterBuffers().

  CondVar slot_freed_;  // A receive buffer became free.
  absl::flat_hash_map<uint64_t, std::shared_ptr<Request>> pending_ ABSL_GUARDED_BY(worker_.mu());
  uint64_t next_request_id_ ABSL_GUARDED_BY(worker_.mu()) = 1;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(worker_.mu());
  std::vector<int> free_slots_ ABSL_GUARDED_BY(worker_.mu());
  // Set by CancelFetches(): Fetch() fails at once, and waiting fetches give up.
  bool fetches_cancelled_ ABSL_GUARDED_BY(worker_.mu()) = false;

  std::atomic<uint64_t> timeouts_{0};
  std::atomic<uint64_t> checksum_failures_{0};
};

}  // namespace monarch

#endif  // MONARCH_REMOTE_PEER_REQUESTER_H_
