// DescriptorTable: descriptor number -> open dataset file, for the preload
// library's hooks; and the fork-safe spin lock it uses. Apart from the hooks
// so that tests can run it under ThreadSanitizer.

#ifndef MONARCH_INTEGRATIONS_PRELOAD_DESCRIPTOR_TABLE_H_
#define MONARCH_INTEGRATIONS_PRELOAD_DESCRIPTOR_TABLE_H_

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <new>
#include <utility>

#include "preload.h"

namespace monarch::preload {

// A lock that is safe across fork(): the atfork handlers take every one of
// them before fork and release them in both processes, so a child never
// inherits one held by a thread it does not have. Held only for a few
// instructions (copying a shared_ptr), so spinning is cheaper than a futex.
class SpinLock {
 public:
  void Lock() {
    while (locked_.exchange(true, std::memory_order_acquire)) {
      while (locked_.load(std::memory_order_relaxed)) sched_yield();
    }
  }
  void Unlock() { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

class SpinLockHolder {
 public:
  explicit SpinLockHolder(SpinLock& lock) : lock_(lock) { lock_.Lock(); }
  ~SpinLockHolder() { lock_.Unlock(); }
  SpinLockHolder(const SpinLockHolder&) = delete;
  SpinLockHolder& operator=(const SpinLockHolder&) = delete;

 private:
  SpinLock& lock_;
};

// Descriptor number -> open file. Two levels of 1,024 so that a process
// that opens descriptor 100,000 does not pay for a million slots, and a
// lookup of a descriptor that was never ours is two atomic loads.
class DescriptorTable {
 public:
  static constexpr int kPageBits = 10;
  static constexpr int kPageSize = 1 << kPageBits;
  static constexpr int kPages = 1024;  // Descriptors up to 1,048,575.
  static constexpr int kLocks = 64;

  std::shared_ptr<OpenFile> Find(int fd) {
    Slot* slot = FindSlot(fd);
    if (slot == nullptr || !slot->used.load(std::memory_order_acquire)) return nullptr;
    SpinLockHolder hold(locks_[fd % kLocks]);
    return slot->file;
  }

  bool Set(int fd, std::shared_ptr<OpenFile> file) {
    if (fd < 0 || fd >= kPages * kPageSize) return false;
    Slot* slot = SlotFor(fd);
    if (slot == nullptr) return false;
    std::shared_ptr<OpenFile> previous;
    {
      SpinLockHolder hold(locks_[fd % kLocks]);
      previous = std::move(slot->file);
      slot->file = std::move(file);
      slot->used.store(true, std::memory_order_release);
    }
    if (!previous) used_.fetch_add(1, std::memory_order_relaxed);
    return true;  // `previous` (a stale entry) is released outside the lock.
  }

  void Forget(int fd) {
    Slot* slot = FindSlot(fd);
    if (slot == nullptr || !slot->used.load(std::memory_order_acquire)) return;
    std::shared_ptr<OpenFile> previous;
    {
      SpinLockHolder hold(locks_[fd % kLocks]);
      previous = std::move(slot->file);
      slot->used.store(false, std::memory_order_release);
    }
    if (previous) used_.fetch_sub(1, std::memory_order_relaxed);
  }

  bool Empty() const { return used_.load(std::memory_order_relaxed) == 0; }

  // Calls `fn(fd, file)` for every registered descriptor in [first, last].
  template <typename Fn>
  void ForEach(unsigned first, unsigned last, Fn fn) {
    if (Empty()) return;
    const unsigned end = std::min<unsigned>(last, kPages * kPageSize - 1);
    for (unsigned page = first >> kPageBits; page <= (end >> kPageBits); ++page) {
      Page* p = pages_[page].load(std::memory_order_acquire);
      if (p == nullptr) continue;
      for (unsigned i = 0; i < kPageSize; ++i) {
        const unsigned fd = (page << kPageBits) | i;
        if (fd < first || fd > end || !p->slots[i].used.load(std::memory_order_acquire)) continue;
        std::shared_ptr<OpenFile> file = Find(static_cast<int>(fd));
        if (file) fn(static_cast<int>(fd), file);
      }
    }
  }

  void LockAll() {
    page_lock_.Lock();
    for (SpinLock& lock : locks_) lock.Lock();
  }
  void UnlockAll() {
    for (SpinLock& lock : locks_) lock.Unlock();
    page_lock_.Unlock();
  }

 private:
  struct Slot {
    std::atomic<bool> used{false};
    std::shared_ptr<OpenFile> file;
  };
  struct Page {
    Slot slots[kPageSize];
  };

  Slot* FindSlot(int fd) {
    if (fd < 0 || fd >= kPages * kPageSize) return nullptr;
    Page* page = pages_[fd >> kPageBits].load(std::memory_order_acquire);
    return page == nullptr ? nullptr : &page->slots[fd & (kPageSize - 1)];
  }

  Slot* SlotFor(int fd) {
    Slot* slot = FindSlot(fd);
    if (slot != nullptr) return slot;
    SpinLockHolder hold(page_lock_);
    std::atomic<Page*>& page = pages_[fd >> kPageBits];
    if (page.load(std::memory_order_acquire) == nullptr) {
      page.store(new (std::nothrow) Page, std::memory_order_release);  // Never freed.
    }
    return FindSlot(fd);
  }

  std::atomic<Page*> pages_[kPages] = {};
  SpinLock page_lock_;
  SpinLock locks_[kLocks];
  std::atomic<int> used_{0};
};

}  // namespace monarch::preload

#endif  // MONARCH_INTEGRATIONS_PRELOAD_DESCRIPTOR_TABLE_H_
