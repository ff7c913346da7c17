// MonarchImpl: the read path and the wiring of namespace, tiers and placement.
//
// The read path is: name -> namespace entry -> the tier its entry names.
// Only files still on the source take the detour through the placement
// handler, which may start a promotion and serve from its staged bytes; the
// bytes of such files come from the read-only tiers at the end of the list:
// with peers enabled the peers tier (the file's home), then the source.

#include "core/monarch_internal.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/counters.h"
#include "common/environment.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/os.h"
#include "common/shutdown.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "config/valid_config.h"
#include "core/read_path.h"
#include "core/read_speeds.h"
#include "drivers/ram_keep.h"
#include "drivers/tier.h"
#include "metadata/manifest.h"
#include "metadata/namespace.h"
#include "placement/memory_governor.h"
#include "placement/placement_handler.h"
#include "placement/placement_policy.h"
#include "placement/prefetcher.h"
#include "placement/stage_ahead.h"
#include "remote/bootstrap.h"
#include "remote/peer_driver.h"
#include "remote/ucx_loader.h"

namespace monarch {
namespace {

// Debian's Abseil has its own string_view type; the public API uses std's.
absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Memory the page cache may spend on buffered posix-tier copies ("auto"
// write mode): half of what is available at start-up, less the RAM tiers.
uint64_t BufferedCopyBudget(const Config& config) {
  uint64_t ram_tiers = 0;
  for (const TierConfig& tier : config.tiers) {
    if (tier.kind == TierKind::kRam) ram_tiers += tier.capacity_bytes;
  }
  const uint64_t available = AvailableMemoryBytes();
  return available > ram_tiers ? (available - ram_tiers) / 2 : 0;
}

}  // namespace

namespace {

// BuildNamespace's plan: the config asked once, for the manifest's path, the
// namespace kept on the node and, where ranks share one walk through the
// rendezvous directory, the job's rank (rank 0 makes the directory here).
absl::StatusOr<NamespacePlan> NamespacePlanOf(const Config& config, int source_index) {
  NamespacePlan plan;
  plan.origin = ManifestOriginOf(config.dataset);
  plan.scan_threads = config.dataset.scan_threads;
  plan.extents = {config.placement.extent_bytes, config.placement.extent_threshold};
  plan.source_tier = source_index;
  if (!config.dataset.manifest.empty()) {
    MONARCH_ASSIGN_OR_RETURN(plan.manifest, DatasetManifestPath(config.dataset));
    return plan;
  }
  if (config.dataset.keep_namespace) plan.kept = KeptNamespacePath(config.dataset);
  if (!config.remote.enabled || config.remote.bootstrap != BootstrapKind::kDirectory) return plan;
  MONARCH_ASSIGN_OR_RETURN(JobRank job, ResolveJobRank(config.remote));
  if (job.size == 1) return plan;
  MONARCH_ASSIGN_OR_RETURN(std::string dir, ExpandEnvironment(config.remote.rendezvous_dir,
                                                              "remote.rendezvous_dir"));
  plan.shared_manifest = absl::StrCat(dir, "/", kSharedManifestName);
  plan.publishes = job.rank == 0;
  if (!plan.publishes) plan.kept.clear();  // It builds from rank 0's.
  plan.await_seconds = config.remote.rendezvous_timeout_seconds;
  if (absl::Status made = plan.publishes ? MakeRendezvousDirectory(dir) : absl::OkStatus();
      !made.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "remote.rendezvous_dir: cannot publish the namespace manifest: ", made.message()));
  }
  return plan;
}

// Says what page size a kept RAM tier's memory gets: on 4 KiB pages every
// new process (the next job, each fresh DataLoader worker) pays a fault per
// 64 KiB it first reads, about doubling its first epoch from RAM
// (bench/results/next_job.md); a tmpfs mounted huge=within_size avoids it.
void LogRamPageSize(const TierConfig& tier, const std::string& ram_dir, uint64_t page) {
  if (page >= (2 << 20)) {
    MONARCH_LOG(kInfo, "RAM tier ", tier.name, ": 2 MiB pages on ", ram_dir);
  } else if (page != 0) {
    MONARCH_LOG(kInfo, "RAM tier ", tier.name, ": 4 KiB pages on ", ram_dir,
                " (node.ram_dir): a new process faults once per 64 KiB it first reads from it. "
                "A tmpfs mounted with huge=within_size, named in node.ram_dir, gives 2 MiB "
                "pages: one fault per 2 MiB");
  }
}

// The driver of `tier`. A kept RAM tier whose tmpfs gives 2 MiB pages
// unasked sets `huge_pages` in `in_effect`, the tier's config as its
// clients are told it (they then map it from the start: service/client.cc).
absl::StatusOr<std::unique_ptr<StorageDriver>> NewDriver(const TierConfig& tier,
                                                         const Config& config,
                                                         const Namespace& ns,
                                                         const CoreOptions& core,
                                                         TierConfig* in_effect) {
  const std::string& kept_ram_for = core.kept_ram_for;
  const int max_open = config.placement.max_open_files;
  switch (tier.kind) {
    case TierKind::kRam: {
      RamTierOptions options;
      // A home's RAM copies keep their block CRCs: peers are sent them
      // without a checksum pass (SharedCopies::InMemoryBytes).
      options.keep_block_sums = config.remote.enabled;
      options.huge_pages = tier.huge_pages;
      // Under memory.watch its memory must be releasable when it shrinks.
      options.releasable = MemoryGovernor::Wanted(config);
      // The tier never holds more than the dataset: backing more would only
      // take memory from the job.
      options.back_ahead = std::min(tier.back_ahead_bytes, ns.total_bytes());
      const std::string& ram_dir = core.ram_dir;
      if (!kept_ram_for.empty() && !config.node.keep_ram) DiscardKeptRam(ram_dir, kept_ram_for);
      if (!kept_ram_for.empty() && config.node.keep_ram) {
        absl::StatusOr<std::string> dir = KeptRamDirectory(ram_dir, kept_ram_for);
        absl::Status made = dir.status();
        if (dir.ok()) made = MakePrivateDirectory(JoinPath(*dir, tier.name), "node.keep_ram");
        if (made.ok()) {
          options.kept_dir = JoinPath(*dir, tier.name);
          const uint64_t page = TmpfsPageSize(ram_dir, tier.huge_pages);
          in_effect->huge_pages |= page >= (2 << 20);
          LogRamPageSize(tier, ram_dir, page);
        } else {  // Memfds, as without the key.
          MONARCH_LOG(kWarning, "node.keep_ram: RAM copies are not kept: ", made.message());
        }
      }
      return NewRamDriver(tier.name, tier.capacity_bytes, ns.entry_count(), options);
    }
    case TierKind::kPmem:
      return NewPmemDriver(tier.path, max_open, config.placement.verify);
    case TierKind::kPosix: {
      PosixWriteOptions options;
      options.mode = tier.write_mode == WriteMode::kBuffered ? PosixWriteOptions::Mode::kBuffered
                     : tier.write_mode == WriteMode::kDirect ? PosixWriteOptions::Mode::kDirect
                                                             : PosixWriteOptions::Mode::kAuto;
      options.buffered_budget_bytes = BufferedCopyBudget(config);
      options.verify = config.placement.verify;
      return NewPosixDriver(tier.path, max_open, options);
    }
    case TierKind::kSource:
      return NewSourceDriver(config.dataset.path, max_open);
    case TierKind::kPeers:
      break;  // Built by CreateMonarchWithDriverWrapper, which needs the namespace.
  }
  return absl::InternalError("unknown tier kind");
}

// The in-process instance's side of the read path (core/read_path.h):
// where files live (the namespace, its tier slots, the pins that keep
// eviction off a copy being read) and what a miss or a bad copy does (the
// placement handler; dropping the copy). Apart from the instance so that
// the threads that read through it (the application's, the placement
// pool's, the peers' serve pool) need nothing else of it: one stuck in a
// read that never returns keeps only this, the tiers and placement alive
// when the instance is abandoned.
class LocalFiles {
 public:
  using Handle = std::optional<FileEntry>;

  // All must outlive this. `tiers`: the cache tiers, the peers tier (if
  // any), then the source.
  // `speeds`: null, or the model that picks between a file tier's copy and
  // the source's page cache (placement.route_by_speed).
  LocalFiles(std::vector<std::unique_ptr<Tier>>* tiers, Namespace* ns, PlacementHandler* placement,
             Prefetcher* prefetcher, ReadSpeeds* speeds)
      : tiers_(*tiers),
        source_index_(static_cast<int>(tiers->size()) - 1),
        namespace_(ns),
        placement_(placement),
        prefetcher_(prefetcher),
        speeds_(speeds),
        pins_(placement->pins_readers()) {
  }

  Handle Find(absl::string_view name) { return namespace_->Find(name); }
  const FileRef& Ref(const Handle& file) const { return file->ref; }
  bool HasExtents(const Handle& file) const { return file->extent_count > 0; }
  Handle ExtentAt(const Handle& file, uint64_t offset) const {
    return namespace_->ExtentAt(*file, offset);
  }
  void ReadingRange(const Handle& file, uint64_t offset, size_t n) {
    placement_->ReadingRange(*file, offset, n);
  }
  void FirstRead(const Handle& file) {
    // A reader's first read of a file frees the prefetch lookahead it took.
    if (prefetcher_->active()) prefetcher_->Consumed(kThisProcess, &file->ref.id, 1);
  }
  // Pinned only where copies are evicted (by the policy, or by memory
  // pressure): an eviction waits for its readers.
  int BeginRead(const Handle& file) {
    return pins_ ? placement_->BeginTierRead(*file) : file->tier->load(std::memory_order_acquire);
  }
  void EndRead(const Handle& file) {
    if (pins_) placement_->EndTierRead(file->ref.id);
  }
  int source_tier() const { return source_index_; }
  StorageDriver* Reader(int tier) { return &tiers_[tier]->driver(); }
  absl::StatusOr<size_t> ReadCopy(StorageDriver& reader, const Handle& file, int tier,
                                  uint64_t offset, char* dst, size_t n) {
    if (speeds_ != nullptr && speeds_->Routes(tier)) {
      return speeds_->ReadHit(tiers_[source_index_]->can().in_memory, reader, file->ref, tier,
                              offset, dst, n, tiers_[tier]->reads());
    }
    absl::StatusOr<size_t> got = reader.Read(file->ref, offset, dst, n);
    if (got.ok() && *got == n) tiers_[tier]->reads().Count(n);
    return got;
  }

  // A copy that cannot be read (deleted behind our back, EIO, damaged) is
  // dropped from the namespace and the read is served from the source: a
  // read never fails or returns wrong bytes because a cache copy went bad.
  std::optional<absl::StatusOr<size_t>> CopyFailed(const Handle& file, int tier,
                                                   const absl::StatusOr<size_t>& result,
                                                   uint64_t offset, char* dst, size_t n) {
    const FileEntry& entry = *file;
    int expected = tier;
    if (entry.tier->compare_exchange_strong(expected, source_index_)) {
      // This thread dropped it (readers racing on the same bad copy count
      // and log it once): give its room back and delete what is left (a RAM
      // copy's memory, a damaged file). Readers already inside the driver
      // are safe: drivers allow Remove concurrent with Read.
      Tier& dropped = *tiers_[tier];
      dropped.CountReadError();
      if (absl::IsDataLoss(result.status())) dropped.CountDamagedCopy();
      MONARCH_LOG(kWarning, "tier '", dropped.config().name, "' failed to read ", entry.ref.name,
                  " (",
                  result.ok() ? absl::StrCat("short read of ", *result, " bytes")
                              : result.status().ToString(),
                  "); serving it from the source from now on");
      entry.state->store(PlacementState::kStaysOnSource);
      absl::Status removed = dropped.driver().Remove(entry.ref);
      if (!removed.ok() && !absl::IsNotFound(removed)) {
        MONARCH_LOG(kWarning, "cannot remove the bad copy: ", removed.ToString());
      }
      dropped.Drop(entry.ref.size);
    }
    Tier& source = *tiers_[source_index_];
    absl::StatusOr<size_t> read = source.Read(entry.ref, offset, dst, n);
    if (!read.ok()) source.CountReadError();
    return read;
  }

  std::optional<absl::StatusOr<size_t>> Miss(const Handle& file, uint64_t offset, char* dst,
                                             size_t n) {
    return placement_->ReadIfOnSource(*file, offset, dst, n,
                                      /*may_defer=*/!prefetcher_->copying());
  }

  // `tiers`: where each piece was (it may have moved since: the stamp
  // then names a copy that is gone, and opening it fails).
  std::vector<std::optional<SourceIdentity>> CheckedCopies(const std::vector<Handle>& pieces,
                                                           const std::vector<int>& tiers) {
    std::vector<std::optional<SourceIdentity>> checked(pieces.size());
    for (size_t i = 0; i < pieces.size(); ++i) {
      CopyMapping* mapping =
          tiers[i] >= 0 && tiers[i] < source_index_ ? tiers_[tiers[i]]->can().mapping : nullptr;
      if (mapping != nullptr) {
        checked[i] = mapping->MarkMapped(pieces[i]->ref);
      }
    }
    return checked;
  }

  // Calls `visit` with the bytes where they rest if the file's copy is in
  // memory (the RAM tier), as a read of it; false if it is not (or was
  // removed meanwhile: the caller reads it the usual way). For the peers,
  // who are sent a RAM copy's bytes without a staging copy.
  bool VisitInMemory(const Handle& file, uint64_t offset, size_t n, PeerNetwork::TakeFn visit) {
    const int tier = BeginRead(file);
    const bool visited = tier != source_index_ &&
                         tiers_[tier]
                             ->VisitInMemory(file->ref, offset, n,
                                             [visit](const SharedCopies::InMemoryBytes& bytes) {
                                               visit(bytes.data, bytes.crc32c);
                                             })
                             .ok();
    EndRead(file);
    return visited;
  }

  // The reader id of this process's own reads (the node service numbers its
  // clients from 1).
  static constexpr uint64_t kThisProcess = 0;

 private:
  std::vector<std::unique_ptr<Tier>>& tiers_;
  const int source_index_;
  Namespace* const namespace_;
  PlacementHandler* const placement_;
  Prefetcher* const prefetcher_;
  ReadSpeeds* const speeds_;
  const bool pins_;
};

class MonarchImpl final : public MonarchCore {
 public:
  // `tiers`: the cache tiers, then the peers tier if `peers` is set (and
  // `peers` is its driver), then the source.
  MonarchImpl(Config config, std::vector<std::unique_ptr<Tier>> tiers,
              std::unique_ptr<Namespace> ns, PeerDriver* peers)
      : config_(std::move(config)),
        parts_(new Parts{std::move(tiers), std::move(ns), nullptr, nullptr, nullptr, nullptr, nullptr,
                         nullptr, nullptr}),
        tiers_(parts_->tiers),
        source_index_(static_cast<int>(tiers_.size()) - 1),
        namespace_(parts_->ns.get()),
        peers_(peers) {}

  ~MonarchImpl() override {
    Shutdown(ShutdownMode::kCancel);
    MutexLock lock(&shutdown_mu_);
    if (!shutdown_clean_) {
      // A thread is still inside a read that has not returned: what it uses
      // stays alive, and this instance goes without joining it.
      MONARCH_LOG(kWarning, "leaving the instance's tiers and threads behind at exit");
      Abandon(std::move(parts_));
    }
  }

  absl::Status Start() {
    source().SetDatasetSize(namespace_->file_count(), namespace_->total_bytes());
    MONARCH_RETURN_IF_ERROR(ReuseEarlierCopies());
    std::unique_ptr<PlacementPolicy> policy = NewPlacementPolicy(
        config_.placement.policy, peers_ != nullptr ? peers_->HomeShare() : KeptShare{});
    const bool governed = MemoryGovernor::Wanted(config_);
    parts_->mappings = std::make_unique<MappingWatch>(static_cast<int>(tiers_.size()));
    parts_->placement = std::make_unique<PlacementHandler>(
        &tiers_, namespace_, std::move(policy), config_.placement,
        /*pin_readers=*/governed, parts_->mappings.get());
    placement_ = parts_->placement.get();
    PrefetchConfig prefetch = config_.prefetch;
    if (placement_->evicts()) {
      // Fetching further ahead than half the cache tiers hold would evict
      // copies fetched earlier before they are read: a second source read.
      uint64_t cache_bytes = 0;
      for (const auto& tier : tiers_) {
        if (tier->is_cache()) cache_bytes += tier->config().capacity_bytes;
      }
      prefetch.lookahead_bytes = std::max<uint64_t>(
          1, std::min(prefetch.lookahead_bytes, cache_bytes / 2));
    }
    parts_->prefetcher = std::make_unique<Prefetcher>(prefetch, namespace_, placement_);
    prefetcher_ = parts_->prefetcher.get();
    if (config_.prefetch.stage_ahead && config_.prefetch.streams > 0) {
      parts_->stage_ahead = std::make_unique<StageAhead>(namespace_, prefetcher_, [this] {
        uint64_t room = 0;  // The cache tiers' capacity in force.
        for (const auto& tier : tiers_) room += tier->is_cache() ? tier->limit() : 0;
        return room;
      });
    }
    std::vector<ReadSpeeds::TierName> names;
    for (const auto& tier : tiers_) names.push_back({tier->config().name, tier->config().kind});
    parts_->speeds = ReadSpeeds::For(config_.placement.route_by_speed, std::move(names));
    parts_->files = std::make_unique<LocalFiles>(&tiers_, namespace_, placement_, prefetcher_,
                                                 parts_->speeds.get());
    files_ = parts_->files.get();
    // An announced order also tells eviction what is read next.
    placement_->SetNextUseOracle(prefetcher_);
    if (governed) {
      // Last: it sheds through the read path's pins, complete from here on.
      MONARCH_ASSIGN_OR_RETURN(
          parts_->memory, MemoryGovernor::Start(config_.memory, CgroupMemory::Discover(), &tiers_,
                                                namespace_, placement_));
    }
    if (peers_ != nullptr) {
      // From here on peers may ask for files: the read path must be complete.
      // Served through the internal read path, not the public Read: a peer's
      // request is not one of this process's reads.
      // Both callbacks use only what an abandoned instance keeps (Parts).
      auto serve = [ns = namespace_, peers = peers_, files = files_](
                       const PeerNetwork::FileRequest& request, char* staging,
                       PeerNetwork::TakeFn take) -> absl::Status {
        // A file or an extent.
        const std::optional<FileEntry> entry = ns->FindCopy(request.name);
        MONARCH_RETURN_IF_ERROR(
            peers->CheckServable(entry.has_value() ? &*entry : nullptr, request));
        if (files->VisitInMemory(entry, request.offset, request.length, take)) {
          return absl::OkStatus();
        }
        if (staging == nullptr) return absl::UnavailableError("not in memory");
        MONARCH_ASSIGN_OR_RETURN(size_t read,
                                 ReadFound(*files, entry, staging, request.length, request.offset));
        if (read != request.length) {
          return absl::DataLossError(absl::StrCat("short read of ", request.name));
        }
        take(staging, std::nullopt);
        return absl::OkStatus();
      };
      // Replicas and a lost peer's files are promoted like prefetched ones.
      auto fill = [ns = namespace_, placement = placement_](uint32_t id) {
        const FileEntry& entry = ns->entry(id);
        placement->Reconsider(entry);  // Declined as someone else's file before.
        placement->Prefetch(entry);
      };
      MONARCH_RETURN_IF_ERROR(peers_->Connect(std::move(serve), std::move(fill)));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<size_t> Read(std::string_view name, void* buffer, size_t n,
                              uint64_t offset) override {
    return ReadNamed(*files_, ToAbsl(name), static_cast<char*>(buffer), n, offset);
  }

  absl::StatusOr<uint64_t> MapCopies(std::string_view name, void* mapping, uint64_t offset,
                                     uint64_t length, int protection, int flags) override {
    const std::optional<FileEntry> entry = namespace_->Find(ToAbsl(name));
    if (!entry.has_value()) {
      return absl::NotFoundError(absl::StrCat("not a dataset file: ", ToAbsl(name)));
    }
    return MapCopiesFound(*files_, entry, static_cast<char*>(mapping), offset, length, protection,
                          flags);
  }

  const std::string& dataset_root() const override { return namespace_->root(); }

  Stats NodeStats() const override { return GetStatsWith({}); }
  const ReadSpeeds* Speeds() const override { return parts_->speeds.get(); }

  Stats GetStatsWith(const std::vector<TierReadTotals>& elsewhere) const override {
    Stats stats;
    CounterSink sink(&stats);
    placement_->ReportCounters(sink);
    if (parts_->memory != nullptr) parts_->memory->ReportCounters(sink);
    prefetcher_->ReportCounters(sink);
    namespace_->ReportCounters(sink);
    sink.Counter("warm_files_reused", warm_reused_, "Valid copies found at start-up.");
    sink.Counter("warm_files_discarded", warm_discarded_,
                 "Copies removed at start-up: of another version of the source file, or damaged.");
    if (peers_ != nullptr) peers_->ReportCounters(sink);
    for (size_t t = 0; t < tiers_.size(); ++t) {
      tiers_[t]->ReportCounters(sink, t < elsewhere.size() ? elsewhere[t] : TierReadTotals{});
    }
    return stats;
  }

  // Bounded (placement.shutdown_timeout, then kCancelGraceSeconds): see
  // Monarch::Shutdown and common/shutdown.h.
  void Shutdown(ShutdownMode mode) override {
    MutexLock lock(&shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
    if (placement_ == nullptr) return;  // Start() failed before placement existed.
    // The prefetch streams and the peers' keeper start no more files.
    prefetcher_->Stop();
    if (peers_ != nullptr) peers_->StopFilling();
    // Shedding stops first: it moves copies through placement's machinery.
    bool memory_clean = parts_->memory == nullptr ||
                        parts_->memory->Stop(DeadlineIn(kCancelGraceSeconds));
    if (mode == ShutdownMode::kDrain &&
        !placement_->Drain(DeadlineIn(config_.placement.shutdown_timeout_seconds))) {
      MONARCH_LOG(kWarning, "shutdown: promotions still in flight after placement.shutdown_timeout (",
                  config_.placement.shutdown_timeout_seconds, " s); cancelling them");
    }
    // Nothing waits for a peer from here on; peers' requests are still
    // served (from the source, at worst) until the network shuts down.
    if (peers_ != nullptr) peers_->CancelFetches();
    const Deadline grace = DeadlineIn(kCancelGraceSeconds);
    bool clean = memory_clean;
    clean &= placement_->Cancel(grace);
    clean &= prefetcher_->Shutdown(grace);
    if (peers_ != nullptr) clean &= peers_->Shutdown(grace);
    shutdown_clean_ = clean;
    // Kept while this rank runs, for a peer that restarts; then removed, so
    // that a later job in the same directory finds only its own rank 0's.
    if (!published_manifest_.empty()) {
      os::Unlink(published_manifest_.c_str());
      published_manifest_.clear();
    }
  }

  // The manifest this instance published for its peers, removed at Shutdown.
  void RemoveAtShutdown(std::string manifest) { published_manifest_ = std::move(manifest); }

  // Each wait ends: fills and promotions are bounded by their reads (and
  // the peers' request timeout), and the tiers' readying by its opens.
  void WaitForPlacement() override {
    if (peers_ != nullptr) peers_->WaitForFills();
    placement_->WaitIdle();
    // Copies published are readied (opened, checked) before the next epoch.
    for (const auto& tier : tiers_) tier->driver().WaitForBackgroundWork();
  }

  // Front.
  const NamespaceView* View() const override { return namespace_; }
  absl::Status AnnounceIds(const NamespaceView&, std::vector<uint32_t> ids,
                           std::vector<FileRange> ranges) override {
    if (ranges.empty()) {
      prefetcher_->Announce(kThisProcess, std::move(ids));
      return absl::OkStatus();
    }
    return AnnounceRangesOf(kThisProcess, ranges, /*payer=*/nullptr);
  }

  // MonarchCore.
  const Namespace& name_space() const override { return *namespace_; }
  absl::StatusOr<size_t> ReadFile(uint32_t id, char* dst, size_t n, uint64_t offset) override {
    if (id >= namespace_->entry_count()) return absl::NotFoundError("no such file id");
    return ReadFound(*files_, LocalFiles::Handle(namespace_->entry(id)), dst, n, offset);
  }
  int tier_count() const override { return static_cast<int>(tiers_.size()); }
  const TierConfig& tier_config(int tier) const override { return tiers_[tier]->config(); }
  std::vector<int> SharedMemoryDescriptors(int tier) const override {
    const SharedCopies* shared = tiers_[tier]->can().shared;
    return shared != nullptr ? shared->SharedMemoryDescriptors() : std::vector<int>{};
  }
  int max_open_files() const override { return config_.placement.max_open_files; }
  void AnnounceOrderOf(uint64_t reader, std::vector<uint32_t> ids, SourcePayer payer) override {
    prefetcher_->Announce(reader, std::move(ids), std::move(payer));
  }
  absl::Status AnnounceRangesOf(uint64_t reader, const std::vector<FileRange>& samples,
                                SourcePayer payer) override {
    std::vector<uint32_t> ids;
    ids.reserve(samples.size());
    for (const FileRange& sample : samples) {
      if (sample.file_id >= namespace_->file_count()) {
        return absl::InvalidArgumentError(absl::StrCat("announced order: no file id ", sample.file_id));
      }
      MONARCH_RETURN_IF_ERROR(AppendSampleEntries(namespace_->entry(sample.file_id), sample.offset,
                                                  sample.length, &ids));
    }
    prefetcher_->Announce(reader, std::move(ids), std::move(payer));
    return absl::OkStatus();
  }
  void ReadAheadOf(uint32_t id, uint64_t end) override {
    if (id < namespace_->file_count()) placement_->ReadAheadPast(namespace_->entry(id), end);
  }
  std::vector<std::optional<SourceIdentity>> CheckedCopiesOf(
      const std::vector<uint32_t>& ids) override {
    std::vector<LocalFiles::Handle> pieces;
    std::vector<int> tiers;
    for (uint32_t id : ids) {
      pieces.push_back(namespace_->entry(id));
      tiers.push_back(namespace_->tier(id).load(std::memory_order_acquire));
    }
    return files_->CheckedCopies(pieces, tiers);
  }
  void StageAheadOnMiss(uint32_t id) override {
    if (parts_->stage_ahead != nullptr) parts_->stage_ahead->OnMiss(id);
  }
  void SetKeeping(bool keeping) override {
    if (parts_->memory != nullptr) parts_->memory->SetKeeping(keeping);
  }
  void ConsumedBy(uint64_t reader, const uint32_t* ids, size_t count) override {
    // Clients' hits, which the service does not see otherwise: uses for
    // eviction's CLOCK too.
    if (placement_->pins_readers()) {
      for (size_t i = 0; i < count; ++i) placement_->Touch(ids[i]);
    }
    if (prefetcher_->active()) prefetcher_->Consumed(reader, ids, count);
  }

 private:
  Tier& source() { return *tiers_.back(); }

  // Appends the entries a sample of `entry` names to an order: the file, for
  // a file cached whole (once for a run of samples in it), or each extent
  // the sample touches, repeats included: a reader reports each extent a
  // read touches (ReadFound), so the order's positions and the reads' stay
  // in step.
  absl::Status AppendSampleEntries(const FileEntry& entry, uint64_t offset, uint64_t length,
                                   std::vector<uint32_t>* ids) const {
    const uint64_t size = entry.ref.size;
    if (offset > size || (offset == size && size > 0)) {
      return absl::OutOfRangeError(absl::StrCat("announced order: offset ", offset,
                                                " is past the end of ",
                                                QuoteForError(entry.ref.name), " (", size,
                                                " bytes)"));
    }
    if (entry.extent_count == 0 || size == 0) {
      if (ids->empty() || ids->back() != entry.ref.id) ids->push_back(entry.ref.id);
      return absl::OkStatus();
    }
    const uint64_t end = length == 0 || length > size - offset ? size : offset + length;
    for (uint64_t at = offset; at < end;) {
      const FileEntry& extent = namespace_->ExtentAt(entry, at);
      ids->push_back(extent.ref.id);
      at = extent.ref.part_offset + extent.ref.size;
    }
    return absl::OkStatus();
  }

  // Warm restart: adopt the copies an earlier run left in file-backed tiers
  // (and a kept RAM tier) when they are copies of the source files as the
  // walk found them (the identity recorded with them, and a stat when the
  // namespace was not walked), delete the others. Their blocks are checked
  // against their checksums as they are read, like any copy's.
  absl::Status ReuseEarlierCopies() {
    for (int t = 0; t < source_index_; ++t) {
      Tier& tier = *tiers_[t];
      KeptCopies* kept = tier.can().kept;
      if (!tier.is_cache() || kept == nullptr) continue;
      struct Found {
        FileEntry entry;
        bool valid;
      };
      std::vector<Found> found;
      MONARCH_RETURN_IF_ERROR(kept->ScanCopies([&](absl::string_view name,
                                                   const SourceIdentity* source) {
        const std::optional<FileEntry> entry = namespace_->FindCopy(name);
        if (!entry.has_value()) return;  // Not ours to judge (another dataset or filter).
        found.push_back(
            {*entry, source != nullptr && *source == namespace_->identity(entry->ref.id)});
      }));
      // A namespace from a manifest cannot see a file rewritten in place:
      // a copy is adopted only if the source still stats the same. The
      // stats go in parallel (dataset.scan_threads), as a walk's do: a PFS
      // answers each in a millisecond or more.
      if (namespace_->built_from_manifest()) {
        ForEachInParallel(found.size(), config_.dataset.scan_threads, 64, [&](size_t i) {
          if (found[i].valid) found[i].valid = namespace_->SourceUnchanged(found[i].entry.ref.id);
        });
      }
      for (const auto& [entry, valid] : found) {
        // A whole copy of a file now cached by extents is never read.
        const bool wanted = valid && entry.extent_count == 0 &&
                            entry.tier->load() == source_index_ &&
                            tier.TryReserve(entry.ref.size);
        if (wanted) {
          tier.Commit(entry.ref.size);
          entry.tier->store(t, std::memory_order_release);
          entry.state->store(PlacementState::kInTier);
          kept->CopyAdopted(entry.ref);
          ++warm_reused_;
          continue;
        }
        // Stale, damaged, a duplicate of a faster tier's copy, or over capacity.
        absl::Status removed = tier.driver().Remove(entry.ref);
        if (!removed.ok()) MONARCH_LOG(kWarning, "cannot remove stale copy: ", removed.ToString());
        if (!valid) ++warm_discarded_;
      }
      kept->AdoptionDone();
    }
    if (warm_reused_ + warm_discarded_ > 0) {
      MONARCH_LOG(kInfo, "warm restart: reused ", warm_reused_, " copies, discarded ",
                  warm_discarded_, " stale or damaged ones");
    }
    return absl::OkStatus();
  }

  // What readers and background threads use, kept apart so that it can be
  // abandoned whole when a shutdown gives up on a thread. Destroyed in
  // reverse order: the read path and the prefetcher, then placement (its
  // pool), then the namespace and the tiers.
  struct Parts {
    std::vector<std::unique_ptr<Tier>> tiers;  // Cache tiers, the peers tier if any, the source.
    std::unique_ptr<Namespace> ns;
    std::unique_ptr<MappingWatch> mappings;  // Who maps the RAM copies it hands out.
    std::unique_ptr<PlacementHandler> placement;
    std::unique_ptr<Prefetcher> prefetcher;  // Its streams drive promotions.
    std::unique_ptr<StageAhead> stage_ahead;  // prefetch.stage_ahead; may be null.
    std::unique_ptr<ReadSpeeds> speeds;  // placement.route_by_speed; may be null.
    std::unique_ptr<LocalFiles> files;  // The read path's view of them.
    // memory.watch: sheds through placement and the tiers, so it goes first.
    std::unique_ptr<MemoryGovernor> memory;
  };

  const Config config_;
  std::unique_ptr<Parts> parts_;
  // Parts', by their roles (stable: Parts is never moved).
  std::vector<std::unique_ptr<Tier>>& tiers_;
  const int source_index_;
  Namespace* const namespace_;
  PeerDriver* const peers_;                      // The peers tier's driver, or null.
  PlacementHandler* placement_ = nullptr;        // Set by Start().
  Prefetcher* prefetcher_ = nullptr;             // Set by Start().
  LocalFiles* files_ = nullptr;                  // Set by Start().
  Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
  // False when Shutdown() left a thread behind: the destructor abandons Parts.
  bool shutdown_clean_ ABSL_GUARDED_BY(shutdown_mu_) = true;
  static constexpr uint64_t kThisProcess = LocalFiles::kThisProcess;
  uint64_t warm_reused_ = 0;                     // Written only during Start().
  uint64_t warm_discarded_ = 0;                  // Written only during Start().
  std::string published_manifest_;               // Rank 0's, or empty.
};

}  // namespace

absl::StatusOr<std::unique_ptr<Monarch>> CreateMonarchWithDriverWrapper(const Config& config,
                                                                        const DriverWrapper& wrap) {
  MONARCH_ASSIGN_OR_RETURN(ValidConfig valid, ValidConfig::Validate(config));
  CoreOptions options;
  options.wrap = wrap;
  MONARCH_ASSIGN_OR_RETURN(std::unique_ptr<MonarchCore> core, CreateMonarchCore(valid, options));
  return std::unique_ptr<Monarch>(std::move(core));
}

absl::StatusOr<std::unique_ptr<MonarchCore>> CreateMonarchCore(const ValidConfig& valid,
                                                               const CoreOptions& options) {
  const Config& config = *valid;
  const DriverWrapper& wrap = options.wrap;
  SetLogLevel(config.logging.level);
  // Peers need UCX, which is opened at run time: without it, fail here,
  // before the dataset is walked or a peer waited for.
  if (config.remote.enabled) MONARCH_RETURN_IF_ERROR(LoadUcx().status());
  // The tiers from the config, with the peers tier before the source when
  // peers are enabled.
  const int source_index = static_cast<int>(config.tiers.size()) - (config.remote.enabled ? 0 : 1);
  MONARCH_ASSIGN_OR_RETURN(NamespacePlan plan, NamespacePlanOf(config, source_index));
  MONARCH_ASSIGN_OR_RETURN(BuiltNamespace built, BuildNamespace(plan, options.tier_slots));
  std::unique_ptr<Namespace> ns = std::move(built.ns);
  // Rank 0's manifest for its peers: removed when this instance is.
  const std::string published = std::move(built.published);
  absl::Cleanup unpublish = [&published] {
    if (!published.empty()) os::Unlink(published.c_str());
  };
  std::vector<std::unique_ptr<Tier>> tiers;
  for (size_t i = 0; i < config.tiers.size(); ++i) {
    TierConfig in_effect = config.tiers[i];
    absl::StatusOr<std::unique_ptr<StorageDriver>> driver =
        NewDriver(config.tiers[i], config, *ns, options, &in_effect);
    if (!driver.ok()) {
      return absl::Status(driver.status().code(),
                          absl::StrCat("tiers[", i, "] ('", config.tiers[i].name,
                                       "'): ", driver.status().message()));
    }
    if (wrap) *driver = wrap(static_cast<int>(i), std::move(*driver));
    tiers.push_back(std::make_unique<Tier>(in_effect, std::move(*driver)));
  }
  PeerDriver* peers = nullptr;
  if (config.remote.enabled) {
    MONARCH_ASSIGN_OR_RETURN(std::unique_ptr<PeerDriver> driver,
                             PeerDriver::Create(config.remote, ns.get()));
    peers = driver.get();
    TierConfig peers_tier;
    peers_tier.name = TierKindName(TierKind::kPeers);
    peers_tier.kind = TierKind::kPeers;
    peers_tier.capacity_bytes = 0;
    tiers.insert(tiers.end() - 1, std::make_unique<Tier>(peers_tier, std::move(driver)));
  }
  auto monarch = std::make_unique<MonarchImpl>(config, std::move(tiers), std::move(ns), peers);
  monarch->RemoveAtShutdown(published);
  std::move(unpublish).Cancel();  // The instance removes it from here on, failed Start() included.
  MONARCH_RETURN_IF_ERROR(monarch->Start());
  return std::unique_ptr<MonarchCore>(std::move(monarch));
}

}  // namespace monarch
