// ThreadPool: futures carry results and exceptions, wait() waits for
// everything, purge() drops queued work, the destructor drains.

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>

#include "common/thread_pool.h"

namespace monarch {
namespace {

// Thrown by a task; see tests/tsan.supp for why ThreadSanitizer needs a
// suppression when exceptions cross threads through futures.
struct TaskFailed {
  int code;
};

TEST_CASE("submit_task returns results and exceptions through futures") {
  ThreadPool pool(2);
  CHECK(pool.get_thread_count() == 2);
  auto answer = pool.submit_task([] { return 42; });
  auto thrown = pool.submit_task([]() -> int { throw TaskFailed{7}; });
  CHECK(answer.get() == 42);
  try {
    thrown.get();
    FAIL("the task's exception was not rethrown");
  } catch (const TaskFailed& e) {
    CHECK(e.code == 7);
  }
}

TEST_CASE("wait() returns only when every task has run") {
  ThreadPool pool(3);
  std::atomic<int> done{0};
  for (int i = 0; i < 200; ++i) {
    pool.detach_task([&] {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      done.fetch_add(1);
    });
  }
  pool.wait();
  CHECK(done.load() == 200);
  CHECK(pool.get_tasks_queued() == 0);
  CHECK(pool.get_tasks_running() == 0);
}

TEST_CASE("purge() drops queued tasks but not running ones") {
  ThreadPool pool(1);
  std::atomic<bool> release{false};
  std::atomic<int> ran{0};
  pool.detach_task([&] {
    while (!release.load()) std::this_thread::yield();
    ran.fetch_add(1);
  });
  while (pool.get_tasks_running() == 0) std::this_thread::yield();
  for (int i = 0; i < 10; ++i) pool.detach_task([&] { ran.fetch_add(1); });
  CHECK(pool.purge() == 10);
  release.store(true);
  pool.wait();
  CHECK(ran.load() == 1);
}

TEST_CASE("the destructor runs what is queued") {
  std::atomic<int> ran{0};
  {
    ThreadPool pool(2);
    for (int i = 0; i < 50; ++i) pool.detach_task([&] { ran.fetch_add(1); });
  }
  CHECK(ran.load() == 50);
}

TEST_CASE("tasks may submit more tasks") {
  ThreadPool pool(2);
  std::atomic<int> ran{0};
  pool.detach_task([&] {
    for (int i = 0; i < 5; ++i) pool.detach_task([&] { ran.fetch_add(1); });
  });
  pool.wait();
  CHECK(ran.load() == 5);
}

}  // namespace
}  // namespace monarch
