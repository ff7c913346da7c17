// ChunkPool implementation.

#include "placement/chunk_pool.h"

#include <algorithm>
#include <cstdlib>
#include <new>

namespace monarch {

ChunkPool::ChunkPool(size_t chunk_bytes, uint64_t budget_bytes, uint64_t reserved_bytes,
                     uint64_t max_parked_bytes)
    : chunk_bytes_(chunk_bytes),
      budget_bytes_(std::max<uint64_t>(budget_bytes, chunk_bytes)),
      readers_limit_(budget_bytes_ -
                     std::min<uint64_t>(reserved_bytes, budget_bytes_ - chunk_bytes)),
      max_parked_bytes_(std::min<uint64_t>(max_parked_bytes, readers_limit_ - chunk_bytes)) {}

ChunkPool::~ChunkPool() {
  for (auto& [capacity, buffers] : free_) {
    for (char* buffer : buffers) std::free(buffer);
  }
}

size_t ChunkPool::CapacityFor(size_t bytes) const {
  size_t capacity = 4096;
  while (capacity < bytes && capacity < chunk_bytes_) capacity <<= 1;
  return capacity < chunk_bytes_ ? capacity : chunk_bytes_;
}

bool ChunkPool::TryAdd(std::atomic<uint64_t>& counter, uint64_t capacity, uint64_t limit,
                       uint64_t* now) {
  uint64_t value = counter.load(std::memory_order_relaxed);
  do {
    if (value + capacity > limit) return false;
  } while (!counter.compare_exchange_weak(value, value + capacity, std::memory_order_relaxed));
  if (now != nullptr) *now = value + capacity;
  return true;
}

bool ChunkPool::TryReserve(size_t capacity, uint64_t limit) {
  uint64_t now;
  if (!TryAdd(in_use_, capacity, limit, &now)) return false;
  uint64_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
  return true;
}

char* ChunkPool::Take(size_t capacity) {
  {
    MutexLock lock(&mu_);
    auto it = free_.find(capacity);
    if (it != free_.end() && !it->second.empty()) {
      char* buffer = it->second.back();
      it->second.pop_back();
      retained_bytes_ -= capacity;
      return buffer;
    }
  }
  void* buffer = std::aligned_alloc(4096, (capacity + 4095) / 4096 * 4096);
  if (buffer == nullptr) {
    in_use_.fetch_sub(capacity, std::memory_order_relaxed);
    throw std::bad_alloc();
  }
  return static_cast<char*>(buffer);
}

char* ChunkPool::TryAcquire(size_t bytes) {
  const size_t capacity = CapacityFor(bytes);
  if (!TryReserve(capacity, readers_limit_)) return nullptr;
  return Take(capacity);
}

char* ChunkPool::Acquire(size_t bytes, Share share) {
  const size_t capacity = CapacityFor(bytes);
  const uint64_t limit = share == Share::kPlacement ? budget_bytes_ : readers_limit_;
  if (!TryReserve(capacity, limit)) {
    waits_.fetch_add(1, std::memory_order_relaxed);
    MutexLock lock(&mu_);
    ++waiters_;
    // Ends when a thread loading or writing a chunk right now finishes it:
    // parked chunks never fill a share (see the banner), and a failed or
    // cancelled promotion returns its parked ones at once.
    while (!TryReserve(capacity, limit)) {
      refusals_.fetch_add(1, std::memory_order_relaxed);
      room_.Wait(&mu_);
    }
    --waiters_;
  }
  return Take(capacity);
}

void ChunkPool::Release(char* buffer, size_t bytes) {
  const size_t capacity = CapacityFor(bytes);
  in_use_.fetch_sub(capacity, std::memory_order_relaxed);
  {
    MutexLock lock(&mu_);
    if (waiters_ > 0) room_.SignalAll();
    if (retained_bytes_ + capacity <= budget_bytes_) {
      free_[capacity].push_back(buffer);
      retained_bytes_ += capacity;
      return;
    }
  }
  std::free(buffer);
}

bool ChunkPool::TryPark(size_t bytes) {
  return TryAdd(parked_, CapacityFor(bytes), max_parked_bytes_, nullptr);
}

void ChunkPool::Unpark(size_t bytes) {
  parked_.fetch_sub(CapacityFor(bytes), std::memory_order_relaxed);
}

}  // namespace monarch
