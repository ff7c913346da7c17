// DeferredCopies: see deferred_copies.h.

#include "placement/deferred_copies.h"

#include <pthread.h>
#include <sched.h>

#include <utility>

namespace monarch {

DeferredCopies::DeferredCopies(uint32_t file_count, std::function<void(uint32_t)> copy)
    : copy_(std::move(copy)),
      queued_bits_(new std::atomic<uint64_t>[(uint64_t{file_count} + 63) / 64]()) {
  thread_.Start([this] { Loop(); });
}

// An owner whose Stop() gave up must abandon this object instead.
DeferredCopies::~DeferredCopies() { Stop(DeadlineIn(kCancelGraceSeconds)); }

void DeferredCopies::Add(uint32_t id) {
  const uint64_t bit = uint64_t{1} << (id % 64);
  if (queued_bits_[id / 64].fetch_or(bit, std::memory_order_acq_rel) & bit) return;
  MutexLock lock(&mu_);
  if (stopping_) return;
  queue_.push_back(id);
  queued_total_.fetch_add(1, std::memory_order_relaxed);
  changed_.SignalAll();
}

void DeferredCopies::WaitIdle() {
  MutexLock lock(&mu_);
  // Ends: the thread takes every queued file and finishes each copy (a
  // promotion, bounded by its reads and writes); Stop() ends it at once.
  while (!stopping_ && (busy_ || !queue_.empty())) changed_.Wait(&mu_);
}

bool DeferredCopies::Drain(Deadline deadline) {
  {
    MutexLock lock(&mu_);
    // Ends: the thread takes every queued file; a copy is bounded by its
    // reads and writes. Or at the deadline.
    while (!stopping_ && (busy_ || !queue_.empty())) {
      if (!changed_.WaitUntil(&mu_, deadline)) break;
    }
  }
  return Stop(deadline);
}

bool DeferredCopies::Stop(Deadline deadline) {
  RequestStop();
  return thread_.JoinUntil(deadline);
}

void DeferredCopies::RequestStop() {
  MutexLock lock(&mu_);
  stopping_ = true;
  queue_.clear();
  changed_.SignalAll();
}

void DeferredCopies::Loop() {
  ::pthread_setname_np(::pthread_self(), "monarch-later");
  // Only CPU time nobody else wants (see the header). The locks this thread
  // shares with readers (a file's, the staging pool's) are held for a few
  // instructions, never across I/O, so its low priority holds no reader up.
  struct sched_param idle = {};
  (void)::pthread_setschedparam(::pthread_self(), SCHED_IDLE, &idle);
  for (;;) {
    uint32_t id;
    {
      MutexLock lock(&mu_);
      busy_ = false;
      changed_.SignalAll();
      // Ends: Add() and Stop() signal.
      while (!stopping_ && queue_.empty()) changed_.Wait(&mu_);
      if (stopping_) return;
      id = queue_.front();
      queue_.pop_front();
      busy_ = true;
    }
    // Taken: a later miss of the file may queue it again.
    queued_bits_[id / 64].fetch_and(~(uint64_t{1} << (id % 64)), std::memory_order_acq_rel);
    copy_(id);
  }
}

void DeferredCopies::ReportCounters(CounterSink& sink) const {
  uint64_t pending;
  {
    MutexLock lock(&mu_);
    pending = queue_.size();
  }
  sink.Counter("deferred_copies_queued", queued_total_.load(std::memory_order_relaxed),
               "Files whose miss was served from the source's memory, queued to be copied into "
               "a tier on CPU time no reader wants (placement.cached_source: defer).");
  sink.Gauge("deferred_copies_pending", pending, "Of those, still waiting for their turn.");
}

}  // namespace monarch
