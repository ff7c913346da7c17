// ThreadPool implementation.

#include "common/thread_pool.h"

#include <algorithm>
#include <atomic>

namespace monarch {

ThreadPool::ThreadPool(size_t threads, std::function<void()> init) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  threads_.reserve(threads);
  for (size_t i = 0; i < threads; ++i) {
    threads_.emplace_back([this, init] {
      if (init) init();
      WorkerLoop();
    });
  }
}

ThreadPool::~ThreadPool() {
  wait();
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  work_available_.SignalAll();
  for (std::thread& thread : threads_) thread.join();
}

void ThreadPool::Enqueue(std::function<void()> task) {
  {
    MutexLock lock(&mu_);
    queue_.push_back(std::move(task));
  }
  work_available_.Signal();
}

// As long as the tasks take: an owner whose tasks may block in a read that
// never returns uses wait_until() instead.
void ThreadPool::wait() {
  MutexLock lock(&mu_);
  while (!queue_.empty() || running_ > 0) idle_.Wait(&mu_);
}

bool ThreadPool::wait_until(std::chrono::steady_clock::time_point deadline) {
  MutexLock lock(&mu_);
  while (!queue_.empty() || running_ > 0) {
    if (!idle_.WaitUntil(&mu_, deadline)) return queue_.empty() && running_ == 0;
  }
  return true;
}

size_t ThreadPool::purge() {
  std::deque<std::function<void()>> dropped;  // Destroyed after unlocking.
  size_t count;
  {
    MutexLock lock(&mu_);
    dropped.swap(queue_);
    count = dropped.size();
  }
  idle_.SignalAll();
  return count;
}

size_t ThreadPool::get_tasks_queued() {
  MutexLock lock(&mu_);
  return queue_.size();
}

size_t ThreadPool::get_tasks_running() {
  MutexLock lock(&mu_);
  return running_;
}

void ThreadPool::WorkerLoop() {
  for (;;) {
    std::function<void()> task;
    {
      MutexLock lock(&mu_);
      while (queue_.empty() && !stopping_) work_available_.Wait(&mu_);
      if (queue_.empty()) return;  // Stopping, and nothing left to run.
      task = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
    }
    task();
    task = nullptr;  // Release captures before reporting idle.
    {
      MutexLock lock(&mu_);
      --running_;
      if (running_ == 0 && queue_.empty()) idle_.SignalAll();
    }
  }
}

void ForEachInParallel(size_t count, size_t threads, size_t per_thread,
                       absl::FunctionRef<void(size_t)> work) {
  std::atomic<size_t> next{0};
  auto drain = [&] {
    for (size_t i; (i = next.fetch_add(1)) < count;) work(i);
  };
  const size_t wanted = std::min(std::max<size_t>(threads, 1),
                                 (count + per_thread - 1) / std::max<size_t>(per_thread, 1));
  std::vector<std::thread> helpers;
  for (size_t t = 1; t < wanted; ++t) helpers.emplace_back(drain);
  drain();
  for (std::thread& helper : helpers) helper.join();
}

}  // namespace monarch
