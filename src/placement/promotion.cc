// Promotion: chunk-shared, streaming copy of one file.

#include "placement/promotion.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace monarch {

Promotion::Promotion(PromotionHost* host, FileEntry* entry, Tier* tier, int tier_index,
                     uint64_t chunk_bytes)
    : host_(host),
      entry_(entry),
      tier_(tier),
      tier_index_(tier_index),
      chunk_bytes_(chunk_bytes),
      chunk_count_((entry->ref.size + chunk_bytes - 1) / chunk_bytes),
      chunks_(chunk_count_) {}

Promotion::~Promotion() {
  MutexLock lock(&mu_);
  for (size_t c = 0; c < chunks_.size(); ++c) {
    if (chunks_[c].buffer != nullptr) host_->chunk_pool().Release(chunks_[c].buffer, ChunkLength(c));
  }
}

size_t Promotion::ChunkLength(size_t c) const {
  return static_cast<size_t>(std::min<uint64_t>(chunk_bytes_, entry_->ref.size - ChunkOffset(c)));
}

bool Promotion::ClaimLoadLocked(size_t c) {
  if (chunks_[c].state != ChunkState::kEmpty) return false;
  chunks_[c].state = ChunkState::kLoading;
  chunks_[c].buffer = host_->chunk_pool().Acquire(ChunkLength(c));
  return true;
}

bool Promotion::ClaimWriteLocked(size_t c) {
  if (chunks_[c].state != ChunkState::kStaged) return false;
  chunks_[c].state = ChunkState::kWriting;
  return true;
}

void Promotion::ReleaseLocked(size_t c) {
  if (chunks_[c].buffer != nullptr) host_->chunk_pool().Release(chunks_[c].buffer, ChunkLength(c));
  chunks_[c].buffer = nullptr;
  chunks_[c].state = ChunkState::kFailed;
}

void Promotion::Load(size_t c) {
  // Read without the lock: a slow PFS read must not block readers of other
  // chunks. Nobody else touches a kLoading chunk's buffer.
  char* buffer;
  {
    MutexLock lock(&mu_);
    buffer = chunks_[c].buffer;
  }
  const size_t length = ChunkLength(c);
  absl::StatusOr<size_t> got = host_->ReadOrigin(entry_->ref, ChunkOffset(c), buffer, length);
  bool failed_here = false;
  {
    MutexLock lock(&mu_);
    if (got.ok() && *got == length && !failed_) {
      chunks_[c].state = ChunkState::kStaged;
    } else {
      // A short read means the file changed on the source; either way the
      // chunk cannot be trusted, and without it there is no copy.
      failed_here = !failed_;
      ReleaseLocked(c);
    }
  }
  chunk_settled_.SignalAll();
  if (failed_here) {
    Fail(got.ok() ? absl::DataLossError(absl::StrCat(entry_->ref.name, ": bytes ", ChunkOffset(c),
                                                     " to ", ChunkOffset(c) + length,
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
  absl::StatusOr<std::unique_ptr<CopyWriter>> created = tier_->driver().NewWriter(entry_->ref);
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
    buffer = chunks_[c].buffer;  // Stable while kWriting; readers only copy from it.
  }
  absl::StatusOr<std::shared_ptr<CopyWriter>> writer = GetWriter();
  absl::Status status = writer.ok() ? (*writer)->Write(ChunkOffset(c), buffer, ChunkLength(c))
                                    : writer.status();
  bool last = false;
  bool failed_here = false;
  {
    MutexLock lock(&mu_);
    if (status.ok() && !failed_) {
      host_->chunk_pool().Release(chunks_[c].buffer, ChunkLength(c));
      chunks_[c].buffer = nullptr;
      chunks_[c].state = ChunkState::kWritten;
      last = ++written_ == chunk_count_;
      committing_ = last;
    } else {
      failed_here = !failed_;
      ReleaseLocked(c);
    }
  }
  if (failed_here) Fail(status, /*tier_failed=*/!absl::IsCancelled(status));
  if (status.ok()) host_->ChunkWritten(by_reader);
  if (last) Commit();
}

void Promotion::Commit() {
  std::shared_ptr<CopyWriter> writer;
  {
    MutexLock lock(&mu_);
    writer = writer_;
  }
  const absl::Status status = writer->Commit();
  std::shared_ptr<CopyWriter> dropped;  // Destroyed (deleting its temporary) after unlocking.
  {
    MutexLock lock(&mu_);
    done_ = true;
    if (!status.ok()) {
      failed_ = true;
      dropped = std::move(writer_);
    }
  }
  host_->PromotionDone(*this, status, /*tier_failed=*/!status.ok());
}

void Promotion::Fail(const absl::Status& status, bool tier_failed) {
  std::shared_ptr<CopyWriter> dropped;
  {
    MutexLock lock(&mu_);
    if (done_ || committing_) return;
    done_ = true;
    failed_ = true;
    for (size_t c = 0; c < chunks_.size(); ++c) {
      // Loading and writing threads own their chunks' buffers until they
      // finish; they see failed_ and release them.
      const ChunkState state = chunks_[c].state;
      if (state == ChunkState::kLoading || state == ChunkState::kWriting) continue;
      ReleaseLocked(c);
    }
    dropped = std::move(writer_);
  }
  chunk_settled_.SignalAll();
  host_->PromotionDone(*this, status, tier_failed);
}

void Promotion::Cancel() { Fail(absl::CancelledError("shutting down"), /*tier_failed=*/false); }

absl::StatusOr<size_t> Promotion::Read(uint64_t offset, char* dst, size_t n,
                                       ReadOutcome* outcome) {
  *outcome = ReadOutcome::kShared;
  if (n == 0) return 0;
  const size_t first = offset / chunk_bytes_;
  const size_t last = (offset + n - 1) / chunk_bytes_;
  std::vector<size_t> loaded;
  bool usable;
  {
    MutexLock lock(&mu_);
    usable = !failed_;
    for (size_t c = first; c <= last && usable; ++c) {
      if (ClaimLoadLocked(c)) loaded.push_back(c);
    }
  }
  for (size_t c : loaded) Load(c);

  // Copy what is staged under the lock (a chunk's buffer is returned once it
  // is written), and note the chunks to read back from the tier's copy, which
  // needs no lock.
  std::vector<size_t> written;
  std::shared_ptr<CopyWriter> writer;
  if (usable) {
    MutexLock lock(&mu_);
    for (size_t c = first; c <= last && usable; ++c) {
      while (chunks_[c].state == ChunkState::kLoading) chunk_settled_.Wait(&mu_);
      if (failed_) {
        usable = false;
        break;
      }
      const uint64_t begin = std::max<uint64_t>(offset, ChunkOffset(c));
      const uint64_t end = std::min<uint64_t>(offset + n, ChunkOffset(c) + ChunkLength(c));
      switch (chunks_[c].state) {
        case ChunkState::kStaged:
        case ChunkState::kWriting:
          std::memcpy(dst + (begin - offset), chunks_[c].buffer + (begin - ChunkOffset(c)),
                      end - begin);
          break;
        case ChunkState::kWritten:
          written.push_back(c);
          writer = writer_;
          break;
        default:
          usable = false;
      }
    }
  }
  for (size_t c : written) {
    if (!usable || writer == nullptr) {
      usable = false;
      break;
    }
    const uint64_t begin = std::max<uint64_t>(offset, ChunkOffset(c));
    const uint64_t end = std::min<uint64_t>(offset + n, ChunkOffset(c) + ChunkLength(c));
    absl::StatusOr<size_t> got = writer->ReadBack(begin, dst + (begin - offset), end - begin);
    usable = got.ok() && *got == end - begin;
  }
  if (!usable) {
    // The promotion failed or a chunk could not be had: the source decides
    // what this read gets.
    *outcome = ReadOutcome::kFellBack;
    return host_->ReadOrigin(entry_->ref, offset, dst, n);
  }
  *outcome = loaded.empty() ? ReadOutcome::kShared : ReadOutcome::kLoaded;
  // Placement is behind: write what this read loaded before returning,
  // rather than leaving it in staging memory for a thread that may not get
  // to it soon.
  if (!loaded.empty() && host_->StagingOverBudget()) {
    for (size_t c : loaded) {
      bool claimed;
      {
        MutexLock lock(&mu_);
        claimed = ClaimWriteLocked(c);
      }
      if (claimed) Write(c, /*by_reader=*/true);
    }
  }
  return n;
}

bool Promotion::ClaimBackgroundTask() {
  MutexLock lock(&mu_);
  if (done_ || background_claimed_) return false;
  for (const Chunk& chunk : chunks_) {
    if (chunk.state == ChunkState::kEmpty || chunk.state == ChunkState::kStaged) {
      background_claimed_ = true;
      return true;
    }
  }
  // Every chunk is loading or being written by the threads that claimed it;
  // each of those threads asks again after its part.
  return false;
}

void Promotion::RunToCompletion() {
  for (size_t c = 0; c < chunk_count_; ++c) {
    if (host_->cancelled()) {
      Cancel();
      return;
    }
    bool load = false;
    bool write = false;
    {
      MutexLock lock(&mu_);
      if (done_) return;
      load = ClaimLoadLocked(c);
      if (!load) {
        while (chunks_[c].state == ChunkState::kLoading) chunk_settled_.Wait(&mu_);
        write = ClaimWriteLocked(c);
      }
    }
    if (load) {
      Load(c);
      MutexLock lock(&mu_);
      write = ClaimWriteLocked(c);
    }
    if (write) Write(c, /*by_reader=*/false);
  }
}

}  // namespace monarch
