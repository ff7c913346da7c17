// DeferredCopies: files to copy into a tier later, on CPU time no reader
// wants.
//
// Why. A miss whose bytes the source already holds in memory (the page
// cache of a local file system, or of a PFS client) is served from there
// at the cost of a plain read: copying the file into a tier at the same
// time would be a second pass over its bytes, into memory that must first
// be allocated and zeroed, on the reader's core or the only other one
// (bench/results/do_no_harm.md: 1.4-3.5x a plain epoch on 2 cores). So
// the copy waits here, and one thread at the lowest CPU priority
// (SCHED_IDLE) makes it when a core is free: with 1 reader on 2 cores at
// once, with every core busy only between epochs.
//
// The copy reads the source again. To keep every byte read from a slow
// source once, it takes only bytes still in memory (Promotion's
// memory-only loads): if they were evicted meanwhile, it gives up, and the
// file is promoted by its next miss as any other.
//
// A file is queued at most once until its turn comes. Thread-safe. Start:
// the constructor starts the thread. Stop: Drain() makes what is queued
// first, Stop() (also the destructor's) drops it; both wait, bounded, for
// the copy in progress.

#ifndef MONARCH_PLACEMENT_DEFERRED_COPIES_H_
#define MONARCH_PLACEMENT_DEFERRED_COPIES_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>

#include "common/counters.h"
#include "common/mutex.h"
#include "common/shutdown.h"

namespace monarch {

class DeferredCopies {
 public:
  // `copy(id)` makes the copy of file `id` (or finds it not needed); it runs
  // on this class's thread. Files are numbered below `file_count`.
  DeferredCopies(uint32_t file_count, std::function<void(uint32_t id)> copy);
  ~DeferredCopies();
  DeferredCopies(const DeferredCopies&) = delete;
  DeferredCopies& operator=(const DeferredCopies&) = delete;

  // Queues file `id`, unless it is queued already or Stop() was called.
  void Add(uint32_t id);
  // Returns when nothing is queued and no copy is in progress, or Stop()
  // was called. (The thread runs at idle priority: a caller that waits
  // leaves it the CPU.)
  void WaitIdle();
  // Makes the copies queued until `deadline` (a shutdown: the readers are
  // gone, so the idle CPU is there), then Stop(deadline). True if the
  // thread ended.
  bool Drain(Deadline deadline);
  // Drops the queue and waits until `deadline` for the copy in progress.
  // True if the thread ended. Idempotent.
  bool Stop(Deadline deadline);
  // Stop() without the wait: what a shutdown calls before it cancels the
  // promotions (the copy in progress among them), so that the thread is
  // gone by the time Stop() waits for it.
  void RequestStop();

  // deferred_copies_queued (files queued so far), deferred_copies_pending.
  void ReportCounters(CounterSink& sink) const;

 private:
  void Loop();

  const std::function<void(uint32_t)> copy_;
  // One bit per file: queued and not yet taken.
  std::unique_ptr<std::atomic<uint64_t>[]> queued_bits_;
  mutable Mutex mu_;
  CondVar changed_;
  std::deque<uint32_t> queue_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> queued_total_{0};
  ThreadGroup thread_;  // Last: stopped before the rest goes.
};

}  // namespace monarch

#endif  // MONARCH_PLACEMENT_DEFERRED_COPIES_H_
