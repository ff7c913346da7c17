// UcxWorker: this process's UCP context and worker, and the progress thread
// that drives them.
//
// It owns everything of UCX's: the context (active messages and wake-up, on
// the transports of remote.transports), the worker (single-thread mode), the
// memory regions registered once at start-up (the requester's receive
// buffers and the server's staging buffers), one endpoint per peer (with
// UCX's peer error handling: a dead peer fails its transfers at once; its
// part UcxEndpoints, in the .cc), and the progress thread. That thread
// sleeps on the worker's event fd and on an eventfd that other threads write
// after they queue a command for it (no busy polling: the cores belong to
// the training job). UCX is called only through the table LoadUcx() opens
// (ucx_loader.h), and a UCX status becomes a Status here and nowhere else.
//
// Messages. Each incoming request or reply is passed, as bytes, to the
// handler set for it (PeerServer: requests; PeerRequester: replies). A
// goodbye UcxEndpoints handles: the peer table marks the sender as left. When
// it stops it says goodbye to every peer (at most 1 s) and closes the
// endpoints (at most 5 s). An endpoint error marks the peer down and closes
// that endpoint; the next request to the peer after its retry time creates
// it again (Reconnect).
//
// Lifetime: SetHandler() for requests and replies, Open(), RegisterRegion()
// as needed, LocalAddress(), Start() (which connects first); then Stop()
// (which joins the progress thread) and Close() (also done by the
// destructor), which releases UCX. Close() must come after Stop(), or when
// Start() never ran. A transfer or handler may be called back while Close()
// destroys the UCP worker.
//
// Threads: after Start() only the progress thread calls into UCX (Open,
// RegisterRegion, LocalAddress and connecting run before it on the starting
// thread, Close after it). The methods under "Progress thread" may be called
// only there: from a command, a message handler or a transfer's Done. Every
// other method may be called from any thread.

#ifndef MONARCH_REMOTE_UCX_WORKER_H_
#define MONARCH_REMOTE_UCX_WORKER_H_

#include <ucp/api/ucp.h>

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/mutex.h"
#include "common/shutdown.h"
#include "remote/peer_network.h"
#include "remote/peer_table.h"
#include "remote/ucx_loader.h"

namespace monarch {

// The protocol's active messages, by UCX id (part of the wire format,
// peer_network.h).
enum class PeerMessage : unsigned {
  kRequest = 1,  // requester -> home: RequestHeader, data = the file name.
  kReply = 2,    // home -> requester: ReplyHeader, data = the bytes.
  kGoodbye = 3,  // "I am shutting down": header = the sender's rank.
};

class UcxEndpoints;

class UcxWorker {
 public:
  // A message from a peer, valid only during the handler's call.
  struct Message {
    absl::string_view header;
    // The data, or with `rendezvous` UCX's descriptor of data still at the
    // sender, which Receive() fetches (during the handler's call only).
    void* data;
    size_t length;
    bool rendezvous;
  };
  // Called on the progress thread for each message of the kind it was set
  // for. A message is dropped once the handler returns.
  class MessageHandler {
   public:
    virtual void OnMessage(const Message& message) = 0;

   protected:
    ~MessageHandler() = default;
  };

  // A send or receive that UCX may finish after the call that started it
  // returned. The caller allocates it and keeps what the transfer reads or
  // writes alive; when the transfer ends later, the worker calls Done() once,
  // on the progress thread, with OK or the transfer's error (Unavailable).
  // Done may delete the Transfer.
  class Transfer {
   public:
    virtual void Done(absl::Status status) = 0;

   protected:
    ~Transfer() = default;

   private:
    friend class UcxWorker;
    UcxWorker* worker_ = nullptr;  // Set when started: the worker frees UCX's request.
  };
  // How a transfer stands when Send() or Receive() returns (an error: it
  // failed at once). Done() is called only for kInFlight.
  enum class Started { kDone, kInFlight };

  // Page-aligned memory registered with UCX once, carved into equal buffers.
  class Region {
   public:
    char* buffer(size_t i) const { return base_ + i * buffer_bytes_; }

   private:
    friend class UcxWorker;
    char* base_ = nullptr;
    size_t bytes_ = 0;
    size_t buffer_bytes_ = 0;
    ucp_mem_h memh_ = nullptr;
  };

  // `options` (rank, size, transports) and `peers` must outlive the worker.
  UcxWorker(const UcxApi& ucx, const PeerNetwork::Options& options, PeerTable& peers);
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  // The peer table and the network's lock. The other parts reach both
  // through here, and only so: the lock annotations name the lock as
  // `worker.mu()`, which is peers().mu().
  PeerTable& peers() const { return peers_; }
  Mutex& mu() const ABSL_LOCK_RETURNED(peers().mu()) { return peers_.mu(); }

  // ---- Start-up, on the starting thread ----

  // Where messages of kind `message` (kRequest or kReply) go. Before Open().
  void SetHandler(PeerMessage message, MessageHandler* handler);
  // Creates the context and the worker, the wake-up eventfd, and registers
  // the message handlers. Unavailable (UCX failed), InvalidArgument
  // (remote.transports refused) or Internal (no eventfd).
  absl::Status Open();
  // Registers `buffers` buffers of `buffer_bytes` each, once: the per-file
  // path never registers. ResourceExhausted (no memory) or Unavailable. The
  // region lives until Close().
  absl::StatusOr<const Region*> RegisterRegion(size_t buffers, size_t buffer_bytes);
  // This worker's address, for the exchange.
  absl::StatusOr<std::string> LocalAddress();
  // Creates an endpoint to every other rank, at `addresses[rank]`, then
  // starts the progress thread. Unavailable naming the first peer that
  // cannot be reached (and no thread started).
  absl::Status Start(std::vector<std::string> addresses);

  // ---- Any thread ----

  // Queues `command` to run on the progress thread; Wake() makes it run soon.
  void PostLocked(std::function<void()> command) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());
  void Wake();

  // A send the progress loop finishes before it stops (until the stop
  // deadline: a peer that died mid-transfer may never complete it). The
  // server counts each reply from when it is queued until UCX is done with it.
  void SendQueuedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) { ++sends_to_finish_; }
  void SendFinishedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) { --sends_to_finish_; }

  // Started, and Stop() not called yet.
  bool Running() const;
  // Stop() has been called.
  bool StoppingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) { return stopping_; }
  // Stops the progress loop once its queue is empty and the sends it
  // finishes are done, or at `deadline`; then it says goodbye (at most 1 s)
  // and closes the endpoints (at most 5 s). Returns when the thread has
  // ended. Once, after Start().
  void Stop(Deadline deadline);
  // Releases the UCP worker, the regions and the context. Idempotent.
  void Close();

  // ---- Progress thread ----

  // The endpoint to `rank`, created again if it was closed after a failure:
  // at `address` when not empty (a restarted peer publishes a new one).
  absl::Status Reconnect(int rank, const std::string& address);
  // Sends message `message` to `rank`: `header`, then `length` bytes of
  // `data` (in `region`, when not null). Both must stay alive until the
  // send is done. Unavailable when there is no endpoint to `rank`, or the
  // send failed at once (the message is UCX's).
  absl::StatusOr<Started> Send(int rank, PeerMessage message, const void* header,
                               size_t header_length, const void* data, size_t length,
                               const Region* region, Transfer* transfer);
  // Fetches the data of a rendezvous message (Message::data, during its
  // handler's call) into `buffer`, inside `region`. Unavailable when it
  // failed at once.
  absl::StatusOr<Started> Receive(void* data, char* buffer, size_t length, const Region& region,
                                  Transfer* transfer);

 private:
  friend class UcxEndpoints;  // Creates and closes endpoints on worker_.

  // Open()'s steps.
  absl::Status CreateContext();
  absl::Status CreateWorker();
  absl::Status SetMessageHandlers();

  // The one place a UCX status becomes a Status: "remote: <what>: <UCX's words>".
  absl::Status UcxError(absl::string_view what, ucs_status_t status) const;
  // The same with UCX's words only (a transfer's outcome).
  absl::Status TransferStatus(ucs_status_t status) const;
  // What UCX's answer to a non-blocking call (a request, null or an error) means.
  absl::StatusOr<Started> Outcome(void* request) const;

  void ProgressLoop();
  void RunCommands();

  // UCX's callbacks.
  static ucs_status_t OnMessage(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param);
  static void OnSendDone(void* request, ucs_status_t status, void* user_data);
  static void OnReceiveDone(void* request, ucs_status_t status, size_t length, void* user_data);

  const UcxApi& ucx_;  // Every call into UCX goes through it (ucx_loader.h).
  const PeerNetwork::Options& options_;
  PeerTable& peers_;
  MessageHandler* request_handler_ = nullptr;
  MessageHandler* reply_handler_ = nullptr;

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int worker_fd_ = -1;
  int wake_fd_ = -1;
  std::vector<std::unique_ptr<Region>> regions_;  // Released in registration order.
  const std::unique_ptr<UcxEndpoints> endpoints_;

  std::deque<std::function<void()>> commands_ ABSL_GUARDED_BY(mu());
  int sends_to_finish_ ABSL_GUARDED_BY(mu()) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu()) = false;
  Clock::time_point stop_deadline_ ABSL_GUARDED_BY(mu()){};  // Set with stopping_.

  std::thread progress_thread_;
};

}  // namespace monarch

#endif  // MONARCH_REMOTE_UCX_WORKER_H_
