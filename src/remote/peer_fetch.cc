#include "remote/peer_fetch.h"

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

// Home-first admission for inclusive copies; see PeerFetch::WrapPolicy.
class HomeFirstPolicy final : public PlacementPolicy {
 public:
  HomeFirstPolicy(std::unique_ptr<PlacementPolicy> inner, const PeerFetch* peers,
                  uint64_t home_bytes_pending)
      : inner_(std::move(inner)), peers_(peers), home_pending_(home_bytes_pending) {}

  std::optional<int> ChooseTier(const FileRef& file,
                                const std::vector<std::unique_ptr<Tier>>& tiers) override {
    if (peers_->IsHome(file.id)) {
      std::optional<int> tier = inner_->ChooseTier(file, tiers);
      if (tier.has_value()) {
        uint64_t pending = home_pending_.load();
        while (
            !home_pending_.compare_exchange_weak(pending, pending - std::min(pending, file.size))) {
        }
      }
      return tier;
    }
    uint64_t free = 0;
    for (size_t i = 0; i + 1 < tiers.size(); ++i) free += tiers[i]->free_bytes();
    if (free < home_pending_.load() + file.size) return std::nullopt;
    return inner_->ChooseTier(file, tiers);
  }

 private:
  const std::unique_ptr<PlacementPolicy> inner_;
  const PeerFetch* const peers_;
  std::atomic<uint64_t> home_pending_;  // Bytes of home files not yet given room.
};

}  // namespace

absl::StatusOr<std::unique_ptr<PeerFetch>> PeerFetch::Create(const RemoteConfig& config,
                                                             const Namespace* ns, Tier* source) {
  int rank, size;
  if (config.bootstrap == "mpi") {
    absl::StatusOr<std::pair<int, int>> mpi = MpiRankAndSize();
    if (!mpi.ok()) return mpi.status();
    std::tie(rank, size) = *mpi;
  } else {
    absl::StatusOr<int> r = ResolveRankSpec(config.rank, "remote.rank", AutoRankVariables());
    if (!r.ok()) return r.status();
    absl::StatusOr<int> s = ResolveRankSpec(config.size, "remote.size", AutoSizeVariables());
    if (!s.ok()) return s.status();
    rank = *r;
    size = *s;
  }
  if (size < 1 || size > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote.size: expected 1 to 65535 peers, got ", size));
  }
  if (rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("remote.rank: expected 0 to ", size - 1,
                                                   " (remote.size is ", size, "), got ", rank));
  }
  auto fetch = std::unique_ptr<PeerFetch>(new PeerFetch(config, ns, source, rank, size));
  if (config.bootstrap == "directory") {
    absl::StatusOr<std::string> dir =
        ExpandEnvironment(config.rendezvous_dir, "remote.rendezvous_dir");
    if (!dir.ok()) return dir.status();
    fetch->rendezvous_dir_ = *dir;
  }
  return fetch;
}

PeerFetch::PeerFetch(const RemoteConfig& config, const Namespace* ns, Tier* source, int rank,
                     int size)
    : config_(config), ns_(ns), source_(source), rank_(rank), size_(size) {
  homes_.resize(ns->file_count());
  for (uint32_t id = 0; id < ns->file_count(); ++id) {
    homes_[id] = static_cast<uint16_t>(HomeRank(StableNameHash(ns->entry(id).ref.name), size));
    if (homes_[id] == rank) ++home_files_;
  }
  buffer_bytes_ = config.buffer_bytes != 0 ? config.buffer_bytes : AutoBufferBytes(*ns);
}

PeerFetch::~PeerFetch() { Shutdown(); }

absl::Status PeerFetch::Connect(PeerNetwork::ServeFn serve) {
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

void PeerFetch::Shutdown() {
  if (network_ == nullptr) return;
  network_->Shutdown();
  if (!rendezvous_dir_.empty()) WithdrawFromDirectory(rendezvous_dir_, rank_);
  rendezvous_dir_.clear();
}

absl::StatusOr<size_t> PeerFetch::Fetch(const FileRef& file, uint64_t offset, char* dst, size_t n) {
  const int home = homes_[file.id];
  if (network_ == nullptr || home == rank_) return source_->Read(file, offset, dst, n);
  if (!network_->IsUp(home)) {
    down_skips_.fetch_add(1, std::memory_order_relaxed);
    return source_->Read(file, offset, dst, n);
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
  if (got.ok()) {
    peer_reads_.fetch_add(1, std::memory_order_relaxed);
    peer_bytes_.fetch_add(*got, std::memory_order_relaxed);
    return got;
  }
  // Whatever went wrong, the source has the right bytes.
  fallbacks_.fetch_add(1, std::memory_order_relaxed);
  MONARCH_LOG(kDebug, "remote: ", file.name, " from peer ", home, " failed (",
              got.status().ToString(), "); reading the source");
  return source_->Read(file, offset, dst, n);
}

absl::Status PeerFetch::CheckServable(const FileEntry* entry,
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

std::unique_ptr<PlacementPolicy> PeerFetch::WrapPolicy(std::unique_ptr<PlacementPolicy> inner) {
  uint64_t pending = 0;  // Home files not already in a tier (warm restart).
  for (uint32_t id = 0; id < ns_->file_count(); ++id) {
    const FileEntry& entry = ns_->entry(id);
    if (homes_[id] == rank_ && entry.state.load() == PlacementState::kOnSource) {
      pending += entry.ref.size;
    }
  }
  return std::make_unique<HomeFirstPolicy>(std::move(inner), this, pending);
}

void PeerFetch::ReportCounters(CounterSink& sink) const {
  sink.Gauge("remote.enabled", 1, "1 when peers are enabled.");
  sink.Gauge("remote.rank", static_cast<uint64_t>(rank_), "This process's rank.");
  sink.Gauge("remote.peers", static_cast<uint64_t>(size_), "Processes in the job.");
  sink.Gauge("remote.buffer_bytes", buffer_bytes_, "Each pre-registered receive buffer.");
  sink.Gauge("remote.home_files", home_files_, "Files whose home is this process.");
  sink.Counter("remote.peer_reads", peer_reads_.load(),
               "Fetches of files no local tier held, served by their home.");
  sink.Counter("remote.peer_bytes_read", peer_bytes_.load(), "Bytes of those fetches.");
  sink.Counter("remote.fallbacks", fallbacks_.load(),
               "Peer fetches that failed and went to the source instead.");
  sink.Counter("remote.down_skips", down_skips_.load(),
               "Fetches sent straight to the source: the home was marked down.");
  sink.Counter("remote.peer_wait_ns", wait_ns_.load(), "Time callers spent waiting on peers.");
  if (network_ != nullptr) network_->ReportCounters(sink);
}

}  // namespace monarch
