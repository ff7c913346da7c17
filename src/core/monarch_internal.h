// Internal construction hook, for tests and tools inside this repository.
//
// Lets a caller wrap each tier's driver (for example in a fault-injecting
// driver) before the instance starts. Not part of the public API.

#ifndef MONARCH_CORE_MONARCH_INTERNAL_H_
#define MONARCH_CORE_MONARCH_INTERNAL_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <vector>

#include "config/valid_config.h"
#include "core/front.h"
#include "drivers/storage_driver.h"
#include "metadata/namespace.h"
#include "monarch/monarch.h"

namespace monarch {

// Receives tier index and the driver built from the config; returns the
// driver to use (the same one, or a wrapper around it).
using DriverWrapper =
    std::function<std::unique_ptr<StorageDriver>(int tier, std::unique_ptr<StorageDriver>)>;

// Validates `config` (tests build theirs in code) and builds an instance in
// this process.
absl::StatusOr<std::unique_ptr<Monarch>> CreateMonarchWithDriverWrapper(const Config& config,
                                                                        const DriverWrapper& wrap);

// The instance a node service (src/service) wraps: the public API plus what
// the service hands its clients and serves them.
class MonarchCore : public Front {
 public:
  // The node's counters (Front::NodeStats), with reads of each tier served
  // by other processes (the node service's clients, by tier index) added to
  // the tier's own.
  virtual Stats GetStatsWith(const std::vector<TierReadTotals>& elsewhere) const = 0;
  virtual const Namespace& name_space() const = 0;
  // Reads file `id` through the internal read path (tier copies,
  // promotions, dropping a bad copy), as Read() does by name. `id` may be
  // an extent's (Namespace::entry_count()): its bytes, at `offset` in it.
  virtual absl::StatusOr<size_t> ReadFile(uint32_t id, char* dst, size_t n, uint64_t offset) = 0;
  // The tiers, fastest first (cache tiers, the peers if any, the source).
  virtual int tier_count() const = 0;
  virtual const TierConfig& tier_config(int tier) const = 0;
  // The descriptors of a tier's shared memory (the RAM tier), if any.
  virtual std::vector<int> SharedMemoryDescriptors(int tier) const = 0;
  virtual int max_open_files() const = 0;
  // Prefetch on behalf of one of several readers (the node service's
  // clients): `reader` announces its order of file ids (AnnounceOrder), and
  // reports the files it started reading, hits it served itself included.
  // `payer` is charged what the prefetch streams fetch for the order.
  virtual void AnnounceOrderOf(uint64_t reader, std::vector<uint32_t> ids,
                               SourcePayer payer) = 0;
  virtual void ConsumedBy(uint64_t reader, const uint32_t* ids, size_t count) = 0;
  // AnnounceRanges on behalf of `reader`, with files given by id (each
  // below name_space().file_count()); the same errors.
  virtual absl::Status AnnounceRangesOf(uint64_t reader, const std::vector<FileRange>& samples,
                                        SourcePayer payer) = 0;
  // A client's scan of file `id` (cached by extents) reached `end`: the
  // extents past it are read ahead (PlacementHandler::ReadAheadPast).
  virtual void ReadAheadOf(uint32_t id, uint64_t end) = 0;
  // For a client's MapCopies: for each entry id (a file or an extent,
  // below name_space().entry_count()), the stamp of its copy in a file
  // tier if that copy was checked whole (CopyMapping::MarkMapped).
  virtual std::vector<std::optional<SourceIdentity>> CheckedCopiesOf(
      const std::vector<uint32_t>& ids) = 0;
  // Whether no reader is attached (a node service between jobs): the RAM
  // tiers then only keep copies for the next job, and under memory
  // pressure yield first (MemoryGovernor::SetKeeping).
  virtual void SetKeeping(bool keeping) = 0;
  // A reader (a node service's client) missed entry `id` with no order
  // announced: the top-level directory it is in may be staged
  // (placement/stage_ahead.h, prefetch.stage_ahead).
  virtual void StageAheadOnMiss(uint32_t id) = 0;
};

struct CoreOptions {
  DriverWrapper wrap;                            // As above; may be empty.
  Namespace::TierSlotAllocator tier_slots;       // Where the tier slots live; empty = heap.
  // A node service's runtime directory: its RAM tiers are kept for it
  // (node.keep_ram, drivers/ram_keep.h) in `ram_dir`, node.ram_dir resolved
  // (service/ram_keeper.h). Empty: in-process, never kept.
  std::string kept_ram_for;
  std::string ram_dir;
};

// Builds an instance in this process whatever config.node says (the service
// itself, and the embedded mode).
absl::StatusOr<std::unique_ptr<MonarchCore>> CreateMonarchCore(const ValidConfig& config,
                                                               const CoreOptions& options);

}  // namespace monarch

#endif  // MONARCH_CORE_MONARCH_INTERNAL_H_
