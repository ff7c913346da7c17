// Promoter: starting, tracking, committing and shutting down promotions.

#include "placement/promoter.h"

#include <pthread.h>

#include <algorithm>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/log.h"

namespace monarch {
namespace {

// Staging memory holds chunks read from the source and not yet written to a
// tier. A backlog lets readers go on while placement catches up in the time
// they spend waiting for a slow source; past it, readers write their chunks
// themselves. Measured on 2 cores (bench/results/placement_ab.md): 256 MiB
// made epoch 1 faster than 32 MiB with a posix tier and four readers (by 18%
// over a page-cached source, 17% over a dropped one), slower for four readers
// into a RAM tier over a page-cached source (by 27%), and no different with
// one reader.
uint64_t DefaultStagingBudget() {
  return std::min<uint64_t>(256ull << 20, PhysicalMemoryBytes() / 16);
}

// Copying into a tier is CPU work (memory or page cache) that competes with
// the readers; a second writer on a 2-core node only takes CPU from the
// reader. Measured on 2 cores: bench/results/placement_ab.md.
size_t DefaultPlacementThreads() {
  return std::max(1u, std::thread::hardware_concurrency() / 2);
}

// A commit is one stat of the source file (a metadata round trip to the
// PFS, milliseconds on a busy one) and the tier's commit: waiting, not CPU
// work. With the commits on the one placement thread of a 2-core node, a
// PFS at 3 ms a stat held it to ~330 copies a second while readers read
// 1,000 files a second, and half the demo's copies had not landed after
// three epochs. 8 at once, as Lustre's mdc max_rpcs_in_flight.
constexpr size_t kCommitThreads = 8;
// Commits queued or running, at most: each holds its copy open (a temporary
// file's descriptor, in a file tier), so they count against
// placement.max_open_files too. Past the bound, the writer of the last chunk
// commits the copy itself rather than queue one more.
constexpr size_t kMaxPendingCommits = 4 * kCommitThreads;

// How the staging budget is shared out (see chunk_pool.h):
// - A chunk per placement thread is kept from the readers: a placement
//   thread holds one at a time, and it should not have to wait for readers
//   to load the chunks nobody asked for.
// - The chunks readers park for the placement threads (the backlog) may fill
//   3/4 of the readers' share. The rest is for chunks being loaded and
//   written right now: a reader that finds no room waits only for those,
//   never for a placement thread to get round to the backlog. A quarter of
//   the default budget is about 64 concurrent loads of 1 MiB chunks; of
//   16 MiB (the busy-cpus scenario), 30 of 128 KiB files.
ChunkPool StagingPool(const PlacementConfig& config, size_t placement_threads) {
  const uint64_t budget =
      config.max_staging_bytes != 0 ? config.max_staging_bytes : DefaultStagingBudget();
  const uint64_t reserved = placement_threads * config.chunk_bytes;
  const uint64_t readers = budget > reserved ? budget - reserved : 0;
  return ChunkPool(config.chunk_bytes, budget, reserved, readers / 4 * 3);
}

}  // namespace

Promoter::Promoter(const std::vector<std::unique_ptr<Tier>>* tiers, const Namespace* ns,
                   PlacementPolicy* policy, ReadPins* pins, const PlacementConfig& config)
    : tiers_(tiers),
      policy_(policy),
      pins_(pins),
      chunk_bytes_(config.chunk_bytes),
      placement_threads_(config.threads > 0 ? static_cast<size_t>(config.threads)
                                            : DefaultPlacementThreads()),
      evicts_(policy->evicts()),
      origin_(tiers, ns, /*remember_content=*/evicts_),
      chunk_pool_(StagingPool(config, placement_threads_)),
      max_pending_commits_(std::clamp<size_t>(static_cast<size_t>(std::max(config.max_open_files, 1)),
                                              1, kMaxPendingCommits)),
      // Named, so that top and profiles tell copying from reading.
      commit_pool_(kCommitThreads,
                   [] { ::pthread_setname_np(::pthread_self(), "monarch-commit"); }),
      pool_(placement_threads_, [] { ::pthread_setname_np(::pthread_self(), "monarch-place"); }) {}

Promoter::~Promoter() { Cancel(DeadlineIn(kCancelGraceSeconds)); }

Promoter::Admission Promoter::StartOrJoin(const FileEntry& entry, bool pin,
                                          FileIdentity::Clock::time_point began) {
  Shard& shard = ShardOf(entry.ref.id);
  MutexLock lock(&shard.mu);
  // Publication changes `tier` under this lock, so this check and the
  // lookup below see either the promotion or its published copy.
  if (entry.tier->load(std::memory_order_acquire) != origin_.source_index()) {
    return {Found::kPublished, nullptr};
  }
  Admission admission;
  auto it = shard.in_flight.find(entry.ref.id);
  if (it != shard.in_flight.end()) {
    admission = {Found::kInFlight, it->second};
  } else if (!accepting_.load(std::memory_order_relaxed) ||
             entry.state->load(std::memory_order_relaxed) != PlacementState::kOnSource) {
    return {Found::kNotPlaceable, nullptr};
  } else {
    admission.promotion = StartLocked(entry, shard, began);
    admission.found = admission.promotion != nullptr ? Found::kStarted : Found::kNoTier;
  }
  // See the header: pinned before the promotion can publish.
  if (pin && admission.promotion != nullptr && pins_->has_slots()) pins_->Pin(entry.ref.id);
  return admission;
}

absl::StatusOr<size_t> Promoter::ReadThrough(const std::shared_ptr<Promotion>& promotion,
                                             uint64_t offset, char* dst, size_t n) {
  absl::Cleanup unpin = [&] {
    if (pins_->has_slots()) pins_->Unpin(promotion->entry().ref.id);
  };
  Promotion::ReadOutcome outcome;
  absl::StatusOr<size_t> result = promotion->Read(offset, dst, n, &outcome);
  if (outcome == Promotion::ReadOutcome::kFellBack) {
    staging_fallbacks_.fetch_add(1, std::memory_order_relaxed);
  } else if (result.ok()) {
    staging_reads_.fetch_add(1, std::memory_order_relaxed);
    staging_bytes_read_.fetch_add(*result, std::memory_order_relaxed);
    if (outcome == Promotion::ReadOutcome::kShared)
      staging_hits_.fetch_add(1, std::memory_order_relaxed);
  }
  // Queued after this reader's own chunks are loaded, so the placement
  // thread never holds a chunk the reader is waiting for.
  RunInBackground(promotion);
  return result;
}

void Promoter::Reconsider(const FileEntry& entry) {
  Shard& shard = ShardOf(entry.ref.id);
  MutexLock lock(&shard.mu);
  if (entry.tier->load(std::memory_order_acquire) == origin_.source_index() &&
      !shard.in_flight.contains(entry.ref.id) &&
      entry.state->load(std::memory_order_relaxed) == PlacementState::kStaysOnSource) {
    entry.state->store(PlacementState::kOnSource, std::memory_order_release);
  }
}

std::shared_ptr<Promotion> Promoter::StartLocked(const FileEntry& entry, Shard& shard,
                                                 FileIdentity::Clock::time_point began) {
  std::optional<int> tier = policy_->ChooseTier(entry.ref, *tiers_);
  if (!tier.has_value()) {
    skipped_.fetch_add(1, std::memory_order_relaxed);
    // No tier has room, and without eviction none will: stop asking. With
    // eviction, only a file larger than every cache tier stops asking.
    const bool may_fit = evicts_ && policy_->MakesRoomFor(entry.ref.id) &&
                         FastestCacheTierFor(*tiers_, entry.ref.size) >= 0;
    if (!may_fit) entry.state->store(PlacementState::kStaysOnSource, std::memory_order_release);
    return nullptr;
  }
  auto promotion =
      std::make_shared<Promotion>(this, entry, (*tiers_)[*tier].get(), *tier, chunk_bytes_,
                                  /*checksum=*/evicts_, began);
  entry.state->store(PlacementState::kPromoting, std::memory_order_relaxed);
  shard.in_flight.emplace(entry.ref.id, promotion);
  started_.fetch_add(1, std::memory_order_relaxed);
  MutexLock lock(&idle_mu_);
  ++in_flight_count_;
  return promotion;
}

void Promoter::CommitLater(std::shared_ptr<Promotion> promotion) {
  if (commits_pending_.fetch_add(1, std::memory_order_relaxed) >= max_pending_commits_) {
    commits_pending_.fetch_sub(1, std::memory_order_relaxed);
    commits_inline_.fetch_add(1, std::memory_order_relaxed);
    promotion->Commit();
    return;
  }
  commit_pool_.detach_task([this, promotion = std::move(promotion)] {
    promotion->Commit();
    commits_pending_.fetch_sub(1, std::memory_order_relaxed);
  });
}

void Promoter::PromotionDone(Promotion& promotion, const absl::Status& status,
                             bool tier_failed) {
  const FileEntry& entry = promotion.entry();
  Tier& tier = *(*tiers_)[promotion.target_tier()];
  if (status.ok()) {
    tier.Commit(entry.ref.size);
    // A new copy starts as recently used (the CLOCK passes it over once),
    // marked before it is published.
    if (pins_->has_slots()) pins_->MarkReferenced(entry.ref.id);
  } else {
    tier.Release(entry.ref.size);
    if (tier_failed) {
      tier.CountWriteError();
      // The device filled up before the configured capacity: stop sending
      // it copies rather than failing every one of them.
      if (absl::IsResourceExhausted(status)) tier.MarkFull();
    }
  }
  // A deferred copy that found the source's bytes gone from memory gave up
  // without reading them: the file's next miss promotes it as usual.
  const bool not_in_memory = !status.ok() && promotion.gave_up_not_in_memory();
  const bool cancelled = absl::IsCancelled(status) || not_in_memory;
  {
    Shard& shard = ShardOf(entry.ref.id);
    MutexLock lock(&shard.mu);
    if (status.ok()) {
      entry.tier->store(promotion.target_tier(), std::memory_order_release);
      entry.state->store(PlacementState::kInTier, std::memory_order_release);
    } else {
      // A cancelled file may be promoted by a later instance; a failed one
      // stays on the source for this run rather than failing again.
      entry.state->store(cancelled ? PlacementState::kOnSource : PlacementState::kStaysOnSource,
                        std::memory_order_release);
    }
    shard.in_flight.erase(entry.ref.id);
  }
  if (status.ok()) {
    completed_.fetch_add(1, std::memory_order_relaxed);
  } else if (not_in_memory) {
    gave_up_not_in_memory_.fetch_add(1, std::memory_order_relaxed);
  } else if (cancelled) {
    cancelled_.fetch_add(1, std::memory_order_relaxed);
  } else {
    failed_.fetch_add(1, std::memory_order_relaxed);
    MONARCH_LOG(kWarning, "promotion of ", entry.ref.name, " to tier '", tier.config().name,
                "' failed; it stays on the source: ", status.ToString());
  }
  MutexLock lock(&idle_mu_);
  if (--in_flight_count_ == 0) idle_.SignalAll();
}

std::vector<std::shared_ptr<Promotion>> Promoter::InFlight() {
  std::vector<std::shared_ptr<Promotion>> all;
  for (Shard& shard : shards_) {
    MutexLock lock(&shard.mu);
    for (const auto& [id, promotion] : shard.in_flight) all.push_back(promotion);
  }
  return all;
}

void Promoter::WaitIdle() {
  MutexLock lock(&idle_mu_);
  idle_waiters_.fetch_add(1, std::memory_order_relaxed);
  while (in_flight_count_ > 0) idle_.Wait(&idle_mu_);
  idle_waiters_.fetch_sub(1, std::memory_order_relaxed);
}

bool Promoter::WaitIdleUntil(Deadline deadline) {
  MutexLock lock(&idle_mu_);
  while (in_flight_count_ > 0) {
    if (!idle_.WaitUntil(&idle_mu_, deadline)) return in_flight_count_ == 0;
  }
  return true;
}

bool Promoter::Drain(Deadline deadline) {
  accepting_.store(false);
  // Promotions whose readers left chunks behind get a placement task. One a
  // reader is still inside asks for its task itself when that reader is
  // done.
  for (const std::shared_ptr<Promotion>& promotion : InFlight()) RunInBackground(promotion);
  return WaitIdleUntil(deadline);
}

bool Promoter::Cancel(Deadline deadline) {
  accepting_.store(false);
  cancel_.store(true);
  {
    // Cancelling reports each promotion done at once (a thread still
    // loading or writing one of its chunks lets go of it at its next chunk
    // boundary), so placement is idle right after, but for a copy being
    // committed.
    std::vector<std::shared_ptr<Promotion>> in_flight = InFlight();
    MutexLock lock(&cancelled_mu_);
    for (const std::shared_ptr<Promotion>& promotion : in_flight) {
      promotion->Cancel();
      cancelled_promotions_.push_back(promotion);
    }
  }
  // The pool's queued tasks run and return at once (a cancelled promotion
  // has nothing left to do); a running one returns after its chunk. A
  // queued commit abandons its copy without asking the source.
  if (WaitIdleUntil(deadline) && pool_.wait_until(deadline) && commit_pool_.wait_until(deadline)) {
    return true;
  }
  std::vector<std::string> stuck;
  {
    MutexLock lock(&cancelled_mu_);
    for (const std::weak_ptr<Promotion>& weak : cancelled_promotions_) {
      if (std::shared_ptr<Promotion> promotion = weak.lock()) stuck.push_back(promotion->Describe());
    }
  }
  for (const std::shared_ptr<Promotion>& promotion : InFlight()) {
    stuck.push_back(promotion->Describe());
  }
  MONARCH_LOG(kWarning, "placement: gave up waiting at shutdown for ",
              pool_.get_tasks_running() + commit_pool_.get_tasks_running(),
              " placement threads and ", stuck.size(),
              " promotions still in a read or write that has not returned (a file system that "
              "stopped answering?); leaving them behind: ",
              absl::StrJoin(stuck, "; "));
  return false;
}

void Promoter::ReportStartedCounter(CounterSink& sink) const {
  sink.Counter("promotions_started", started_.load(), "Promotions started.");
}

void Promoter::ReportCounters(CounterSink& sink) const {
  sink.Counter("promotions_completed", completed_.load(), "Copies published to a tier.");
  sink.Counter("promotions_failed", failed_.load(),
               "Promotions abandoned on a source or tier error; the file stays on the source.");
  sink.Counter("promotions_skipped", skipped_.load(),
               "Files left on the source because no tier had room.");
  sink.Counter("promotions_cancelled", cancelled_.load(), "Promotions cancelled at shutdown.");
  sink.Gauge("placement_waiters", idle_waiters_.load(),
             "Threads in WaitForPlacement waiting for the promotions in flight.");
  sink.Counter("promotion_bytes_from_memory", origin_.bytes_from_memory(),
               "Bytes deferred copies took from the source's memory (its page cache), apart "
               "from the source's reads: readers read them from the source once already.");
  sink.Counter("promotions_not_in_memory", gave_up_not_in_memory_.load(),
               "Deferred copies given up: the source no longer held the bytes in memory, and a "
               "copy reads the device or network only at a miss (placement.cached_source).");
  sink.Counter("promotions_source_changed", origin_.source_changed(),
               "Copies not committed: the source file changed since the namespace walk.");
  if (evicts_) {
    sink.Counter("promotions_identified_by_content", origin_.identified_by_content(),
                 "Copies of files copied before, found to be the same version by their bytes' "
                 "CRC32C instead of a stat of the source.");
  }
  sink.Counter("staging_reads", staging_reads_.load(),
               "Reads of files being promoted, served from the promotion's chunks.");
  sink.Counter("staging_bytes_read", staging_bytes_read_.load(),
               "Bytes of those reads.");
  sink.Counter("staging_hits", staging_hits_.load(),
               "Reads of files being promoted whose bytes other threads had already loaded.");
  sink.Counter("staging_fallbacks", staging_fallbacks_.load(),
               "Reads of files being promoted that went to the source instead.");
  sink.Gauge("staging_bytes", chunk_pool_.bytes_in_use(),
             "Staging memory now: chunks read from the source, not yet written to a tier.");
  sink.Gauge("staging_peak_bytes", chunk_pool_.peak_bytes_in_use(),
             "The most staging memory held at any time; never over its budget.");
  sink.Counter("chunks_written_by_placement", written_by_placement_.load(),
               "Chunks placement threads wrote into tiers.");
  sink.Counter("chunks_written_by_readers", written_by_readers_.load(),
               "Chunks readers wrote into tiers themselves, placement being behind.");
  sink.Counter("commits_inline", commits_inline_.load(),
               "Copies committed by the thread that wrote their last chunk, the commit threads "
               "having too many waiting.");
  sink.Counter("staging_waits", chunk_pool_.waits(),
               "Times a reader or placement thread waited for staging memory, the budget "
               "being taken by chunks in flight.");
  sink.Gauge("staging_budget_bytes", chunk_pool_.budget_bytes(),
             "The staging budget in force: placement.max_staging_bytes (or its default), "
             "at least one chunk.");
}

}  // namespace monarch
