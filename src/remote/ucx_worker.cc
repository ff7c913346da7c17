// UcxWorker: UCX's context, worker, regions and endpoints, and the progress
// thread. See ucx_worker.h.

#include "remote/ucx_worker.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/os.h"
#include "common/status_macros.h"

namespace monarch {

// UcxEndpoints: the worker's endpoint to each peer, by rank, from creation
// to close. Each is created at start-up with UCX's peer error handling; an
// error marks the peer down and closes that endpoint, and the next request
// to the peer after its retry time creates it again. At the end they all
// close, after a goodbye. Apart from UcxWorker, which owns UCX's context,
// worker and progress thread: this part follows the peers' comings and
// goings, and their goodbyes. It uses the worker's UCX handles and, on an
// error, its lock, peer table and commands. Progress thread only, but for
// Connect() (from UcxWorker::Start(), before the thread starts).
class UcxEndpoints final {
 public:
  explicit UcxEndpoints(UcxWorker& worker)
      : worker_(worker), ucx_(worker.ucx_), endpoints_(worker.options_.size) {}

  absl::Status Connect(std::vector<std::string> addresses) {
    for (int r = 0; r < worker_.options_.size; ++r) {
      endpoints_[r].table = this;
      endpoints_[r].rank = r;
      endpoints_[r].address = std::move(addresses[r]);
      if (r != worker_.options_.rank) MONARCH_RETURN_IF_ERROR(Create(endpoints_[r]));
    }
    return absl::OkStatus();
  }

  absl::Status Reconnect(int rank, const std::string& address) {
    Endpoint& endpoint = endpoints_[rank];
    if (endpoint.ep != nullptr) return absl::OkStatus();
    // Closed after a failure: this is the retry. A peer that restarted has
    // published a new address.
    if (!address.empty()) endpoint.address = address;
    return Create(endpoint);
  }

  // Null after a failure, until Reconnect().
  ucp_ep_h ep(int rank) const { return endpoints_[rank].ep; }

  // Tells the peers we are leaving, so they stop asking (quietly) instead of
  // discovering it through an endpoint error. Best effort, bounded.
  void SayGoodbye() {
    std::vector<void*> sending;
    const int32_t me = worker_.options_.rank;
    for (Endpoint& endpoint : endpoints_) {
      if (endpoint.ep == nullptr) continue;
      ucp_request_param_t param = {};
      void* request =
          ucx_.ucp_am_send_nbx(endpoint.ep, static_cast<unsigned>(PeerMessage::kGoodbye), &me,
                               sizeof(me), nullptr, 0, &param);
      if (request != nullptr && !UCS_PTR_IS_ERR(request)) sending.push_back(request);
    }
    Finish(sending, std::chrono::seconds(1));
  }

  void CloseAll() {
    std::vector<void*> closing;
    for (Endpoint& endpoint : endpoints_) {
      if (endpoint.ep == nullptr) continue;
      if (void* request = StartClose(endpoint.ep)) closing.push_back(request);
      endpoint.ep = nullptr;
    }
    Finish(closing, std::chrono::seconds(5));
  }

  // UCX's handler of a goodbye, with the table as `arg`: the sender has left.
  static ucs_status_t OnGoodbye(void* arg, const void* header, size_t header_length, void*, size_t,
                                const ucp_am_recv_param_t*) {
    UcxEndpoints* self = static_cast<UcxEndpoints*>(arg);
    const absl::StatusOr<int> decoded = peer_wire::DecodeGoodbye(
        absl::string_view(static_cast<const char*>(header), header_length),
        self->worker_.options_.rank, self->worker_.options_.size);
    if (decoded.ok()) self->worker_.peers().MarkLeft(*decoded);
    return UCS_OK;
  }

 private:
  struct Endpoint {
    UcxEndpoints* table = nullptr;
    int rank = 0;
    std::string address;
    ucp_ep_h ep = nullptr;
  };

  absl::Status Create(Endpoint& endpoint) {
    ucp_ep_params_t params = {};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = reinterpret_cast<const ucp_address_t*>(endpoint.address.data());
    // Peer failure detection: a dead peer fails its requests instead of
    // hanging them. (It also rules out UCX's shared-memory transports, see DESIGN.md.)
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = OnError;
    params.err_handler.arg = &endpoint;
    const ucs_status_t status = ucx_.ucp_ep_create(worker_.worker_, &params, &endpoint.ep);
    if (status != UCS_OK) {
      endpoint.ep = nullptr;
      return absl::UnavailableError(absl::StrCat("remote: cannot reach peer ", endpoint.rank,
                                                 " over '", worker_.options_.transports,
                                                 "': ", ucx_.ucs_status_string(status)));
    }
    return absl::OkStatus();
  }

  // Starts closing `ep`, at once (force): the request to wait for, or null.
  void* StartClose(ucp_ep_h ep) {
    ucp_request_param_t param = {};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* request = ucx_.ucp_ep_close_nbx(ep, &param);
    return request != nullptr && !UCS_PTR_IS_ERR(request) ? request : nullptr;
  }

  // Progresses the worker until each of `requests` is done or `bound` has
  // passed, and frees them.
  void Finish(const std::vector<void*>& requests, Clock::duration bound) {
    const Clock::time_point give_up = Clock::now() + bound;
    for (void* request : requests) {
      while (ucx_.ucp_request_check_status(request) == UCS_INPROGRESS && Clock::now() < give_up) {
        ucx_.ucp_worker_progress(worker_.worker_);
      }
      ucx_.ucp_request_free(request);
    }
  }

  // Outside the error callback; the next request after retry_after reconnects.
  void CloseFailed(Endpoint& endpoint, ucp_ep_h ep) {
    if (endpoint.ep == ep) endpoint.ep = nullptr;
    if (void* request = StartClose(ep)) ucx_.ucp_request_free(request);
  }

  // UCX's error callback, on the progress thread.
  static void OnError(void* arg, ucp_ep_h ep, ucs_status_t status) {
    Endpoint* endpoint = static_cast<Endpoint*>(arg);
    UcxEndpoints* self = endpoint->table;
    UcxWorker& worker = self->worker_;
    {
      MutexLock lock(&worker.mu());
      worker.peers().MarkDownLocked(
          endpoint->rank, absl::StrCat("failed (", self->ucx_.ucs_status_string(status), ")"));
      worker.PostLocked([self, endpoint, ep] { self->CloseFailed(*endpoint, ep); });
    }
    worker.Wake();
  }

  UcxWorker& worker_;
  const UcxApi& ucx_;
  std::vector<Endpoint> endpoints_;  // Never resized: UCX points into it.
};

UcxWorker::UcxWorker(const UcxApi& ucx, const PeerNetwork::Options& options, PeerTable& peers)
    : ucx_(ucx),
      options_(options),
      peers_(peers),
      endpoints_(std::make_unique<UcxEndpoints>(*this)) {}

// After Stop(), or when the progress thread never started.
UcxWorker::~UcxWorker() { Close(); }

void UcxWorker::SetHandler(PeerMessage message, MessageHandler* handler) {
  (message == PeerMessage::kRequest ? request_handler_ : reply_handler_) = handler;
}

absl::Status UcxWorker::Open() {
  MONARCH_RETURN_IF_ERROR(CreateContext());
  MONARCH_RETURN_IF_ERROR(CreateWorker());
  return SetMessageHandlers();
}

absl::Status UcxWorker::CreateContext() {
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
  return absl::OkStatus();
}

absl::Status UcxWorker::CreateWorker() {
  ucp_worker_params_t worker_params = {};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;  // Only the progress thread uses it.
  ucs_status_t status = ucx_.ucp_worker_create(context_, &worker_params, &worker_);
  if (status != UCS_OK) return UcxError("ucp_worker_create", status);
  status = ucx_.ucp_worker_get_efd(worker_, &worker_fd_);
  if (status != UCS_OK) return UcxError("ucp_worker_get_efd", status);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return absl::InternalError("remote: eventfd failed");
  return absl::OkStatus();
}

absl::Status UcxWorker::SetMessageHandlers() {
  struct Handler {
    PeerMessage message;
    ucp_am_recv_callback_t callback;
    void* arg;
  };
  for (const Handler& h :
       {Handler{PeerMessage::kRequest, OnMessage, request_handler_},
        Handler{PeerMessage::kReply, OnMessage, reply_handler_},
        Handler{PeerMessage::kGoodbye, UcxEndpoints::OnGoodbye, endpoints_.get()}}) {
    ucp_am_handler_param_t handler = {};
    handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                         UCP_AM_HANDLER_PARAM_FIELD_ARG;
    handler.id = static_cast<unsigned>(h.message);
    handler.cb = h.callback;
    handler.arg = h.arg;
    const ucs_status_t status = ucx_.ucp_worker_set_am_recv_handler(worker_, &handler);
    if (status != UCS_OK) return UcxError("ucp_worker_set_am_recv_handler", status);
  }
  return absl::OkStatus();
}

absl::StatusOr<const UcxWorker::Region*> UcxWorker::RegisterRegion(size_t buffers,
                                                                    size_t buffer_bytes) {
  regions_.push_back(std::make_unique<Region>());  // Close() frees what this allocates.
  Region& region = *regions_.back();
  region.buffer_bytes_ = buffer_bytes;
  region.bytes_ = buffers * buffer_bytes;
  region.base_ =
      static_cast<char*>(std::aligned_alloc(4096, (region.bytes_ + 4095) / 4096 * 4096));
  if (region.base_ == nullptr) return absl::ResourceExhaustedError("remote: cannot allocate buffers");
  ucp_mem_map_params_t params = {};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  params.address = region.base_;
  params.length = region.bytes_;
  const ucs_status_t status = ucx_.ucp_mem_map(context_, &params, &region.memh_);
  if (status != UCS_OK) {
    return UcxError(absl::StrCat("ucp_mem_map of ", region.bytes_, " bytes"), status);
  }
  return &region;
}

absl::StatusOr<std::string> UcxWorker::LocalAddress() {
  ucp_address_t* address;
  size_t address_length;
  const ucs_status_t status = ucx_.ucp_worker_get_address(worker_, &address, &address_length);
  if (status != UCS_OK) return UcxError("ucp_worker_get_address", status);
  std::string mine(reinterpret_cast<const char*>(address), address_length);
  ucx_.ucp_worker_release_address(worker_, address);
  return mine;
}

absl::Status UcxWorker::Start(std::vector<std::string> addresses) {
  MONARCH_RETURN_IF_ERROR(endpoints_->Connect(std::move(addresses)));
  progress_thread_ = std::thread([this] { ProgressLoop(); });
  return absl::OkStatus();
}

void UcxWorker::PostLocked(std::function<void()> command) {
  commands_.push_back(std::move(command));
}

void UcxWorker::Wake() {
  const uint64_t one = 1;
  // An eventfd, no file: outside the seam of common/os.h.
  ssize_t ignored = ::write(wake_fd_, &one, sizeof(one));
  (void)ignored;
}

bool UcxWorker::Running() const {
  MutexLock lock(&mu());
  return progress_thread_.joinable() && !stopping_;
}

void UcxWorker::Stop(Deadline deadline) {
  {
    MutexLock lock(&mu());
    stopping_ = true;
    // Replies still being sent get until the deadline (a peer that died
    // mid-transfer may never complete them); then the endpoints close.
    stop_deadline_ = deadline;
  }
  Wake();
  // Bounded: the progress loop ends at the deadline, then says goodbye
  // (at most 1 s) and closes the endpoints (at most 5 s).
  progress_thread_.join();
}

void UcxWorker::Close() {
  if (worker_ != nullptr) ucx_.ucp_worker_destroy(worker_);
  worker_ = nullptr;
  for (const std::unique_ptr<Region>& region : regions_) {
    if (region->memh_ != nullptr) ucx_.ucp_mem_unmap(context_, region->memh_);
    std::free(region->base_);
  }
  regions_.clear();
  if (context_ != nullptr) ucx_.ucp_cleanup(context_);
  context_ = nullptr;
  if (wake_fd_ >= 0) os::Close(wake_fd_);
  wake_fd_ = -1;
}

// ---- Progress thread ----

absl::Status UcxWorker::Reconnect(int rank, const std::string& address) {
  return endpoints_->Reconnect(rank, address);
}

absl::StatusOr<UcxWorker::Started> UcxWorker::Send(int rank, PeerMessage message,
                                                   const void* header, size_t header_length,
                                                   const void* data, size_t length,
                                                   const Region* region, Transfer* transfer) {
  const ucp_ep_h ep = endpoints_->ep(rank);
  if (ep == nullptr) {
    // The peer failed (and has not been asked since): it reads the source.
    return absl::UnavailableError(absl::StrCat("remote: no endpoint to peer ", rank));
  }
  transfer->worker_ = this;
  ucp_request_param_t param = {};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = OnSendDone;
  param.user_data = transfer;
  if (region != nullptr) {
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    param.memh = region->memh_;
  }
  return Outcome(ucx_.ucp_am_send_nbx(ep, static_cast<unsigned>(message), header,
                                      header_length, data, length, &param));
}

absl::StatusOr<UcxWorker::Started> UcxWorker::Receive(void* data, char* buffer, size_t length,
                                                      const Region& region, Transfer* transfer) {
  transfer->worker_ = this;
  ucp_request_param_t param = {};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMH;
  param.cb.recv_am = OnReceiveDone;
  param.user_data = transfer;
  param.memh = region.memh_;
  return Outcome(ucx_.ucp_am_recv_data_nbx(worker_, data, buffer, length, &param));
}

absl::StatusOr<UcxWorker::Started> UcxWorker::Outcome(void* request) const {
  if (request == nullptr) return Started::kDone;
  if (UCS_PTR_IS_ERR(request)) return TransferStatus(UCS_PTR_STATUS(request));
  return Started::kInFlight;
}

absl::Status UcxWorker::UcxError(absl::string_view what, ucs_status_t status) const {
  return absl::UnavailableError(
      absl::StrCat("remote: ", what, ": ", ucx_.ucs_status_string(status)));
}

absl::Status UcxWorker::TransferStatus(ucs_status_t status) const {
  if (status == UCS_OK) return absl::OkStatus();
  return absl::UnavailableError(ucx_.ucs_status_string(status));
}

void UcxWorker::ProgressLoop() {
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
      MutexLock lock(&mu());
      if (stopping_ && commands_.empty() &&
          (sends_to_finish_ == 0 || Clock::now() >= stop_deadline_)) {
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
  endpoints_->SayGoodbye();
  endpoints_->CloseAll();
  os::Close(epoll_fd);
}

void UcxWorker::RunCommands() {
  std::deque<std::function<void()>> commands;
  {
    MutexLock lock(&mu());
    commands.swap(commands_);
  }
  for (auto& command : commands) command();
}

// ---- UCX's callbacks, on the progress thread ----

ucs_status_t UcxWorker::OnMessage(void* arg, const void* header, size_t header_length, void* data,
                                  size_t length, const ucp_am_recv_param_t* param) {
  static_cast<MessageHandler*>(arg)->OnMessage(
      Message{absl::string_view(static_cast<const char*>(header), header_length), data, length,
              (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0});
  return UCS_OK;  // The data is not kept: UCX drops it (an unreceived rendezvous too).
}

void UcxWorker::OnSendDone(void* request, ucs_status_t status, void* user_data) {
  Transfer* transfer = static_cast<Transfer*>(user_data);
  UcxWorker* self = transfer->worker_;
  transfer->Done(self->TransferStatus(status));  // May delete it.
  self->ucx_.ucp_request_free(request);
}

void UcxWorker::OnReceiveDone(void* request, ucs_status_t status, size_t, void* user_data) {
  OnSendDone(request, status, user_data);  // The same, but for the length received.
}

}  // namespace monarch
