// Evictor: CLOCK and next-use eviction, and demotion tier to tier.

#include "placement/evictor.h"

#include <algorithm>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace monarch {

Evictor::Evictor(const std::vector<std::unique_ptr<Tier>>* tiers, const Namespace* ns,
                 const PlacementPolicy* policy, ReadPins* pins, FileLocks* locks,
                 ChunkPool* staging, uint64_t chunk_bytes, MappingWatch* mappings)
    : tiers_(tiers),
      namespace_(ns),
      policy_(policy),
      pins_(pins),
      locks_(locks),
      staging_(staging),
      chunk_bytes_(chunk_bytes),
      mappings_(mappings),
      source_index_(static_cast<int>(tiers->size()) - 1),
      first_origin_(FirstReadOnlyTier(*tiers)),
      cache_tiers_(static_cast<int>(std::count_if(tiers->begin(), tiers->end(),
                                                  [](const auto& t) { return t->is_cache(); }))) {}

bool Evictor::MakeRoom(uint32_t id_wanted, uint64_t file_bytes) {
  const NextUseOracle* future = oracle_.load(std::memory_order_acquire);
  if (future != nullptr && future->known()) {
    // The fastest tier whose last-read copy is read later than this file.
    const uint64_t wanted_next = future->NextUse(id_wanted);
    // Removed copies no process maps any more make room first.
    for (int t = 0; t < first_origin_; ++t) ReleaseUnmapped(t);
    MutexLock lock(&mu_);
    for (int t = 0; t < first_origin_; ++t) {
      const Tier& tier = *(*tiers_)[t];
      const uint64_t need = tier.Footprint(file_bytes);
      if (!tier.is_cache() || tier.config().capacity_bytes < need) continue;
      if (MakeRoomByNextUseLocked(t, need, wanted_next, *future)) return true;
    }
    // Every copy is read again before this file: keep them, and read this
    // one from the source this time.
    admissions_declined_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  const int target = FastestCacheTierFor(*tiers_, file_bytes);
  if (target < 0) return false;
  Tier& tier = *(*tiers_)[target];
  const uint64_t need = tier.Footprint(file_bytes);
  const uint32_t files = namespace_->entry_count();
  ReleaseUnmapped(target);
  MutexLock lock(&mu_);
  // Two turns of the hand: the first may only clear reference bits.
  for (uint64_t scanned = 0; tier.free_bytes() < need && scanned < 2 * uint64_t{files};
       ++scanned) {
    const uint32_t id = hand_;
    hand_ = hand_ + 1 < files ? hand_ + 1 : 0;
    // The tier slot first: most entries are elsewhere, and a whole entry
    // is made from the namespace's table.
    if (namespace_->tier(id).load(std::memory_order_acquire) != target) continue;
    if (pins_->TakeReference(id)) continue;  // Second chance.
    if (pins_->IsPinned(id) || !policy_->MayEvict(id)) continue;
    const FileEntry victim = namespace_->entry(id);
    if (tier.MayBeMapped(victim.ref)) continue;  // Evicted, it would only be held.
    EvictLocked(victim, target);
  }
  if (tier.free_bytes() >= need) return true;
  eviction_failures_.fetch_add(1, std::memory_order_relaxed);
  return false;
}

Evictor::ShedResult Evictor::ShedTier(int tier_index, uint64_t target,
                                      const std::atomic<bool>& stop) {
  ShedResult result;
  Tier& tier = *(*tiers_)[tier_index];
  // Lowered first, so that promotions starting meanwhile do not take back
  // the room being made.
  if (target < tier.limit()) tier.SetLimit(target);
  ReleaseUnmapped(tier_index);
  const uint32_t files = namespace_->entry_count();
  MutexLock lock(&mu_);
  for (uint64_t scanned = 0; tier.reserved_bytes() > target && scanned < 2 * uint64_t{files} &&
                             !stop.load(std::memory_order_relaxed);
       ++scanned) {
    const uint32_t id = hand_;
    hand_ = hand_ + 1 < files ? hand_ + 1 : 0;
    if (namespace_->tier(id).load(std::memory_order_acquire) != tier_index) continue;
    if (scanned < files && pins_->TakeReference(id)) continue;  // Second chance, once.
    const FileEntry victim = namespace_->entry(id);
    // A copy a process maps frees no memory when dropped: it is held.
    if (pins_->IsPinned(id) || tier.MayBeMapped(victim.ref)) continue;
    const uint64_t size = victim.ref.size;
    int lower = -1;
    for (int t = tier_index + 1; t < first_origin_; ++t) {
      const Tier& candidate = *(*tiers_)[t];
      // Not into another RAM tier: that memory is under the same pressure.
      if (candidate.is_cache() && candidate.config().kind != TierKind::kRam &&
          candidate.free_bytes() >= candidate.Footprint(size)) {
        lower = t;
        break;
      }
    }
    if (lower >= 0 && DemoteLocked(victim, tier_index, lower)) {
      ++result.files;
      result.demoted_bytes += size;
    } else if (EvictLocked(victim, tier_index)) {
      ++result.files;
      result.dropped_bytes += size;
    }
  }
  return result;
}

void Evictor::ReleaseUnmapped(int tier) {
  SharedCopies* shared = (*tiers_)[tier]->can().shared;
  if (shared == nullptr || mappings_ == nullptr) return;
  mappings_->ReleaseUnmapped(
      tier, [shared](MappingWalk walk) { return shared->ReleaseUnmapped(walk); });
}

bool Evictor::WantsFasterTier(const FileEntry& entry) const {
  if (cache_tiers_ < 2 || !policy_->MakesRoomFor(entry.ref.id) ||
      entry.state->load(std::memory_order_relaxed) != PlacementState::kOnSource) {
    return false;
  }
  const NextUseOracle* future = oracle_.load(std::memory_order_acquire);
  if (future == nullptr || !future->known()) return false;
  const int fastest = FastestCacheTierFor(*tiers_, entry.ref.size);
  if (fastest < 0) return false;
  const Tier& tier = *(*tiers_)[fastest];
  return tier.free_bytes() < tier.Footprint(entry.ref.size);
}

bool Evictor::MakeRoomByNextUseLocked(int target, uint64_t need, uint64_t next_use,
                                      const NextUseOracle& future) {
  // Candidates per eviction: a sample from the hand's walk, not every copy
  // (which would cost a pass over the namespace per miss).
  constexpr int kCandidates = 32;
  Tier& tier = *(*tiers_)[target];
  const uint32_t files = namespace_->entry_count();
  // Bounded: a victim that changed meanwhile is not moved and is sampled
  // again; a file needs a few evictions at most.
  for (int round = 0; tier.free_bytes() < need; ++round) {
    if (round == 64) {
      eviction_failures_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    int64_t victim = -1;
    uint64_t victim_next = 0;
    int found = 0;
    for (uint32_t scanned = 0; scanned < files && found < kCandidates; ++scanned) {
      const uint32_t id = hand_;
      hand_ = hand_ + 1 < files ? hand_ + 1 : 0;
      if (namespace_->tier(id).load(std::memory_order_acquire) != target) continue;
      if (pins_->IsPinned(id) || !policy_->MayEvict(id)) continue;
      if (tier.MayBeMapped(namespace_->entry(id).ref)) continue;
      ++found;
      const uint64_t next = future.NextUse(id);
      if (victim < 0 || next > victim_next) {
        victim = id;
        victim_next = next;
      }
    }
    if (victim < 0 || victim_next <= next_use) return false;
    MoveDownLocked(namespace_->entry(static_cast<uint32_t>(victim)), target, victim_next, future);
  }
  return true;
}

void Evictor::MoveDownLocked(const FileEntry& entry, int tier, uint64_t next_use,
                             const NextUseOracle& future) {
  // A copy never read again, or read after everything a tier below holds,
  // is not worth the copying: MakeRoomByNextUseLocked says no to it there.
  for (int t = tier + 1; t < first_origin_; ++t) {
    const Tier& lower = *(*tiers_)[t];
    const uint64_t need = lower.Footprint(entry.ref.size);
    if (!lower.is_cache() || lower.config().capacity_bytes < need) continue;
    if (!MakeRoomByNextUseLocked(t, need, next_use, future)) continue;
    if (DemoteLocked(entry, tier, t)) return;
    break;
  }
  EvictLocked(entry, tier);
}

bool Evictor::DemoteLocked(const FileEntry& entry, int from, int to) {
  const uint32_t id = entry.ref.id;
  if (entry.tier->load(std::memory_order_acquire) != from ||
      entry.state->load(std::memory_order_acquire) != PlacementState::kInTier) {
    return false;
  }
  if (!(*tiers_)[to]->TryReserve(entry.ref.size)) return false;
  // Pinned as a reader's copy is, which keeps it from being picked for
  // eviction or another move while mu_ is released.
  pins_->Pin(id);
  mu_.Unlock();
  const bool moved = CopyDown(entry, from, to);
  pins_->Unpin(id);
  mu_.Lock();
  return moved;
}

bool Evictor::CopyDown(const FileEntry& entry, int from, int to) {
  const uint32_t id = entry.ref.id;
  Tier& upper = *(*tiers_)[from];
  Tier& lower = *(*tiers_)[to];
  // Readers go on reading the upper copy meanwhile. One that finds it
  // damaged drops it, which the switch below notices.
  bool upper_failed = false;  // Else the lower tier's writer failed, if anything did.
  absl::Status copied = [&]() -> absl::Status {
    MONARCH_ASSIGN_OR_RETURN(std::unique_ptr<CopyWriter> writer,
                             lower.driver().NewWriter(entry.ref));
    const size_t buffer_bytes =
        static_cast<size_t>(std::min<uint64_t>(chunk_bytes_, entry.ref.size));
    char* buffer = staging_->Acquire(buffer_bytes, ChunkPool::Share::kReaders);
    absl::Cleanup release = [&] { staging_->Release(buffer, buffer_bytes); };
    for (uint64_t offset = 0; offset < entry.ref.size; offset += chunk_bytes_) {
      const size_t n =
          static_cast<size_t>(std::min<uint64_t>(chunk_bytes_, entry.ref.size - offset));
      absl::StatusOr<size_t> got = upper.driver().Read(entry.ref, offset, buffer, n);
      if (!got.ok() || *got != n) {
        upper_failed = true;
        return got.ok() ? absl::DataLossError(absl::StrCat("short read of the copy at ", offset))
                        : got.status();
      }
      MONARCH_RETURN_IF_ERROR(writer->Write(offset, buffer, n));
    }
    return writer->Commit(namespace_->identity(id));
  }();
  bool switched = false;
  if (copied.ok()) {
    MutexLock lock(&locks_->LockOf(id));
    int expected = from;
    switched = entry.state->load(std::memory_order_relaxed) == PlacementState::kInTier &&
               entry.tier->compare_exchange_strong(expected, to, std::memory_order_seq_cst);
  }
  if (!switched) {
    if (copied.ok()) {
      (void)lower.driver().Remove(entry.ref);  // The upper copy was dropped meanwhile.
    } else {
      MONARCH_LOG(kWarning, "moving ", entry.ref.name, " from tier '", upper.config().name,
                  "' to '", lower.config().name, "' failed; it is evicted instead: ",
                  copied.ToString());
    }
    lower.Release(entry.ref.size);
    if (!copied.ok() && !upper_failed) {
      lower.CountWriteError();
      // The device filled up before the configured capacity: no more copies
      // are sent there (marked after the release, so that its room is not
      // counted as free).
      if (absl::IsResourceExhausted(copied)) lower.MarkFull();
    }
    return false;
  }
  lower.Commit(entry.ref.size);
  // Readers already inside the upper copy finish first (ReadPins); the one
  // left is this thread's pin. Each is one read of the tier away.
  pins_->WaitForReaders(id, /*own=*/1);
  absl::Status removed = upper.driver().Remove(entry.ref);
  if (!removed.ok() && !absl::IsNotFound(removed)) {
    MONARCH_LOG(kWarning, "removing ", entry.ref.name, " from tier '", upper.config().name,
                "' after moving it down: ", removed.ToString());
  }
  upper.Drop(entry.ref.size);
  demotions_.fetch_add(1, std::memory_order_relaxed);
  demoted_bytes_.fetch_add(entry.ref.size, std::memory_order_relaxed);
  return true;
}

bool Evictor::EvictLocked(const FileEntry& entry, int tier_index) {
  const uint32_t id = entry.ref.id;
  Mutex& file_lock = locks_->LockOf(id);
  {
    MutexLock lock(&file_lock);
    if (entry.tier->load(std::memory_order_relaxed) != tier_index ||
        entry.state->load(std::memory_order_relaxed) != PlacementState::kInTier) {
      return false;
    }
    // New readers go to the source from here on; while the copy is being
    // deleted no promotion may start (a new copy could be deleted with it),
    // so the file reads as staying on the source until then.
    entry.tier->store(source_index_, std::memory_order_seq_cst);
    entry.state->store(PlacementState::kStaysOnSource, std::memory_order_release);
  }
  // Readers already inside the copy finish first (ReadPins); each is one
  // read of the tier away, and new ones go to the source.
  pins_->WaitForReaders(id, /*own=*/0);
  Tier& tier = *(*tiers_)[tier_index];
  absl::Status removed = tier.driver().Remove(entry.ref);
  if (!removed.ok() && !absl::IsNotFound(removed)) {
    MONARCH_LOG(kWarning, "evicting ", entry.ref.name, " from tier '", tier.config().name,
                "': ", removed.ToString());
  }
  tier.Drop(entry.ref.size);
  {
    MutexLock lock(&file_lock);
    entry.state->store(PlacementState::kOnSource, std::memory_order_release);
  }
  evictions_.fetch_add(1, std::memory_order_relaxed);
  evicted_bytes_.fetch_add(entry.ref.size, std::memory_order_relaxed);
  return true;
}

void Evictor::ReportCounters(CounterSink& sink) const {
  sink.Counter("evictions", evictions_.load(), "Copies evicted to make room (placement.policy lru).");
  sink.Counter("evicted_bytes", evicted_bytes_.load(), "Bytes of the copies evicted.");
  sink.Counter("eviction_failures", eviction_failures_.load(),
               "Times no room could be made: every candidate in use or read since the hand passed.");
  sink.Counter("demotions", demotions_.load(),
               "Copies moved down a tier, tier to tier, to make room for files read sooner "
               "(announced order).");
  sink.Counter("demoted_bytes", demoted_bytes_.load(), "Bytes of the copies moved down.");
  sink.Counter("admissions_declined", admissions_declined_.load(),
               "Files not placed because every copy they would evict is read again sooner "
               "(announced order).");
}

}  // namespace monarch
