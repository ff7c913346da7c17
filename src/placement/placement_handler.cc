// PlacementHandler: the read-through of files on the source, prefetch, and
// the wiring of the Promoter, the Evictor and the ReadPins.

#include "placement/placement_handler.h"

#include "placement/scan_rule.h"

#include <algorithm>

#include "absl/cleanup/cleanup.h"

namespace monarch {

PlacementHandler::PlacementHandler(const std::vector<std::unique_ptr<Tier>>* tiers,
                                   const Namespace* ns, std::unique_ptr<PlacementPolicy> policy,
                                   const PlacementConfig& config, bool pin_readers,
                                   MappingWatch* mappings)
    : policy_(std::move(policy)),
      evicts_(policy_->evicts()),
      pins_(evicts_ || pin_readers ? ns->entry_count() : 0),
      promoter_(tiers, ns, policy_.get(), &pins_, config),
      evictor_(tiers, ns, policy_.get(), &pins_, &promoter_, &promoter_.chunk_pool(),
               config.chunk_bytes, mappings),
      source_(tiers->back().get()),
      namespace_(ns) {
  if (ns->entry_count() > ns->file_count()) {
    scans_.reset(new ScanState[ns->file_count()]());
    // At most a quarter of the largest cache tier: in a tier that holds a
    // few windows only, the reader's own promotions would evict what was
    // read ahead for it before it gets there, and it would read it again.
    uint64_t largest = 0;
    for (const auto& tier : *tiers) {
      if (tier->is_cache()) largest = std::max(largest, tier->config().capacity_bytes);
    }
    read_ahead_bytes_ =
        std::min(kReadAheadExtents * ns->extent_layout().extent_bytes, largest / 4);
  }
  // Only where the source is the one origin: with peers, a miss goes to the
  // file's home first, and its copy to the home's share.
  const bool source_only =
      FirstReadOnlyTier(*tiers) == static_cast<int>(tiers->size()) - 1;
  if (config.cached_source == CachedSourcePolicy::kDefer && source_only &&
      config.policy != PlacementPolicyKind::kNone) {
    deferred_ = std::make_unique<DeferredCopies>(
        ns->entry_count(), [this](uint32_t id) { CopyFromMemory(id); });
  }
}

void PlacementHandler::CopyFromMemory(uint32_t id) {
  const FileEntry& entry = namespace_->entry(id);
  if (entry.state->load(std::memory_order_acquire) != PlacementState::kOnSource) return;
  const Promoter::Admission admission = StartOrJoinMakingRoom(entry, /*pin=*/false);
  if (admission.found != Promoter::Found::kStarted) return;
  // This thread is the promotion's placement task, as for a prefetch.
  if (admission.promotion->ClaimBackgroundTask()) {
    admission.promotion->RunToCompletion(/*memory_only=*/true);
  }
}

std::optional<absl::StatusOr<size_t>> PlacementHandler::ReadIfOnSource(const FileEntry& entry,
                                                                       uint64_t offset, char* dst,
                                                                       size_t n,
                                                                       bool may_defer) {
  // The cold path: a file that stays on the source takes no lock at all.
  if (entry.state->load(std::memory_order_acquire) == PlacementState::kStaysOnSource) {
    ChargeSourceReads::Add(n);
    return promoter_.origin().Read(entry.ref, offset, dst, n);
  }
  // Taken before the source is asked what it holds in memory, which opens
  // the file's descriptor: the promotion that follows then reads through a
  // descriptor opened since it began, whose attributes it may commit
  // without asking the PFS again (Promotion::Commit).
  const FileIdentity::Clock::time_point began = FileIdentity::Clock::now();
  if (deferred_ != nullptr && may_defer &&
      entry.state->load(std::memory_order_acquire) == PlacementState::kOnSource) {
    // The source has the bytes in memory: a plain read serves them, and the
    // copy waits for idle CPU (deferred_copies.h). Else (Unavailable: not
    // all in memory; Unimplemented: cannot tell) promoted as usual.
    absl::StatusOr<size_t> got =
        source_->ReadIfInMemory(entry.ref, offset, dst, n, InMemoryReads::Asker::kMiss);
    if (got.ok() && *got == n) {
      ChargeSourceReads::Add(n);
      deferred_->Add(entry.ref.id);
      return got;
    }
  }
  const Promoter::Admission admission = StartOrJoinMakingRoom(entry, /*pin=*/true, began);
  if (admission.found == Promoter::Found::kPublished) return std::nullopt;
  // Not a read of a promotion someone else started.
  const bool own_miss = admission.found != Promoter::Found::kInFlight;
  if (own_miss) reader_misses_in_flight_.fetch_add(1, std::memory_order_relaxed);
  absl::Cleanup count_miss_done = [&] {
    if (own_miss) reader_misses_in_flight_.fetch_sub(1, std::memory_order_relaxed);
  };
  if (admission.promotion == nullptr) {
    ChargeSourceReads::Add(n);
    return promoter_.origin().Read(entry.ref, offset, dst, n);
  }
  // A promotion reads the whole file: its starter pays for it.
  if (admission.found == Promoter::Found::kStarted) ChargeSourceReads::Add(entry.ref.size);
  return promoter_.ReadThrough(admission.promotion, offset, dst, n);
}

PlacementHandler::PrefetchOutcome PlacementHandler::Prefetch(const FileEntry& entry) {
  if (entry.extent_count > 0) {
    // A file cached by extents (announced by name) is fetched extent by
    // extent, into the room the tiers have: a file larger than the tiers
    // would otherwise evict its own extents to fetch the next. (An order
    // of ranges names the extents themselves.)
    PrefetchOutcome outcome = PrefetchOutcome::kNotNeeded;
    for (uint32_t k = 0; k < entry.extent_count; ++k) {
      const FileEntry& extent = namespace_->entry(entry.first_extent + k);
      const Promoter::Admission admission = promoter_.StartOrJoin(extent, /*pin=*/false);
      if (admission.found == Promoter::Found::kNoTier ||
          admission.found == Promoter::Found::kNotPlaceable) {
        return outcome == PrefetchOutcome::kFetched ? outcome : PrefetchOutcome::kNoRoom;
      }
      if (admission.found != Promoter::Found::kStarted) continue;
      if (admission.promotion->ClaimBackgroundTask()) admission.promotion->RunToCompletion();
      outcome = PrefetchOutcome::kFetched;
    }
    return outcome;
  }
  const Promoter::Admission admission = StartOrJoinMakingRoom(entry, /*pin=*/false);
  switch (admission.found) {
    case Promoter::Found::kPublished:
    case Promoter::Found::kInFlight:
      return PrefetchOutcome::kNotNeeded;
    case Promoter::Found::kNoTier:
    case Promoter::Found::kNotPlaceable:
      return PrefetchOutcome::kNoRoom;
    case Promoter::Found::kStarted:
      break;
  }
  // This thread is the promotion's placement task: no pool thread is queued
  // for it, and readers that join only load the chunks they need first.
  if (admission.promotion->ClaimBackgroundTask()) admission.promotion->RunToCompletion();
  return PrefetchOutcome::kFetched;
}

void PlacementHandler::ReadingRange(const FileEntry& file, uint64_t offset, size_t n) {
  if (scans_ == nullptr || n == 0) return;
  const uint64_t end = offset + n;
  const uint64_t extent_bytes = namespace_->extent_layout().extent_bytes;
  // Racy across readers of one file, as a hint may be.
  ScanState& scan = scans_[file.ref.id];
  uint64_t start = scan.start.load(std::memory_order_relaxed);
  const bool scanning = ContinuesScan(scan.end.exchange(end, std::memory_order_relaxed), offset,
                                      end, extent_bytes, &start);
  scan.start.store(start, std::memory_order_relaxed);
  if (scanning) ReadAheadPast(file, end);
}

void PlacementHandler::ReadAheadPast(const FileEntry& file, uint64_t end) {
  if (scans_ == nullptr || file.extent_count == 0 || end == 0) return;
  const uint64_t extent_bytes = namespace_->extent_layout().extent_bytes;
  const uint64_t ahead_end = std::min(file.ref.size, end + read_ahead_bytes_);
  if (end >= ahead_end) return;
  // The extents past the one this read ends in, up to the window's end.
  const uint32_t first = static_cast<uint32_t>((end - 1) / extent_bytes) + 1;
  const uint32_t last_extent = static_cast<uint32_t>((ahead_end - 1) / extent_bytes);
  for (uint32_t k = first; k <= last_extent && k < file.extent_count; ++k) {
    const FileEntry& extent = namespace_->entry(file.first_extent + k);
    if (extent.state->load(std::memory_order_acquire) != PlacementState::kOnSource) continue;
    // Never by eviction: in a tier smaller than the window, an extent read
    // ahead would push out the one the reader is about to read.
    const Promoter::Admission admission = promoter_.StartOrJoin(extent, /*pin=*/false);
    if (admission.found == Promoter::Found::kNoTier ||
        admission.found == Promoter::Found::kNotPlaceable) {
      return;  // No room for the rest either.
    }
    if (admission.found != Promoter::Found::kStarted) continue;
    read_ahead_started_.fetch_add(1, std::memory_order_relaxed);
    promoter_.RunInBackground(admission.promotion);
  }
}

Promoter::Admission PlacementHandler::StartOrJoinMakingRoom(const FileEntry& entry, bool pin,
                                                            FileIdentity::Clock::time_point began) {
  bool room_made = false;
  if (WantsFasterTier(entry)) {
    // Whatever room this made (none, if every copy is read sooner), the
    // policy then picks among the tiers as they are.
    evictor_.MakeRoom(entry.ref.id, entry.ref.size);
    room_made = true;
  }
  for (;;) {
    Promoter::Admission admission = promoter_.StartOrJoin(entry, pin, began);
    // Eviction happens outside the file's lock: it takes the victims'.
    if (admission.found != Promoter::Found::kNoTier || !MayMakeRoomFor(entry) || room_made ||
        !evictor_.MakeRoom(entry.ref.id, entry.ref.size)) {
      return admission;
    }
    room_made = true;
  }
}

void PlacementHandler::Reconsider(const FileEntry& entry) {
  // No eviction is under way meanwhile: one marks its file as staying on the
  // source until the copy is deleted.
  MutexLock no_eviction(&evictor_.mutex());
  promoter_.Reconsider(entry);
}

void PlacementHandler::ReportCounters(CounterSink& sink) const {
  // In the order the stats have always listed them: promotions_started, then
  // eviction's, then the rest of the promotions' and the staging's.
  promoter_.ReportStartedCounter(sink);
  if (evicts_) evictor_.ReportCounters(sink);
  promoter_.ReportCounters(sink);
  if (deferred_ != nullptr) deferred_->ReportCounters(sink);
  if (scans_ != nullptr) {
    sink.Counter("read_ahead_extents", read_ahead_started_.load(std::memory_order_relaxed),
                 "Extents promoted ahead of a reader scanning a file cached by extents.");
  }
}

}  // namespace monarch
