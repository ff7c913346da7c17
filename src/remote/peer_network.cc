// PeerNetwork over UCP active messages. See peer_network.h and DESIGN.md.
// UCX is called only through the table LoadUcx() opens (ucx_loader.h).
//
// Threads: the progress thread owns the UCP worker and is the only thread
// that calls into UCX after start-up. Callers of Fetch and the serve pool
// hand it work as commands (closures) through a queue and an eventfd; it
// hands results back through Request objects under `mu_`.

#include "common/os.h"
#include "remote/peer_network.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "remote/ucx_loader.h"

namespace monarch {
namespace {

constexpr unsigned kRequestAm = 1;
constexpr unsigned kReplyAm = 2;
constexpr unsigned kGoodbyeAm = 3;  // "I am shutting down": header = the sender's rank.
constexpr uint64_t kMinRing = 4;

using peer_wire::kProtocol;
using peer_wire::ReplyHeader;
using peer_wire::RequestHeader;

Clock::duration Seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// Page-aligned memory registered with UCX once, carved into equal buffers.
class RegisteredRegion {
 public:
  RegisteredRegion() = default;
  ~RegisteredRegion() { Release(); }

  absl::Status Init(const UcxApi& ucx, ucp_context_h context, size_t buffers, size_t buffer_bytes) {
    ucx_ = &ucx;
    context_ = context;
    buffer_bytes_ = buffer_bytes;
    bytes_ = buffers * buffer_bytes;
    base_ = static_cast<char*>(std::aligned_alloc(4096, (bytes_ + 4095) / 4096 * 4096));
    if (base_ == nullptr) return absl::ResourceExhaustedError("remote: cannot allocate buffers");
    ucp_mem_map_params_t params = {};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    params.address = base_;
    params.length = bytes_;
    const ucs_status_t status = ucx_->ucp_mem_map(context, &params, &memh_);
    if (status != UCS_OK) {
      return absl::UnavailableError(absl::StrCat("remote: ucp_mem_map of ", bytes_,
                                                 " bytes: ", ucx_->ucs_status_string(status)));
    }
    return absl::OkStatus();
  }
  void Release() {
    if (memh_ != nullptr) ucx_->ucp_mem_unmap(context_, memh_);
    memh_ = nullptr;
    std::free(base_);
    base_ = nullptr;
  }
  char* buffer(size_t i) const { return base_ + i * buffer_bytes_; }
  ucp_mem_h memh() const { return memh_; }

 private:
  const UcxApi* ucx_ = nullptr;
  ucp_context_h context_ = nullptr;
  char* base_ = nullptr;
  size_t bytes_ = 0;
  size_t buffer_bytes_ = 0;
  ucp_mem_h memh_ = nullptr;
};

}  // namespace

class PeerNetwork::Impl {
 public:
  Impl(const UcxApi& ucx, const Options& options, ServeFn serve)
      : ucx_(ucx),
        options_(options),
        serve_(std::move(serve)),
        peers_(options.size),
        serve_pool_(options.serve_threads) {}

  // An owner whose Shutdown() gave up must abandon the network instead.
  ~Impl() {
    Shutdown(DeadlineIn(kCancelGraceSeconds));
    if (worker_ != nullptr) ucx_.ucp_worker_destroy(worker_);
    receive_region_.Release();
    send_region_.Release();
    if (context_ != nullptr) ucx_.ucp_cleanup(context_);
    if (wake_fd_ >= 0) os::Close(wake_fd_);
  }

  absl::Status Init(const AddressExchange& exchange) {
    ucp_config_t* config;
    ucs_status_t status = ucx_.ucp_config_read(nullptr, nullptr, &config);
    if (status != UCS_OK) return UcxError("ucp_config_read", status);
    // Replies up to a few hundred KiB (ImageNet-sized files) go eagerly, in
    // one trip: a rendezvous's extra round trip costs them a fifth of their
    // throughput (bench/results/remote_fetch.md). An explicit UCX_RNDV_THRESH wins.
    if (std::getenv("UCX_RNDV_THRESH") == nullptr) {
      (void)ucx_.ucp_config_modify(config, "RNDV_THRESH", "256k");
    }
    if (options_.transports != "all") {
      status = ucx_.ucp_config_modify(config, "TLS", options_.transports.c_str());
      if (status != UCS_OK) {
        ucx_.ucp_config_release(config);
        return absl::InvalidArgumentError(absl::StrCat("remote.transports: UCX refused '",
                                                       options_.transports,
                                                       "': ", ucx_.ucs_status_string(status)));
      }
    }
    ucp_params_t params = {};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    status = ucx_.Init(&params, config, &context_);
    ucx_.ucp_config_release(config);
    if (status != UCS_OK) return UcxError("ucp_init", status);

    ucp_worker_params_t worker_params = {};
    worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;  // Only the progress thread uses it.
    status = ucx_.ucp_worker_create(context_, &worker_params, &worker_);
    if (status != UCS_OK) return UcxError("ucp_worker_create", status);
    status = ucx_.ucp_worker_get_efd(worker_, &worker_fd_);
    if (status != UCS_OK) return UcxError("ucp_worker_get_efd", status);
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) return absl::InternalError("remote: eventfd failed");

    for (auto [id, callback] : {std::pair<unsigned, ucp_am_recv_callback_t>{kRequestAm, OnRequest},
                                {kReplyAm, OnReply},
                                {kGoodbyeAm, OnGoodbye}}) {
      ucp_am_handler_param_t handler = {};
      handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                           UCP_AM_HANDLER_PARAM_FIELD_ARG;
      handler.id = id;
      handler.cb = callback;
      handler.arg = this;
      status = ucx_.ucp_worker_set_am_recv_handler(worker_, &handler);
      if (status != UCS_OK) return UcxError("ucp_worker_set_am_recv_handler", status);
    }

    // The buffers are registered once, here; the per-file path never registers.
    send_bytes_ = std::max(options_.buffer_bytes, options_.chunk_bytes);
    const size_t send_buffers = 2 * static_cast<size_t>(options_.serve_threads);
    if (absl::Status s =
            receive_region_.Init(ucx_, context_, options_.receive_buffers, options_.buffer_bytes);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = send_region_.Init(ucx_, context_, send_buffers, send_bytes_); !s.ok()) {
      return s;
    }
    {
      MutexLock lock(&mu_);
      slots_.resize(options_.receive_buffers);
      for (int i = options_.receive_buffers - 1; i >= 0; --i) free_slots_.push_back(i);
      for (size_t i = send_buffers; i-- > 0;) free_send_buffers_.push_back(i);
    }

    ucp_address_t* address;
    size_t address_length;
    status = ucx_.ucp_worker_get_address(worker_, &address, &address_length);
    if (status != UCS_OK) return UcxError("ucp_worker_get_address", status);
    const std::string mine(reinterpret_cast<const char*>(address), address_length);
    ucx_.ucp_worker_release_address(worker_, address);

    absl::StatusOr<std::vector<std::string>> addresses = exchange(mine);
    if (!addresses.ok()) return addresses.status();
    if (static_cast<int>(addresses->size()) != options_.size) {
      return absl::InternalError("remote: address exchange returned the wrong number of peers");
    }
    // Before the progress thread starts: it only reads secret_ from then on.
    absl::StatusOr<std::string> secret =
        options_.secret ? options_.secret()
                        : absl::InvalidArgumentError("remote: no job secret was given");
    if (!secret.ok()) return secret.status();
    if (secret->size() != peer_wire::kSecretBytes) {
      return absl::InvalidArgumentError(absl::StrCat("remote: the job secret has ", secret->size(),
                                                     " bytes, not ", peer_wire::kSecretBytes));
    }
    secret_ = std::move(*secret);
    for (int r = 0; r < options_.size; ++r) {
      peers_[r].owner = this;
      peers_[r].rank = r;
      peers_[r].address = std::move((*addresses)[r]);
      if (r != options_.rank) {
        if (absl::Status s = Connect(peers_[r]); !s.ok()) return s;
      }
    }
    progress_thread_ = std::thread([this] { ProgressLoop(); });
    return absl::OkStatus();
  }

  absl::StatusOr<size_t> Fetch(int rank, const FileRef& file, uint64_t offset, char* dst,
                               size_t n) {
    if (n == 0) return 0;
    const auto timeout = Seconds(options_.request_timeout_seconds);
    // A peer tried again after a failure may have restarted elsewhere: its
    // address is looked up here, not on the progress thread, which every
    // peer's transfers wait on while it reads the rendezvous directory.
    std::string address;
    if (options_.lookup_address) {
      bool retry;
      {
        MutexLock lock(&mu_);
        retry = peers_[rank].lost && UpLocked(rank);
      }
      if (retry) {
        absl::StatusOr<std::string> found = options_.lookup_address(rank);
        if (found.ok()) address = *std::move(found);
      }
    }
    int slot;
    {
      MutexLock lock(&mu_);
      if (stopping_ || fetches_cancelled_) return absl::UnavailableError("remote: shutting down");
      if (!UpLocked(rank)) return PeerDown(rank);
      const Clock::time_point give_up = Clock::now() + timeout;
      while (free_slots_.empty()) {
        if (fetches_cancelled_) return absl::UnavailableError("remote: shutting down");
        if (!slot_freed_.WaitUntil(&mu_, give_up) && free_slots_.empty()) {
          return absl::UnavailableError("remote: no receive buffer became free");
        }
      }
      slot = free_slots_.back();
      free_slots_.pop_back();
      slots_[slot].fetch_active = true;
    }
    char* const buffer = receive_region_.buffer(slot);
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
      request->owner = this;
      request->rank = rank;
      request->slot = slot;
      request->buffer = buffer + (k % depth) * piece;
      request->destination = dst + k * piece;
      request->length = std::min(piece, n - k * piece);
      request->name = std::string(file.name);
      request->address = address;
      request->header =
          RequestHeader{kProtocol, options_.rank, 0, offset + k * piece, request->length,
                        file.size, file.mtime_ns, {}};
      std::memcpy(request->header.secret, secret_.data(), sizeof(request->header.secret));
      request->deadline = Clock::now() + timeout;
      {
        MutexLock lock(&mu_);
        request->header.request_id = request->id = next_request_id_++;
        pending_.emplace(request->id, request);
        commands_.push_back([this, request] { SendRequest(request); });
      }
      Wake();
      ring[k % depth] = request;
    };

    absl::Status status;
    for (size_t k = 0; k < ring.size(); ++k) issue(k);
    for (size_t k = 0; k < pieces && status.ok(); ++k) {
      std::shared_ptr<Request> request = ring[k % depth];
      {
        MutexLock lock(&mu_);
        // Ends when the reply is in, at the request's deadline, or when
        // shutdown cancels the fetches (CancelFetches signals `done`).
        while (request->state != Request::kDone && !fetches_cancelled_) {
          if (!request->done.WaitUntil(&mu_, request->deadline) &&
              request->state != Request::kDone) {
            timeouts_.fetch_add(1, std::memory_order_relaxed);
            MarkDownLocked(rank, "did not answer within remote.request_timeout");
            break;
          }
        }
        if (request->state != Request::kDone) {
          status = fetches_cancelled_
                       ? absl::UnavailableError("remote: shutting down")
                       : absl::DeadlineExceededError(
                             absl::StrCat("remote: peer ", rank, " did not answer within ",
                                          options_.request_timeout_seconds, " s"));
        } else {
          // Taken, not copied: a refusal's message was made on the progress
          // thread, which may drop the Request last; this way the caller
          // frees it. (Abseil's reference count is not instrumented, so TSan
          // would see that free racing with the caller's reads.)
          status = std::move(request->status);
          pending_.erase(request->id);
        }
      }
      if (!status.ok()) break;
      // Copy out first, then verify the copy: a late message landing in the
      // buffer afterwards cannot change bytes already checked. An eager
      // reply is already in place (copied under mu_ while this fetch was
      // waiting for it, so never after it gave up).
      const uint64_t sum = request->in_place
                               ? Crc32c(request->destination, request->length)
                               : Crc32cCopy(request->destination, request->buffer,
                                            request->length);
      if (sum != request->checksum) {
        checksum_failures_.fetch_add(1, std::memory_order_relaxed);
        status = absl::DataLossError(
            absl::StrCat("remote: checksum mismatch for ", file.name, " from peer ", rank));
        break;
      }
      ring[k % depth] = nullptr;
      if (k + depth < pieces) issue(k + depth);
    }

    {
      MutexLock lock(&mu_);
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
    if (!status.ok()) return status;
    return n;
  }

  bool IsUp(int rank) const {
    MutexLock lock(&mu_);
    return UpLocked(rank);
  }

  bool IsLost(int rank) const {
    MutexLock lock(&mu_);
    return peers_[rank].lost;
  }

  bool HasLeft(int rank) const {
    MutexLock lock(&mu_);
    return peers_[rank].departed;
  }

  void StartServing() {
    MutexLock lock(&mu_);
    if (serving_ != Serving::kHeld) return;
    serving_ = Serving::kOn;
    for (auto& [request, name] : held_) {
      serve_pool_.detach_task(
          [this, request = request, name = std::move(name)] { Serve(request, name); });
    }
    held_.clear();
  }

  void CancelFetches() {
    MutexLock lock(&mu_);
    fetches_cancelled_ = true;
    for (auto& [id, request] : pending_) {
      // A request whose data is arriving completes when it is in (its
      // fetch no longer waits for it); the others complete now.
      if (request->state == Request::kSent) {
        Complete(*request, absl::UnavailableError("remote: shutting down"));
      } else {
        request->done.SignalAll();
      }
    }
    slot_freed_.SignalAll();
  }

  bool Shutdown(Deadline deadline) {
    CancelFetches();
    {
      MutexLock lock(&mu_);
      if (stopping_ || !progress_thread_.joinable()) {
        stopping_ = true;
        return serve_pool_.wait_until(deadline);
      }
      serving_ = Serving::kOff;
      for (const auto& [request, name] : held_) {
        QueueReplyLocked(request, absl::StatusCode::kUnavailable, nullptr, -1, 0);
      }
      held_.clear();
    }
    // Requests already accepted are answered; new ones are refused. Each
    // ends within its read (a Serve waiting for a send buffer gives up at
    // the request timeout).
    const bool served = serve_pool_.wait_until(deadline);
    if (!served) {
      MONARCH_LOG(kWarning, "remote: gave up waiting at shutdown for ",
                  serve_pool_.get_tasks_running(),
                  " peer requests still being read (a file system that stopped answering?)");
    }
    {
      MutexLock lock(&mu_);
      stopping_ = true;
      // Replies still being sent get until the deadline (a peer that died
      // mid-transfer may never complete them); then the endpoints close.
      stop_deadline_ = deadline;
    }
    slot_freed_.SignalAll();
    Wake();
    // Bounded: the progress loop ends at the deadline, then says goodbye
    // (at most 1 s) and closes the endpoints (at most 5 s).
    progress_thread_.join();
    return served;
  }

  void ReportCounters(CounterSink& sink) const {
    sink.Counter("remote.requests_served", requests_served_.load(),
                 "Requests this process answered for peers, with data.");
    sink.Counter("remote.bytes_served", bytes_served_.load(), "Bytes sent to peers.");
    sink.Counter("remote.requests_refused", requests_refused_.load(),
                 "Peer requests answered with an error (wrong version, shutting down...).");
    sink.Counter("remote.timeouts", timeouts_.load(), "Fetches a peer did not answer in time.");
    sink.Counter("remote.peer_failures", peer_failures_.load(), "Times a peer was marked down.");
    sink.Counter("remote.requests_unauthenticated", requests_unauthenticated_.load(),
                 "Peer requests refused for want of this job's secret (also counted in "
                 "remote.requests_refused).");
    sink.Counter("remote.checksum_failures", checksum_failures_.load(),
                 "Transfers whose length or checksum did not match.");
  }

 private:
  // One piece of a Fetch in flight.
  struct Request {
    enum State { kSent, kReceiving, kDone };
    Impl* owner = nullptr;
    uint64_t id = 0;
    int rank = 0;
    int slot = 0;
    char* buffer = nullptr;  // Where rendezvous reply data lands (inside the slot).
    char* destination = nullptr;  // The caller's bytes for this piece.
    size_t length = 0;
    std::string name;  // Kept alive until the request message is sent.
    std::string address;  // The peer's, looked up again: it is being retried.
    RequestHeader header;
    Clock::time_point deadline;
    // Guarded by mu_:
    State state = kSent;
    absl::Status status;
    uint64_t checksum = 0;
    bool in_place = false;   // The data was copied to `destination` (an eager reply).
    bool abandoned = false;  // The fetch gave up while data was arriving.
    CondVar done;            // Signalled when state becomes kDone.
  };

  struct Slot {
    bool fetch_active = false;
    int receives = 0;  // Receives still writing into it.
  };

  struct Peer {
    Impl* owner = nullptr;
    int rank = 0;
    std::string address;
    ucp_ep_h ep = nullptr;           // Progress thread (and Init) only.
    Clock::time_point down_until{};  // Guarded by mu_.
    bool lost = false;               // Down, and not heard from since. Guarded by mu_.
    bool departed = false;           // Said goodbye before it was lost. Guarded by mu_.
  };

  // A reply being sent, kept alive until UCX is done with its header and buffer.
  struct Reply {
    Impl* impl;
    ReplyHeader header;
    int send_buffer = -1;         // Staging buffer the data is in, or -1.
    const char* data = nullptr;   // The bytes of an OK reply.
  };

  absl::Status UcxError(const char* what, ucs_status_t status) const {
    return absl::UnavailableError(
        absl::StrCat("remote: ", what, ": ", ucx_.ucs_status_string(status)));
  }

  absl::Status PeerDown(int rank) const {
    return absl::UnavailableError(absl::StrCat("remote: peer ", rank, " is marked down"));
  }

  bool UpLocked(int rank) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return Clock::now() >= peers_[rank].down_until;
  }

  void Wake() {
    const uint64_t one = 1;
    // An eventfd, no file: outside the seam of common/os.h.
    ssize_t ignored = ::write(wake_fd_, &one, sizeof(one));
    (void)ignored;
  }

  // Wakes exactly the thread waiting for this request.
  void Complete(Request& request, absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    request.state = Request::kDone;
    request.status = std::move(status);
    request.done.SignalAll();
  }

  // Marks `rank` down until retry_after and fails its requests that are
  // still waiting for an answer. A peer that said goodbye is not a failure.
  void MarkDownLocked(int rank, absl::string_view why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const bool was_up = UpLocked(rank);
    peers_[rank].down_until = Clock::now() + Seconds(options_.retry_after_seconds);
    peers_[rank].lost = true;
    if (was_up && !peers_[rank].departed) {
      peer_failures_.fetch_add(1, std::memory_order_relaxed);
      MONARCH_LOG(kWarning, "peer ", rank, " ", why, "; its files go to the next rank of their ",
                  "order for ", options_.retry_after_seconds, " s");
    }
    for (auto& [id, request] : pending_) {
      if (request->rank == rank && request->state == Request::kSent) {
        Complete(*request, PeerDown(rank));
      }
    }
  }

  void ReleaseSlotIfIdleLocked(int slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!slots_[slot].fetch_active && slots_[slot].receives == 0) {
      free_slots_.push_back(slot);
      slot_freed_.Signal();
    }
  }

  // ---- Progress thread ----

  absl::Status Connect(Peer& peer) {
    ucp_ep_params_t params = {};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = reinterpret_cast<const ucp_address_t*>(peer.address.data());
    // Peer failure detection: a dead peer fails its requests instead of
    // hanging them. (It also rules out UCX's shared-memory transports, see DESIGN.md.)
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = OnEndpointError;
    params.err_handler.arg = &peer;
    const ucs_status_t status = ucx_.ucp_ep_create(worker_, &params, &peer.ep);
    if (status != UCS_OK) {
      peer.ep = nullptr;
      return absl::UnavailableError(absl::StrCat("remote: cannot reach peer ", peer.rank, " over '",
                                                 options_.transports,
                                                 "': ", ucx_.ucs_status_string(status)));
    }
    return absl::OkStatus();
  }

  void ProgressLoop() {
    const int epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
    for (int fd : {worker_fd_, wake_fd_}) {
      epoll_event event = {};
      event.events = EPOLLIN;
      event.data.fd = fd;
      ::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &event);
    }
    for (;;) {
      RunCommands();
      while (ucx_.ucp_worker_progress(worker_) != 0) {
      }
      {
        MutexLock lock(&mu_);
        if (stopping_ && commands_.empty() &&
            (replies_in_flight_ == 0 || Clock::now() >= stop_deadline_)) {
          break;
        }
        if (!commands_.empty()) continue;
      }
      if (ucx_.ucp_worker_arm(worker_) == UCS_ERR_BUSY) continue;
      epoll_event events[2];
      const int ready = ::epoll_wait(epoll_fd, events, 2, 100);
      for (int i = 0; i < ready; ++i) {
        if (events[i].data.fd == wake_fd_) {
          uint64_t count;
          ssize_t ignored = os::Read(wake_fd_, &count, sizeof(count));
          (void)ignored;
        }
      }
    }
    SayGoodbye();
    CloseEndpoints();
    os::Close(epoll_fd);
  }

  // Tells the peers we are leaving, so they stop asking (quietly) instead
  // of discovering it through an endpoint error. Best effort, bounded.
  void SayGoodbye() {
    std::vector<void*> sending;
    const int32_t me = options_.rank;
    for (Peer& peer : peers_) {
      if (peer.ep == nullptr) continue;
      ucp_request_param_t param = {};
      void* request =
          ucx_.ucp_am_send_nbx(peer.ep, kGoodbyeAm, &me, sizeof(me), nullptr, 0, &param);
      if (request != nullptr && !UCS_PTR_IS_ERR(request)) sending.push_back(request);
    }
    const Clock::time_point give_up = Clock::now() + std::chrono::seconds(1);
    for (void* request : sending) {
      while (ucx_.ucp_request_check_status(request) == UCS_INPROGRESS && Clock::now() < give_up) {
        ucx_.ucp_worker_progress(worker_);
      }
      ucx_.ucp_request_free(request);
    }
  }

  static ucs_status_t OnGoodbye(void* arg, const void* header, size_t header_length, void*, size_t,
                                const ucp_am_recv_param_t*) {
    Impl* self = static_cast<Impl*>(arg);
    const absl::StatusOr<int> decoded =
        peer_wire::DecodeGoodbye(absl::string_view(static_cast<const char*>(header), header_length),
                                 self->options_.rank, self->options_.size);
    if (!decoded.ok()) return UCS_OK;
    const int rank = *decoded;
    {
      MutexLock lock(&self->mu_);
      // Down like a failed peer (its files go to the next rank, and it is
      // tried again after retry_after, in case it comes back), but not
      // counted as a failure.
      self->peers_[rank].departed = true;
      self->MarkDownLocked(rank, "left");
    }
    MONARCH_LOG(kInfo, "peer ", rank, " left; its files go to the next rank of their order");
    return UCS_OK;
  }

  void RunCommands() {
    std::deque<std::function<void()>> commands;
    {
      MutexLock lock(&mu_);
      commands.swap(commands_);
    }
    for (auto& command : commands) command();
  }

  void CloseEndpoints() {
    std::vector<void*> closing;
    for (Peer& peer : peers_) {
      if (peer.ep == nullptr) continue;
      ucp_request_param_t param = {};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = UCP_EP_CLOSE_FLAG_FORCE;
      void* request = ucx_.ucp_ep_close_nbx(peer.ep, &param);
      if (request != nullptr && !UCS_PTR_IS_ERR(request)) closing.push_back(request);
      peer.ep = nullptr;
    }
    const Clock::time_point give_up = Clock::now() + std::chrono::seconds(5);
    for (void* request : closing) {
      while (ucx_.ucp_request_check_status(request) == UCS_INPROGRESS && Clock::now() < give_up) {
        ucx_.ucp_worker_progress(worker_);
      }
      ucx_.ucp_request_free(request);
    }
  }

  void SendRequest(const std::shared_ptr<Request>& request) {
    Peer& peer = peers_[request->rank];
    {
      MutexLock lock(&mu_);
      if (request->state != Request::kSent || request->abandoned) return;
    }
    if (peer.ep == nullptr) {  // Closed after a failure: this is the retry.
      // A peer that restarted has published a new address.
      if (!request->address.empty()) peer.address = request->address;
      if (absl::Status s = Connect(peer); !s.ok()) {
        MutexLock lock(&mu_);
        MarkDownLocked(request->rank, s.message());
        return;
      }
    }
    auto* keep = new std::shared_ptr<Request>(request);
    ucp_request_param_t param = {};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = OnRequestSent;
    param.user_data = keep;
    void* status =
        ucx_.ucp_am_send_nbx(peer.ep, kRequestAm, &request->header, sizeof(RequestHeader),
                             request->name.data(), request->name.size(), &param);
    if (status == nullptr) {
      delete keep;
    } else if (UCS_PTR_IS_ERR(status)) {
      delete keep;
      MutexLock lock(&mu_);
      MarkDownLocked(request->rank, ucx_.ucs_status_string(UCS_PTR_STATUS(status)));
    }
  }

  static void OnRequestSent(void* ucx_request, ucs_status_t status, void* user_data) {
    // A failed send needs no handling here: the endpoint's error callback
    // marks the peer down and fails its requests.
    (void)status;
    auto* keep = static_cast<std::shared_ptr<Request>*>(user_data);
    const UcxApi& ucx = (*keep)->owner->ucx_;
    delete keep;
    ucx.ucp_request_free(ucx_request);
  }

  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
    Peer* peer = static_cast<Peer*>(arg);
    Impl* self = peer->owner;
    {
      MutexLock lock(&self->mu_);
      self->MarkDownLocked(peer->rank,
                           absl::StrCat("failed (", self->ucx_.ucs_status_string(status), ")"));
      self->commands_.push_back([self, peer, ep] {
        // Close outside the callback; reconnect on the next request after retry_after.
        if (peer->ep == ep) peer->ep = nullptr;
        ucp_request_param_t param = {};
        param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = UCP_EP_CLOSE_FLAG_FORCE;
        void* request = self->ucx_.ucp_ep_close_nbx(ep, &param);
        if (request != nullptr && !UCS_PTR_IS_ERR(request)) self->ucx_.ucp_request_free(request);
      });
    }
    self->Wake();
  }

  // Incoming request (home side): hand it to the serve pool.
  static ucs_status_t OnRequest(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param) {
    Impl* self = static_cast<Impl*>(arg);
    const absl::StatusOr<RequestHeader> decoded = peer_wire::DecodeRequestHeader(
        absl::string_view(static_cast<const char*>(header), header_length), self->options_.rank,
        self->options_.size);
    if (!decoded.ok()) return UCS_OK;
    const RequestHeader& request = *decoded;
    if (!peer_wire::CarriesSecret(request, self->secret_)) {
      // Answered (not dropped), so that a peer of another job, or of an
      // earlier run, reads the source at once instead of timing out.
      if (self->requests_unauthenticated_.fetch_add(1, std::memory_order_relaxed) == 0) {
        MONARCH_LOG(kWarning, "remote: refused a request claiming to be from rank ",
                    request.from_rank,
                    " without this job's secret (a process of another job, or of an earlier "
                    "run?); later ones are only counted in remote.requests_unauthenticated");
      }
      self->QueueRefusal(request, absl::StatusCode::kUnauthenticated);
      return UCS_OK;
    }
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {  // A name this long is not ours.
      self->QueueRefusal(request, absl::StatusCode::kInvalidArgument);
      return UCS_OK;
    }
    const absl::string_view name(static_cast<const char*>(data), length);
    if (self->ServeFromMemory(request, name)) return UCS_OK;
    // Queued under the lock that Shutdown() takes to stop serving, so no
    // task can slip into the pool after Shutdown() has waited for it.
    MutexLock lock(&self->mu_);
    switch (self->serving_) {
      case Serving::kHeld:
        self->held_.emplace_back(request, std::string(name));
        break;
      case Serving::kOn:
        self->serve_pool_.detach_task(
            [self, request, name = std::string(name)] { self->Serve(request, name); });
        break;
      case Serving::kOff:
        self->QueueReplyLocked(request, absl::StatusCode::kUnavailable, nullptr, -1, 0);
        break;
    }
    return UCS_OK;
  }

  // Progress thread: answers a request whose bytes are in memory (a RAM
  // copy) right here, saving the two thread hand-offs of the serve pool,
  // which is what a transfer's time goes to once the bytes are not read:
  // their CRC comes from the copy's block sums. Only a range that is not
  // whole blocks (a reader's odd piece) is checksummed here. False: not
  // answered.
  bool ServeFromMemory(const RequestHeader& request, absl::string_view name) {
    if (request.length > send_bytes_) return false;
    {
      MutexLock lock(&mu_);
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
    MutexLock lock(&mu_);
    QueueReplyLocked(request, absl::StatusCode::kOk, data, -1, checksum);
    return true;
  }

  // Serve pool thread: finds the bytes and queues the reply.
  void Serve(const RequestHeader& request, const std::string& name) {
    int buffer_index;
    {
      MutexLock lock(&mu_);
      // Send buffers come back as replies complete; a requester that died
      // mid-transfer may hold one until its endpoint fails. The requester
      // gives up at the request timeout, and so does this wait: it is then
      // refused (and reads the source).
      const Clock::time_point give_up = Clock::now() + Seconds(options_.request_timeout_seconds);
      while (free_send_buffers_.empty()) {
        if (!send_buffer_freed_.WaitUntil(&mu_, give_up) && free_send_buffers_.empty()) {
          QueueReplyLocked(request, absl::StatusCode::kUnavailable, nullptr, -1, 0);
          return;
        }
      }
      buffer_index = free_send_buffers_.back();
      free_send_buffers_.pop_back();
    }
    char* staging = send_region_.buffer(buffer_index);
    absl::StatusCode code = absl::StatusCode::kOk;
    const char* data = nullptr;
    uint64_t checksum = 0;
    if (request.length > send_bytes_) {
      code = absl::StatusCode::kInvalidArgument;  // remote.buffer_size differs between peers.
    } else {
      const FileRequest file = peer_wire::ToFileRequest(request, name);
      const absl::Status served =
          serve_(file, staging, [&](const char* bytes, std::optional<uint32_t> known_crc32c) {
            data = bytes;
            checksum = known_crc32c ? *known_crc32c : Crc32c(bytes, request.length);
          });
      if (!served.ok()) code = served.code();
      if (served.ok() && data == nullptr) code = absl::StatusCode::kInternal;
    }
    MutexLock lock(&mu_);
    const bool staged = code == absl::StatusCode::kOk && data == staging;
    if (!staged) {  // Not needed: an error, or sent from where the bytes rest.
      free_send_buffers_.push_back(buffer_index);
      send_buffer_freed_.Signal();
    }
    QueueReplyLocked(request, code, code == absl::StatusCode::kOk ? data : nullptr,
                     staged ? buffer_index : -1, checksum);
  }

  void QueueRefusal(const RequestHeader& request, absl::StatusCode code) {
    MutexLock lock(&mu_);
    QueueReplyLocked(request, code, nullptr, -1, 0);
  }

  // `data`: the bytes to send with an OK reply (from staging buffer
  // `send_buffer`, or -1 when they are sent from where they rest).
  void QueueReplyLocked(const RequestHeader& request, absl::StatusCode code, const char* data,
                        int send_buffer, uint64_t checksum) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++replies_in_flight_;
    auto* reply =
        new Reply{this,
                  ReplyHeader{kProtocol, static_cast<int32_t>(code), request.request_id,
                              code == absl::StatusCode::kOk ? request.length : 0, checksum},
                  send_buffer, data};
    const int to = request.from_rank;
    commands_.push_back([this, reply, to] { SendReply(reply, to); });
    Wake();
  }

  void SendReply(Reply* reply, int to) {
    Peer& peer = peers_[to];
    if (peer.ep == nullptr) {
      // The requester failed; it reads the source (or has already timed out).
      FinishReply(reply, false);
      return;
    }
    ucp_request_param_t param = {};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = OnReplySent;
    param.user_data = reply;
    if (reply->send_buffer >= 0) {
      param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
      param.memh = send_region_.memh();
    }
    void* status = ucx_.ucp_am_send_nbx(peer.ep, kReplyAm, &reply->header, sizeof(ReplyHeader),
                                        reply->data, reply->header.length, &param);
    if (status == nullptr) {
      FinishReply(reply, true);
    } else if (UCS_PTR_IS_ERR(status)) {
      FinishReply(reply, false);
    }
  }

  static void OnReplySent(void* ucx_request, ucs_status_t status, void* user_data) {
    Reply* reply = static_cast<Reply*>(user_data);
    Impl* self = reply->impl;
    self->FinishReply(reply, status == UCS_OK);  // Deletes the reply.
    self->ucx_.ucp_request_free(ucx_request);
  }

  void FinishReply(Reply* reply, bool sent) {
    if (sent && reply->data != nullptr) {
      requests_served_.fetch_add(1, std::memory_order_relaxed);
      bytes_served_.fetch_add(reply->header.length, std::memory_order_relaxed);
    } else if (reply->header.status_code != 0) {
      requests_refused_.fetch_add(1, std::memory_order_relaxed);
    }
    {
      MutexLock lock(&mu_);
      if (reply->send_buffer >= 0) {
        free_send_buffers_.push_back(reply->send_buffer);
        send_buffer_freed_.Signal();
      }
      --replies_in_flight_;
    }
    delete reply;
  }

  // Incoming reply (requester side).
  static ucs_status_t OnReply(void* arg, const void* header, size_t header_length, void* data,
                              size_t length, const ucp_am_recv_param_t* param) {
    Impl* self = static_cast<Impl*>(arg);
    const absl::StatusOr<ReplyHeader> decoded = peer_wire::DecodeReplyHeader(
        absl::string_view(static_cast<const char*>(header), header_length));
    if (!decoded.ok()) return UCS_OK;
    const ReplyHeader& reply = *decoded;
    std::shared_ptr<Request> request;
    {
      MutexLock lock(&self->mu_);
      auto it = self->pending_.find(reply.request_id);
      // Unknown: the fetch gave up on it. Returning UCS_OK drops the data.
      if (it == self->pending_.end() || it->second->state != Request::kSent) return UCS_OK;
      request = it->second;
      // It answered: whatever it was before, it is back.
      self->peers_[request->rank].lost = false;
      self->peers_[request->rank].departed = false;
      if (absl::Status verdict =
              peer_wire::CheckReply(reply, length, request->length, request->rank);
          !verdict.ok()) {
        self->Complete(*request, std::move(verdict));
      } else if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        request->state = Request::kReceiving;
        request->checksum = reply.checksum;
        ++self->slots_[request->slot].receives;
      } else {
        std::memcpy(request->destination, data, length);
        request->in_place = true;
        request->checksum = reply.checksum;
        self->Complete(*request, absl::OkStatus());
      }
      if (request->state == Request::kDone) return UCS_OK;
    }
    // Rendezvous: pull the data into the pre-registered receive buffer.
    auto* keep = new std::shared_ptr<Request>(request);
    ucp_request_param_t recv = {};
    recv.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMH;
    recv.cb.recv_am = OnReplyData;
    recv.user_data = keep;
    recv.memh = self->receive_region_.memh();
    void* status =
        self->ucx_.ucp_am_recv_data_nbx(self->worker_, data, request->buffer, length, &recv);
    if (status == nullptr) {
      self->FinishReceive(keep, UCS_OK);
    } else if (UCS_PTR_IS_ERR(status)) {
      self->FinishReceive(keep, UCS_PTR_STATUS(status));
    }
    return UCS_OK;
  }

  static void OnReplyData(void* ucx_request, ucs_status_t status, size_t, void* user_data) {
    auto* keep = static_cast<std::shared_ptr<Request>*>(user_data);
    Impl* self = (*keep)->owner;
    self->FinishReceive(keep, status);
    self->ucx_.ucp_request_free(ucx_request);
  }

  void FinishReceive(std::shared_ptr<Request>* keep, ucs_status_t status) {
    std::shared_ptr<Request> request = std::move(*keep);
    delete keep;
    {
      MutexLock lock(&mu_);
      --slots_[request->slot].receives;
      if (request->abandoned) {
        pending_.erase(request->id);
        ReleaseSlotIfIdleLocked(request->slot);
      } else {
        Complete(*request, status == UCS_OK ? absl::OkStatus()
                                            : absl::UnavailableError(absl::StrCat(
                                                  "remote: transfer from peer ", request->rank,
                                                  " failed: ", ucx_.ucs_status_string(status))));
      }
    }
  }

  const UcxApi& ucx_;  // Every call into UCX goes through it (ucx_loader.h).
  const Options options_;
  const ServeFn serve_;
  std::string secret_;  // Set by Init before the progress thread starts; read-only after.

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int worker_fd_ = -1;
  int wake_fd_ = -1;
  RegisteredRegion receive_region_;
  RegisteredRegion send_region_;
  uint64_t send_bytes_ = 0;
  std::vector<Peer> peers_;

  mutable Mutex mu_;
  CondVar slot_freed_;         // A receive buffer became free.
  CondVar send_buffer_freed_;  // A staging buffer became free.
  absl::flat_hash_map<uint64_t, std::shared_ptr<Request>> pending_ ABSL_GUARDED_BY(mu_);
  uint64_t next_request_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<int> free_slots_ ABSL_GUARDED_BY(mu_);
  std::vector<int> free_send_buffers_ ABSL_GUARDED_BY(mu_);
  std::deque<std::function<void()>> commands_ ABSL_GUARDED_BY(mu_);
  int replies_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // Requests that come before StartServing() are held, not refused: a
  // faster peer may ask while this one is still connecting.
  enum class Serving { kHeld, kOn, kOff };
  Serving serving_ ABSL_GUARDED_BY(mu_) = Serving::kHeld;
  std::vector<std::pair<RequestHeader, std::string>> held_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Set by CancelFetches(): Fetch() fails at once, and waiting fetches give up.
  bool fetches_cancelled_ ABSL_GUARDED_BY(mu_) = false;
  Clock::time_point stop_deadline_ ABSL_GUARDED_BY(mu_){};  // Set with stopping_.

  std::atomic<uint64_t> requests_served_{0};
  std::atomic<uint64_t> bytes_served_{0};
  std::atomic<uint64_t> requests_refused_{0};
  std::atomic<uint64_t> timeouts_{0};
  std::atomic<uint64_t> peer_failures_{0};
  std::atomic<uint64_t> checksum_failures_{0};
  std::atomic<uint64_t> requests_unauthenticated_{0};

  ThreadPool serve_pool_;
  std::thread progress_thread_;
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
  return impl_->Fetch(rank, file, offset, dst, n);
}
bool PeerNetwork::IsUp(int rank) const { return impl_->IsUp(rank); }
bool PeerNetwork::IsLost(int rank) const { return impl_->IsLost(rank); }
bool PeerNetwork::HasLeft(int rank) const { return impl_->HasLeft(rank); }
void PeerNetwork::StartServing() { impl_->StartServing(); }
void PeerNetwork::CancelFetches() { impl_->CancelFetches(); }
bool PeerNetwork::Shutdown(Deadline deadline) { return impl_->Shutdown(deadline); }
void PeerNetwork::ReportCounters(CounterSink& sink) const { impl_->ReportCounters(sink); }

}  // namespace monarch
