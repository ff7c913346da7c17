// Bounded joins and abandoned objects.

#include "common/shutdown.h"

#include <algorithm>

namespace monarch {

Deadline DeadlineIn(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(std::max(seconds, 0.0)));
}

ThreadGroup::~ThreadGroup() {
  std::vector<std::thread> threads;
  {
    MutexLock lock(&mu_);
    threads.swap(threads_);
  }
  for (std::thread& thread : threads) thread.join();
}

void ThreadGroup::Start(std::function<void()> body) {
  MutexLock lock(&mu_);
  ++running_;
  threads_.emplace_back([this, body = std::move(body)] {
    body();
    MutexLock lock(&mu_);
    if (--running_ == 0) finished_.SignalAll();
  });
}

bool ThreadGroup::JoinUntil(Deadline deadline) {
  std::vector<std::thread> threads;
  {
    MutexLock lock(&mu_);
    while (running_ > 0) {
      if (!finished_.WaitUntil(&mu_, deadline) && running_ > 0) return false;
    }
    threads.swap(threads_);
  }
  // Each has returned from its body; join only waits for the thread's exit.
  for (std::thread& thread : threads) thread.join();
  return true;
}

int ThreadGroup::running() const {
  MutexLock lock(&mu_);
  return running_;
}

bool ThreadGroup::empty() const {
  MutexLock lock(&mu_);
  return threads_.empty();
}

namespace {

struct Abandoned {
  Mutex mu;
  std::vector<std::shared_ptr<void>> objects ABSL_GUARDED_BY(mu);
};

Abandoned& AbandonedObjects() {
  static Abandoned* abandoned = new Abandoned;  // Never destroyed: that is its point.
  return *abandoned;
}

}  // namespace

void AbandonPointer(std::shared_ptr<void> object) {
  Abandoned& abandoned = AbandonedObjects();
  MutexLock lock(&abandoned.mu);
  abandoned.objects.push_back(std::move(object));
}

int AbandonedCount() {
  Abandoned& abandoned = AbandonedObjects();
  MutexLock lock(&abandoned.mu);
  return static_cast<int>(abandoned.objects.size());
}

}  // namespace monarch
