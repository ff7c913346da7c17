// Mutex, MutexLock and CondVar with Abseil's thread-safety annotations.
//
// Why not absl::Mutex: Debian's Abseil is not built with ThreadSanitizer
// hooks, so TSan cannot see absl::Mutex's happens-before edges and reports
// every guarded access as a race (tried: a counter under absl::MutexLock in
// four threads is flagged). std::mutex goes through pthread, which TSan
// intercepts. The annotations are Abseil's, so Clang's -Wthread-safety
// checks GUARDED_BY / EXCLUSIVE_LOCKS_REQUIRED as it would with absl::Mutex.

#ifndef MONARCH_COMMON_MUTEX_H_
#define MONARCH_COMMON_MUTEX_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"

namespace monarch {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

class CondVar {
 public:
  // Atomically releases `mu`, waits for a signal, and re-acquires `mu`.
  // Spurious wake-ups happen: callers loop on their condition.
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // `mu` stays held, as the caller expects.
  }
  // As Wait(), but gives up at `deadline`; false if it timed out.
  bool WaitUntil(Mutex* mu, std::chrono::steady_clock::time_point deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool signalled = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return signalled;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace monarch

#endif  // MONARCH_COMMON_MUTEX_H_
