// RAM tier: whole-file images in process memory.
//
// Images are indexed by file id in a fixed set of shards, each a small
// map under its own mutex, so concurrent readers of different files rarely
// meet. A copy becomes visible only when its writer commits.

#include <algorithm>
#include <array>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "common/mutex.h"
#include "drivers/storage_driver.h"

namespace monarch {
namespace {

class RamDriver final : public StorageDriver {
 public:
  absl::StatusOr<size_t> Read(const FileRef& file, uint64_t offset, char* dst, size_t n) override {
    std::shared_ptr<const FileImage> image = Find(file.id);
    if (image == nullptr) return absl::NotFoundError("no RAM copy");
    if (offset >= image->size()) return 0;
    size_t count = std::min<uint64_t>(n, image->size() - offset);
    std::memcpy(dst, image->data() + offset, count);
    return count;
  }

  absl::StatusOr<std::unique_ptr<CopyWriter>> NewWriter(const FileRef& file) override {
    return std::unique_ptr<CopyWriter>(new Writer(this, file));
  }

  absl::Status Remove(const FileRef& file) override {
    std::shared_ptr<const FileImage> dropped;  // Freed after unlocking.
    Shard& shard = ShardFor(file.id);
    MutexLock lock(&shard.mu);
    auto it = shard.images.find(file.id);
    if (it == shard.images.end()) return absl::NotFoundError("no RAM copy");
    dropped = std::move(it->second);
    shard.images.erase(it);
    return absl::OkStatus();
  }

 private:
  // Fills a FileImage; Commit() publishes it to the shard map.
  class Writer final : public CopyWriter {
   public:
    Writer(RamDriver* driver, const FileRef& file)
        : driver_(driver), id_(file.id), image_(std::make_shared<FileImage>(file.size)) {}
    absl::Status Write(uint64_t offset, const char* data, size_t n) override {
      if (offset + n > image_->size())
        return absl::OutOfRangeError("write past the end of the file");
      std::memcpy(image_->mutable_data() + offset, data, n);
      return absl::OkStatus();
    }
    absl::StatusOr<size_t> ReadBack(uint64_t offset, char* dst, size_t n) override {
      if (offset >= image_->size()) return 0;
      const size_t count = std::min<uint64_t>(n, image_->size() - offset);
      std::memcpy(dst, image_->data() + offset, count);
      return count;
    }
    absl::Status Commit() override {
      Shard& shard = driver_->ShardFor(id_);
      MutexLock lock(&shard.mu);
      shard.images[id_] = image_;
      return absl::OkStatus();
    }

   private:
    RamDriver* const driver_;
    const uint32_t id_;
    const std::shared_ptr<FileImage> image_;
  };

  static constexpr size_t kShards = 64;
  struct alignas(64) Shard {
    Mutex mu;
    absl::flat_hash_map<uint32_t, std::shared_ptr<const FileImage>> images ABSL_GUARDED_BY(mu);
  };

  Shard& ShardFor(uint32_t id) { return shards_[id % kShards]; }

  // Returns a reference-counted image so a concurrent Remove (future eviction
  // policies) cannot free it under a reader.
  std::shared_ptr<const FileImage> Find(uint32_t id) {
    Shard& shard = ShardFor(id);
    MutexLock lock(&shard.mu);
    auto it = shard.images.find(id);
    return it == shard.images.end() ? nullptr : it->second;
  }

  std::array<Shard, kShards> shards_;
};

}  // namespace

std::unique_ptr<StorageDriver> NewRamDriver() { return std::make_unique<RamDriver>(); }

}  // namespace monarch
