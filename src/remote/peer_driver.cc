#include "remote/peer_driver.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "remote/bootstrap.h"
#include "remote/rendezvous_hash.h"

namespace monarch {
namespace {

// Receive buffers: enough for the placement threads and a few readers to
// fetch at once.
constexpr int kReceiveBuffers = 8;

// "auto": the 95th percentile of file sizes, so that nearly every file
// arrives in one piece, within [64 KiB, 4 MiB]: larger files stream.
uint64_t AutoBufferBytes(const Namespace& ns) {
  std::vector<uint64_t> sizes(ns.file_count());
  for (uint32_t id = 0; id < ns.file_count(); ++id) sizes[id] = ns.entry(id).ref.size;
  uint64_t p95 = 0;
  if (!sizes.empty()) {
    const size_t k = std::min(sizes.size() - 1, sizes.size() * 95 / 100);
    std::nth_element(sizes.begin(), sizes.begin() + k, sizes.end());
    p95 = sizes[k];
  }
  p95 = (p95 + 4095) / 4096 * 4096;
  return std::clamp<uint64_t>(p95, 64 << 10, 4 << 20);
}

}  // namespace

absl::StatusOr<std::unique_ptr<PeerDriver>> PeerDriver::Create(const RemoteConfig& config,
                                                               const Namespace* ns) {
  absl::StatusOr<JobRank> job = ResolveJobRank(config);
  if (!job.ok()) return job.status();
  const int rank = job->rank, size = job->size;
  auto fetch = std::unique_ptr<PeerDriver>(new PeerDriver(config, ns, rank, size));
  if (config.bootstrap == "directory") {
    absl::StatusOr<std::string> dir =
        ExpandEnvironment(config.rendezvous_dir, "remote.rendezvous_dir");
    if (!dir.ok()) return dir.status();
    fetch->rendezvous_dir_ = *dir;
  }
  return fetch;
}

PeerDriver::PeerDriver(const RemoteConfig& config, const Namespace* ns, int rank, int size)
    : config_(config), ns_(ns), rank_(rank), size_(size) {
  homes_.resize(ns->file_count());
  for (uint32_t id = 0; id < ns->file_count(); ++id) {
    homes_[id] = static_cast<uint16_t>(HomeRank(StableNameHash(ns->entry(id).ref.name), size));
    if (homes_[id] == rank) ++home_files_;
  }
  buffer_bytes_ = config.buffer_bytes != 0 ? config.buffer_bytes : AutoBufferBytes(*ns);
}

PeerDriver::~PeerDriver() { Shutdown(); }

absl::Status PeerDriver::Connect(PeerNetwork::ServeFn serve) {
  if (size_ == 1) return absl::OkStatus();  // Alone: every file is ours.
  PeerNetwork::Options options;
  options.rank = rank_;
  options.size = size_;
  options.transports = config_.transports;
  options.buffer_bytes = buffer_bytes_;
  options.chunk_bytes = config_.chunk_bytes;
  options.receive_buffers = kReceiveBuffers;
  options.request_timeout_seconds = config_.request_timeout_seconds;
  options.retry_after_seconds = config_.retry_after_seconds;
  PeerNetwork::AddressExchange exchange;
  if (config_.bootstrap == "mpi") {
    exchange = [](const std::string& mine) { return ExchangeThroughMpi(mine); };
  } else {
    exchange = [this](const std::string& mine) {
      return ExchangeThroughDirectory(rendezvous_dir_, rank_, size_, mine,
                                      config_.rendezvous_timeout_seconds);
    };
  }
  absl::StatusOr<std::unique_ptr<PeerNetwork>> network =
      PeerNetwork::Start(options, exchange, std::move(serve));
  if (!network.ok()) {
    if (!rendezvous_dir_.empty()) WithdrawFromDirectory(rendezvous_dir_, rank_);
    return network.status();
  }
  network_ = std::move(*network);
  MONARCH_LOG(kInfo, "remote: rank ", rank_, " of ", size_, ", home of ", home_files_,
              " files, receive buffers of ", buffer_bytes_, " bytes over '", config_.transports,
              "'");
  return absl::OkStatus();
}

void PeerDriver::Shutdown() {
  if (network_ == nullptr) return;
  network_->Shutdown();
  if (!rendezvous_dir_.empty()) WithdrawFromDirectory(rendezvous_dir_, rank_);
  rendezvous_dir_.clear();
}

absl::StatusOr<size_t> PeerDriver::Read(const FileRef& file, uint64_t offset, char* dst,
                                        size_t n) {
  const int home = homes_[file.id];
  if (network_ == nullptr || home == rank_) {
    return absl::NotFoundError(absl::StrCat(file.name, " is homed here"));
  }
  if (!network_->IsUp(home)) {
    down_skips_.fetch_add(1, std::memory_order_relaxed);
    return absl::NotFoundError(absl::StrCat("the home of ", file.name, " (rank ", home,
                                            ") is marked down"));
  }
  // The network wants the exact range; clip to the file like a pread would.
  if (offset >= file.size) return 0;
  n = static_cast<size_t>(std::min<uint64_t>(n, file.size - offset));
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<size_t> got = network_->Fetch(home, file, offset, dst, n);
  wait_ns_.fetch_add(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count(),
      std::memory_order_relaxed);
  if (!got.ok()) {
    // The caller goes on to the source, which has the right bytes.
    fallbacks_.fetch_add(1, std::memory_order_relaxed);
    MONARCH_LOG(kDebug, "remote: ", file.name, " from peer ", home, " failed (",
                got.status().ToString(), "); reading the source");
    // Never NotFound: a failed fetch is an error of this tier.
    if (absl::IsNotFound(got.status())) return absl::UnavailableError(got.status().message());
  }
  return got;
}

absl::StatusOr<std::unique_ptr<CopyWriter>> PeerDriver::NewWriter(const FileRef& /*file*/) {
  return absl::PermissionDeniedError("the peers tier is read-only");
}

absl::Status PeerDriver::Remove(const FileRef& /*file*/) {
  return absl::PermissionDeniedError("the peers tier is read-only");
}

absl::Status PeerDriver::CheckServable(const FileEntry* entry,
                                      const PeerNetwork::FileRequest& request) const {
  if (entry == nullptr) {
    return absl::NotFoundError(absl::StrCat("not a dataset file here: ", request.name));
  }
  if (homes_[entry->ref.id] != rank_) {
    // Peers disagree on the peer list: refuse rather than forward (no loops).
    return absl::FailedPreconditionError(absl::StrCat("not the home of ", request.name));
  }
  if (entry->ref.size != request.size || entry->ref.mtime_ns != request.mtime_ns) {
    return absl::FailedPreconditionError(
        absl::StrCat(request.name, " differs between the peers' views of the source"));
  }
  if (request.offset > entry->ref.size || request.length > entry->ref.size - request.offset) {
    return absl::OutOfRangeError(absl::StrCat("range outside ", request.name));
  }
  return absl::OkStatus();
}

KeptShare PeerDriver::HomeShare() const {
  KeptShare share;
  for (uint32_t id = 0; id < ns_->file_count(); ++id) {
    const FileEntry& entry = ns_->entry(id);
    if (homes_[id] == rank_ && entry.state.load() == PlacementState::kOnSource) {
      share.pending_bytes += Tier::MaxFootprint(entry.ref.size);
    }
  }
  share.is_kept = [this](uint32_t id) { return IsHome(id); };
  return share;
}

void PeerDriver::ReportCounters(CounterSink& sink) const {
  sink.Gauge("remote.enabled", 1, "1 when peers are enabled.");
  sink.Gauge("remote.rank", static_cast<uint64_t>(rank_), "This process's rank.");
  sink.Gauge("remote.peers", static_cast<uint64_t>(size_), "Processes in the job.");
  sink.Gauge("remote.buffer_bytes", buffer_bytes_, "Each pre-registered receive buffer.");
  sink.Gauge("remote.home_files", home_files_, "Files whose home is this process.");
  sink.Counter("remote.fallbacks", fallbacks_.load(),
               "Peer fetches that failed and went to the source instead (the peers tier's "
               "read errors).");
  sink.Counter("remote.down_skips", down_skips_.load(),
               "Fetches sent straight to the source: the home was marked down.");
  sink.Counter("remote.peer_wait_ns", wait_ns_.load(), "Time callers spent waiting on peers.");
  if (network_ != nullptr) network_->ReportCounters(sink);
}

}  // namespace monarch
