// Promotion: chunk-shared, streaming copy of one file; its ChunkTable, and
// the Origin it reads from.

#include "placement/promotion.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/copy_bytes.h"
#include "common/crc32c.h"
#include "common/status_macros.h"
#include "placement/placement_policy.h"

namespace monarch {

Origin::Origin(const std::vector<std::unique_ptr<Tier>>* tiers, const Namespace* ns,
               bool remember_content)
    : tiers_(tiers),
      namespace_(ns),
      source_index_(static_cast<int>(tiers->size()) - 1),
      first_origin_(FirstReadOnlyTier(*tiers)),
      content_crcs_(remember_content
                        ? new std::atomic<uint64_t>[std::max<uint32_t>(ns->entry_count(), 1)]()
                        : nullptr) {}

absl::StatusOr<size_t> Origin::Read(const FileRef& file, uint64_t offset, char* dst, size_t n,
                                    bool* from_source) {
  for (int t = first_origin_;; ++t) {
    Tier& tier = *(*tiers_)[t];
    if (from_source != nullptr) *from_source = t == source_index_;
    absl::StatusOr<size_t> result = tier.Read(file, offset, dst, n);
    if (result.ok()) return result;
    // The source has the last word; a peer that does not have the file
    // (NotFound: this node is its home, or the home is down) is no error.
    if (t == source_index_ || !absl::IsNotFound(result.status())) tier.CountReadError();
    if (t == source_index_) return result;
  }
}

absl::StatusOr<size_t> Origin::ReadSourceIfInMemory(const FileRef& file, uint64_t offset,
                                                    char* dst, size_t n) {
  // Not counted as the source's reads: those are what readers were served
  // and what came from its device or network, and these bytes were read
  // from the source once already, by the reader whose miss queued the copy.
  Tier& source = *(*tiers_)[source_index_];
  InMemoryReads* in_memory = source.can().in_memory;
  if (in_memory == nullptr) return absl::UnimplementedError("cannot tell what is in memory");
  absl::StatusOr<size_t> result =
      in_memory->ReadIfInMemory(file, offset, dst, n, InMemoryReads::Asker::kDeferredCopy);
  if (result.ok()) {
    bytes_from_memory_.fetch_add(*result, std::memory_order_relaxed);
  } else if (!absl::IsUnavailable(result.status()) && !absl::IsUnimplemented(result.status())) {
    source.CountReadError();
  }
  return result;
}

absl::StatusOr<SourceIdentity> Origin::IdentityToCommit(
    const FileEntry& entry, bool read_source, std::optional<uint32_t> content_crc,
    FileIdentity::Clock::time_point opened_since) {
  const SourceIdentity identity = namespace_->identity(entry.ref.id);
  std::atomic<uint64_t>* known =
      content_crc.has_value() && content_crcs_ != nullptr ? &content_crcs_[entry.ref.id] : nullptr;
  if (read_source && known != nullptr) {
    // Copied before: the same bytes are the same version, which the first
    // copy's check found to be the walk's. Any change to the file since,
    // before or during this copy, shows as other bytes (a CRC32C misses a
    // change with odds of 2^-32).
    const uint64_t first = known->load(std::memory_order_acquire);
    if ((first & kContentKnown) != 0) {
      if (static_cast<uint32_t>(first) != *content_crc) {
        source_changed_.fetch_add(1, std::memory_order_relaxed);
        return absl::AbortedError(absl::StrCat(
            entry.ref.name, " changed on the source since it was first copied; not copied"));
      }
      identified_by_content_.fetch_add(1, std::memory_order_relaxed);
      return identity;
    }
  }
  // Without `read_source` the home peer checked its own copy's source.
  if (read_source) {
    FileIdentity* source = (*tiers_)[source_index_]->can().identity;
    if (source == nullptr) return absl::UnimplementedError("the source identifies no file");
    MONARCH_ASSIGN_OR_RETURN(SourceIdentity now, source->Identify(entry.ref, opened_since));
    if (now != identity) {
      source_changed_.fetch_add(1, std::memory_order_relaxed);
      return absl::AbortedError(absl::StrCat(
          entry.ref.name, " changed on the source since the namespace walk; not copied"));
    }
  }
  if (known != nullptr) known->store(kContentKnown | *content_crc, std::memory_order_release);
  return identity;
}

ChunkTable::ChunkTable(ChunkLayout layout, ChunkPool* pool, bool checksum)
    : layout_(layout), pool_(pool), chunks_(layout.count()), crcs_(checksum ? layout.count() : 0) {}

ChunkTable::~ChunkTable() {
  for (size_t c = 0; c < chunks_.size(); ++c) ReturnBuffer(c);
}

bool ChunkTable::ClaimWrite(size_t c) {
  if (chunks_[c].state != State::kStaged) return false;
  chunks_[c].state = State::kWriting;
  Unpark(c);
  return true;
}

bool ChunkTable::MarkWritten(size_t c) {
  ReturnBuffer(c);
  chunks_[c].state = State::kWritten;
  return ++written_ == chunks_.size();
}

void ChunkTable::ReleaseSettled() {
  for (size_t c = 0; c < chunks_.size(); ++c) {
    if (chunks_[c].state != State::kLoading && chunks_[c].state != State::kWriting) Release(c);
  }
}

uint32_t ChunkTable::ContentCrc() const {
  uint32_t crc = 0;
  for (size_t c = 0; c < crcs_.size(); ++c) crc = Crc32cConcat(crc, crcs_[c], layout_.Length(c));
  return crc;
}

void ChunkTable::Unpark(size_t c) {
  if (!chunks_[c].parked) return;
  pool_->Unpark(layout_.Length(c));
  chunks_[c].parked = false;
}

void ChunkTable::ReturnBuffer(size_t c) {
  Unpark(c);
  if (chunks_[c].buffer != nullptr) pool_->Release(chunks_[c].buffer, layout_.Length(c));
  chunks_[c].buffer = nullptr;
}

Promotion::Promotion(PromotionHost* host, const FileEntry& entry, Tier* tier, int tier_index,
                     uint64_t chunk_bytes, bool checksum, FileIdentity::Clock::time_point began)
    : host_(host),
      entry_(entry),
      tier_(tier),
      tier_index_(tier_index),
      layout_{entry.ref.size, chunk_bytes},
      checksum_(checksum),
      began_(began),
      chunks_(layout_, &host->chunk_pool(), checksum) {}

void Promotion::Load(size_t c, bool memory_only) {
  // Read without the lock: a slow PFS read must not block readers of other
  // chunks. Nobody else touches a kLoading chunk's buffer.
  char* buffer;
  {
    MutexLock lock(&mu_);
    buffer = chunks_.buffer(c);
  }
  const size_t length = layout_.Length(c);
  bool from_source = memory_only;
  Origin& origin = host_->origin();
  absl::StatusOr<size_t> got =
      memory_only ? origin.ReadSourceIfInMemory(entry_.ref, layout_.Offset(c), buffer, length)
                  : origin.Read(entry_.ref, layout_.Offset(c), buffer, length, &from_source);
  if (memory_only && (absl::IsUnavailable(got.status()) || absl::IsUnimplemented(got.status()))) {
    // Before Fail(), which reports the outcome: not a failure of the file.
    gave_up_not_in_memory_.store(true, std::memory_order_release);
  }
  const bool complete = got.ok() && *got == length;
  const uint32_t crc = checksum_ && complete ? Crc32c(buffer, length) : 0;
  bool failed_here = false;
  {
    MutexLock lock(&mu_);
    if (from_source) read_source_ = true;
    if (complete && !failed_) {
      chunks_.Stage(c, crc);
    } else {
      // A short read means the file changed on the source; either way the
      // chunk cannot be trusted, and without it there is no copy.
      failed_here = !failed_;
      chunks_.Release(c);
    }
  }
  chunk_settled_.SignalAll();
  if (failed_here) {
    Fail(got.ok() ? absl::DataLossError(absl::StrCat(entry_.ref.name, ": bytes ", layout_.Offset(c),
                                                     " to ", layout_.Offset(c) + length,
                                                     " came back short from the source"))
                  : got.status(),
         /*tier_failed=*/false);
  }
}

absl::StatusOr<std::shared_ptr<CopyWriter>> Promotion::GetWriter() {
  {
    MutexLock lock(&mu_);
    if (writer_ != nullptr) return writer_;
  }
  // Creating a copy can be slow (a file create on a busy file system), so it
  // happens outside mu_; writer_mu_ makes sure only one thread does it.
  MutexLock creating(&writer_mu_);
  {
    MutexLock lock(&mu_);
    if (writer_ != nullptr) return writer_;
    if (failed_) return absl::CancelledError("promotion abandoned");
  }
  absl::StatusOr<std::unique_ptr<CopyWriter>> created = tier_->driver().NewWriter(entry_.ref);
  if (!created.ok()) return created.status();
  std::shared_ptr<CopyWriter> writer(std::move(*created));
  MutexLock lock(&mu_);
  if (failed_) return absl::CancelledError("promotion abandoned");
  writer_ = writer;
  return writer;
}

void Promotion::Write(size_t c, bool by_reader) {
  char* buffer;
  {
    MutexLock lock(&mu_);
    buffer = chunks_.buffer(c);  // Stable while kWriting; readers only copy from it.
  }
  absl::StatusOr<std::shared_ptr<CopyWriter>> writer = GetWriter();
  absl::Status status = writer.ok() ? (*writer)->Write(layout_.Offset(c), buffer, layout_.Length(c))
                                    : writer.status();
  bool last = false;
  bool failed_here = false;
  {
    MutexLock lock(&mu_);
    if (status.ok() && !failed_) {
      last = chunks_.MarkWritten(c);
      committing_ = last;
    } else {
      failed_here = !failed_;
      chunks_.Release(c);
    }
  }
  if (failed_here) Fail(status, /*tier_failed=*/!absl::IsCancelled(status));
  if (status.ok()) host_->ChunkWritten(by_reader);
  if (last) host_->CommitLater(shared_from_this());
}

void Promotion::Commit() {
  std::shared_ptr<CopyWriter> writer;
  bool read_source;
  std::optional<uint32_t> content_crc;
  {
    MutexLock lock(&mu_);
    writer = writer_;
    read_source = read_source_;
    if (checksum_) content_crc = chunks_.ContentCrc();
  }
  // After the last chunk was read: a change to the source file since the
  // walk shows here. A copy of several chunks was read over a longer time
  // and asks the source, so a change during the copy shows too. A copy of
  // one chunk is the one read that followed its descriptor's open: when
  // it was opened since the miss that started this promotion began (by
  // this promotion, or by that miss's ask of what the source holds in
  // memory), the attributes the open fetched serve (FileIdentity::Identify),
  // and only a change between that open and the read goes unseen. That
  // saves a metadata round trip per file: at 8 processes of a node it was a
  // second request in flight for each, which queued at the PFS behind the
  // readers' (bench/results/service.md). A shutdown that
  // cancelled placement meanwhile asks the source nothing more.
  const FileIdentity::Clock::time_point opened_since =
      layout_.count() <= 1 ? began_ : FileIdentity::kAlwaysAsk;
  absl::StatusOr<SourceIdentity> source =
      host_->cancelled()
          ? absl::StatusOr<SourceIdentity>(absl::CancelledError("shutting down"))
          : host_->origin().IdentityToCommit(entry_, read_source, content_crc, opened_since);
  const absl::Status status = source.ok() ? writer->Commit(*source) : source.status();
  // A source that changed is no failure of the tier.
  const bool tier_failed = source.ok() && !status.ok();
  std::shared_ptr<CopyWriter> dropped;  // Destroyed (deleting its temporary) after unlocking.
  {
    MutexLock lock(&mu_);
    done_ = true;
    if (!status.ok()) {
      failed_ = true;
      dropped = std::move(writer_);
    }
  }
  // A failed copy's temporary is deleted before the promotion counts as
  // done, so that whoever waits for placement to go idle finds none left.
  writer.reset();
  dropped.reset();
  host_->PromotionDone(*this, status, tier_failed);
}

void Promotion::Fail(const absl::Status& status, bool tier_failed) {
  std::shared_ptr<CopyWriter> dropped;
  {
    MutexLock lock(&mu_);
    if (done_ || committing_) return;
    done_ = true;
    failed_ = true;
    // Loading and writing threads own their chunks' buffers until they
    // finish; they see failed_ and release them.
    chunks_.ReleaseSettled();
    dropped = std::move(writer_);
  }
  chunk_settled_.SignalAll();
  dropped.reset();  // As in Commit(): the temporary goes before "done".
  host_->PromotionDone(*this, status, tier_failed);
}

void Promotion::Cancel() { Fail(absl::CancelledError("shutting down"), /*tier_failed=*/false); }

std::string Promotion::Describe() {
  int loading = 0, writing = 0;
  bool committing;
  {
    MutexLock lock(&mu_);
    loading = chunks_.CountIn(ChunkTable::State::kLoading);
    writing = chunks_.CountIn(ChunkTable::State::kWriting);
    committing = committing_;
  }
  return absl::StrCat(entry_.ref.name, " to tier '", tier_->config().name, "' (",
                      committing ? "committing the copy"
                                 : absl::StrCat(loading, " of ", layout_.count(),
                                                " chunks being read from the source, ", writing,
                                                " being written"),
                      ")");
}

absl::StatusOr<size_t> Promotion::Read(uint64_t offset, char* dst, size_t n,
                                       ReadOutcome* outcome) {
  *outcome = ReadOutcome::kShared;
  if (n == 0) return 0;
  const size_t first = offset / layout_.chunk_bytes;
  const size_t last = (offset + n - 1) / layout_.chunk_bytes;
  // In rounds: claim the empty chunks from `from` on while staging has room
  // for their buffers, load them, serve [from, end) from them and the
  // others' chunks, park or write them. A chunk with no room ends the round
  // (at `end`), and the next round starts with a buffer for it. Waiting for
  // that buffer while holding others could deadlock with readers doing the
  // same; by then this read holds none.
  bool usable = true;
  char* waited = nullptr;  // A buffer for chunk `from`, waited for.
  for (size_t from = first;;) {
    std::vector<size_t> loaded;
    size_t end = last + 1;
    {
      MutexLock lock(&mu_);
      usable = !failed_;
      for (size_t c = from; c <= last && usable; ++c) {
        if (chunks_.state(c) != ChunkTable::State::kEmpty) continue;
        // Reserved before the chunk is loaded, so that threads loading at
        // the same moment cannot take staging past its budget together.
        char* buffer = c == from && waited != nullptr
                           ? std::exchange(waited, nullptr)
                           : host_->chunk_pool().TryAcquire(layout_.Length(c));
        if (buffer == nullptr) {
          end = c;
          break;
        }
        chunks_.ClaimLoad(c, buffer);
        loaded.push_back(c);
      }
      // Another thread claimed the chunk while this one waited for its
      // buffer, or the promotion failed.
      if (waited != nullptr) {
        host_->chunk_pool().Release(waited, layout_.Length(from));
        waited = nullptr;
      }
    }
    for (size_t c : loaded) Load(c);
    if (!loaded.empty()) *outcome = ReadOutcome::kLoaded;
    if (usable) usable = CopyOut(offset, dst, n, from, end);
    ParkOrWrite(loaded);
    if (!usable || end > last) break;
    // Counted in the pool's waits: staging is full of chunks being loaded
    // and written right now.
    waited = host_->chunk_pool().Acquire(layout_.Length(end), ChunkPool::Share::kReaders);
    from = end;
  }
  if (!usable) {
    // The promotion failed or a chunk could not be had: the source decides
    // what this read gets.
    *outcome = ReadOutcome::kFellBack;
    return host_->origin().Read(entry_.ref, offset, dst, n);
  }
  return n;
}

bool Promotion::CopyOut(uint64_t offset, char* dst, size_t n, size_t from, size_t end) {
  // Copy what is staged under the lock (a chunk's buffer is returned once it
  // is written), and note the chunks to read back from the tier's copy, which
  // needs no lock.
  std::vector<size_t> written;
  std::shared_ptr<CopyWriter> writer;
  {
    MutexLock lock(&mu_);
    for (size_t c = from; c < end; ++c) {
      // Ends when the loading thread's read returns (it signals, loaded or
      // failed); a failed or cancelled promotion signals too.
      while (chunks_.state(c) == ChunkTable::State::kLoading) chunk_settled_.Wait(&mu_);
      if (failed_) return false;
      const uint64_t begin = std::max<uint64_t>(offset, layout_.Offset(c));
      const uint64_t stop = std::min<uint64_t>(offset + n, layout_.Offset(c) + layout_.Length(c));
      switch (chunks_.state(c)) {
        case ChunkTable::State::kStaged:
        case ChunkTable::State::kWriting:
          CopyBytes(dst + (begin - offset), chunks_.buffer(c) + (begin - layout_.Offset(c)),
                      stop - begin);
          break;
        case ChunkTable::State::kWritten:
          written.push_back(c);
          writer = writer_;
          break;
        default:
          return false;
      }
    }
  }
  for (size_t c : written) {
    if (writer == nullptr) return false;
    const uint64_t begin = std::max<uint64_t>(offset, layout_.Offset(c));
    const uint64_t stop = std::min<uint64_t>(offset + n, layout_.Offset(c) + layout_.Length(c));
    absl::StatusOr<size_t> got = writer->ReadBack(begin, dst + (begin - offset), stop - begin);
    if (!got.ok() || *got != stop - begin) return false;
  }
  return true;
}

void Promotion::ParkOrWrite(const std::vector<size_t>& loaded) {
  // Parked, a chunk waits for a placement thread, off the reader's path.
  // When the parked chunks fill their part of the budget, placement is
  // behind: this reader writes its chunks before returning rather than leave
  // them for a thread that may not get to them soon, and staging memory
  // keeps room for the next readers.
  for (size_t c : loaded) {
    bool write;
    {
      MutexLock lock(&mu_);
      // A placement thread may have taken the chunk to write it, or the
      // promotion failed.
      if (chunks_.state(c) != ChunkTable::State::kStaged) continue;
      write = !chunks_.Park(c) && chunks_.ClaimWrite(c);
    }
    if (write) Write(c, /*by_reader=*/true);
  }
}

bool Promotion::ClaimBackgroundTask() {
  MutexLock lock(&mu_);
  if (done_ || background_claimed_) return false;
  // If every chunk is loading or being written by the threads that claimed
  // it, each of those threads asks again after its part.
  background_claimed_ = chunks_.HasUnclaimed();
  return background_claimed_;
}

void Promotion::RunToCompletion(bool memory_only) {
  for (size_t c = 0; c < layout_.count(); ++c) {
    if (host_->cancelled()) {
      Cancel();
      return;
    }
    bool empty;
    {
      MutexLock lock(&mu_);
      if (done_) return;
      empty = chunks_.state(c) == ChunkTable::State::kEmpty;
    }
    // Taken without the lock: Acquire() may wait for room (the placement
    // threads' part of the budget is a chunk each, but the rest may be in
    // use), and this thread holds no other buffer meanwhile.
    char* buffer =
        empty ? host_->chunk_pool().Acquire(layout_.Length(c), ChunkPool::Share::kPlacement) : nullptr;
    bool load = false;
    bool write = false;
    {
      MutexLock lock(&mu_);
      if (buffer != nullptr && (done_ || chunks_.state(c) != ChunkTable::State::kEmpty)) {
        // Finished, or a reader claimed the chunk meanwhile.
        host_->chunk_pool().Release(buffer, layout_.Length(c));
        buffer = nullptr;
      }
      if (done_) return;
      if (buffer != nullptr) {
        chunks_.ClaimLoad(c, buffer);
        load = true;
      } else {
        // As in CopyOut(): ends with the loading thread's read.
        while (chunks_.state(c) == ChunkTable::State::kLoading) chunk_settled_.Wait(&mu_);
        write = chunks_.ClaimWrite(c);
      }
    }
    if (load) {
      Load(c, memory_only);
      MutexLock lock(&mu_);
      write = chunks_.ClaimWrite(c);
    }
    if (write) Write(c, /*by_reader=*/false);
  }
}

}  // namespace monarch
