// Promotion: chunk-shared, streaming copy of one file.

#include "placement/promotion.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace monarch {

Promotion::Promotion(FileEntry* entry, int target_tier, uint64_t chunk_bytes, ChunkPool* pool)
    : entry_(entry),
      target_tier_(target_tier),
      chunk_bytes_(chunk_bytes),
      chunk_count_((entry->ref.size + chunk_bytes - 1) / chunk_bytes),
      pool_(pool),
      chunks_(chunk_count_) {}

Promotion::~Promotion() {
  MutexLock lock(&mu_);
  for (size_t c = 0; c < chunks_.size(); ++c) {
    if (chunks_[c].buffer != nullptr) pool_->Release(chunks_[c].buffer, ChunkLength(c));
  }
}

size_t Promotion::ChunkLength(size_t c) const {
  return static_cast<size_t>(std::min<uint64_t>(chunk_bytes_, entry_->ref.size - ChunkOffset(c)));
}

bool Promotion::ClaimLocked(size_t c) {
  if (chunks_[c].state != ChunkState::kEmpty) return false;
  chunks_[c].state = ChunkState::kLoading;
  chunks_[c].buffer = pool_->Acquire(ChunkLength(c));
  return true;
}

void Promotion::Load(FetchSource& source, size_t c) {
  // Read without the lock: a slow PFS read must not block readers of other
  // chunks. Nobody else touches a kLoading chunk's buffer.
  char* buffer;
  {
    MutexLock lock(&mu_);
    buffer = chunks_[c].buffer;
  }
  const size_t length = ChunkLength(c);
  absl::StatusOr<size_t> got = source.Fetch(entry_->ref, ChunkOffset(c), buffer, length);
  {
    MutexLock lock(&mu_);
    if (got.ok() && *got == length) {
      chunks_[c].state = ChunkState::kReady;
    } else {
      // A short read means the file changed on the source; either way this
      // chunk cannot be trusted.
      chunks_[c].state = ChunkState::kFailed;
      pool_->Release(chunks_[c].buffer, length);
      chunks_[c].buffer = nullptr;
    }
  }
  chunk_settled_.SignalAll();
}

absl::StatusOr<size_t> Promotion::Read(FetchSource& source, uint64_t offset, char* dst, size_t n,
                                       ReadOutcome* outcome) {
  *outcome = ReadOutcome::kShared;
  if (n == 0) return 0;
  const size_t first = offset / chunk_bytes_;
  const size_t last = (offset + n - 1) / chunk_bytes_;
  std::vector<size_t> claimed;
  {
    MutexLock lock(&mu_);
    for (size_t c = first; c <= last; ++c) {
      if (ClaimLocked(c)) claimed.push_back(c);
    }
  }
  for (size_t c : claimed) Load(source, c);

  // Copy what is in memory under the lock (the background copy frees a
  // chunk's buffer once written), and note the chunks to read back from the
  // writer, which needs no lock.
  std::vector<size_t> written;
  std::shared_ptr<CopyWriter> writer;
  bool usable = true;
  {
    MutexLock lock(&mu_);
    for (size_t c = first; c <= last && usable; ++c) {
      while (chunks_[c].state == ChunkState::kLoading) chunk_settled_.Wait(&mu_);
      const uint64_t begin = std::max<uint64_t>(offset, ChunkOffset(c));
      const uint64_t end = std::min<uint64_t>(offset + n, ChunkOffset(c) + ChunkLength(c));
      switch (chunks_[c].state) {
        case ChunkState::kReady:
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
  if (usable) {
    *outcome = claimed.empty() ? ReadOutcome::kShared : ReadOutcome::kLoaded;
    return n;
  }
  // Some chunk could not be had: the source decides what this read gets.
  *outcome = ReadOutcome::kFellBack;
  return source.Fetch(entry_->ref, offset, dst, n);
}

absl::Status Promotion::CopyTo(FetchSource& source, std::shared_ptr<CopyWriter> writer,
                               const std::atomic<bool>& cancel, bool* writer_failed) {
  *writer_failed = false;
  {
    MutexLock lock(&mu_);
    writer_ = writer;
  }
  for (size_t c = 0; c < chunk_count_; ++c) {
    if (cancel.load(std::memory_order_relaxed)) return absl::CancelledError("shutting down");
    bool claimed;
    {
      MutexLock lock(&mu_);
      claimed = ClaimLocked(c);
    }
    if (claimed) Load(source, c);
    char* buffer;
    {
      MutexLock lock(&mu_);
      while (chunks_[c].state == ChunkState::kLoading) chunk_settled_.Wait(&mu_);
      if (chunks_[c].state != ChunkState::kReady) {
        return absl::DataLossError(
            absl::StrCat(entry_->ref.name, ": reading bytes ", ChunkOffset(c), " to ",
                         ChunkOffset(c) + ChunkLength(c), " from the source failed"));
      }
      buffer = chunks_[c].buffer;  // Only this loop frees a ready chunk's buffer.
    }
    absl::Status status = writer->Write(ChunkOffset(c), buffer, ChunkLength(c));
    if (!status.ok()) {
      *writer_failed = true;
      return status;
    }
    {
      MutexLock lock(&mu_);
      chunks_[c].state = ChunkState::kWritten;
      pool_->Release(chunks_[c].buffer, ChunkLength(c));
      chunks_[c].buffer = nullptr;
    }
  }
  return absl::OkStatus();
}

void Promotion::Abandon() {
  std::shared_ptr<CopyWriter> dropped;  // Destroyed (deleting its temporary) after unlocking.
  MutexLock lock(&mu_);
  for (Chunk& chunk : chunks_) {
    if (chunk.state == ChunkState::kWritten) chunk.state = ChunkState::kFailed;
  }
  dropped = std::move(writer_);
}

}  // namespace monarch
