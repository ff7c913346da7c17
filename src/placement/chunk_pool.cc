// ChunkPool implementation.

#include "placement/chunk_pool.h"

#include <cstdlib>
#include <new>

namespace monarch {

ChunkPool::ChunkPool(size_t chunk_bytes, size_t max_retained_bytes)
    : chunk_bytes_(chunk_bytes), max_retained_bytes_(max_retained_bytes) {}

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

char* ChunkPool::Acquire(size_t bytes) {
  const size_t capacity = CapacityFor(bytes);
  const uint64_t in_use = in_use_.fetch_add(capacity, std::memory_order_relaxed) + capacity;
  uint64_t peak = peak_.load(std::memory_order_relaxed);
  while (in_use > peak && !peak_.compare_exchange_weak(peak, in_use, std::memory_order_relaxed)) {
  }
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
  if (buffer == nullptr) throw std::bad_alloc();
  return static_cast<char*>(buffer);
}

void ChunkPool::Release(char* buffer, size_t bytes) {
  const size_t capacity = CapacityFor(bytes);
  in_use_.fetch_sub(capacity, std::memory_order_relaxed);
  {
    MutexLock lock(&mu_);
    if (retained_bytes_ + capacity <= max_retained_bytes_) {
      free_[capacity].push_back(buffer);
      retained_bytes_ += capacity;
      return;
    }
  }
  std::free(buffer);
}

}  // namespace monarch
