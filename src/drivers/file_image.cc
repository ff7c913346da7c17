// FileImage: aligned, page-padded buffers for whole-file images, with a
// bounded free list for the short-lived ones.

#include <sys/mman.h>

#include <cstdlib>
#include <new>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/mutex.h"
#include "drivers/storage_driver.h"

namespace monarch {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kHugePage = 2 << 20;
// Transient buffers kept for reuse, process-wide. Enough for a couple of
// large shards or a few thousand small files in flight.
constexpr size_t kMaxRetainedBytes = 256 << 20;

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Transient capacities are powers of two (at least 64 KiB), so buffers of
// similar files can be reused for one another.
size_t TransientCapacity(size_t size) {
  size_t capacity = 64 << 10;
  while (capacity < size) capacity <<= 1;
  return capacity;
}

char* Allocate(size_t capacity) {
  const size_t alignment = capacity >= kHugePage ? kHugePage : kPage;
  const size_t allocated = RoundUp(capacity, alignment);
  char* data = static_cast<char*>(std::aligned_alloc(alignment, allocated));
  if (data == nullptr) throw std::bad_alloc();
  if (alignment == kHugePage) ::madvise(data, allocated, MADV_HUGEPAGE);  // A hint only.
  return data;
}

class FreeList {
 public:
  char* Take(size_t capacity) {
    MutexLock lock(&mu_);
    auto it = buffers_.find(capacity);
    if (it == buffers_.end() || it->second.empty()) return nullptr;
    char* data = it->second.back();
    it->second.pop_back();
    retained_ -= capacity;
    return data;
  }
  // Keeps `data` for reuse if there is room; otherwise frees it.
  void Give(char* data, size_t capacity) {
    {
      MutexLock lock(&mu_);
      if (retained_ + capacity <= kMaxRetainedBytes) {
        buffers_[capacity].push_back(data);
        retained_ += capacity;
        return;
      }
    }
    std::free(data);
  }

 private:
  Mutex mu_;
  absl::flat_hash_map<size_t, std::vector<char*>> buffers_ ABSL_GUARDED_BY(mu_);
  size_t retained_ ABSL_GUARDED_BY(mu_) = 0;
};

// Never destroyed: images may be freed during static destruction.
FreeList& TransientBuffers() {
  static FreeList* list = new FreeList();
  return *list;
}

}  // namespace

FileImage::FileImage(size_t size, bool transient) : size_(size), transient_(transient) {
  if (transient_) {
    capacity_ = TransientCapacity(size);
    data_ = TransientBuffers().Take(capacity_);
    if (data_ == nullptr) data_ = Allocate(capacity_);
  } else {
    capacity_ = RoundUp(size == 0 ? 1 : size, kPage);
    data_ = Allocate(capacity_);
  }
}

FileImage::~FileImage() {
  if (transient_) {
    TransientBuffers().Give(data_, capacity_);
  } else {
    std::free(data_);
  }
}

}  // namespace monarch
