// Promotion: one file on its way from the source to a faster tier.
//
// The whole file is staged in memory (a FileImage) in fixed-size chunks.
// Readers that arrive while the copy is in flight and the background copy
// share those chunks: whoever first needs a chunk claims it and reads it from
// the source, everyone else waits for it, and nobody reads it again. So a
// framework that reads the whole file feeds the promotion (the paper's
// "reuse the bytes already read"), a partial read of a shard costs the PFS
// no extra bytes, and no byte is ever read twice from the PFS, while readers
// never see a half-written tier copy: the tier only receives the image once
// every chunk is in.
//
// Thread-safe. Lifetime: shared by the placement handler, the background
// task and in-flight readers; the image may outlive it inside the RAM tier.

#ifndef MONARCH_PLACEMENT_PROMOTION_H_
#define MONARCH_PLACEMENT_PROMOTION_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "drivers/tier.h"
#include "metadata/namespace.h"

namespace monarch {

class Promotion {
 public:
  // `tier_keeps_image`: the target tier holds on to the image itself (RAM);
  // otherwise the image is transient and its buffer is recycled.
  Promotion(FileEntry* entry, int target_tier, bool tier_keeps_image, uint64_t chunk_bytes);

  FileEntry& entry() const { return *entry_; }
  int target_tier() const { return target_tier_; }

  // Serves [offset, offset + n) (within the file) from the staged image,
  // loading the chunks nobody has loaded yet from `source`. If a chunk failed
  // to load, the request is read from the source directly instead, so the
  // caller gets either the right bytes or the source's error. `*hit` is set
  // when every byte was already staged by someone else.
  absl::StatusOr<size_t> Read(Tier& source, uint64_t offset, char* dst, size_t n, bool* hit);

  // Loads every chunk still missing, in order, in runs of up to
  // `max_run_bytes`. Stops early with Cancelled once `*cancel` is set, and
  // with the source's error if a chunk fails.
  absl::Status FillAll(Tier& source, const std::atomic<bool>& cancel);

  // The complete image. Only valid after FillAll() returned OK.
  std::shared_ptr<const FileImage> image() const { return image_; }

 private:
  enum class ChunkState : uint8_t { kEmpty, kLoading, kReady, kFailed };

  // Claims the empty chunks in [first, last] and loads them, one source read
  // per contiguous run. Returns the first load error.
  absl::Status ClaimAndLoad(Tier& source, size_t first, size_t last, bool* loaded_any);
  // Waits until no chunk in [first, last] is loading; true if all are ready.
  bool AwaitChunks(size_t first, size_t last);

  FileEntry* const entry_;
  const int target_tier_;
  const uint64_t chunk_bytes_;
  const size_t chunk_count_;
  const std::shared_ptr<FileImage> image_;

  Mutex mu_;
  CondVar chunk_settled_;  // A chunk left kLoading.
  std::vector<ChunkState> chunks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace monarch

#endif  // MONARCH_PLACEMENT_PROMOTION_H_
