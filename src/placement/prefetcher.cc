// Prefetcher implementation.

#include "placement/prefetcher.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <optional>

namespace monarch {
namespace {

// How often a stream held back by the readers' misses looks again: misses
// end without telling the prefetcher (they are counted, not signalled, to
// keep the read path free of this lock).
constexpr auto kYieldPoll = std::chrono::milliseconds(1);

}  // namespace

Prefetcher::Prefetcher(const PrefetchConfig& config, Namespace* ns, PlacementHandler* placement)
    : streams_(std::max(config.streams, 0)),
      lookahead_bytes_(config.lookahead_bytes),
      namespace_(ns),
      placement_(placement) {}

// An owner whose Shutdown() gave up must abandon the prefetcher instead.
Prefetcher::~Prefetcher() { Shutdown(DeadlineIn(kCancelGraceSeconds)); }

void Prefetcher::Announce(uint64_t reader, std::vector<uint32_t> order, SourcePayer payer) {
  const size_t files = order.size();
  MutexLock lock(&mu_);
  if (stopping_) return;
  if (order.empty()) {
    orders_.erase(reader);
  } else {
    orders_.erase(kStagingReader);  // A reader's own order comes first.
    orders_[reader] = Order{std::move(order), 0, std::move(payer), Clock::now()};
  }
  announced_files_.fetch_add(files, std::memory_order_relaxed);
  StartLocked();
}

bool Prefetcher::StageAhead(std::vector<uint32_t> order) {
  const size_t files = order.size();
  MutexLock lock(&mu_);
  if (stopping_ || order.empty() || orders_.size() > orders_.count(kStagingReader)) return false;
  auto staging = orders_.find(kStagingReader);
  if (staging != orders_.end()) {  // Another directory: after those staged before.
    staging->second.ids.insert(staging->second.ids.end(), order.begin(), order.end());
  } else {
    orders_[kStagingReader] = Order{std::move(order), 0, nullptr, Clock::now(), /*staged=*/true};
  }
  staged_files_.fetch_add(files, std::memory_order_relaxed);
  StartLocked();
  return true;
}

void Prefetcher::StartLocked() {
  // A new epoch: what the streams fetched for the last one and nobody read
  // (a shorter epoch, a changed order) no longer holds the lookahead back.
  ahead_.clear();
  ahead_bytes_ = 0;
  MergeLocked();
  active_.store(!orders_.empty(), std::memory_order_relaxed);
  announced_.store(orders_.size() > orders_.count(kStagingReader), std::memory_order_relaxed);
  // The streams start with the first announcement: an instance nobody
  // announces to has no prefetch threads.
  if (!started_ && !orders_.empty()) {
    started_ = true;
    for (int i = 0; i < streams_; ++i) {
      threads_.Start([this] {
        ::pthread_setname_np(::pthread_self(), "monarch-prefetch");
        StreamLoop();
      });
    }
  }
  changed_.SignalAll();
}

void Prefetcher::Consumed(uint64_t reader, const uint32_t* ids, size_t count) {
  if (!active()) return;
  MutexLock lock(&mu_);
  auto order = orders_.find(reader);
  if (order != orders_.end()) {
    order->second.consumed = std::min(order->second.ids.size(), order->second.consumed + count);
  }
  bool freed = false;
  for (size_t i = 0; i < count; ++i) {
    auto it = ahead_.find(ids[i]);
    if (it == ahead_.end()) continue;
    ahead_bytes_ -= it->second;
    ahead_.erase(it);
    hits_.fetch_add(1, std::memory_order_relaxed);
    freed = true;
  }
  consumed_files_.fetch_add(count, std::memory_order_relaxed);
  if (freed) changed_.SignalAll();
}

void Prefetcher::MergeLocked() {
  // By reader id, so that the merge does not depend on the hash order.
  std::vector<uint64_t> readers;
  for (const auto& [reader, order] : orders_) readers.push_back(reader);
  std::sort(readers.begin(), readers.end());
  std::vector<const Order*> orders;
  size_t longest = 0;
  merged_payers_.clear();
  merged_orders_.clear();
  for (uint64_t reader : readers) {
    const Order& order = orders_.at(reader);
    orders.push_back(&order);
    if (merged_orders_.size() < kNobody) {
      merged_orders_.push_back(&order);
      merged_payers_.push_back(order.payer);
    }
    longest = std::max(longest, order.ids.size() - order.consumed);
  }
  const bool evicts = placement_->evicts();
  merged_.clear();
  merged_order_.clear();
  merged_index_.clear();
  for (size_t i = 0; i < longest; ++i) {
    for (size_t o = 0; o < orders.size(); ++o) {
      const Order& order = *orders[o];
      if (order.consumed + i >= order.ids.size()) continue;
      merged_.push_back(order.ids[order.consumed + i]);
      // Past 65,535 readers (never, in practice) the rest pay nobody.
      merged_order_.push_back(static_cast<uint16_t>(std::min<size_t>(o, kNobody)));
      if (evicts) merged_index_.push_back(static_cast<uint32_t>(order.consumed + i));
    }
  }
  next_ = 0;
  // Each file's positions, for NextUse (a counting sort by file id): only
  // eviction asks for them.
  first_.clear();
  occurrences_.clear();
  next_occurrence_.clear();
  if (!evicts) return;
  const uint32_t files = namespace_->entry_count();  // Extents too (announced ranges).
  first_.assign(files + 1, 0);
  for (uint32_t id : merged_) ++first_[id + 1];
  for (uint32_t f = 0; f < files; ++f) first_[f + 1] += first_[f];
  occurrences_.resize(merged_.size());
  next_occurrence_.assign(first_.begin(), first_.end() - 1);
  std::vector<uint32_t> fill(first_.begin(), first_.end() - 1);
  for (uint32_t q = 0; q < merged_.size(); ++q) occurrences_[fill[merged_[q]]++] = q;
}

std::optional<uint64_t> Prefetcher::ReadsUntil(uint32_t q) const {
  if (merged_order_[q] >= merged_orders_.size()) return std::nullopt;
  const Order& order = *merged_orders_[merged_order_[q]];
  if (order.staged || merged_index_[q] < order.consumed) return std::nullopt;
  return merged_index_[q] - order.consumed;
}

uint64_t Prefetcher::NextUse(uint32_t id) const {
  MutexLock lock(&mu_);
  if (merged_.empty() || id + 1 >= first_.size()) return kNever;
  // Occurrences behind their reader stay behind (readers only move on).
  uint32_t& next = next_occurrence_[id];
  while (next < first_[id + 1] && !ReadsUntil(occurrences_[next])) ++next;
  // Each reader at its own pace: its reads since its announcement, per
  // second. A fast job's next use of a file comes sooner than a slow
  // job's at the same distance, and a slow job's is not behind just
  // because the other job read on.
  const auto now = Clock::now();
  uint64_t soonest = kNever;
  for (uint32_t k = next; k < first_[id + 1]; ++k) {
    const uint32_t q = occurrences_[k];
    const std::optional<uint64_t> reads = ReadsUntil(q);
    if (!reads) continue;
    const Order& order = *merged_orders_[merged_order_[q]];
    const double seconds = std::max(
        1e-3, std::chrono::duration<double>(now - order.announced_at).count());
    const double reads_per_second = (static_cast<double>(order.consumed) + 1) / seconds;
    soonest = std::min(soonest, static_cast<uint64_t>(1e6 * static_cast<double>(*reads) /
                                                      reads_per_second));
  }
  return soonest;
}

int Prefetcher::AllowedStreams() const {
  return std::max(1, streams_ - placement_->reader_misses_in_flight());
}

void Prefetcher::StreamLoop() {
  for (;;) {
    uint32_t id;
    uint64_t size;
    SourcePayer payer;
    {
      MutexLock lock(&mu_);
      for (;;) {
        if (stopping_) return;
        if (next_ >= merged_.size()) {
          // Until an announcement, or Stop() (every wait here ends there).
          changed_.Wait(&mu_);
          continue;
        }
        id = merged_[next_];
        const FileEntry& entry = namespace_->entry(id);
        const PlacementState state = entry.state->load(std::memory_order_acquire);
        if (state != PlacementState::kOnSource || ahead_.contains(id)) {
          // Placed, on its way, or left on the source: nothing to read.
          ++next_;
          (state == PlacementState::kStaysOnSource ? no_room_files_ : skipped_files_)
              .fetch_add(1, std::memory_order_relaxed);
          continue;
        }
        size = entry.ref.size;
        const bool staged = merged_order_[next_] < merged_orders_.size() &&
                            merged_orders_[merged_order_[next_]]->staged;
        if (!staged && ahead_bytes_ > 0 && ahead_bytes_ + size > lookahead_bytes_) {
          ++held_by_lookahead_;
          changed_.Wait(&mu_);  // Until readers read what is ahead.
          --held_by_lookahead_;
          continue;
        }
        if (fetching_ >= AllowedStreams()) {
          if (fetching_ < streams_) yields_.fetch_add(1, std::memory_order_relaxed);
          changed_.WaitUntil(&mu_, std::chrono::steady_clock::now() + kYieldPoll);
          continue;
        }
        if (merged_order_[next_] < merged_payers_.size()) payer = merged_payers_[merged_order_[next_]];
        ++next_;
        ++fetching_;
        ahead_.emplace(id, size);
        ahead_bytes_ += size;
        break;
      }
    }
    const PlacementHandler::PrefetchOutcome outcome =
        placement_->Prefetch(namespace_->entry(id));
    MutexLock lock(&mu_);
    --fetching_;
    if (outcome == PlacementHandler::PrefetchOutcome::kFetched) {
      fetched_files_.fetch_add(1, std::memory_order_relaxed);
      fetched_bytes_.fetch_add(size, std::memory_order_relaxed);
      if (payer != nullptr) payer->fetch_add(size, std::memory_order_relaxed);
    } else {
      // A reader or another stream got there first, or no tier had room:
      // this stream read nothing, so the file takes no lookahead.
      (outcome == PlacementHandler::PrefetchOutcome::kNoRoom ? no_room_files_ : skipped_files_)
          .fetch_add(1, std::memory_order_relaxed);
      auto it = ahead_.find(id);
      if (it != ahead_.end()) {
        ahead_bytes_ -= it->second;
        ahead_.erase(it);
      }
    }
    changed_.SignalAll();
  }
}

void Prefetcher::Stop() {
  MutexLock lock(&mu_);
  stopping_ = true;
  active_.store(false, std::memory_order_relaxed);
  changed_.SignalAll();
}

bool Prefetcher::Shutdown(Deadline deadline) {
  Stop();
  return threads_.JoinUntil(deadline);
}

void Prefetcher::ReportCounters(CounterSink& sink) const {
  sink.Counter("prefetch_announced_files", announced_files_.load(),
               "Files in the read orders announced for prefetch.");
  sink.Counter("prefetch_staged_files", staged_files_.load(),
               "Files of the dataset given to the streams with no order (StageAhead).");
  sink.Counter("prefetch_files", fetched_files_.load(),
               "Files the prefetch streams promoted ahead of the readers.");
  sink.Counter("prefetch_bytes", fetched_bytes_.load(), "Bytes of those files.");
  sink.Counter("prefetch_skipped_files", skipped_files_.load(),
               "Files of the order already in a tier or on their way when a stream got there.");
  sink.Counter("prefetch_no_room_files", no_room_files_.load(),
               "Files of the order left on the source: no tier had room.");
  sink.Counter("prefetch_reads", consumed_files_.load(),
               "First reads of files reported by readers while an order was announced.");
  sink.Counter("prefetch_hits", hits_.load(),
               "Of those, files a prefetch stream had started before the reader came.");
  sink.Counter("prefetch_yields", yields_.load(),
               "Times a stream waited because readers had misses of their own in flight.");
  MutexLock lock(&mu_);
  sink.Gauge("prefetch_lookahead_bytes", ahead_bytes_,
             "Bytes the streams fetched that no reader has read yet.");
  sink.Gauge("prefetch_position", next_, "Position of the streams in the merged order.");
  sink.Gauge("prefetch_streams_held", held_by_lookahead_,
             "Streams waiting for the readers: the lookahead is full.");
  sink.Gauge("prefetch_order_files", merged_.size(), "Files in the merged order.");
}

}  // namespace monarch
