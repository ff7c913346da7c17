#include "remote/peer_driver.h"

#include <algorithm>
#include <chrono>
#include <deque>

#include "absl/strings/str_cat.h"
#include "common/environment.h"
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

// Not in a tier and not on its way there: on the source, or declined by the
// placement policy (as another node's file, before this one kept it).
bool Unplaced(const FileEntry& entry) {
  const PlacementState state = entry.state->load();
  return state == PlacementState::kOnSource || state == PlacementState::kStaysOnSource;
}

}  // namespace

// PeerKeeper: the keeper thread of peer_driver.h's banner, which fills what
// this process should keep but does not hold. Apart from PeerDriver, which
// answers reads on the readers' threads: it is the tier's one background
// job, with its own thread, lock and state, and asks the driver only who
// keeps a file and which peers are alive.
class PeerKeeper final {
 public:
  explicit PeerKeeper(const PeerDriver& driver) : driver_(driver) {}

  // Queues the files among `replicas` not placed yet, and starts the thread,
  // which calls `fill` for each file to keep. Once, when connected.
  void Start(PeerDriver::FillFn fill, const std::vector<uint32_t>& replicas) {
    fill_ = std::move(fill);
    {
      MutexLock lock(&mu_);
      QueueUnplaced(replicas);
      started_ = true;
    }
    thread_.Start([this] { Loop(); });
  }

  // PeerDriver::WaitForFills.
  void WaitForFills() {
    MutexLock lock(&mu_);
    if (!started_) return;
    // A peer marked down just now counts: wait for one more look at them.
    const uint64_t look = looks_ + 1;
    wake_.Signal();
    while (!stop_ && (looks_ < look || filling_ || !to_fill_.empty())) {
      idle_.Wait(&mu_);
    }
  }

  // PeerDriver::StopFilling.
  void StopFilling() {
    MutexLock lock(&mu_);
    stop_ = true;
    wake_.Signal();
  }

  bool JoinUntil(Deadline deadline) { return thread_.JoinUntil(deadline); }

  void ReportCounters(CounterSink& sink) const {
    sink.Counter("remote.adopted_files", adopted_files_.load(),
                 "Files this process took over from peers marked down.");
    sink.Counter("remote.fills", fills_.load(),
                 "Replicas and adopted files this process fetched in the background.");
  }

 private:
  // Queues the files this process keeps but has not placed among `ids`.
  void QueueUnplaced(const std::vector<uint32_t>& ids) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (uint32_t id : ids) {
      if (Unplaced(driver_.ns_->entry(id))) to_fill_.push_back(id);
    }
    if (!to_fill_.empty()) wake_.Signal();
  }

  void Loop() {
    // Peers are marked down by whichever thread meets the failure; the keeper
    // looks a few times a second and adopts what falls to this process when a
    // peer fails. A peer that said goodbye is not adopted ahead of reads: at
    // the end of a job every peer leaves, and the last ones running must not
    // fetch the others' files for nothing (they still move, a read at a time).
    constexpr auto kLook = std::chrono::milliseconds(200);
    const int size = driver_.size_;
    const Namespace& ns = *driver_.ns_;
    std::vector<char> was_alive(size, 1);
    MutexLock lock(&mu_);
    while (!stop_) {
      ++looks_;
      std::vector<char> failed(size, 0);
      bool any_failed = false;
      for (int r = 0; r < size; ++r) {
        const bool alive = driver_.Alive(r);
        if (!alive && was_alive[r] && !driver_.network_->HasLeft(r)) failed[r] = any_failed = true;
        was_alive[r] = alive;
      }
      if (any_failed) {
        // Kept now, and not before these failures: whichever ranks failed
        // earlier, each file falls to the first live ranks of its order.
        auto alive_before = [&](int r) { return failed[r] || driver_.Alive(r); };
        std::vector<uint32_t> adopted;
        adopted_.resize(ns.entry_count());
        for (uint32_t id = 0; id < ns.entry_count(); ++id) {
          if (!driver_.IsKept(id) || driver_.KeptGiven(id, alive_before)) continue;
          adopted.push_back(id);
          if (!adopted_[id]) {
            adopted_[id] = true;
            adopted_files_.fetch_add(1, std::memory_order_relaxed);
          }
        }
        MONARCH_LOG(kInfo, "remote: a peer failed; this process now keeps ", adopted.size(),
                    " more files");
        QueueUnplaced(adopted);
      }
      if (to_fill_.empty()) {
        idle_.SignalAll();
        wake_.WaitUntil(&mu_, std::chrono::steady_clock::now() + kLook);
        continue;
      }
      const uint32_t id = to_fill_.front();
      to_fill_.pop_front();
      // Still ours and still unplaced (a reader may have brought it up).
      if (!Unplaced(ns.entry(id)) || !driver_.IsKept(id)) continue;
      filling_ = true;
      mu_.Unlock();
      fill_(id);
      fills_.fetch_add(1, std::memory_order_relaxed);
      mu_.Lock();
      filling_ = false;
    }
    idle_.SignalAll();
  }

  const PeerDriver& driver_;
  PeerDriver::FillFn fill_;
  ThreadGroup thread_;  // The keeper thread, once started.
  Mutex mu_;
  CondVar wake_;
  CondVar idle_;
  std::deque<uint32_t> to_fill_ ABSL_GUARDED_BY(mu_);
  bool filling_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t looks_ ABSL_GUARDED_BY(mu_) = 0;            // Looks for lost peers so far.
  std::vector<bool> adopted_ ABSL_GUARDED_BY(mu_);  // By file id, once a peer is lost.
  bool stop_ ABSL_GUARDED_BY(mu_) = false;

  std::atomic<uint64_t> fills_{0};
  std::atomic<uint64_t> adopted_files_{0};
};

absl::StatusOr<std::unique_ptr<PeerDriver>> PeerDriver::Create(const RemoteConfig& config,
                                                               const Namespace* ns) {
  absl::StatusOr<JobRank> job = ResolveJobRank(config);
  if (!job.ok()) return job.status();
  const int rank = job->rank, size = job->size;
  auto fetch = std::unique_ptr<PeerDriver>(new PeerDriver(config, ns, rank, size));
  if (config.bootstrap == BootstrapKind::kDirectory) {
    absl::StatusOr<std::string> dir =
        ExpandEnvironment(config.rendezvous_dir, "remote.rendezvous_dir");
    if (!dir.ok()) return dir.status();
    fetch->rendezvous_dir_ = *dir;
  }
  return fetch;
}

PeerDriver::PeerDriver(const RemoteConfig& config, const Namespace* ns, int rank, int size)
    : config_(config),
      ns_(ns),
      rank_(rank),
      size_(size),
      replicas_(std::clamp(config.replicas, 1, size)),
      keeper_(std::make_unique<PeerKeeper>(*this)) {
  // Extents have homes of their own, striped over the peers
  // (HolderOrder): a few big files spread over every peer. A file cached by
  // extents is never fetched whole, and is no one's to keep.
  holders_.resize(size_t{ns->entry_count()} * replicas_);
  std::vector<int> order;
  for (uint32_t id = 0; id < ns->entry_count(); ++id) {
    uint16_t* holders = &holders_[size_t{id} * replicas_];
    const HolderOrder holder_order = OrderOf(id);
    if (replicas_ == 1) {
      holders[0] = static_cast<uint16_t>(holder_order.Home(size));
    } else {
      holder_order.Ranks(size, &order);
      for (int i = 0; i < replicas_; ++i) holders[i] = static_cast<uint16_t>(order[i]);
    }
    if (ns->entry(id).extent_count > 0) continue;
    if (holders[0] == rank) ++home_files_;
    for (int i = 1; i < replicas_; ++i) replica_files_ += holders[i] == rank;
  }
  buffer_bytes_ = config.buffer_bytes != 0 ? config.buffer_bytes : AutoBufferBytes(*ns);
}

HolderOrder PeerDriver::OrderOf(uint32_t id) const {
  const FileEntry entry = ns_->entry(id);
  if (!entry.ref.is_extent) return HolderOrder::OfFile(StableNameHash(entry.ref.name));
  const FileEntry file = ns_->entry(entry.ref.file_id);
  return HolderOrder::OfExtent(StableNameHash(entry.ref.name), StableNameHash(file.ref.name),
                               id - file.first_extent, size_);
}

int PeerDriver::FirstUpHolder(uint32_t id) const {
  const uint16_t* holders = Holders(id);
  for (int i = 0; i < replicas_; ++i) {
    if (Up(holders[i])) return holders[i];
  }
  // Every holder is down: the file has moved further down its order.
  std::vector<int> order;
  OrderOf(id).Ranks(size_, &order);
  for (int r : order) {
    if (Up(r)) return r;
  }
  return rank_;
}

bool PeerDriver::IsKept(uint32_t id) const {
  if (ns_->entry(id).extent_count > 0) return false;
  return KeptGiven(id, [this](int rank) { return Alive(rank); });
}

template <typename AliveFn>
bool PeerDriver::KeptGiven(uint32_t id, AliveFn alive) const {
  const uint16_t* holders = Holders(id);
  bool mine = false, all_alive = true;
  for (int i = 0; i < replicas_; ++i) {
    mine |= holders[i] == rank_;
    all_alive &= alive(holders[i]);
  }
  if (all_alive) return mine;
  // A holder is lost: the first replicas_ live ranks of the order keep it.
  std::vector<int> order;
  OrderOf(id).Ranks(size_, &order);
  int live = 0;
  for (int r : order) {
    if (!alive(r)) continue;
    if (r == rank_) return true;
    if (++live == replicas_) return false;
  }
  return false;
}

// An owner whose Shutdown() gave up must abandon the driver instead.
PeerDriver::~PeerDriver() { Shutdown(DeadlineIn(kCancelGraceSeconds)); }

absl::Status PeerDriver::Connect(PeerNetwork::ServeFn serve, FillFn fill) {
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
  // Job identity: rank 0 makes the secret. The others get it through MPI,
  // or read it from the rendezvous directory once the exchange has given
  // them rank 0's address file, which names the secret by its fingerprint.
  static_assert(kJobSecretBytes == peer_wire::kSecretBytes, "one secret size");
  PeerNetwork::AddressExchange exchange;
  if (config_.bootstrap == BootstrapKind::kMpi) {
    std::string secret;
    absl::Status made = absl::OkStatus();
    if (rank_ == 0) {
      absl::StatusOr<std::string> fresh = NewJobSecret();
      if (fresh.ok()) secret = *std::move(fresh);
      else made = fresh.status();
    }
    // Every rank joins the broadcast, rank 0 even without a secret, so
    // that none waits in it for ever.
    const absl::Status shared = ShareJobSecretThroughMpi(&secret);
    if (!made.ok()) return made;
    if (!shared.ok()) return shared;
    options.secret = [secret] { return absl::StatusOr<std::string>(secret); };
    exchange = [](const std::string& mine) { return ExchangeThroughMpi(mine); };
  } else {
    std::string fingerprint;  // Rank 0's, published with its address.
    auto rank0_fingerprint = std::make_shared<std::string>();
    if (rank_ == 0) {
      // A rank 0 started again in a running job (it was killed) takes the
      // secret it left: the other ranks hold that one, and would refuse a
      // new one until the whole job restarted.
      absl::StatusOr<std::string> secret = ReadLeftJobSecret(rendezvous_dir_);
      if (secret.ok()) {
        MONARCH_LOG(kInfo, "remote: rank 0 rejoins with the job secret left in ",
                    rendezvous_dir_);
      } else {
        secret = NewJobSecret();
      }
      if (!secret.ok()) return secret.status();
      if (absl::Status s = PublishJobSecret(rendezvous_dir_, *secret); !s.ok()) return s;
      fingerprint = JobSecretFingerprint(*secret);
      options.secret = [secret = *secret] { return absl::StatusOr<std::string>(secret); };
    } else {
      options.secret = [this, rank0_fingerprint] {
        return ReadJobSecret(rendezvous_dir_, *rank0_fingerprint,
                             config_.rendezvous_timeout_seconds);
      };
    }
    exchange = [this, fingerprint, rank0_fingerprint](const std::string& mine) {
      return ExchangeThroughDirectory(rendezvous_dir_, rank_, size_, mine,
                                      config_.rendezvous_timeout_seconds, fingerprint,
                                      rank0_fingerprint.get());
    };
    options.lookup_address = [this](int rank) {
      return ReadPublishedAddress(rendezvous_dir_, rank, size_);
    };
  }
  absl::StatusOr<std::unique_ptr<PeerNetwork>> network =
      PeerNetwork::Start(options, exchange, std::move(serve));
  if (!network.ok()) {
    if (!rendezvous_dir_.empty()) {
      WithdrawFromDirectory(rendezvous_dir_, rank_);
      if (rank_ == 0) RemoveJobSecret(rendezvous_dir_);
    }
    return network.status();
  }
  network_ = std::move(*network);
  MONARCH_LOG(kInfo, "remote: rank ", rank_, " of ", size_, ", home of ", home_files_,
              " files (and replica of ", replica_files_, "), receive buffers of ", buffer_bytes_,
              " bytes over '", config_.transports, "'");
  std::vector<uint32_t> replicas;  // None with one replica: a file's only holder is its home.
  if (replicas_ > 1) {
    for (uint32_t id = 0; id < ns_->entry_count(); ++id) {
      if (Holders(id)[0] != rank_ && IsKept(id)) replicas.push_back(id);
    }
  }
  keeper_->Start(std::move(fill), replicas);
  // Only now: serving a request reads network_ (and a faster peer may have
  // asked already; its request waited).
  network_->StartServing();
  return absl::OkStatus();
}

void PeerDriver::WaitForFills() { keeper_->WaitForFills(); }

void PeerDriver::StopFilling() { keeper_->StopFilling(); }

void PeerDriver::CancelFetches() {
  if (network_ != nullptr) network_->CancelFetches();
}

bool PeerDriver::Shutdown(Deadline deadline) {
  StopFilling();
  // A fill in progress is a promotion: cancelled with placement, or done.
  bool clean = keeper_->JoinUntil(deadline);
  if (!clean) MONARCH_LOG(kWarning, "remote: gave up waiting at shutdown for a fill in progress");
  if (network_ == nullptr) return clean;
  clean &= network_->Shutdown(deadline);
  if (!rendezvous_dir_.empty()) {
    WithdrawFromDirectory(rendezvous_dir_, rank_);
    if (rank_ == 0) RemoveJobSecret(rendezvous_dir_);  // A later job must not find it either.
  }
  rendezvous_dir_.clear();
  return clean;
}

absl::StatusOr<size_t> PeerDriver::Read(const FileRef& file, uint64_t offset, char* dst,
                                        size_t n) {
  if (network_ == nullptr) return absl::NotFoundError(absl::StrCat(file.name, " is homed here"));
  const int home = Holders(file.id)[0];
  // The network wants the exact range; clip to the file like a pread would.
  if (offset >= file.size) return 0;
  n = static_cast<size_t>(std::min<uint64_t>(n, file.size - offset));
  // Each failure that marks a rank down moves the read one rank further
  // down the file's order; at most every other rank is tried once.
  absl::Status failure;
  for (int attempt = 0; attempt < size_; ++attempt) {
    const int holder = FirstUpHolder(file.id);
    // The first holder asked is not the home only when the home is down.
    if (attempt == 0 && holder != home) down_skips_.fetch_add(1, std::memory_order_relaxed);
    if (holder == rank_) {
      // Never NotFound after a failed fetch: that is an error of this tier
      // (counted as such); either way the read goes on to the source.
      if (!failure.ok()) return absl::UnavailableError(failure.message());
      return absl::NotFoundError(absl::StrCat(file.name, " is kept here"));
    }
    if (holder != home) rehomed_fetches_.fetch_add(1, std::memory_order_relaxed);
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<size_t> got = network_->Fetch(holder, file, offset, dst, n);
    wait_ns_.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::steady_clock::now() - start)
                           .count(),
                       std::memory_order_relaxed);
    if (got.ok()) return got;
    fallbacks_.fetch_add(1, std::memory_order_relaxed);
    MONARCH_LOG(kDebug, "remote: ", file.name, " from peer ", holder, " failed (",
                got.status().ToString(), ")");
    failure = got.status();
    // A dead holder's files fall to the next rank of the order; one that
    // answered but did not deliver sends the read to the source, which has
    // the right bytes.
    if (Up(holder)) break;
  }
  return absl::UnavailableError(failure.message());
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
  if (request.from_rank < 0 || request.from_rank >= size_ ||
      !OrderOf(entry->ref.id).ComesBefore(rank_, request.from_rank)) {
    // Peers disagree on who is down: refuse rather than ask further down the
    // order, which could loop back to the requester.
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", request.from_rank, " comes before this one in the order of ",
                     request.name));
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
  for (uint32_t id = 0; id < ns_->entry_count(); ++id) {
    const FileEntry& entry = ns_->entry(id);
    if (entry.extent_count > 0) continue;  // Kept by extents.
    const uint16_t* holders = Holders(id);
    if (std::find(holders, holders + replicas_, rank_) != holders + replicas_ &&
        entry.state->load() == PlacementState::kOnSource) {
      share.pending_bytes += Tier::MaxFootprint(entry.ref.size);
    }
  }
  share.is_kept = [this](uint32_t id) { return IsKept(id); };
  return share;
}

void PeerDriver::ReportCounters(CounterSink& sink) const {
  sink.Gauge("remote.enabled", 1, "1 when peers are enabled.");
  sink.Gauge("remote.rank", static_cast<uint64_t>(rank_), "This process's rank.");
  sink.Gauge("remote.peers", static_cast<uint64_t>(size_), "Processes in the job.");
  sink.Gauge("remote.buffer_bytes", buffer_bytes_, "Each pre-registered receive buffer.");
  sink.Gauge("remote.home_files", home_files_,
             "Files (and extents of files cached by extents) whose home is this process.");
  sink.Gauge("remote.replicas", static_cast<uint64_t>(replicas_), "Peers that keep each file.");
  sink.Gauge("remote.replica_files", replica_files_,
             "Files this process keeps a second (or later) copy of.");
  keeper_->ReportCounters(sink);
  sink.Counter("remote.rehomed_fetches", rehomed_fetches_.load(),
               "Fetches sent past a file's home, to the next live rank of its order.");
  sink.Counter("remote.fallbacks", fallbacks_.load(),
               "Peer fetches that failed: the read went on to the next rank of the file's "
               "order, or to the source.");
  uint64_t down = 0;
  for (int r = 0; r < size_; ++r) down += !Up(r);
  sink.Gauge("remote.peers_down", down, "Peers marked down now.");
  sink.Counter("remote.down_skips", down_skips_.load(),
               "Reads whose home was marked down (they go to the next rank of the order).");
  sink.Counter("remote.peer_wait_ns", wait_ns_.load(), "Time callers spent waiting on peers.");
  if (network_ != nullptr) network_->ReportCounters(sink);
}

}  // namespace monarch
