// PlacementHandler: background promotion of whole files.

#include "placement/placement_handler.h"

#include <pthread.h>
#include <sched.h>

#include "common/file_util.h"
#include "common/log.h"

namespace monarch {
namespace {

// Runs the calling thread under SCHED_IDLE for the scope's duration, so the
// work in it takes CPU time only when the job's readers leave some idle.
class ScopedIdlePriority {
 public:
  explicit ScopedIdlePriority(bool enabled) {
    struct sched_param param = {};
    // If the kernel refuses, the work simply runs at normal priority.
    enabled_ = enabled && ::pthread_setschedparam(::pthread_self(), SCHED_IDLE, &param) == 0;
  }
  ~ScopedIdlePriority() {
    struct sched_param param = {};
    if (enabled_) ::pthread_setschedparam(::pthread_self(), SCHED_OTHER, &param);
  }
  ScopedIdlePriority(const ScopedIdlePriority&) = delete;
  ScopedIdlePriority& operator=(const ScopedIdlePriority&) = delete;

 private:
  bool enabled_;
};

// Runs a writer's Write() and Commit() at idle priority. Nobody waits for
// them: readers are served from the promotion's chunks meanwhile. Loading
// chunks from the source stays at normal priority, because a reader may be
// waiting for exactly that chunk.
class IdlePriorityWriter final : public CopyWriter {
 public:
  explicit IdlePriorityWriter(std::unique_ptr<CopyWriter> target) : target_(std::move(target)) {}
  absl::Status Write(uint64_t offset, const char* data, size_t n) override {
    ScopedIdlePriority idle(true);
    return target_->Write(offset, data, n);
  }
  absl::StatusOr<size_t> ReadBack(uint64_t offset, char* dst, size_t n) override {
    return target_->ReadBack(offset, dst, n);
  }
  absl::Status Commit() override {
    ScopedIdlePriority idle(true);
    return target_->Commit();
  }

 private:
  const std::unique_ptr<CopyWriter> target_;
};

}  // namespace

PlacementHandler::PlacementHandler(const std::vector<std::unique_ptr<Tier>>* tiers,
                                   FetchSource* fetch, std::unique_ptr<PlacementPolicy> policy,
                                   const PlacementConfig& config)
    : tiers_(tiers),
      fetch_(fetch),
      source_index_(static_cast<int>(tiers->size()) - 1),
      policy_(std::move(policy)),
      chunk_bytes_(config.chunk_bytes),
      max_staging_bytes_(config.max_staging_bytes != 0 ? config.max_staging_bytes
                                                       : PhysicalMemoryBytes() / 4),
      // Recycled chunk buffers: enough for a couple of large files in flight.
      idle_priority_(config.idle_priority),
      chunk_pool_(config.chunk_bytes, std::max<uint64_t>(128 << 20, 16 * config.chunk_bytes)),
      pool_(static_cast<size_t>(config.threads)) {}

PlacementHandler::~PlacementHandler() { Shutdown(/*drain=*/false); }

std::optional<absl::StatusOr<size_t>> PlacementHandler::ReadIfOnSource(FileEntry& entry,
                                                                       uint64_t offset, char* dst,
                                                                       size_t n) {
  std::shared_ptr<Promotion> promotion;
  bool started = false;
  {
    MutexLock lock(&mu_);
    // Publication changes `tier` under this lock, so this check and the
    // lookup below see either the promotion or its published copy.
    if (entry.tier.load(std::memory_order_acquire) != source_index_) return std::nullopt;
    auto it = in_flight_.find(entry.ref.id);
    if (it != in_flight_.end()) {
      promotion = it->second;
    } else if (accepting_ && entry.state.load() == PlacementState::kOnSource) {
      promotion = StartLocked(entry);
      started = promotion != nullptr;
    }
  }
  if (promotion == nullptr) return fetch_->Fetch(entry.ref, offset, dst, n);
  Promotion::ReadOutcome outcome;
  absl::StatusOr<size_t> result = promotion->Read(*fetch_, offset, dst, n, &outcome);
  if (outcome == Promotion::ReadOutcome::kFellBack) {
    staging_fallbacks_.fetch_add(1, std::memory_order_relaxed);
  } else if (result.ok()) {
    staging_reads_.fetch_add(1, std::memory_order_relaxed);
    staging_bytes_read_.fetch_add(*result, std::memory_order_relaxed);
    if (outcome == Promotion::ReadOutcome::kShared)
      staging_hits_.fetch_add(1, std::memory_order_relaxed);
  }
  // The reader that started the promotion queues the background copy only
  // after loading its own chunks, so the copy never holds a chunk the
  // reader is waiting for.
  if (started) {
    pool_.detach_task([this, promotion] { Run(promotion); });
    {
      MutexLock lock(&mu_);
      --unqueued_starts_;
    }
    starts_queued_.SignalAll();
  }
  return result;
}

std::shared_ptr<Promotion> PlacementHandler::StartLocked(FileEntry& entry) {
  const uint64_t size = entry.ref.size;
  if (size > max_staging_bytes_) {
    MONARCH_LOG(kInfo, entry.ref.name, " is larger than placement.max_staging_bytes (",
                max_staging_bytes_, "); it stays on the source");
    entry.state.store(PlacementState::kStaysOnSource);
    skipped_.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  // Staging memory is busy: serve from the source now and let a later read
  // of this file try again.
  if (staging_bytes_ + size > max_staging_bytes_) return nullptr;
  std::optional<int> tier = policy_->ChooseTier(entry.ref, *tiers_);
  if (!tier.has_value()) {
    // No tier has room, and without eviction none will: stop asking.
    entry.state.store(PlacementState::kStaysOnSource);
    skipped_.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  auto promotion = std::make_shared<Promotion>(&entry, *tier, chunk_bytes_, &chunk_pool_);
  entry.state.store(PlacementState::kPromoting);
  in_flight_.emplace(entry.ref.id, promotion);
  staging_bytes_ += size;
  ++unqueued_starts_;
  started_.fetch_add(1, std::memory_order_relaxed);
  return promotion;
}

void PlacementHandler::Run(const std::shared_ptr<Promotion>& promotion) {
  FileEntry& entry = promotion->entry();
  Tier& tier = *(*tiers_)[promotion->target_tier()];
  absl::Status status = absl::CancelledError("shutting down");
  bool write_failed = false;
  if (!cancel_.load()) {
    absl::StatusOr<std::unique_ptr<CopyWriter>> writer;
    {
      ScopedIdlePriority idle(idle_priority_);
      writer = tier.driver().NewWriter(entry.ref);
    }
    if (writer.ok() && idle_priority_) {
      writer = std::unique_ptr<CopyWriter>(new IdlePriorityWriter(std::move(*writer)));
    }
    if (!writer.ok()) {
      status = writer.status();
      write_failed = true;
    } else {
      std::shared_ptr<CopyWriter> shared(std::move(*writer));
      status = promotion->CopyTo(*fetch_, shared, cancel_, &write_failed);
      if (status.ok()) {
        status = shared->Commit();
        write_failed = !status.ok();
      }
      if (!status.ok()) promotion->Abandon();
    }
  }
  if (status.ok()) {
    tier.Commit(entry.ref.size);
  } else {
    tier.Release(entry.ref.size);
    if (write_failed) {
      tier.CountWriteError();
      // The device filled up before the configured capacity: stop sending
      // it copies rather than failing every one of them.
      if (absl::IsResourceExhausted(status)) tier.MarkFull();
    }
  }
  const bool cancelled = absl::IsCancelled(status);
  {
    MutexLock lock(&mu_);
    if (status.ok()) {
      entry.tier.store(promotion->target_tier(), std::memory_order_release);
      entry.state.store(PlacementState::kInTier);
    } else {
      // A cancelled file may be promoted by a later instance; a failed one
      // stays on the source for this run rather than failing again.
      entry.state.store(cancelled ? PlacementState::kOnSource : PlacementState::kStaysOnSource);
    }
    in_flight_.erase(entry.ref.id);
    staging_bytes_ -= entry.ref.size;
  }
  if (status.ok()) {
    completed_.fetch_add(1, std::memory_order_relaxed);
  } else if (cancelled) {
    cancelled_.fetch_add(1, std::memory_order_relaxed);
  } else {
    failed_.fetch_add(1, std::memory_order_relaxed);
    MONARCH_LOG(kWarning, "promotion of ", entry.ref.name, " to tier '", tier.config().name,
                "' failed; it stays on the source: ", status.ToString());
  }
}

void PlacementHandler::Shutdown(bool drain) {
  {
    MutexLock lock(&mu_);
    accepting_ = false;
    // A reader that just started a promotion queues its task after loading
    // its own chunks; wait for that, or the pool could look idle too early.
    while (unqueued_starts_ > 0) starts_queued_.Wait(&mu_);
  }
  if (!drain) cancel_.store(true);
  pool_.wait();
}

void PlacementHandler::AddStats(Stats* stats) const {
  stats->promotions_started = started_.load();
  stats->promotions_completed = completed_.load();
  stats->promotions_failed = failed_.load();
  stats->promotions_skipped = skipped_.load();
  stats->promotions_cancelled = cancelled_.load();
  stats->staging_reads = staging_reads_.load();
  stats->staging_bytes_read = staging_bytes_read_.load();
  stats->staging_hits = staging_hits_.load();
  stats->staging_fallbacks = staging_fallbacks_.load();
}

}  // namespace monarch
