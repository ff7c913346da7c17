// Promotion: shared, chunked staging of one file.

#include "placement/promotion.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace monarch {
namespace {

// The background copy reads at most this much per source call. Chunks only
// become ready when their call returns, so a reader waiting on the copy's
// next chunk waits for at most one such call.
constexpr uint64_t kMaxRunBytes = 1 << 20;

}  // namespace

Promotion::Promotion(FileEntry* entry, int target_tier, bool tier_keeps_image,
                     uint64_t chunk_bytes)
    : entry_(entry),
      target_tier_(target_tier),
      chunk_bytes_(chunk_bytes),
      chunk_count_((entry->ref.size + chunk_bytes - 1) / chunk_bytes),
      image_(std::make_shared<FileImage>(entry->ref.size, /*transient=*/!tier_keeps_image)),
      chunks_(chunk_count_, ChunkState::kEmpty) {}

absl::Status Promotion::ClaimAndLoad(Tier& source, size_t first, size_t last, bool* loaded_any) {
  // Claim under the lock, read without it: a slow PFS read must not block
  // readers waiting on other chunks.
  std::vector<std::pair<size_t, size_t>> runs;  // [begin, end) chunk ranges.
  {
    MutexLock lock(&mu_);
    for (size_t c = first; c <= last; ++c) {
      if (chunks_[c] != ChunkState::kEmpty) continue;
      chunks_[c] = ChunkState::kLoading;
      if (!runs.empty() && runs.back().second == c) {
        runs.back().second = c + 1;
      } else {
        runs.emplace_back(c, c + 1);
      }
    }
  }
  absl::Status first_error;
  for (const auto& [begin, end] : runs) {
    const uint64_t offset = begin * chunk_bytes_;
    const uint64_t length = std::min<uint64_t>(end * chunk_bytes_, entry_->ref.size) - offset;
    absl::StatusOr<size_t> got =
        source.Read(entry_->ref, offset, image_->mutable_data() + offset, length);
    bool ok = got.ok() && *got == length;
    if (!ok && first_error.ok()) {
      first_error = got.ok() ? absl::DataLossError(absl::StrCat(
                                   entry_->ref.name, ": source returned ", *got, " bytes at ",
                                   offset, ", expected ", length, " (file changed?)"))
                             : got.status();
    }
    {
      MutexLock lock(&mu_);
      for (size_t c = begin; c < end; ++c) chunks_[c] = ok ? ChunkState::kReady : ChunkState::kFailed;
    }
    chunk_settled_.SignalAll();
  }
  *loaded_any = !runs.empty();
  return first_error;
}

bool Promotion::AwaitChunks(size_t first, size_t last) {
  MutexLock lock(&mu_);
  for (size_t c = first; c <= last; ++c) {
    while (chunks_[c] == ChunkState::kLoading) chunk_settled_.Wait(&mu_);
    if (chunks_[c] != ChunkState::kReady) return false;
  }
  return true;
}

absl::StatusOr<size_t> Promotion::Read(Tier& source, uint64_t offset, char* dst, size_t n,
                                       bool* hit) {
  *hit = false;
  if (n == 0) return 0;
  const size_t first = offset / chunk_bytes_;
  const size_t last = (offset + n - 1) / chunk_bytes_;
  bool loaded_any = false;
  absl::Status load = ClaimAndLoad(source, first, last, &loaded_any);
  if (load.ok() && AwaitChunks(first, last)) {
    // Ready chunks never change again, so copying needs no lock.
    std::memcpy(dst, image_->data() + offset, n);
    *hit = !loaded_any;
    return n;
  }
  // Some chunk could not be loaded: the source decides what this read gets.
  return source.Read(entry_->ref, offset, dst, n);
}

absl::Status Promotion::FillAll(Tier& source, const std::atomic<bool>& cancel) {
  const size_t chunks_per_run = std::max<uint64_t>(1, kMaxRunBytes / chunk_bytes_);
  for (size_t first = 0; first < chunk_count_; first += chunks_per_run) {
    if (cancel.load(std::memory_order_relaxed)) return absl::CancelledError("shutting down");
    size_t last = std::min(first + chunks_per_run, chunk_count_) - 1;
    bool loaded_any = false;
    absl::Status status = ClaimAndLoad(source, first, last, &loaded_any);
    if (!status.ok()) return status;
  }
  if (chunk_count_ > 0 && !AwaitChunks(0, chunk_count_ - 1)) {
    return absl::DataLossError(absl::StrCat(entry_->ref.name, ": a source read failed"));
  }
  return absl::OkStatus();
}

}  // namespace monarch
