// NodeService implementation.

#include "service/node_service.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <new>
#include <random>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/counters.h"
#include "common/log.h"
#include "common/os.h"
#include "common/status_macros.h"
#include "drivers/ram_keep.h"
#include "frontend/dataset_paths.h"
#include "frontend/glob.h"
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

absl::Status SendError(int socket, const absl::Status& status) {
  return SendFrame(socket, MessageType::kError, Encode(ErrorReply::From(status)));
}

// Checks file ids from a client: an id past the namespace is a hostile or
// broken message, refused like a malformed one.
absl::Status CheckFileIds(const std::vector<uint32_t>& ids, uint32_t count,
                          absl::string_view what) {
  for (uint32_t id : ids) {
    if (id >= count) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": id ", id, " out of range (", count, " in the namespace)"));
    }
  }
  return absl::OkStatus();
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

// A client's requests on the instance, on one connection: its misses, its
// read order and its hints (first reads, scans, which copies to map).
class ClientRequests {
 public:
  // `guest`: the grants of the service's guests when this connection is
  // one's (its reads then need them), else null.
  ClientRequests(MonarchCore& core, uint64_t buffer_bytes, GuestAccess* guest)
      : core_(core), buffer_bytes_(buffer_bytes), guest_(guest) {}

  static bool Handles(MessageType type) {
    return type == MessageType::kRead || type == MessageType::kAnnounce ||
           type == MessageType::kConsumed || type == MessageType::kReadAhead ||
           type == MessageType::kCheckedCopies || type == MessageType::kProveAccess;
  }
  // One of them. `transfer` is null before the hello: reads, orders and copy
  // checks need its session; hints come on bare connections too.
  absl::Status Handle(int socket, char* transfer, pid_t pid, const Frame& frame,
                      absl::FunctionRef<void()> mark_announced) {
    const bool hint = frame.type == MessageType::kConsumed || frame.type == MessageType::kReadAhead;
    if (transfer == nullptr && !hint) return absl::InvalidArgumentError("request before hello");
    switch (frame.type) {
      case MessageType::kRead: return Read(socket, transfer, pid, frame);
      case MessageType::kAnnounce: return Announce(socket, pid, frame, mark_announced);
      case MessageType::kConsumed: return Consumed(pid, frame);
      case MessageType::kReadAhead: return ReadAhead(frame);
      case MessageType::kProveAccess: return ProveAccess(socket, pid, frame);
      default:
        // A guest maps no copy: it would read bytes nobody checked it may.
        if (guest_ != nullptr) {
          return SendError(socket, absl::PermissionDeniedError(
                                       "a guest of the service maps no copies"));
        }
        return CheckedCopies(socket, frame);
    }
  }

 private:

  // A miss: the bytes go into `transfer`, the connection's buffer.
  absl::Status Read(int socket, char* transfer, pid_t pid, const Frame& frame) {
    absl::StatusOr<ReadRequest> request = DecodeReadRequest(frame.payload);
    if (!request.ok()) return request.status();  // Answered and closed by Serve().
    if (guest_ != nullptr && !guest_->Granted(pid, request->file_id)) {
      return SendError(socket, absl::PermissionDeniedError(absl::StrCat(
                                   "entry ", request->file_id,
                                   ": this process has not proved it may read the file "
                                   "(node.share_with_group)")));
    }
    if (request->length > buffer_bytes_) {
      return SendError(socket,
                       absl::InvalidArgumentError(absl::StrCat(
                           "read of ", request->length, " bytes is larger than the transfer buffer (",
                           buffer_bytes_, ")")));
    }
    // A file's id, or an extent's (a client reads a file cached by extents
    // extent by extent, as the service would). The source reads it makes
    // are this client's to pay (`monarch status`).
    absl::StatusOr<size_t> n = [&] {
      ChargeSourceReads charged(&source_bytes);
      return core_.ReadFile(request->file_id, transfer, static_cast<size_t>(request->length),
                            request->offset);
    }();
    if (!n.ok()) return SendError(socket, n.status());
    misses.fetch_add(1, std::memory_order_relaxed);
    miss_bytes.fetch_add(*n, std::memory_order_relaxed);
    absl::Status sent = SendFrame(socket, MessageType::kReadReply, Encode(ReadReply{*n}));
    // After the miss was answered (and its promotion started): a miss of
    // a job that announces nothing may stage the directory it is in.
    core_.StageAheadOnMiss(request->file_id);
    return sent;
  }

  // A guest's proof that it may read a file; the service's own user needs
  // none, and is answered yes.
  absl::Status ProveAccess(int socket, pid_t pid, const Frame& frame) {
    absl::StatusOr<ProveAccessRequest> request = DecodeProveAccessRequest(frame.payload);
    if (!request.ok()) return request.status();  // Answered and closed by Serve().
    if (guest_ != nullptr) {
      if (frame.fds.size() != 1) {
        return absl::InvalidArgumentError("prove access: expected one descriptor");
      }
      absl::Status proved = guest_->Prove(pid, request->file_id, frame.fds[0].get());
      if (absl::IsInvalidArgument(proved)) return proved;
      if (!proved.ok()) {
        MONARCH_LOG(kWarning, "monarch service: guest pid ", pid, ": ", proved.message());
        return SendError(socket, proved);
      }
    }
    return SendFrame(socket, MessageType::kOk, "");
  }

  // A piece of the read order; `mark` is called once it is complete, before
  // it is announced (the order is withdrawn when the process leaves).
  absl::Status Announce(int socket, pid_t pid, const Frame& frame, absl::FunctionRef<void()> mark) {
    absl::StatusOr<AnnounceRequest> request = DecodeAnnounceRequest(frame.payload);
    if (!request.ok()) return request.status();  // Answered and closed by Serve().
    const uint32_t files = core_.name_space().file_count();
    if (request->first) {
      pending_order_.clear();
      pending_ranges_.clear();
      pending_is_ranges_ = request->ranges;
    } else if (request->ranges != pending_is_ranges_) {
      return absl::InvalidArgumentError("announce: a piece of ranges in an order of files, or the "
                                        "other way round");
    }
    // An order covers some epochs, not an unbounded stream of pieces.
    const uint64_t limit = std::max<uint64_t>(uint64_t{files} * kMaxAnnouncedEpochs, kMaxIdsPerMessage);
    const uint64_t pending = pending_order_.size() + pending_ranges_.size();
    if (!request->ranges) {
      MONARCH_RETURN_IF_ERROR(CheckFileIds(request->file_ids, files, "announce"));
      if (pending + request->file_ids.size() > limit) {
        return absl::InvalidArgumentError(absl::StrCat(
            "announce: an order of more than ", limit, " files (", kMaxAnnouncedEpochs,
            " epochs of the dataset)"));
      }
      pending_order_.insert(pending_order_.end(), request->file_ids.begin(),
                              request->file_ids.end());
    } else {
      // Samples are bounded like files, by epochs of the dataset: an epoch
      // has at most a sample per file, or per 4 KiB of a big file's records.
      const uint64_t per_epoch =
          std::max<uint64_t>(files, core_.name_space().total_bytes() / 4096);
      const uint64_t range_limit =
          std::max<uint64_t>(per_epoch * kMaxAnnouncedEpochs, kMaxRangesPerMessage);
      if (pending + request->samples.size() > range_limit) {
        return absl::InvalidArgumentError(
            absl::StrCat("announce: an order of more than ", range_limit, " samples"));
      }
      for (const FileRange& sample : request->samples) {
        if (sample.file_id >= files) {
          return absl::InvalidArgumentError(absl::StrCat("announce: file id ", sample.file_id,
                                                         " out of range (", files, " files)"));
        }
        pending_ranges_.push_back(sample);
      }
    }
    if (request->last) {
      mark();
      if (pending_is_ranges_) {
        // A sample past its file's end is the client's mistake, not a
        // hostile message: answered, and the connection stays.
        absl::Status announced = core_.AnnounceRangesOf(pid, pending_ranges_, prefetched);
        pending_ranges_ = {};
        if (!announced.ok()) return SendError(socket, announced);
      } else {
        core_.AnnounceOrderOf(pid, std::move(pending_order_), prefetched);
        pending_order_ = {};
      }
    }
    return SendFrame(socket, MessageType::kOk, "");
  }

  // Files the client started reading.
  absl::Status Consumed(pid_t pid, const Frame& frame) {
    absl::StatusOr<ConsumedNotice> notice = DecodeConsumedNotice(frame.payload);
    if (!notice.ok()) return notice.status();
    // Extents too: a client's first reads of the extents of an order of ranges.
    MONARCH_RETURN_IF_ERROR(
        CheckFileIds(notice->file_ids, core_.name_space().entry_count(), "consumed"));
    core_.ConsumedBy(pid, notice->file_ids.data(), notice->file_ids.size());
    return absl::OkStatus();  // Not answered: the client does not wait for it.
  }

  absl::Status ReadAhead(const Frame& frame) {
    absl::StatusOr<ReadAheadNotice> notice = DecodeReadAheadNotice(frame.payload);
    if (!notice.ok()) return notice.status();
    MONARCH_RETURN_IF_ERROR(
        CheckFileIds({notice->file_id}, core_.name_space().file_count(), "read-ahead"));
    core_.ReadAheadOf(notice->file_id, notice->end);
    return absl::OkStatus();
  }

  absl::Status CheckedCopies(int socket, const Frame& frame) {
    absl::StatusOr<CheckedCopiesRequest> request = DecodeCheckedCopiesRequest(frame.payload);
    if (!request.ok()) return request.status();
    MONARCH_RETURN_IF_ERROR(
        CheckFileIds(request->ids, core_.name_space().entry_count(), "checked copies"));
    const std::vector<std::optional<SourceIdentity>> checked = core_.CheckedCopiesOf(request->ids);
    CheckedCopiesReply reply;
    for (size_t i = 0; i < request->ids.size(); ++i) {
      if (checked[i]) reply.copies.push_back(CheckedCopyStamp{request->ids[i], *checked[i]});
    }
    return SendFrame(socket, MessageType::kCheckedCopiesReply, Encode(reply));
  }

  // The longest read order a client may announce, in epochs of the dataset.
  static constexpr uint64_t kMaxAnnouncedEpochs = 100;

  MonarchCore& core_;
  const uint64_t buffer_bytes_;
  GuestAccess* const guest_;
  // The read order this client is sending in pieces (kAnnounce): file ids,
  // or samples inside files.
  std::vector<uint32_t> pending_order_;
  std::vector<FileRange> pending_ranges_;
  bool pending_is_ranges_ = false;

 public:
  std::atomic<uint64_t> misses{0};
  std::atomic<uint64_t> miss_bytes{0};
  std::atomic<uint64_t> source_bytes{0};  // What its misses made the source read.
  // What the prefetch streams fetched for its read order.
  const SourcePayer prefetched = std::make_shared<std::atomic<uint64_t>>(0);
};

// `monarch stage`: promotes the files the request's globs name (all when
// none), answering with progress until every promotion has landed or
// `stopping`.
absl::Status Stage(MonarchCore& core, const std::atomic<bool>& stopping, int socket,
                   const Frame& frame) {
  absl::StatusOr<StageRequest> request = DecodeStageRequest(frame.payload);
  if (!request.ok()) return request.status();  // Answered and closed by Serve().
  const Namespace& ns = core.name_space();
  const int source = core.tier_count() - 1;
  // The files to stage, in namespace order, each once.
  std::vector<uint32_t> ids;
  if (request->globs.empty()) {
    for (uint32_t id = 0; id < ns.file_count(); ++id) ids.push_back(id);
  } else {
    const frontend::DatasetPaths paths(core.dataset_root());
    std::vector<bool> chosen(ns.file_count(), false);
    for (const std::string& glob : request->globs) {
      const std::string pattern =
          absl::StartsWith(glob, "/") ? glob : absl::StrCat(core.dataset_root(), "/", glob);
      for (const std::string& match : frontend::Glob(core, paths, pattern)) {
        if (const std::optional<FileEntry> entry = ns.Find(match)) {
          chosen[entry->ref.id] = true;
          continue;
        }
        // A directory: everything under it.
        std::string name;
        if (!paths.ToDatasetName(match, &name)) continue;
        const std::string prefix = name.empty() ? "" : name + "/";
        for (uint32_t id = 0; id < ns.file_count(); ++id) {
          if (absl::StartsWith(ns.entry(id).ref.name, prefix)) chosen[id] = true;
        }
      }
    }
    for (uint32_t id = 0; id < ns.file_count(); ++id) {
      if (chosen[id]) ids.push_back(id);
    }
  }
  // A file cached by extents is staged extent by extent (each counted as a
  // file): it never has a copy of its own.
  std::vector<uint32_t> copies;
  copies.reserve(ids.size());
  for (uint32_t id : ids) {
    const FileEntry& entry = ns.entry(id);
    if (entry.extent_count == 0) {
      copies.push_back(id);
      continue;
    }
    for (uint32_t k = 0; k < entry.extent_count; ++k) copies.push_back(entry.first_extent + k);
  }
  ids = std::move(copies);
  StageProgress progress;
  progress.files_total = ids.size();
  for (uint32_t id : ids) progress.bytes_total += ns.entry(id).ref.size;
  auto measure = [&] {
    progress.files_done = progress.bytes_done = progress.files_in_tiers = 0;
    for (uint32_t id : ids) {
      const FileEntry& entry = ns.entry(id);
      const bool in_tier = entry.tier->load(std::memory_order_acquire) < source &&
                           entry.state->load() == PlacementState::kInTier;
      const bool given_up = entry.state->load() == PlacementState::kStaysOnSource;
      if (in_tier) ++progress.files_in_tiers;
      if (in_tier || given_up) {
        ++progress.files_done;
        progress.bytes_done += entry.ref.size;
      }
    }
  };
  auto last_report = std::chrono::steady_clock::now();
  char scratch[1];
  for (uint32_t id : ids) {
    if (stopping.load(std::memory_order_relaxed)) return absl::CancelledError("stopping");
    // One byte is enough: the first read of a file starts its promotion,
    // and placement completes it whatever part was read.
    const FileEntry& entry = ns.entry(id);
    if (entry.ref.size > 0 && entry.state->load() == PlacementState::kOnSource) {
      core.ReadFile(id, scratch, 1, 0).IgnoreError();
    }
    const auto now = std::chrono::steady_clock::now();
    if (now - last_report > std::chrono::milliseconds(250)) {
      last_report = now;
      measure();
      MONARCH_RETURN_IF_ERROR(
          SendFrame(socket, MessageType::kStageProgress, Encode(progress)));
    }
  }
  // Then until every promotion has landed, still reporting. The wait ends
  // when placement is idle, which a stop brings about at once (it cancels).
  std::atomic<bool> idle{false};
  std::thread waiter([&] {
    core.WaitForPlacement();
    idle.store(true);
  });
  absl::Status sent;
  while (!idle.load() && sent.ok()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    measure();
    sent = SendFrame(socket, MessageType::kStageProgress, Encode(progress));
  }
  waiter.join();
  MONARCH_RETURN_IF_ERROR(sent);
  measure();
  progress.finished = 1;
  return SendFrame(socket, MessageType::kStageProgress, Encode(progress));
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
        for (const auto& c : connections_) absl::StrAppend(&pids, pids.empty() ? "" : ", ", c->peer.pid);
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
