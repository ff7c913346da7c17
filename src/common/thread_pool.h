// ThreadPool: a small fixed-size pool with BS::thread_pool's interface
// (submit_task returning a future, detach_task, wait, purge), which is in no
// package registry we can reach.
//
// Lifetime: threads start in the constructor; the destructor waits for queued
// and running tasks, then joins. No thread is ever detached.
// Thread-safe: every method may be called from any thread, including tasks.

#ifndef MONARCH_COMMON_THREAD_POOL_H_
#define MONARCH_COMMON_THREAD_POOL_H_

#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "common/mutex.h"

namespace monarch {

class ThreadPool {
 public:
  // `threads` == 0 means one per hardware thread.
  explicit ThreadPool(size_t threads = 0) : ThreadPool(threads, nullptr) {}
  // As BS::thread_pool: `init` runs first in every worker thread (to set its
  // name, for instance).
  ThreadPool(size_t threads, std::function<void()> init);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Queues `task`; the future yields its result (or rethrows its exception).
  template <typename F, typename R = std::invoke_result_t<std::decay_t<F>>>
  std::future<R> submit_task(F&& task) {
    auto packaged = std::make_shared<std::packaged_task<R()>>(std::forward<F>(task));
    std::future<R> future = packaged->get_future();
    Enqueue([packaged] { (*packaged)(); });
    return future;
  }

  // Queues `task` with no future. It must not throw.
  template <typename F>
  void detach_task(F&& task) {
    Enqueue(std::function<void()>(std::forward<F>(task)));
  }

  // Blocks until no task is queued or running. Must not be called from a task.
  void wait();
  // As wait(), but gives up at `deadline`: false if a task is still queued
  // or running then (one blocked in a system call that does not return).
  bool wait_until(std::chrono::steady_clock::time_point deadline);
  // Drops the queued (not yet running) tasks; returns how many.
  size_t purge();

  size_t get_thread_count() const { return threads_.size(); }
  size_t get_tasks_queued();
  size_t get_tasks_running();

 private:
  void Enqueue(std::function<void()> task);
  void WorkerLoop();

  Mutex mu_;
  CondVar work_available_;  // Signalled when a task is queued or stopping_ is set.
  CondVar idle_;            // Signalled when the pool may have become idle.
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  size_t running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// Calls `work(i)` for every i in [0, count) on up to `threads` threads, this
// one among them, with a thread more only per `per_thread` items: for a
// batch of metadata calls, each a round trip on a PFS, too short-lived for
// a pool. `work` must be safe to run concurrently for different i.
void ForEachInParallel(size_t count, size_t threads, size_t per_thread,
                       absl::FunctionRef<void(size_t)> work);

}  // namespace monarch

#endif  // MONARCH_COMMON_THREAD_POOL_H_
