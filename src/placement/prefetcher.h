// Prefetcher: clairvoyant prefetch. Readers announce the order in which they
// will read files; background streams walk that order ahead of them and
// promote each file (PlacementHandler::Prefetch), so that by the time a
// reader gets there the file is in a tier, or on its way with its chunks
// shared.
//
// - Several readers (a process's own threads count as one reader; in the
//   node service, each client is one) each announce their own order. The
//   streams walk the orders merged round-robin, position by position: the
//   readers of a DataLoader or of the ranks on a node move in step, so the
//   i-th file of each is wanted at about the same time.
// - Lookahead is bounded in bytes: the files a stream has started and no
//   reader has read yet. A reader reports each file it starts reading
//   (Consumed); the room it frees lets the streams go on. Files the order
//   promised and nobody read keep their room until the next announcement.
// - Every byte is still read from the source once: a file is fetched only
//   by starting its promotion, which happens at most once per file however
//   it is triggered; files already in a tier, in flight, or left on the
//   source (no room) are skipped without a read.
// - The orders also tell eviction what is read next (NextUse, for
//   placement.policy lru): how soon, at each reader's own pace, its
//   position being the first reads it reported. Readers at different
//   speeds (jobs sharing a node service) each keep their next files.
// - Readers come first. A read of a file the streams have not reached is a
//   miss like any other, served at once. While readers have misses of their
//   own in flight, each takes one of the `streams` slots (one stream always
//   keeps going, so the prefetch catches up once readers hit).
//
// - With no order at all, StageAhead() gives the streams the directories
//   the readers read from (placement/stage_ahead.h): epoch 1 of a job that
//   announces nothing is then not bounded by its readers' own misses. That
//   order has no lookahead bound (it evicts nothing), tells eviction
//   nothing, and gives way to the first order a reader announces.
//
// Thread-safe. Start: the constructor starts the streams; Shutdown() (also
// run by the destructor) stops them after the files they are fetching.

#ifndef MONARCH_PLACEMENT_PREFETCHER_H_
#define MONARCH_PLACEMENT_PREFETCHER_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/counters.h"
#include "common/mutex.h"
#include "common/shutdown.h"
#include "metadata/namespace.h"
#include "monarch/config.h"
#include "placement/placement_handler.h"

namespace monarch {

class Prefetcher final : public NextUseOracle {
 public:
  // `ns` and `placement` must outlive the prefetcher.
  Prefetcher(const PrefetchConfig& config, Namespace* ns, PlacementHandler* placement);
  ~Prefetcher() override;

  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Replaces `reader`'s order (file ids, in the order it will read them);
  // an empty one withdraws it. The lookahead starts afresh: an announcement
  // begins an epoch. `payer`, if any, is charged the bytes the streams
  // fetch for this order's positions (the node service's jobs' shares).
  void Announce(uint64_t reader, std::vector<uint32_t> order, SourcePayer payer = nullptr);
  // `reader` started reading these files (its first read of each).
  void Consumed(uint64_t reader, const uint32_t* ids, size_t count);
  // Unless some reader announced an order: the streams fetch `order` (the
  // files, or extents, of a part of the dataset the tiers hold; after the
  // parts staged before), with no lookahead bound, until a reader's
  // announcement replaces it. False if a reader's order was there.
  bool StageAhead(std::vector<uint32_t> order);
  // Whether any order is announced: readers skip Consumed() when none is.
  bool active() const { return active_.load(std::memory_order_relaxed); }
  // Whether streams are copying an announced order (prefetch.streams > 0).
  bool copying() const { return streams_ > 0 && active(); }

  // The future the announced orders tell, for eviction: how soon file `id`
  // is next read, in microseconds: for each reader whose order reads it
  // again, its reads until then (from the first reads it reported) at its
  // pace since its announcement; the soonest. kNever if no order reads it
  // again (or none is known).
  static constexpr uint64_t kNever = ~uint64_t{0};
  uint64_t NextUse(uint32_t id) const override;
  bool known() const override { return announced_.load(std::memory_order_relaxed); }

  // Stop(): no stream starts another file. Shutdown(): Stop(), then waits
  // until `deadline` for the files the streams are fetching (cancel the
  // placement handler in between to cut those short). False if a stream is
  // still inside one then (a read that does not return): the prefetcher
  // must be abandoned, not destroyed. Both idempotent.
  void Stop();
  bool Shutdown(Deadline deadline);

  void ReportCounters(CounterSink& sink) const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Order {
    std::vector<uint32_t> ids;
    size_t consumed = 0;  // How many of its files the reader started.
    SourcePayer payer;
    Clock::time_point announced_at;  // Its pace: `consumed` since then.
    bool staged = false;  // StageAhead's: no lookahead bound, no next use.
  };
  // StageAhead's order's reader: no client's (pids, kThisProcess).
  static constexpr uint64_t kStagingReader = ~uint64_t{0};

  // After a change of orders: merges them, and starts the streams at the
  // first.
  void StartLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StreamLoop();
  // Where the reader of merged_ position q is in its order against where q
  // lies in it: reads of that reader from now, or none if it is past it.
  std::optional<uint64_t> ReadsUntil(uint32_t q) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Rebuilds merged_ from the readers' orders, each from where its reader is.
  void MergeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Streams allowed to fetch now: `streams` less the readers' own misses,
  // at least one.
  int AllowedStreams() const;

  const int streams_;
  const uint64_t lookahead_bytes_;
  Namespace* const namespace_;
  PlacementHandler* const placement_;

  mutable Mutex mu_;
  CondVar changed_;  // An order, the lookahead room, or the streams in flight changed.
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;  // The streams, at the first announcement.
  absl::flat_hash_map<uint64_t, Order> orders_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> merged_ ABSL_GUARDED_BY(mu_);
  // Whose order each position of merged_ comes from: an index into
  // merged_payers_, which holds the orders' payers as of the merge, or
  // kNobody for readers past the 65,535th, which pay nothing.
  static constexpr uint16_t kNobody = 0xffff;
  std::vector<uint16_t> merged_order_ ABSL_GUARDED_BY(mu_);
  std::vector<SourcePayer> merged_payers_ ABSL_GUARDED_BY(mu_);
  std::vector<const Order*> merged_orders_ ABSL_GUARDED_BY(mu_);  // Into orders_, as merged.
  // Where each position of merged_ lies in its reader's order (for NextUse;
  // only when placement evicts).
  std::vector<uint32_t> merged_index_ ABSL_GUARDED_BY(mu_);
  // Where each file occurs in merged_: its positions, ascending, are
  // occurrences_[first_[id] .. first_[id + 1]); next_[id] indexes the first
  // not yet behind the readers (advanced lazily by NextUse).
  std::vector<uint32_t> first_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> occurrences_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<uint32_t> next_occurrence_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;  // The next position of merged_ to fetch.
  // Files started by a stream since the last announcement and not read yet,
  // with their sizes: the lookahead in use.
  absl::flat_hash_map<uint32_t, uint64_t> ahead_ ABSL_GUARDED_BY(mu_);
  uint64_t ahead_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int fetching_ ABSL_GUARDED_BY(mu_) = 0;
  int held_by_lookahead_ ABSL_GUARDED_BY(mu_) = 0;  // Streams waiting for the readers.
  std::atomic<bool> active_{false};
  std::atomic<bool> announced_{false};  // A reader's order, not only StageAhead's.

  // Counters.
  std::atomic<uint64_t> announced_files_{0};
  std::atomic<uint64_t> staged_files_{0};
  std::atomic<uint64_t> fetched_files_{0};
  std::atomic<uint64_t> fetched_bytes_{0};
  std::atomic<uint64_t> skipped_files_{0};  // Already placed or in flight.
  std::atomic<uint64_t> no_room_files_{0};
  std::atomic<uint64_t> consumed_files_{0};
  std::atomic<uint64_t> hits_{0};  // Read after a stream had started them.
  std::atomic<uint64_t> yields_{0};

  ThreadGroup threads_;  // Last: they stop before the state above goes.
};

}  // namespace monarch

#endif  // MONARCH_PLACEMENT_PREFETCHER_H_
