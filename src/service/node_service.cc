// NodeService implementation.

#include "service/node_service.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/counters.h"
#include "common/log.h"
#include "common/os.h"
#include "common/status_macros.h"
#include "drivers/ram_keep.h"
#include "service/client_requests.h"
#include "service/metrics_http.h"
#include "service/namespace_image.h"
#include "service/ram_keeper.h"
#include "service/unix_socket.h"

namespace monarch::service {
namespace {

std::string StripTrailingSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

// Answers a client's hello: `reply` (its instance id and buffer size set)
// completed with the namespace and the tiers, and the descriptors of what
// the service shares.
absl::Status SendHelloReply(const MonarchCore& core, HelloReply reply, int socket, int image_fd,
                            int slots_fd, int buffer_fd) {
  // A guest gets no tier's descriptors: it reads every byte through the
  // service, which checks each file (guest_access.h).
  reply.service_pid = static_cast<uint32_t>(::getpid());
  reply.file_count = core.name_space().file_count();
  reply.max_open_files = static_cast<uint32_t>(core.max_open_files());
  reply.dataset_root = core.dataset_root();
  // Clients get read-only reopenings of the shared regions: they can map
  // them but never write them. The transfer buffer is the exception (its
  // first page holds the client's counters).
  std::vector<ScopedFd> owned;
  MONARCH_ASSIGN_OR_RETURN(ScopedFd image, ReopenReadOnly(image_fd));
  MONARCH_ASSIGN_OR_RETURN(ScopedFd slots, ReopenReadOnly(slots_fd));
  owned.push_back(std::move(image));
  owned.push_back(std::move(slots));
  std::vector<int> fds = {owned[0].get(), owned[1].get(), buffer_fd};
  for (int t = 0; t < core.tier_count(); ++t) {
    const TierConfig& tier = core.tier_config(t);
    TierDescription description{static_cast<uint32_t>(tier.kind), tier.name, tier.path, 0,
                                tier.huge_pages};
    for (int fd : reply.guest ? std::vector<int>{} : core.SharedMemoryDescriptors(t)) {
      MONARCH_ASSIGN_OR_RETURN(ScopedFd reopened, ReopenReadOnly(fd));
      fds.push_back(reopened.get());
      owned.push_back(std::move(reopened));
      ++description.descriptors;
    }
    reply.tiers.push_back(std::move(description));
  }
  return SendFrame(socket, MessageType::kHelloReply, Encode(reply), fds);
}

// The node's counters as Prometheus text, with each client's reads.
std::string MetricsText(const StatsReply& stats) {
  std::string text = stats.node.ToPrometheus();
  absl::StrAppend(&text,
                  "# HELP monarch_client_reads Reads each client process served itself "
                  "(hits) or through the service (misses).\n"
                  "# TYPE monarch_client_reads counter\n");
  for (const ClientStats& c : stats.clients) {
    absl::StrAppend(&text, "monarch_client_reads{pid=\"", c.pid, "\",via=\"hit\"} ",
                    c.hits, "\nmonarch_client_reads{pid=\"", c.pid,
                    "\",via=\"service\"} ", c.misses, "\n");
  }
  return text;
}

// Who a connecting process is to the service: its own user, a guest (a
// member of node.share_with_group's `group`), or refused (logged).
enum class Admission { kOwner, kGuest, kRefused };
Admission Admit(const absl::StatusOr<PeerCredentials>& peer, std::optional<gid_t> group) {
  if (peer.ok() && peer->uid == ::geteuid()) return Admission::kOwner;
  if (peer.ok() && group && peer->InGroup(*group)) return Admission::kGuest;
  MONARCH_LOG(kWarning, "monarch service: refused a connection from ",
              peer.ok() ? absl::StrCat("pid ", peer->pid, " uid ", peer->uid)
                        : peer.status().ToString(),
              ": only uid ", ::geteuid(), group ? absl::StrCat(" and group ", *group) : "",
              " may use this service");
  return Admission::kRefused;
}

}  // namespace

struct NodeService::Connection {
  // `guest`: the service's guests' grants, for another user's connection.
  Connection(MonarchCore& core, uint64_t buffer_bytes, PeerCredentials peer, GuestAccess* guest)
      : peer(std::move(peer)), guest(guest != nullptr), requests(core, buffer_bytes, guest) {}
  ScopedFd socket;
  const PeerCredentials peer;
  const bool guest;  // Another user of node.share_with_group's group.
  std::string job;  // Hello::job; set with `buffer`.
  MappedRegion buffer;  // The counters page, then the transfer buffer.
  ClientRequests requests;
  std::atomic<bool> finished{false};
  std::thread thread;

  // The client's own counters; null before the handshake.
  const ClientCounters* counters() const {
    return buffer.data() == nullptr ? nullptr
                                    : reinterpret_cast<const ClientCounters*>(buffer.data());
  }
  char* transfer() const { return buffer.data() + kCountersPageBytes; }
  ConnectionReads reads() const {
    return ConnectionReads{peer.pid, job, counters(),
                           requests.misses.load(std::memory_order_relaxed),
                           requests.miss_bytes.load(std::memory_order_relaxed),
                           requests.source_bytes.load(std::memory_order_relaxed) +
                               requests.prefetched->load(std::memory_order_relaxed)};
  }
};

NodeService::NodeService(const ValidConfig& config, const ServeOptions& options,
                         ServicePaths paths)
    : config_(config),
      options_(options),
      paths_(std::move(paths)),
      started_(std::chrono::steady_clock::now()) {}

absl::StatusOr<std::unique_ptr<NodeService>> NodeService::Start(const ValidConfig& config,
                                                                const ServeOptions& options) {
  // ValidateConfig spares the dataset for shared configs (clients must not
  // touch the PFS); the service is the one that reads it.
  struct stat st;
  if (os::Stat(config->dataset.path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset.path: '", config->dataset.path, "' is not an existing directory"));
  }
  RaiseDescriptorLimit();  // The budget of placement.max_open_files counts on it.
  MONARCH_ASSIGN_OR_RETURN(ServicePaths paths, ServicePathsFor(*config));
  MONARCH_RETURN_IF_ERROR(PrepareRuntimeDirectory(paths));
  // First of all: of two services started at once, one goes on.
  MONARCH_ASSIGN_OR_RETURN(ScopedFd lock, TakeServiceLock(paths));
  std::unique_ptr<NodeService> service(new NodeService(config, options, std::move(paths)));
  MONARCH_RETURN_IF_ERROR(service->Init(std::move(lock)));
  return service;
}

absl::Status NodeService::Init(ScopedFd lock) {
  lock_ = std::move(lock);
  stop_event_ = ScopedFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!stop_event_.valid()) return ErrnoToStatus(errno, "eventfd");
  instance_id_ = (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}() ^
                 static_cast<uint64_t>(::getpid());
  dataset_key_ = DatasetKey(config_->dataset);

  // The tier slots go into shared memory: clients read where each file is.
  absl::Status slots_status;
  CoreOptions core_options;
  core_options.wrap = options_.wrap;
  core_options.kept_ram_for = paths_.dir;
  SetLogLevel(config_->logging.level);  // Where the RAM tiers go is logged at info.
  core_options.ram_dir = ResolveRamDir(*config_, paths_.dir);
  core_options.tier_slots = [this, &slots_status](uint32_t count) -> TierSlot* {
    absl::StatusOr<WriteSealedRegion> region =
        CreateWriteSealedRegion("monarch-tier-slots", uint64_t{count} * sizeof(TierSlot));
    if (!region.ok()) {
      slots_status = region.status();
      return nullptr;
    }
    tier_slots_fd_ = std::move(region->fd);
    tier_slots_ = std::move(region->writable);
    return reinterpret_cast<TierSlot*>(tier_slots_.data());
  };
  absl::StatusOr<std::unique_ptr<MonarchCore>> core = CreateMonarchCore(config_, core_options);
  if (!core.ok()) return slots_status.ok() ? core.status() : slots_status;
  core_ = std::move(*core);
  if (core_->tier_count() > kMaxSharedTiers) {
    return absl::InvalidArgumentError(
        absl::StrCat("tiers: a node service shares at most ", kMaxSharedTiers, " tiers"));
  }
  MONARCH_ASSIGN_OR_RETURN(image_fd_, WriteNamespaceImage(core_->name_space()));
  if (config_->node.metrics_port > 0) {
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> metrics = MetricsHttpServer::Start(
        config_->node.metrics_port, [this] { return MetricsText(NodeStats()); });
    if (!metrics.ok()) {
      return absl::Status(metrics.status().code(),
                          absl::StrCat("node.metrics_port: ", metrics.status().message()));
    }
    metrics_ = std::move(*metrics);
  }
  if (paths_.group) guests_ = std::make_unique<GuestAccess>(core_->name_space());
  MONARCH_ASSIGN_OR_RETURN(listen_, ListenUnix(paths_.socket, 128, paths_.group));
  accept_thread_ = std::thread([this] { AcceptLoop(); });
  MONARCH_LOG(kInfo, "monarch service ", ::getpid(), " serving ", core_->dataset_root(), " at ",
              paths_.socket, " (", core_->name_space().file_count(), " files)");
  return absl::OkStatus();
}

NodeService::~NodeService() {
  RequestStop();
  if (accept_thread_.joinable()) accept_thread_.join();
  // Connections the stop gave up on (stopped_cleanly() false): joined here,
  // so this blocks until their reads return; an owner that cannot wait
  // abandons the service instead. Joined without mu_, which they take last.
  std::list<std::unique_ptr<Connection>> left;
  {
    MutexLock lock(&mu_);
    left.swap(connections_);
  }
  for (auto& c : left) c->thread.join();
}

int NodeService::metrics_port() const { return metrics_ == nullptr ? 0 : metrics_->port(); }

void NodeService::RequestStop() {
  stopping_.store(true, std::memory_order_relaxed);
  const uint64_t one = 1;
  // An eventfd, no file: outside the seam of common/os.h.
  ssize_t ignored = ::write(stop_event_.get(), &one, sizeof(one));
  (void)ignored;
}

void NodeService::Wait() {
  MutexLock lock(&mu_);
  while (!stopped_) stopped_cv_.Wait(&mu_);
}

void NodeService::ReapFinished() {
  for (auto it = connections_.begin(); it != connections_.end();) {
    Connection& c = **it;
    if (!c.finished.load(std::memory_order_acquire)) {
      ++it;
      continue;
    }
    c.thread.join();
    ledger_.Depart(c.reads());
    it = connections_.erase(it);
  }
}

void NodeService::AcceptLoop() {
  const double idle_exit = config_->node.idle_exit_seconds;
  auto idle_since = std::chrono::steady_clock::now();
  while (!stopping_.load(std::memory_order_relaxed)) {
    pollfd fds[2] = {{listen_.get(), POLLIN, 0}, {stop_event_.get(), POLLIN, 0}};
    const int ready = ::poll(fds, 2, 500);
    if (ready < 0 && errno != EINTR) {
      MONARCH_LOG(kError, "monarch service: poll: ", std::strerror(errno));
      break;
    }
    if (fds[1].revents != 0) break;
    if (ready > 0 && (fds[0].revents & POLLIN) != 0) {
      ScopedFd socket(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (socket.valid()) {
        absl::StatusOr<PeerCredentials> peer = GetPeerCredentials(socket.get());
        const Admission admitted = Admit(peer, paths_.group);
        if (admitted == Admission::kRefused) {
          refused_.fetch_add(1, std::memory_order_relaxed);
        } else {
          auto connection = std::make_unique<Connection>(
              *core_, options_.buffer_bytes, *peer,
              admitted == Admission::kGuest ? guests_.get() : nullptr);
          connection->socket = std::move(socket);
          Connection* raw = connection.get();
          MutexLock lock(&mu_);
          ++connections_per_pid_[raw->peer.pid];
          connections_.push_back(std::move(connection));
          raw->thread = std::thread([this, raw] { Serve(raw); });
        }
      }
    }
    MutexLock lock(&mu_);
    ReapFinished();
    // Between jobs the copies are only kept: they yield to memory pressure
    // first.
    core_->SetKeeping(connections_.empty());
    const auto now = std::chrono::steady_clock::now();
    if (!connections_.empty()) {
      idle_since = now;
    } else if (idle_exit > 0 &&
               std::chrono::duration<double>(now - idle_since).count() >= idle_exit) {
      MONARCH_LOG(kInfo, "monarch service: no client for ", idle_exit, " s, exiting");
      // Only an idle exit frees the kept RAM copies, and their keeper.
      DiscardAllKeptRam(*config_, paths_.dir);
      break;
    }
  }
  Shutdown();
}

void NodeService::Shutdown() {
  stopping_.store(true, std::memory_order_relaxed);
  // No new clients: the socket goes first (we still hold the lock, so the
  // name is ours to remove).
  os::Unlink(paths_.socket.c_str());
  listen_ = ScopedFd();
  {
    MutexLock lock(&mu_);
    // Wake every connection thread blocked on its socket; one in the middle
    // of a read finishes it first.
    for (auto& c : connections_) ::shutdown(c->socket.get(), SHUT_RDWR);
  }
  // The instance first (bounded): a connection waiting on placement (a
  // stage, WaitForPlacement) returns once promotions are cancelled, and a
  // read in progress finishes from the source if its promotion goes.
  core_->Shutdown(Monarch::ShutdownMode::kCancel);
  // Then the connections, each a read away from noticing at most.
  const Deadline give_up = DeadlineIn(kCancelGraceSeconds);
  for (;;) {
    {
      MutexLock lock(&mu_);
      ReapFinished();
      if (connections_.empty()) break;
      if (Clock::now() >= give_up) {
        std::string pids;
        for (const auto& c : connections_) {
          absl::StrAppend(&pids, pids.empty() ? "" : ", ", c->peer.pid);
        }
        MONARCH_LOG(kWarning, "monarch service: gave up waiting at stop for ", connections_.size(),
                    " connections still in a read that has not returned (client pids ", pids,
                    "); leaving them behind");
        left_behind_ = true;
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  metrics_.reset();
  MONARCH_LOG(kInfo, "monarch service ", ::getpid(), " stopped");
  MutexLock lock(&mu_);
  stopped_ = true;
  stopped_cv_.SignalAll();
}

bool NodeService::stopped_cleanly() {
  MutexLock lock(&mu_);
  return stopped_ && !left_behind_;
}

void NodeService::Serve(Connection* c) {
  // A client that connects and says nothing must not hold a thread forever.
  SetIoTimeout(c->socket.get(), 10).IgnoreError();
  bool first = true;
  absl::Status status;
  while (status.ok() && !stopping_.load(std::memory_order_relaxed)) {
    // One descriptor at most: a guest's proof of access carries one.
    absl::StatusOr<Frame> frame = ReceiveFrame(c->socket.get(), /*max_fds=*/1);
    if (first) SetIoTimeout(c->socket.get(), 0).IgnoreError();
    if (!frame.ok()) {
      // A malformed message gets its reason, then the connection closes:
      // after a bad frame the stream cannot be trusted to be in step.
      if (absl::IsInvalidArgument(frame.status())) {
        MONARCH_LOG(kWarning, "monarch service: client pid ", c->peer.pid, ": ",
                    frame.status().message());
        SendError(c->socket.get(), frame.status()).IgnoreError();
      }
      break;
    }
    // Clients say hello first; administrative commands (monarch stop,
    // status, stats, stage) need no handshake.
    if (frame->type == MessageType::kHello) {
      status = first ? Handshake(c, *frame) : absl::InvalidArgumentError("hello sent twice");
      first = false;
      continue;
    }
    first = false;
    switch (frame->type) {
      case MessageType::kStats:
        status = SendFrame(c->socket.get(), MessageType::kStatsReply, Encode(NodeStats()));
        break;
      case MessageType::kStatus:
        status = SendFrame(c->socket.get(), MessageType::kStatusReply, Encode(Status()));
        break;
      case MessageType::kStage:
        status = Stage(*core_, stopping_, c->socket.get(), *frame);
        break;
      case MessageType::kWaitForPlacement:
        core_->WaitForPlacement();
        status = SendFrame(c->socket.get(), MessageType::kOk, "");
        break;
      case MessageType::kStop:
        if (c->guest) {
          status = SendError(c->socket.get(), absl::PermissionDeniedError(absl::StrCat(
                                                  "only uid ", ::geteuid(),
                                                  ", who started it, may stop this service")));
          break;
        }
        MONARCH_LOG(kInfo, "monarch service: stop requested by pid ", c->peer.pid);
        status = SendFrame(c->socket.get(), MessageType::kOk, "");
        RequestStop();
        break;
      default:  // A client's own requests.
        if (!ClientRequests::Handles(frame->type)) {
          status = absl::InvalidArgumentError("unexpected message type");
          break;
        }
        status = c->requests.Handle(c->socket.get(), c->counters() ? c->transfer() : nullptr,
                                    c->peer.pid, *frame, [&] {
                                      MutexLock lock(&mu_);
                                      announced_pids_.insert(c->peer.pid);
                                    });
        break;
    }
    if (absl::IsInvalidArgument(status)) SendError(c->socket.get(), status).IgnoreError();
  }
  // A process's read order goes with its last connection.
  bool withdraw = false;
  {
    MutexLock lock(&mu_);
    auto live = connections_per_pid_.find(c->peer.pid);
    if (live != connections_per_pid_.end() && --live->second == 0) {
      connections_per_pid_.erase(live);
      withdraw = announced_pids_.erase(c->peer.pid) > 0;
      if (guests_ != nullptr) guests_->Forget(c->peer.pid);
    }
  }
  if (withdraw) core_->AnnounceOrderOf(c->peer.pid, {}, /*payer=*/nullptr);
  c->finished.store(true, std::memory_order_release);
}

absl::Status NodeService::Handshake(Connection* c, const Frame& frame) {
  absl::Status refused;
  absl::StatusOr<Hello> hello = DecodeHello(frame.payload);
  if (!hello.ok()) {
    refused = hello.status();
  } else if (hello->version != kProtocolVersion) {
    refused = absl::FailedPreconditionError(
        absl::StrCat("protocol version ", hello->version, " is not this service's (",
                     kProtocolVersion, "): client and service come from different builds"));
  } else if (StripTrailingSlashes(hello->dataset_root) != core_->dataset_root() ||
             hello->dataset_key != dataset_key_) {
    refused = absl::FailedPreconditionError(absl::StrCat(
        "the Monarch service at ", paths_.socket, " serves dataset '", core_->dataset_root(),
        "' (key ", dataset_key_, "), not this config's '", hello->dataset_root, "' (key ",
        hello->dataset_key,
        "): both configs name this node.runtime_dir; leave it unset (one service per dataset "
        "and cache shape) or give each config its own"));
  }
  if (!refused.ok()) {
    MONARCH_LOG(kWarning, "monarch service: refused client pid ", c->peer.pid, ": ",
                refused.message());
    SendError(c->socket.get(), refused).IgnoreError();
    return absl::CancelledError("refused");  // Answered already.
  }

  MONARCH_ASSIGN_OR_RETURN(
      ScopedFd buffer_fd,
      CreateSealedMemfd(absl::StrCat("monarch-transfer:", c->peer.pid),
                        kCountersPageBytes + options_.buffer_bytes));
  MONARCH_ASSIGN_OR_RETURN(MappedRegion buffer,
                           MappedRegion::Map(buffer_fd.get(), /*writable=*/true));
  {
    MutexLock lock(&mu_);  // NodeStats() reads them from other threads.
    c->buffer = std::move(buffer);
    c->job = hello->job.empty() ? absl::StrCat("pid-", c->peer.pid) : SafeJobName(hello->job);
    ledger_.Attach(c->job);
  }
  HelloReply reply;
  reply.instance_id = instance_id_;
  reply.buffer_bytes = options_.buffer_bytes;
  reply.cache_shape = CacheShape(*config_);
  reply.guest = c->guest;
  return SendHelloReply(*core_, std::move(reply), c->socket.get(), image_fd_.get(),
                        tier_slots_fd_.get(), buffer_fd.get());
}

ClientLedger::Tally NodeService::Tally() {
  std::vector<ConnectionReads> open;
  MutexLock lock(&mu_);
  for (const auto& c : connections_) open.push_back(c->reads());
  return ledger_.Count(open);
}

StatsReply NodeService::NodeStats() {
  StatsReply reply;
  ClientLedger::Tally tally = Tally();
  // Clients' own hits are reads of the tiers too: summed by tier index.
  reply.node = core_->GetStatsWith(std::vector<TierReadTotals>(
      std::begin(tally.tiers), std::begin(tally.tiers) + core_->tier_count()));
  CounterSink sink(&reply.node);
  sink.Counter("service.client_source_fallbacks", tally.source_fallbacks,
               "Reads clients served from the source themselves while no service answered.");
  sink.Counter("service.refused_connections", refused_.load(std::memory_order_relaxed),
               "Connections refused: another user's process (not of "
               "node.share_with_group's group).");
  sink.Counter("service.guest_refusals", guests_ != nullptr ? guests_->refusals() : 0,
               "Guests' proofs of access and reads refused (node.share_with_group).");
  sink.Gauge("service.clients", tally.clients.size(), "Client processes connected now.");
  reply.clients = std::move(tally.clients);
  reply.jobs = std::move(tally.jobs);
  return reply;
}

StatusReply NodeService::Status() {
  StatusReply status;
  status.service_pid = static_cast<uint32_t>(::getpid());
  status.uptime_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  status.dataset_root = core_->dataset_root();
  status.dataset_key = dataset_key_;
  const Namespace& ns = core_->name_space();
  status.files = ns.file_count();
  status.dataset_bytes = ns.total_bytes();
  const int source = core_->tier_count() - 1;
  // Extents in tiers count as files.
  for (uint32_t id = 0; id < ns.entry_count(); ++id) {
    const FileEntry& entry = ns.entry(id);
    if (entry.tier->load(std::memory_order_relaxed) < source &&
        core_->tier_config(entry.tier->load(std::memory_order_relaxed)).kind != TierKind::kPeers) {
      ++status.files_in_tiers;
      status.bytes_in_tiers += entry.ref.size;
    }
  }
  status.cache_shape = CacheShape(*config_);
  status.source_bytes = core_->GetStatsWith({}).Source("bytes_read");
  ClientLedger::Tally tally = Tally();
  status.clients = static_cast<uint32_t>(tally.clients.size());
  status.jobs = std::move(tally.jobs);
  return status;
}

}  // namespace monarch::service
