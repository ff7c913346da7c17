// Bounded shutdown: threads joined by a deadline, and what is left behind
// when a deadline passes.
//
// Every wait in Monarch ends: on its own condition, on a deadline, or on
// cancellation. The one kind of wait nothing can end is a thread blocked in
// a system call on a file system that stopped answering (a hung NFS or
// Lustre mount): pread() does not return, whatever we cancel. Shutdown
// therefore waits for its threads until a deadline, and when one is still
// inside such a call it logs what it waited for and returns anyway. The
// objects that thread uses must then stay alive for the rest of the
// process: Abandon() keeps them, so that the owner can be destroyed (and
// the process exit) without joining a thread that may never return.
//
// Thread-safe.

#ifndef MONARCH_COMMON_SHUTDOWN_H_
#define MONARCH_COMMON_SHUTDOWN_H_

#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace monarch {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// A deadline `seconds` from now (fractions allowed; negative counts as 0).
Deadline DeadlineIn(double seconds);

// How long a shutdown waits, after it cancelled its background work, for the
// threads doing it to notice: each is at most one chunk's read or write
// away from the check (a peer fetch is cut short at once).
constexpr double kCancelGraceSeconds = 5;

// Threads that can be joined by a deadline: each marks itself finished as
// its last act, so a join after JoinUntil() succeeded never blocks.
class ThreadGroup {
 public:
  ThreadGroup() = default;
  // Joins every thread: only after JoinUntil() returned true, or for threads
  // known to end (the owner must Abandon() a group that did not finish).
  ~ThreadGroup();
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;

  // Runs `body` on a new thread.
  void Start(std::function<void()> body);
  // Waits until every thread started so far has returned, or `deadline`.
  // True (and every thread joined) if they all returned; false if some are
  // still running (those stay joinable).
  bool JoinUntil(Deadline deadline);
  // Threads started and not yet returned.
  int running() const;
  bool empty() const;

 private:
  mutable Mutex mu_;
  CondVar finished_;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

// Keeps `object` alive until the process exits, never destroying it: a
// thread stuck in a blocking call may still use it. Reachable from a global,
// so leak checkers do not report it.
void AbandonPointer(std::shared_ptr<void> object);

template <typename T>
void Abandon(std::unique_ptr<T> object) {
  if (object != nullptr) AbandonPointer(std::shared_ptr<void>(object.release(), [](void*) {}));
}

// How many objects were abandoned in this process (for tests and logs).
int AbandonedCount();

}  // namespace monarch

#endif  // MONARCH_COMMON_SHUTDOWN_H_
