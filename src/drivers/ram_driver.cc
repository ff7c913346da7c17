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
//
// The slots and the arena are memfds, so a node service's clients map both
// read-only and read copies themselves (RamReader) with the same seqlock.
//
// Copies are mapped in place too (Monarch::MapCopies), privately, by a
// process and by any child it forks. A mapping sees whatever the arena
// holds at those offsets, so the memory of a copy that may be mapped must
// not take another copy. A process maps a copy first, then asks the tier
// (MarkMapped), which marks the file as maybe mapped. A marked file's
// copy is held once removed, counted against the capacity, and eviction
// passes over it. A walk of every process's mappings, which the instance
// makes (MappingWatch), frees the held copies nobody maps, and unmarks the
// files whose copy nobody maps (ReleaseUnmapped). Every mapping of a copy
// existed before its file was marked, so a walk that starts after the mark
// sees them all. A
// mapper whose copy was removed before it asked finds the slot's sequence
// moved (StillCopyOf) and drops its mapping: that memory may be reused.
//
// A node service's RAM tier is kept (RamTierOptions::kept_dir): its arena
// and slot table are tmpfs files, and a journal (ram_keep.h) lists each
// committed copy with its source's identity and its CRC32C. The next driver
// on that directory first clears every slot of the table before (a client
// of the dead service may still read through it: its seqlock then sends it
// to the source), then adopts, through KeptCopies, the copies whose source
// is unchanged and whose bytes still match their CRC; the rest is freed.
//
// With peers, the driver also keeps each copy's per-4 KiB CRC32Cs, computed
// as the copy is written: a home then sends a RAM copy to a peer with the
// CRC of the range combined from them, without reading the bytes.

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/copy_bytes.h"
#include "common/crc32c.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/os.h"
#include "common/process_mappings.h"
#include "common/status_macros.h"
#include "common/shared_memory.h"
#include "drivers/copy_integrity.h"
#include "drivers/ram_arena.h"
#include "drivers/ram_keep.h"
#include "drivers/storage_driver.h"

namespace monarch {
namespace {

// Where a file's copy lies. In shared memory: address-free atomics only.
struct Slot {
  std::atomic<uint32_t> sequence{0};
  std::atomic<uint64_t> location{0};  // Pack(extent); 0 = no copy.
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "slots are shared between processes");

// A location: the stripe in the top 8 bits, offset + 1 below.
uint64_t Pack(RamArena::Extent extent) { return uint64_t{extent.stripe} << 56 | (extent.offset + 1); }
RamArena::Extent Unpack(uint64_t location) {
  return RamArena::Extent{static_cast<uint32_t>(location >> 56),
                          (location & ((uint64_t{1} << 56) - 1)) - 1};
}

// The read of a copy, for the driver and for readers in other processes.
// Calls `visit(at, count)` with [offset, offset + n) of the RAM copy of
// `file`, clipped to the file (`at`: where its first byte lies in the
// arena), under the slot's seqlock: the count, or NotFound if the copy was
// removed before `visit` was done with it.
// Where the copy of `file` lies now, and its slot's sequence then (even).
struct FoundCopy {
  RamArena::Extent extent;
  uint32_t sequence = 0;
};
absl::StatusOr<FoundCopy> FindCopy(const Slot* slots, uint32_t file_count, const RamArena& arena,
                                   const FileRef& file) {
  if (file.id >= file_count) return absl::NotFoundError("no RAM copy");
  const Slot& slot = slots[file.id];
  const uint32_t sequence = slot.sequence.load(std::memory_order_acquire);
  const uint64_t location = slot.location.load(std::memory_order_acquire);
  if ((sequence & 1) != 0 || location == 0) return absl::NotFoundError("no RAM copy");
  const RamArena::Extent extent = Unpack(location);
  // A reader in another process trusts nothing it did not write: the
  // extent must lie inside the mapping.
  if (static_cast<int>(extent.stripe) >= arena.stripe_count() ||
      extent.offset > arena.stripe_bytes() || file.size > arena.stripe_bytes() - extent.offset) {
    return absl::DataLossError("RAM copy location out of the arena");
  }
  return FoundCopy{extent, sequence};
}

template <typename Visit>
absl::StatusOr<size_t> VisitCopy(const Slot* slots, uint32_t file_count, const RamArena& arena,
                                 const FileRef& file, uint64_t offset, size_t n, Visit visit) {
  MONARCH_ASSIGN_OR_RETURN(const FoundCopy found, FindCopy(slots, file_count, arena, file));
  const RamArena::Extent& extent = found.extent;
  const uint32_t sequence = found.sequence;
  const Slot& slot = slots[file.id];
  if (offset >= file.size) return 0;
  const size_t count = static_cast<size_t>(std::min<uint64_t>(n, file.size - offset));
  visit(RamArena::Extent{extent.stripe, extent.offset + offset}, count);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (slot.sequence.load(std::memory_order_relaxed) != sequence) {
    return absl::NotFoundError("RAM copy removed during the read");
  }
  return count;
}

absl::StatusOr<size_t> ReadCopy(const Slot* slots, uint32_t file_count, const RamArena& arena,
                                const FileRef& file, uint64_t offset, char* dst, size_t n) {
  return VisitCopy(slots, file_count, arena, file, offset, n,
                   [&](RamArena::Extent at, size_t count) {
                     CopyBytes(dst, arena.data(at), count);
                   });
}

// Copies of at least this many bytes start on a page, so that they can be
// mapped in place: at most 4 KiB of 1 MiB (0.4%) is lost to the alignment.
// Smaller files gain little from a mapping.
constexpr uint64_t kMappableCopyBytes = 1 << 20;
constexpr uint64_t kPageBytes = 4096;

// CopyMapping::OpenCheckedCopy for the driver and for readers in other
// processes: where the copy of `file` lies now, and its slot's sequence.
absl::StatusOr<CopyMapping::MappableCopy> MappableCopyOf(const Slot* slots,
                                                          uint32_t file_count,
                                                          const RamArena& arena,
                                                          const FileRef& file,
                                                          const SourceIdentity* vouched) {
  if (vouched != nullptr) {
    // Mapped only after the tier was asked, the copy might have been held
    // for the mappings that existed then, which did not include this one.
    return absl::FailedPreconditionError("a RAM copy is mapped before its tier is asked");
  }
  MONARCH_ASSIGN_OR_RETURN(const FoundCopy found, FindCopy(slots, file_count, arena, file));
  const RamArena::Extent& extent = found.extent;
  const uint32_t sequence = found.sequence;
  const Slot& slot = slots[file.id];
  if (extent.offset % kPageBytes != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the RAM copy of ", file.name, " does not start on a page"));
  }
  // The tier learns who maps its memory from /proc/<pid>/maps, which a
  // process that is not dumpable hides from it.
  if (::prctl(PR_GET_DUMPABLE) != 1) {
    return absl::FailedPreconditionError(
        "a process that is not dumpable maps no RAM copy: the tier could not see it");
  }
  // The location and the sequence belong together only if no removal came
  // between the two loads.
  if (slot.sequence.load(std::memory_order_acquire) != sequence) {
    return absl::NotFoundError("RAM copy removed meanwhile");
  }
  CopyMapping::MappableCopy copy;
  copy.fd = arena.stripe_fd(static_cast<int>(extent.stripe));
  copy.offset = extent.offset;
  copy.generation = sequence;
  return copy;
}

// CopyMapping::StillCopyOf: no removal since MappableCopyOf. The caller's
// mapping exists by now; the fence orders its mmap() before this load, as
// the remover's sequence bump comes before its walk of the mappings.
bool SameCopy(const Slot* slots, uint32_t file_count, const FileRef& file,
              const CopyMapping::MappableCopy& copy) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return file.id < file_count &&
         slots[file.id].sequence.load(std::memory_order_seq_cst) == copy.generation;
}

uint64_t SlotTableBytes(uint32_t file_count) { return uint64_t{file_count} * sizeof(Slot); }

Slot* ConstructSlots(char* memory, uint32_t file_count) {
  Slot* slots = reinterpret_cast<Slot*>(memory);
  for (uint32_t i = 0; i < file_count; ++i) new (&slots[i]) Slot;
  return slots;
}

class RamDriver final : public StorageDriver,
                        public CopyMapping,
                        public MemoryBacking,
                        public SharedCopies,
                        public KeptCopies {
 public:
  // `journal`: a kept arena's (null otherwise), and what it listed.
  RamDriver(std::unique_ptr<RamArena> arena, uint32_t file_count, ScopedFd slots_fd,
            MappedRegion slots_region, bool keep_block_sums,
            std::unique_ptr<RamJournal> journal, std::map<std::string, KeptCopy> kept)
      : arena_(std::move(arena)),
        file_count_(file_count),
        slots_fd_(std::move(slots_fd)),
        slots_region_(std::move(slots_region)),
        slots_(ConstructSlots(slots_region_.data(), file_count)),
        keep_block_sums_(keep_block_sums),
        journal_(std::move(journal)),
        kept_(std::move(kept)) {
    for (int i = 0; i < arena_->stripe_count(); ++i) {
      struct stat st;
      if (os::Fstat(arena_->stripe_fd(i), &st) == 0) {
        stripe_keys_.push_back(MappedFileKey{static_cast<uint64_t>(st.st_dev),
                                             static_cast<uint64_t>(st.st_ino)});
      } else {
        stripe_keys_.push_back(MappedFileKey{});  // Matches no mapping: never mapped, never held.
      }
    }
  }

  absl::StatusOr<size_t> Read(const FileRef& file, uint64_t offset, char* dst, size_t n) override {
    return ReadCopy(slots_, file_count_, *arena_, file, offset, dst, n);
  }

  absl::Status VisitInMemory(const FileRef& file, uint64_t offset, size_t n,
                             absl::FunctionRef<void(const InMemoryBytes&)> visit) override {
    absl::StatusOr<size_t> visited =
        VisitCopy(slots_, file_count_, *arena_, file, offset, n,
                  [&](RamArena::Extent at, size_t count) {
                    // Looked up inside the seqlock's window: if the copy was
                    // removed meanwhile (and its sums with it), the visit
                    // fails below, whatever was found.
                    InMemoryBytes shown{arena_->data(at), std::nullopt};
                    if (keep_block_sums_ && count == n) shown.crc32c = RangeCrc(file, offset, n);
                    visit(shown);
                  });
    if (!visited.ok()) return visited.status();
    if (*visited != n) return absl::OutOfRangeError("range outside the RAM copy");
    return absl::OkStatus();
  }

  DriverCapabilities capabilities() override {
    DriverCapabilities can = StorageDriver::capabilities();
    if (journal_ == nullptr) can.kept = nullptr;
    return can;
  }

  // The copies the journal listed, each checked against its CRC32C where it
  // lies; AdoptionDone() frees what none adopted, and starts the journal
  // afresh.
  absl::Status ScanCopies(CopyVisitor visit) override {
    adopting_ = true;
    std::map<uint64_t, uint64_t> taken;  // Begin -> end, as stripe << 56 | offset.
    auto overlaps = [&](const KeptCopy& copy) {
      const uint64_t begin = uint64_t{copy.stripe} << 56 | copy.offset;
      const uint64_t end = begin + copy.length;
      auto next = taken.lower_bound(begin);
      if (copy.length == 0) return false;
      if (next != taken.end() && next->first < end) return true;
      if (next != taken.begin() && std::prev(next)->second > begin) return true;
      taken.emplace(begin, end);
      return false;
    };
    for (auto it = kept_.begin(); it != kept_.end();) {
      const KeptCopy& copy = it->second;
      const bool fits = copy.stripe < static_cast<uint32_t>(arena_->stripe_count()) &&
                        copy.offset % 64 == 0 && copy.offset <= arena_->stripe_bytes() &&
                        copy.length <= arena_->stripe_bytes() - copy.offset &&
                        copy.source.size == copy.length;
      const bool intact =
          fits && !overlaps(copy) &&
          Crc32c(arena_->data(RamArena::Extent{copy.stripe, copy.offset}), copy.length) ==
              copy.crc32c;
      visit(it->first, intact ? &copy.source : nullptr);
      it = intact ? std::next(it) : kept_.erase(it);  // Only an intact copy may be adopted.
    }
    return absl::OkStatus();
  }
  void CopyAdopted(const FileRef& file) override {
    auto it = kept_.find(std::string(file.name));
    if (!adopting_ || it == kept_.end() || file.id >= file_count_ ||
        file.size != it->second.length) {
      return;
    }
    slots_[file.id].location.store(Pack({it->second.stripe, it->second.offset}),
                                   std::memory_order_release);
    adopted_[file.id] = std::move(it->second);
    kept_.erase(it);
  }
  void AdoptionDone() override {
    std::vector<std::pair<RamArena::Extent, uint64_t>> extents;
    for (const auto& [id, copy] : adopted_) {
      if (copy.length > 0) extents.push_back({{copy.stripe, copy.offset}, copy.length});
    }
    arena_->Adopt(extents);
    kept_.clear();
    adopting_ = false;
    MutexLock lock(&remove_mu_);
    journal_->Rewrite(std::move(adopted_));
  }

  uint64_t ReleaseFreeMemory() override { return arena_->ReleaseFreePages(); }
  void AllowMemoryAhead(uint64_t bytes) override { arena_->AllowBackingAhead(bytes); }

  std::optional<SourceIdentity> MarkMapped(const FileRef& file) override {
    if (file.id >= file_count_ || file.size < kMappableCopyBytes) return std::nullopt;
    MutexLock lock(&remove_mu_);
    if (slots_[file.id].location.load(std::memory_order_relaxed) == 0) return std::nullopt;
    // The asker mapped the copy already (MapCopiesFound): Remove() holds
    // its copies from now on, until a walk finds nobody mapping them.
    if (first_handed_out_ == 0) first_handed_out_ = BootTimeNanos();
    maybe_mapped_[file.id] = MaybeMapped{walks_, file.size};
    maybe_mapped_count_.store(maybe_mapped_.size(), std::memory_order_relaxed);
    return SourceIdentity::Of(file);
  }
  absl::StatusOr<MappableCopy> OpenCheckedCopy(const FileRef& file,
                                               const SourceIdentity* checked) override {
    return MappableCopyOf(slots_, file_count_, *arena_, file, checked);
  }
  bool StillCopyOf(const FileRef& file, const MappableCopy& copy) override {
    return SameCopy(slots_, file_count_, file, copy);
  }
  uint64_t HeldBytes() const override { return held_bytes_.load(std::memory_order_relaxed); }
  bool MayBeMapped(const FileRef& file) override {
    if (maybe_mapped_count_.load(std::memory_order_relaxed) == 0) return false;
    MutexLock lock(&remove_mu_);
    return maybe_mapped_.contains(file.id);
  }

  uint64_t ReleaseUnmapped(MappingWalk walk) override {
    if (held_bytes_.load(std::memory_order_relaxed) == 0 &&
        maybe_mapped_count_.load(std::memory_order_relaxed) == 0) {
      return 0;
    }
    // Only copies held before the walk starts: a mapping of one held later
    // may have been made after the walk read that process's mappings.
    std::vector<HeldCopy> candidates;
    uint64_t number = 0;
    int64_t since = 0;
    {
      MutexLock lock(&remove_mu_);
      candidates.swap(held_);
      number = ++walks_;
      since = first_handed_out_;
    }
    absl::StatusOr<std::vector<MappedFileRange>> mapped = walk(stripe_keys_, since);
    auto in_use = [&](RamArena::Extent extent, uint64_t bytes) {
      return !mapped.ok() ||
             std::any_of(mapped->begin(), mapped->end(), [&](const MappedFileRange& range) {
               return range.file == stripe_keys_[extent.stripe] &&
                      range.begin < extent.offset + bytes && extent.offset < range.end;
             });
    };
    std::vector<HeldCopy> still_mapped;
    uint64_t released = 0;
    for (const HeldCopy& held : candidates) {
      if (in_use(held.extent, held.bytes)) {
        still_mapped.push_back(held);
      } else {
        arena_->Free(held.extent, held.bytes);
        released += held.bytes;
      }
    }
    MutexLock lock(&remove_mu_);
    held_.insert(held_.end(), still_mapped.begin(), still_mapped.end());
    held_bytes_.fetch_sub(released, std::memory_order_relaxed);
    // Copies nobody maps may be evicted again, unless asked about meanwhile.
    for (auto it = maybe_mapped_.begin(); it != maybe_mapped_.end();) {
      const uint64_t location = slots_[it->first].location.load(std::memory_order_relaxed);
      const bool keep = it->second.asked_in_walk >= number ||
                        (location != 0 && in_use(Unpack(location), it->second.bytes));
      if (keep) {
        ++it;
      } else {
        maybe_mapped_.erase(it++);
      }
    }
    maybe_mapped_count_.store(maybe_mapped_.size(), std::memory_order_relaxed);
    return released;
  }

  void ReportTierCounters(CounterSink& sink) const override {
    sink.Gauge("resident_bytes", arena_->resident_bytes(),
               "Memory the RAM tier's arena holds now: its copies', and freed pages not yet "
               "given back (they are given back when memory pressure shrinks the tier).");
    sink.Counter("backed_ahead_bytes", arena_->backed_ahead_bytes(),
                 "Memory allocated ahead of the copies (tiers[i].back_ahead), in all.");
    sink.Gauge("held_bytes", HeldBytes(),
               "Removed copies held because a process may still map them in place "
               "(Monarch::MapCopies): they count against the capacity until none does.");
  }

  std::vector<int> SharedMemoryDescriptors() const override {
    std::vector<int> fds{slots_fd_.get()};
    for (int i = 0; i < arena_->stripe_count(); ++i) fds.push_back(arena_->stripe_fd(i));
    return fds;
  }

  absl::StatusOr<std::unique_ptr<CopyWriter>> NewWriter(const FileRef& file) override {
    if (file.id >= file_count_) return absl::InvalidArgumentError("file id outside the namespace");
    RamArena::Extent extent;
    if (file.size > 0) {
      MONARCH_ASSIGN_OR_RETURN(
          extent, arena_->Allocate(file.size, file.size >= kMappableCopyBytes ? kPageBytes : 64));
    }
    return std::unique_ptr<CopyWriter>(new Writer(this, file, extent));
  }

  absl::Status Remove(const FileRef& file) override {
    if (file.id >= file_count_) return absl::NotFoundError("no RAM copy");
    // A kept copy not adopted: AdoptionDone() frees it.
    if (adopting_ && slots_[file.id].location.load() == 0) return absl::OkStatus();
    Slot& slot = slots_[file.id];
    MutexLock lock(&remove_mu_);  // Serializes removers of the same slot; readers never take it.
    const uint64_t location = slot.location.load(std::memory_order_relaxed);
    if (location == 0) return absl::NotFoundError("no RAM copy");
    slot.sequence.fetch_add(1, std::memory_order_relaxed);  // Odd: being removed.
    std::atomic_thread_fence(std::memory_order_release);
    slot.location.store(0, std::memory_order_relaxed);
    slot.sequence.fetch_add(1, std::memory_order_release);
    if (journal_ != nullptr) journal_->Removed(file.id);
    if (keep_block_sums_) {
      MutexLock sums_lock(&sums_mu_);
      block_sums_.erase(file.id);
    }
    if (file.size == 0) return absl::OkStatus();
    if (maybe_mapped_.contains(file.id)) {
      held_.push_back(HeldCopy{Unpack(location), file.size});
      held_bytes_.fetch_add(file.size, std::memory_order_relaxed);
    } else {
      arena_->Free(Unpack(location), file.size);
    }
    return absl::OkStatus();
  }

 private:
  // The CRC32C of [offset, offset + n) of `file`'s copy from its block sums:
  // none unless the range is whole blocks (the last may end the file).
  std::optional<uint32_t> RangeCrc(const FileRef& file, uint64_t offset, size_t n) {
    const uint64_t end = offset + n;
    constexpr uint64_t kBlock = kChecksumBlockBytes;
    if (n == 0 || offset % kBlock != 0 || (end % kBlock != 0 && end != file.size)) {
      return std::nullopt;
    }
    MutexLock lock(&sums_mu_);
    auto it = block_sums_.find(file.id);
    if (it == block_sums_.end() || it->second.size() != (file.size + kBlock - 1) / kBlock) {
      return std::nullopt;
    }
    const std::vector<uint32_t>& sums = it->second;
    uint64_t block = offset / kBlock;
    uint32_t crc = sums[block];
    for (++block; block * kBlock < end; ++block) {
      crc = Crc32cConcat(crc, sums[block], std::min(kBlock, file.size - block * kBlock));
    }
    return crc;
  }

  // Streams chunks into the file's extent; Commit() publishes the slot.
  class Writer final : public CopyWriter {
   public:
    Writer(RamDriver* driver, const FileRef& file, RamArena::Extent extent)
        : driver_(driver), id_(file.id), size_(file.size), extent_(extent) {
      if (driver->journal_ != nullptr) name_ = std::string(file.name);
      if (driver->keep_block_sums_) sums_.emplace(size_);
    }
    ~Writer() override {
      if (!committed_ && size_ > 0) driver_->arena_->Free(extent_, size_);
    }

    absl::Status Write(uint64_t offset, const char* data, size_t n) override {
      if (offset > size_ || n > size_ - offset)
        return absl::OutOfRangeError("write past the end of the file");
      MONARCH_RETURN_IF_ERROR(driver_->arena_->Write(extent_, offset, data, n));
      // A write that is not whole blocks (CopyWriter's contract allows
      // only the last one short) leaves the sums incomplete: none are kept.
      if (sums_) (void)sums_->Add(offset, data, n);
      return absl::OkStatus();
    }
    absl::StatusOr<size_t> ReadBack(uint64_t offset, char* dst, size_t n) override {
      if (offset >= size_) return 0;
      const size_t count = static_cast<size_t>(std::min<uint64_t>(n, size_ - offset));
      CopyBytes(dst, driver_->arena_->data(extent_) + offset, count);
      return count;
    }
    absl::Status Commit(const SourceIdentity& source) override {
      // The copy's first reader would otherwise fault on every page.
      if (size_ > 0) driver_->arena_->PrepareForReading(extent_, size_);
      // Kept: the journal's record, its CRC computed off the lock.
      std::optional<KeptCopy> kept;
      if (driver_->journal_ != nullptr && source.size == size_) {
        kept = KeptCopy{std::move(name_), source, extent_.stripe, extent_.offset, size_,
                        size_ == 0 ? 0 : Crc32c(driver_->arena_->data(extent_), size_)};
      }
      Slot& slot = driver_->slots_[id_];
      MutexLock lock(&driver_->remove_mu_);
      const uint64_t previous = slot.location.load(std::memory_order_relaxed);
      if (previous != 0) {
        return absl::AlreadyExistsError(absl::StrCat("file ", id_, " already has a RAM copy"));
      }
      if (sums_ && sums_->complete()) {
        MutexLock sums_lock(&driver_->sums_mu_);
        driver_->block_sums_[id_] = sums_->Take();
      }
      // The writes happened before; release order makes them visible to
      // a reader that loads the location with acquire order.
      slot.location.store(Pack(extent_), std::memory_order_release);
      committed_ = true;
      // After the bytes, which are in the tmpfs file already: a service
      // killed from here on leaves the record and the copy.
      if (kept) driver_->journal_->Committed(id_, std::move(*kept));
      return absl::OkStatus();
    }

   private:
    RamDriver* const driver_;
    const uint32_t id_;
    const uint64_t size_;
    const RamArena::Extent extent_;
    bool committed_ = false;
    std::string name_;  // Kept arena: the file's, for the journal.
    // With peers: filled by concurrent Write()s for disjoint blocks, taken
    // by Commit(), which comes after every Write().
    std::optional<BlockSums> sums_;
  };

  const std::unique_ptr<RamArena> arena_;
  const uint32_t file_count_;
  const ScopedFd slots_fd_;
  const MappedRegion slots_region_;
  Slot* const slots_;  // In slots_region_.
  const bool keep_block_sums_;
  std::vector<MappedFileKey> stripe_keys_;  // By stripe: how /proc/<pid>/maps names it.
  // A kept arena's: written under remove_mu_ once ScanCopies() began it.
  const std::unique_ptr<RamJournal> journal_;
  // From ScanCopies() to AdoptionDone() (one thread, before any other
  // call): what the journal listed (once visited, the intact copies only),
  // and the copies adopted.
  bool adopting_ = false;
  std::map<std::string, KeptCopy> kept_;
  absl::flat_hash_map<uint32_t, KeptCopy> adopted_;
  Mutex remove_mu_;
  int64_t first_handed_out_ ABSL_GUARDED_BY(remove_mu_) = 0;  // BootTimeNanos().
  // Files whose copy may be mapped now (MayBeMapped): asked about
  // (MarkMapped) in walk `asked_in_walk` or later, or found mapped by the
  // last walk. A copy of one of them is held once removed; another's is
  // freed at once, since every mapping of it existed before it was asked
  // about, and the walk that dropped it saw them all gone.
  struct MaybeMapped {
    uint64_t asked_in_walk = 0;
    uint64_t bytes = 0;
  };
  absl::flat_hash_map<uint32_t, MaybeMapped> maybe_mapped_ ABSL_GUARDED_BY(remove_mu_);
  std::atomic<size_t> maybe_mapped_count_{0};
  uint64_t walks_ ABSL_GUARDED_BY(remove_mu_) = 0;  // Walks started.
  // Removed copies of those, not freed yet (ReleaseUnmapped).
  struct HeldCopy {
    RamArena::Extent extent;
    uint64_t bytes = 0;
  };
  std::vector<HeldCopy> held_ ABSL_GUARDED_BY(remove_mu_);
  std::atomic<uint64_t> held_bytes_{0};
  // Taken after remove_mu_ when both are. Heap memory beside the tier's
  // capacity: 4 bytes per 4 KiB of copies (0.1%), plus a map entry a copy.
  Mutex sums_mu_ ABSL_ACQUIRED_AFTER(remove_mu_);
  absl::flat_hash_map<uint32_t, std::vector<uint32_t>> block_sums_ ABSL_GUARDED_BY(sums_mu_);
};

// The service's RAM tier seen from a client: reads only.
//
// Unless told to map from the start, reads copy with pread() of the arena's
// memfds until this process reads a file again, and from its mapping from
// then on. Copying from a mapping is 2-3x faster once its pages are mapped,
// but mapping them (a page fault per 16 pages, and unmapping them at exit)
// costs more than pread's copy when several processes map at once. A
// process that reads each file once, as a DataLoader worker started for one
// epoch does, would pay the faults and never use the pages again; one that
// reads files again (a persistent worker) earns them back
// (bench/results/python.md). A read again is a read of a file this process
// has read to its end: one bit per file.
class RamReader final : public StorageDriver, public CopyMapping {
 public:
  RamReader(std::unique_ptr<RamArena> arena, uint32_t file_count, MappedRegion slots,
            bool map_from_start)
      : arena_(std::move(arena)),
        file_count_(file_count),
        slots_region_(std::move(slots)),
        read_to_end_(map_from_start ? nullptr
                                    : new std::atomic<uint64_t>[(file_count + 63) / 64]()),
        maps_(map_from_start) {}

  absl::StatusOr<size_t> Read(const FileRef& file, uint64_t offset, char* dst, size_t n) override {
    const Slot* slots = reinterpret_cast<const Slot*>(slots_region_.data());
    if (maps_.load(std::memory_order_relaxed) || file.id >= file_count_) {
      return ReadCopy(slots, file_count_, *arena_, file, offset, dst, n);
    }
    std::atomic<uint64_t>& word = read_to_end_[file.id / 64];
    const uint64_t bit = uint64_t{1} << (file.id % 64);
    if ((word.load(std::memory_order_relaxed) & bit) != 0) {
      maps_.store(true, std::memory_order_relaxed);
      return ReadCopy(slots, file_count_, *arena_, file, offset, dst, n);
    }
    absl::StatusOr<size_t> read = VisitCopy(slots, file_count_, *arena_, file, offset, n,
                                            [&](RamArena::Extent at, size_t count) {
                                              arena_->CopyWithoutMapping(at, dst, count);
                                            });
    if (read.ok() && offset + *read >= file.size) word.fetch_or(bit, std::memory_order_relaxed);
    return read;
  }
  // The service marks copies mapped (kCheckedCopies), asked once this
  // process mapped them: it then holds them while this process maps them.
  std::optional<SourceIdentity> MarkMapped(const FileRef&) override { return std::nullopt; }
  absl::StatusOr<MappableCopy> OpenCheckedCopy(const FileRef& file,
                                               const SourceIdentity* checked) override {
    const Slot* slots = reinterpret_cast<const Slot*>(slots_region_.data());
    return MappableCopyOf(slots, file_count_, *arena_, file, checked);
  }
  bool StillCopyOf(const FileRef& file, const MappableCopy& copy) override {
    return SameCopy(reinterpret_cast<const Slot*>(slots_region_.data()), file_count_, file, copy);
  }
  absl::StatusOr<std::unique_ptr<CopyWriter>> NewWriter(const FileRef&) override {
    return absl::PermissionDeniedError("the node service's RAM tier is read-only in a client");
  }
  absl::Status Remove(const FileRef&) override {
    return absl::PermissionDeniedError("the node service's RAM tier is read-only in a client");
  }

 private:
  const std::unique_ptr<RamArena> arena_;
  const uint32_t file_count_;
  const MappedRegion slots_region_;
  // Bit `id`: this process has read file `id`'s copy up to its end. Null
  // when mapping from the start.
  const std::unique_ptr<std::atomic<uint64_t>[]> read_to_end_;
  std::atomic<bool> maps_;  // Reads copy from the mapping; never goes back.
};

}  // namespace

absl::StatusOr<std::unique_ptr<StorageDriver>> NewRamDriver(const std::string& name,
                                                            uint64_t capacity,
                                                            uint32_t file_count,
                                                            const RamTierOptions& options) {
  // Each stripe has room for the capacity plus each file's rounding to a
  // 64-byte extent, and the pages skipped to start copies of 1 MiB or more
  // on a page (under 4 KiB a MiB). Writers are the placement threads plus,
  // when staging is over budget, every reader: 8 stripes keep them from
  // queueing on one memfd's inode lock, for the cost of 8 descriptors and
  // mappings.
  constexpr int kStripes = 8;
  RamArena::Options arena_options;
  arena_options.huge_pages = options.huge_pages;
  arena_options.releasable = options.releasable;
  arena_options.back_ahead = options.back_ahead;
  arena_options.kept_dir = options.kept_dir;
  // A copy of the service before mapped in place (Monarch::MapCopies) is a
  // private mapping of a stripe file, which no seqlock guards: while any
  // process may map one, the kept arena is left to it, and this one starts
  // on new files.
  std::vector<MappedFileKey> kept_files;
  for (int i = 0; !options.kept_dir.empty() && i < kStripes; ++i) {
    struct stat st;
    if (os::Stat(JoinPath(options.kept_dir, absl::StrCat("stripe-", i)).c_str(), &st) == 0) {
      kept_files.push_back({static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)});
    }
  }
  if (!kept_files.empty()) {
    // No process older than the kept directory (KeptRamDirectory) can map it.
    int64_t since = 0;
    struct stat made;
    if (os::Stat(JoinPath(options.kept_dir, "../runtime-dir").c_str(), &made) == 0) {
      struct timespec now;
      ::clock_gettime(CLOCK_REALTIME, &now);
      since = BootTimeNanos() - (TimespecNanos(now) - TimespecNanos(made.st_mtim)) - 1000000000;
    }
    absl::StatusOr<std::vector<MappedFileRange>> mapped = FindPrivateMappings(kept_files, since);
    if (!mapped.ok() || !mapped->empty()) {
      MONARCH_LOG(kWarning, "RAM tier ", name, ": discarding the copies kept in ",
                  options.kept_dir, ": ",
                  mapped.ok() ? "a process maps them in place" : mapped.status().message());
      for (const char* file : {"journal", "slots"}) os::Unlink(JoinPath(options.kept_dir, file).c_str());
      for (int i = 0; i < kStripes; ++i) {
        os::Unlink(JoinPath(options.kept_dir, absl::StrCat("stripe-", i)).c_str());
      }
    }
  }
  const uint64_t arena_bytes = capacity + capacity / 256 + 64 * uint64_t{file_count};
  MONARCH_ASSIGN_OR_RETURN(std::unique_ptr<RamArena> arena,
                           RamArena::Create(arena_bytes, kStripes,
                                            absl::StrCat("monarch-ram:", name), arena_options));
  if (options.kept_dir.empty()) {
    MONARCH_ASSIGN_OR_RETURN(WriteSealedRegion slots,
                             CreateWriteSealedRegion(absl::StrCat("monarch-ram-slots:", name),
                                                     SlotTableBytes(file_count)));
    return std::unique_ptr<StorageDriver>(new RamDriver(std::move(arena), file_count,
                                                        std::move(slots.fd),
                                                        std::move(slots.writable),
                                                        options.keep_block_sums, nullptr, {}));
  }
  // Kept: the slot table before is cleared, as removals do, for a client of
  // the service before that still reads through it; then a new one.
  const std::string slots_path = JoinPath(options.kept_dir, "slots");
  if (ScopedFd old(os::Open(slots_path.c_str(), O_RDWR | O_CLOEXEC)); old.valid()) {
    if (absl::StatusOr<MappedRegion> before = MappedRegion::Map(old.get(), true, true); before.ok()) {
      Slot* slot = reinterpret_cast<Slot*>(before->data());
      for (uint64_t i = 0; i < before->size() / sizeof(Slot); ++i, ++slot) {
        if (slot->location.load() == 0) continue;
        slot->sequence.fetch_add(1);
        slot->location.store(0);
        slot->sequence.fetch_add(1);
      }
    }
    os::Unlink(slots_path.c_str());
  }
  ScopedFd slots_fd(os::Open(slots_path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!slots_fd.valid() ||
      os::Ftruncate(slots_fd.get(), static_cast<off_t>(
                                        (SlotTableBytes(file_count) + kPageBytes) / kPageBytes *
                                        kPageBytes)) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("create ", slots_path));
  }
  MONARCH_ASSIGN_OR_RETURN(MappedRegion slots, MappedRegion::Map(slots_fd.get(), true, true));
  auto journal = std::make_unique<RamJournal>(JoinPath(options.kept_dir, "journal"), kStripes,
                                              capacity);
  absl::StatusOr<std::map<std::string, KeptCopy>> kept = journal->Read();
  if (!kept.ok() && !absl::IsNotFound(kept.status())) {
    MONARCH_LOG(kWarning, "RAM tier ", name, ": discarding the copies kept in ", options.kept_dir,
                ": ", kept.status().message());
  }
  return std::unique_ptr<StorageDriver>(
      new RamDriver(std::move(arena), file_count, std::move(slots_fd), std::move(slots),
                    options.keep_block_sums, std::move(journal),
                    kept.ok() ? std::move(*kept) : std::map<std::string, KeptCopy>{}));
}

absl::StatusOr<std::unique_ptr<StorageDriver>> NewRamReader(std::vector<ScopedFd> fds,
                                                            uint32_t file_count,
                                                            bool map_from_start) {
  if (fds.size() < 2) return absl::InvalidArgumentError("a RAM reader needs slots and stripes");
  MONARCH_ASSIGN_OR_RETURN(MappedRegion slots, MappedRegion::Map(fds[0].get(), false, true));
  if (slots.size() < SlotTableBytes(file_count)) {
    return absl::FailedPreconditionError("RAM slot table smaller than the namespace");
  }
  std::vector<ScopedFd> stripes;
  for (size_t i = 1; i < fds.size(); ++i) stripes.push_back(std::move(fds[i]));
  MONARCH_ASSIGN_OR_RETURN(std::unique_ptr<RamArena> arena, RamArena::MapReadOnly(std::move(stripes)));
  return std::unique_ptr<StorageDriver>(
      new RamReader(std::move(arena), file_count, std::move(slots), map_from_start));
}

}  // namespace monarch
