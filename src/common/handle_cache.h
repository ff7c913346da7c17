// HandleCache: a bounded LRU cache of open handles (file descriptors, pmem
// mappings), keyed by file id.
//
// Why: reopening a file for every read costs an open() per call (a metadata
// operation on the PFS), while keeping every file open exhausts descriptors
// (the original MONARCH hung under `ulimit -n 1024`). Handles are shared
// pointers: evicting one only drops the cache's reference, so a reader that
// still uses it is never left with a closed descriptor. At most `capacity`
// handles live in the cache, plus at most two per concurrent caller.
//
// Descriptors can run out below that bound: the process's limit is shared
// with the rest of the program, and a FUSE or network file system's server
// has a limit of its own for all its clients (several node services on one
// mount). An open that fails for want of resources (ResourceExhausted:
// EMFILE, ENFILE) halves the capacity, drops the least recently used
// handles down to it and is tried once more, so the cache settles below
// what the system allows instead of failing reads.
//
// Thread-safe. Opening happens outside the lock, so a slow open() on the PFS
// does not serialize other readers.

#ifndef MONARCH_COMMON_HANDLE_CACHE_H_
#define MONARCH_COMMON_HANDLE_CACHE_H_

#include <algorithm>
#include <cstdint>
#include <list>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"

namespace monarch {

template <typename Handle>
class HandleCache {
 public:
  using HandlePtr = std::shared_ptr<Handle>;

  explicit HandleCache(size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}

  // Returns the cached handle for `key`, or calls `open` and caches its result.
  absl::StatusOr<HandlePtr> Get(uint32_t key, absl::FunctionRef<absl::StatusOr<HandlePtr>()> open) {
    if (HandlePtr cached = Find(key)) return cached;
    absl::StatusOr<HandlePtr> opened = open();
    if (absl::IsResourceExhausted(opened.status()) && Shrink()) opened = open();
    if (!opened.ok()) return opened.status();
    std::vector<HandlePtr> evicted;  // Released after unlocking: closing may block.
    MutexLock lock(&mu_);
    auto it = index_.find(key);
    if (it != index_.end()) return it->second->second;  // Another caller won the race.
    lru_.emplace_front(key, *opened);
    index_[key] = lru_.begin();
    while (lru_.size() > capacity_) {
      evicted.push_back(std::move(lru_.back().second));
      index_.erase(lru_.back().first);
      lru_.pop_back();
    }
    return *opened;
  }

  // The cached handle for `key`, or null: never opens.
  HandlePtr Find(uint32_t key) {
    MutexLock lock(&mu_);
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second->second;
  }

  // Drops the cached handle for `key`, if any (e.g. after the file was
  // replaced); with `only`, only if the handle cached is that one.
  void Erase(uint32_t key, const Handle* only = nullptr) {
    HandlePtr dropped;
    MutexLock lock(&mu_);
    auto it = index_.find(key);
    if (it == index_.end() || (only != nullptr && it->second->second.get() != only)) return;
    dropped = std::move(it->second->second);
    lru_.erase(it->second);
    index_.erase(it);
  }

  size_t size() {
    MutexLock lock(&mu_);
    return lru_.size();
  }
  size_t capacity() {
    MutexLock lock(&mu_);
    return capacity_;
  }

 private:
  // Halves the capacity (to half the handles cached, if fewer) and drops
  // the handles past it; false if none was cached to drop.
  bool Shrink() {
    std::vector<HandlePtr> evicted;  // Released after unlocking: closing may block.
    MutexLock lock(&mu_);
    if (lru_.empty()) return false;
    capacity_ = std::max<size_t>(1, std::min(capacity_, lru_.size()) / 2);
    while (lru_.size() > capacity_) {
      evicted.push_back(std::move(lru_.back().second));
      index_.erase(lru_.back().first);
      lru_.pop_back();
    }
    return true;
  }

  using Lru = std::list<std::pair<uint32_t, HandlePtr>>;
  size_t capacity_ ABSL_GUARDED_BY(mu_);
  Mutex mu_;
  Lru lru_ ABSL_GUARDED_BY(mu_);  // Most recently used first.
  absl::flat_hash_map<uint32_t, typename Lru::iterator> index_ ABSL_GUARDED_BY(mu_);
};

}  // namespace monarch

#endif  // MONARCH_COMMON_HANDLE_CACHE_H_
