// Tier: one level of the storage hierarchy, a driver plus its properties.
//
// The tier owns its driver, its configuration (name, kind, path, capacity)
// and its counters. Capacity is accounted in two steps so that concurrent
// promotions never overcommit a tier, while "bytes used" only ever counts
// complete copies: TryReserve() before a copy starts, then Commit() or
// Release() when it ends.
//
// Thread-safe: counters are atomics; the config and driver never change.

#ifndef MONARCH_DRIVERS_TIER_H_
#define MONARCH_DRIVERS_TIER_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "common/counters.h"
#include "drivers/storage_driver.h"
#include "monarch/config.h"
#include "monarch/stats.h"

namespace monarch {

class Tier {
 public:
  Tier(TierConfig config, std::unique_ptr<StorageDriver> driver);

  const TierConfig& config() const { return config_; }
  // Holds copies Monarch makes (not the source, not the peers).
  bool is_cache() const {
    return config_.kind != TierKind::kSource && config_.kind != TierKind::kPeers;
  }
  StorageDriver& driver() { return *driver_; }
  // What the driver can do beyond StorageDriver, asked once.
  const DriverCapabilities& can() const { return can_; }

  // Reads through the driver; a success adds to reads and bytes read.
  // Failures are counted by the caller (CountReadError), which knows whether
  // one is an error: NotFound from the peers tier only means "not from a
  // peer this time", and the read goes on to the source.
  absl::StatusOr<size_t> Read(const FileRef& file, uint64_t offset, char* dst, size_t n);
  // The same for InMemoryReads::ReadIfInMemory; Unimplemented without it.
  absl::StatusOr<size_t> ReadIfInMemory(const FileRef& file, uint64_t offset, char* dst,
                                        size_t n, InMemoryReads::Asker asker);
  // Where reads of this tier are counted (the read path counts its hits
  // here itself).
  TierReads& reads() { return reads_; }
  // The same for SharedCopies::VisitInMemory: a success is a read of `n`
  // bytes. Unimplemented without it.
  absl::Status VisitInMemory(const FileRef& file, uint64_t offset, size_t n,
                             absl::FunctionRef<void(const SharedCopies::InMemoryBytes&)> visit);
  void CountReadError() { read_errors_.fetch_add(1, std::memory_order_relaxed); }
  // A read found the copy damaged or altered (DataLoss).
  void CountDamagedCopy() { damaged_.fetch_add(1, std::memory_order_relaxed); }

  // Reserves room for a copy of a `file_bytes` file; false if it would not fit.
  bool TryReserve(uint64_t file_bytes);
  // The reserved copy is complete: it now counts as used.
  void Commit(uint64_t file_bytes);
  // The reserved copy was abandoned.
  void Release(uint64_t file_bytes);
  // A committed copy was dropped (found damaged): undoes Commit and the
  // reservation.
  void Drop(uint64_t file_bytes);
  // The most room a copy of a `file_bytes` file takes in any tier kind (a
  // file-backed copy carries its checksum trailer). For budgets that span
  // tiers, such as the room kept for a peer's home share.
  static uint64_t MaxFootprint(uint64_t file_bytes);
  // Bytes a copy of a `file_bytes` file takes in this tier.
  uint64_t Footprint(uint64_t file_bytes) const;
  // SharedCopies': what eviction passes over (a copy a process may map),
  // and what counts against the capacity beside the reservations.
  bool MayBeMapped(const FileRef& file) const {
    return can_.shared != nullptr && can_.shared->MayBeMapped(file);
  }
  uint64_t HeldBytes() const { return can_.shared != nullptr ? can_.shared->HeldBytes() : 0; }
  // Room left for new copies: capacity minus complete and reserved ones,
  // and removed ones still held for mappings (SharedCopies::HeldBytes).
  uint64_t free_bytes() const {
    const uint64_t limit = limit_.load(std::memory_order_relaxed);
    const uint64_t taken = reserved_.load(std::memory_order_relaxed) + HeldBytes();
    return taken < limit ? limit - taken : 0;
  }
  // Treats the tier as full from now on (after the device reported ENOSPC
  // before the configured capacity was reached).
  void MarkFull();
  // The capacity in force: the configured one, lowered by MarkFull(), or
  // set by SetLimit() (a RAM tier yielding to memory pressure). Copies
  // already held above it stay until removed; no new one is reserved.
  uint64_t limit() const { return limit_.load(std::memory_order_relaxed); }
  void SetLimit(uint64_t bytes) { limit_.store(bytes, std::memory_order_relaxed); }
  // Complete copies plus in-flight reservations.
  uint64_t reserved_bytes() const { return reserved_.load(std::memory_order_relaxed); }
  void CountWriteError() { write_errors_.fetch_add(1, std::memory_order_relaxed); }

  // For the source: what the dataset holds, reported as its files and bytes.
  void SetDatasetSize(uint64_t files, uint64_t bytes);

  // Reads, bytes read, files, bytes used, capacity, read and write errors.
  // `elsewhere`: reads of this tier served by other processes (a node
  // service's clients), added to this process's.
  void ReportCounters(CounterSink& sink, TierReadTotals elsewhere = {}) const;

 private:
  const TierConfig config_;
  const std::unique_ptr<StorageDriver> driver_;
  const DriverCapabilities can_;

  std::atomic<uint64_t> limit_;         // Capacity, lowered by MarkFull().
  std::atomic<uint64_t> committed_{0};  // Bytes of complete copies, trailers included.
  std::atomic<uint64_t> reserved_{0};   // Committed plus in-flight reservations.
  std::atomic<uint64_t> files_{0};

  // Counters, each on its own cache line: reader threads bump them on every call.
  TierReads reads_;
  alignas(64) std::atomic<uint64_t> read_errors_{0};
  std::atomic<uint64_t> write_errors_{0};
  std::atomic<uint64_t> damaged_{0};

};

}  // namespace monarch

#endif  // MONARCH_DRIVERS_TIER_H_
