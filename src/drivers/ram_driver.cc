// RAM tier: whole-file copies in a RamArena.
//
// Each dataset file has a slot, indexed by its dense id, holding where its
// copy lies in the arena. A read is a slot load and a memcpy: no lock, no
// reference count. A copy becomes visible only when its writer commits.
//
// Removal never frees memory under a reader: slots carry a sequence number
// (a seqlock). Remove() makes it odd, clears the location, makes it even
// again and only then frees the extent. A reader notes the sequence before
// copying and checks it after; if it moved, the bytes it copied may belong
// to a reused extent, and the read reports NotFound instead (the caller then
// serves the source). The arena's pages stay mapped throughout, so such a
// reader never faults.

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "drivers/ram_arena.h"
#include "drivers/storage_driver.h"

namespace monarch {
namespace {

class RamDriver final : public StorageDriver {
 public:
  RamDriver(std::unique_ptr<RamArena> arena, uint32_t file_count)
      : arena_(std::move(arena)), file_count_(file_count), slots_(new Slot[file_count]) {}

  absl::StatusOr<size_t> Read(const FileRef& file, uint64_t offset, char* dst, size_t n) override {
    if (file.id >= file_count_) return absl::NotFoundError("no RAM copy");
    const Slot& slot = slots_[file.id];
    const uint32_t sequence = slot.sequence.load(std::memory_order_acquire);
    const uint64_t location = slot.location.load(std::memory_order_acquire);
    if ((sequence & 1) != 0 || location == 0) return absl::NotFoundError("no RAM copy");
    if (offset >= file.size) return 0;
    const size_t count = static_cast<size_t>(std::min<uint64_t>(n, file.size - offset));
    std::memcpy(dst, arena_->data(Unpack(location)) + offset, count);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (slot.sequence.load(std::memory_order_relaxed) != sequence) {
      return absl::NotFoundError("RAM copy removed during the read");
    }
    return count;
  }

  absl::StatusOr<std::unique_ptr<CopyWriter>> NewWriter(const FileRef& file) override {
    if (file.id >= file_count_) return absl::InvalidArgumentError("file id outside the namespace");
    RamArena::Extent extent;
    if (file.size > 0) {
      MONARCH_ASSIGN_OR_RETURN(extent, arena_->Allocate(file.size));
    }
    return std::unique_ptr<CopyWriter>(new Writer(this, file, extent));
  }

  absl::Status Remove(const FileRef& file) override {
    if (file.id >= file_count_) return absl::NotFoundError("no RAM copy");
    Slot& slot = slots_[file.id];
    MutexLock lock(&remove_mu_);  // Serializes removers of the same slot; readers never take it.
    const uint64_t location = slot.location.load(std::memory_order_relaxed);
    if (location == 0) return absl::NotFoundError("no RAM copy");
    slot.sequence.fetch_add(1, std::memory_order_relaxed);  // Odd: being removed.
    std::atomic_thread_fence(std::memory_order_release);
    slot.location.store(0, std::memory_order_relaxed);
    slot.sequence.fetch_add(1, std::memory_order_release);
    if (file.size > 0) arena_->Free(Unpack(location), file.size);
    return absl::OkStatus();
  }

 private:
  struct Slot {
    std::atomic<uint32_t> sequence{0};
    std::atomic<uint64_t> location{0};  // Pack(extent); 0 = no copy.
  };
  // A location: the stripe in the top 8 bits, offset + 1 below.
  static uint64_t Pack(RamArena::Extent extent) {
    return uint64_t{extent.stripe} << 56 | (extent.offset + 1);
  }
  static RamArena::Extent Unpack(uint64_t location) {
    return RamArena::Extent{static_cast<uint32_t>(location >> 56),
                            (location & ((uint64_t{1} << 56) - 1)) - 1};
  }

  // Streams chunks into the file's extent; Commit() publishes the slot.
  class Writer final : public CopyWriter {
   public:
    Writer(RamDriver* driver, const FileRef& file, RamArena::Extent extent)
        : driver_(driver), id_(file.id), size_(file.size), extent_(extent) {}
    ~Writer() override {
      if (!committed_ && size_ > 0) driver_->arena_->Free(extent_, size_);
    }

    absl::Status Write(uint64_t offset, const char* data, size_t n) override {
      if (offset > size_ || n > size_ - offset)
        return absl::OutOfRangeError("write past the end of the file");
      return driver_->arena_->Write(extent_, offset, data, n);
    }
    absl::StatusOr<size_t> ReadBack(uint64_t offset, char* dst, size_t n) override {
      if (offset >= size_) return 0;
      const size_t count = static_cast<size_t>(std::min<uint64_t>(n, size_ - offset));
      std::memcpy(dst, driver_->arena_->data(extent_) + offset, count);
      return count;
    }
    absl::Status Commit() override {
      // The copy's first reader would otherwise fault on every page.
      if (size_ > 0) driver_->arena_->PrepareForReading(extent_, size_);
      Slot& slot = driver_->slots_[id_];
      MutexLock lock(&driver_->remove_mu_);
      const uint64_t previous = slot.location.load(std::memory_order_relaxed);
      if (previous != 0) {
        return absl::AlreadyExistsError(absl::StrCat("file ", id_, " already has a RAM copy"));
      }
      // The pwrite()s happened before; release order makes them visible to
      // a reader that loads the location with acquire order.
      slot.location.store(Pack(extent_), std::memory_order_release);
      committed_ = true;
      return absl::OkStatus();
    }

   private:
    RamDriver* const driver_;
    const uint32_t id_;
    const uint64_t size_;
    const RamArena::Extent extent_;
    bool committed_ = false;
  };

  const std::unique_ptr<RamArena> arena_;
  const uint32_t file_count_;
  const std::unique_ptr<Slot[]> slots_;
  Mutex remove_mu_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<StorageDriver>> NewRamDriver(const std::string& name,
                                                            uint64_t capacity,
                                                            uint32_t file_count) {
  // Each stripe has room for the capacity plus each file's rounding to a
  // 64-byte extent. Writers are the placement threads plus, when staging is
  // over budget, every reader: 8 stripes keep them from queueing on one
  // memfd's inode lock, for the cost of 8 descriptors and mappings.
  constexpr int kStripes = 8;
  MONARCH_ASSIGN_OR_RETURN(std::unique_ptr<RamArena> arena,
                           RamArena::Create(capacity + 64 * uint64_t{file_count}, kStripes,
                                            absl::StrCat("monarch-ram:", name)));
  return std::unique_ptr<StorageDriver>(new RamDriver(std::move(arena), file_count));
}

}  // namespace monarch
