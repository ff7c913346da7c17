// Tier: driver plus capacity accounting and counters.

#include "drivers/tier.h"

#include "drivers/copy_integrity.h"

namespace monarch {

Tier::Tier(TierConfig config, std::unique_ptr<StorageDriver> driver)
    : config_(std::move(config)),
      driver_(std::move(driver)),
      can_(driver_->capabilities()),
      limit_(config_.capacity_bytes) {}

absl::StatusOr<size_t> Tier::Read(const FileRef& file, uint64_t offset, char* dst, size_t n) {
  absl::StatusOr<size_t> result = driver_->Read(file, offset, dst, n);
  if (result.ok()) reads_.Count(*result);
  return result;
}

absl::StatusOr<size_t> Tier::ReadIfInMemory(const FileRef& file, uint64_t offset, char* dst,
                                            size_t n, InMemoryReads::Asker asker) {
  if (can_.in_memory == nullptr) return absl::UnimplementedError("cannot tell what is in memory");
  absl::StatusOr<size_t> result = can_.in_memory->ReadIfInMemory(file, offset, dst, n, asker);
  if (result.ok()) reads_.Count(*result);
  return result;
}

absl::Status Tier::VisitInMemory(const FileRef& file, uint64_t offset, size_t n,
                                 absl::FunctionRef<void(const SharedCopies::InMemoryBytes&)> visit) {
  if (can_.shared == nullptr) return absl::UnimplementedError("copies not in memory");
  absl::Status status = can_.shared->VisitInMemory(file, offset, n, visit);
  if (status.ok()) reads_.Count(n);
  return status;
}

uint64_t Tier::MaxFootprint(uint64_t bytes) { return bytes + CopyTrailerBytes(bytes); }

uint64_t Tier::Footprint(uint64_t bytes) const {
  const bool file_backed = config_.kind == TierKind::kPmem || config_.kind == TierKind::kPosix;
  return file_backed ? bytes + CopyTrailerBytes(bytes) : bytes;
}

bool Tier::TryReserve(uint64_t file_bytes) {
  const uint64_t bytes = Footprint(file_bytes);
  // Removed copies a process may still map take room too (not reserved:
  // the driver frees them).
  const uint64_t wanted = bytes + HeldBytes();
  uint64_t current = reserved_.load(std::memory_order_relaxed);
  do {
    if (current + wanted > limit_.load(std::memory_order_relaxed) || current + wanted < current) {
      return false;
    }
  } while (!reserved_.compare_exchange_weak(current, current + bytes, std::memory_order_relaxed));
  return true;
}

void Tier::Commit(uint64_t file_bytes) {
  committed_.fetch_add(Footprint(file_bytes), std::memory_order_relaxed);
  files_.fetch_add(1, std::memory_order_relaxed);
}

void Tier::Release(uint64_t file_bytes) {
  reserved_.fetch_sub(Footprint(file_bytes), std::memory_order_relaxed);
}

void Tier::Drop(uint64_t file_bytes) {
  committed_.fetch_sub(Footprint(file_bytes), std::memory_order_relaxed);
  files_.fetch_sub(1, std::memory_order_relaxed);
  reserved_.fetch_sub(Footprint(file_bytes), std::memory_order_relaxed);
}

void Tier::MarkFull() { limit_.store(reserved_.load(std::memory_order_relaxed)); }

void Tier::SetDatasetSize(uint64_t files, uint64_t bytes) {
  files_.store(files);
  committed_.store(bytes);
}

void Tier::ReportCounters(CounterSink& out, TierReadTotals elsewhere) const {
  CounterSink sink = out.ForTier(config_.name, TierKindName(config_.kind));
  sink.Counter("reads", reads_.reads.load(std::memory_order_relaxed) + elsewhere.reads,
               "Read calls served, fully or partly, from this tier.");
  sink.Counter("bytes_read", reads_.bytes.load(std::memory_order_relaxed) + elsewhere.bytes,
               "Bytes served from this tier.");
  sink.Gauge("files", files_.load(std::memory_order_relaxed),
             "Complete copies held (for the source: dataset files).");
  sink.Gauge("bytes_used", committed_.load(std::memory_order_relaxed),
             "Bytes of the complete copies held, with their checksums (for the source: the "
             "dataset's size).");
  sink.Gauge("capacity", config_.capacity_bytes, "Configured capacity in bytes (source: 0).");
  if (is_cache()) {
    sink.Gauge("effective_capacity", limit_.load(std::memory_order_relaxed),
               "The capacity in force: lower than `capacity` while memory pressure shrinks a "
               "RAM tier (memory.watch), or after the device filled up early.");
  }
  sink.Counter("read_errors", read_errors_.load(std::memory_order_relaxed),
               "Failed reads; a cache or peer tier's went on to the source.");
  sink.Counter("write_errors", write_errors_.load(std::memory_order_relaxed),
               "Failed copies (ENOSPC, EIO...).");
  sink.Counter("damaged_copies", damaged_.load(std::memory_order_relaxed),
               "Copies found damaged or altered when read (checksum, size, type), dropped.");
  driver_->ReportTierCounters(sink);
}

}  // namespace monarch
