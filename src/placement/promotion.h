// Promotion: one file on its way from the source to a faster tier.
//
// The file is streamed through fixed-size chunks. Readers that arrive while
// the copy is in flight and the background copy share those chunks: whoever
// first needs a chunk claims it and reads it from the source into a pooled
// buffer, everyone else waits for it, and nobody reads it again. So a
// framework that reads the whole file feeds the promotion (the paper's
// "reuse the bytes already read"), and a partial read of a shard costs the
// PFS no extra bytes. The background copy writes chunks to the tier's
// CopyWriter in order and then frees their buffers, so a promotion holds
// only the chunks loaded but not yet written, never the whole file; readers
// get those later chunks back from the writer. The tier copy becomes visible
// only when the handler commits the writer.
//
// Thread-safe. Lifetime: shared by the placement handler, the background
// task and in-flight readers.

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
#include "placement/chunk_pool.h"
#include "placement/fetch_source.h"

namespace monarch {

class Promotion {
 public:
  // `pool` must outlive the promotion.
  Promotion(FileEntry* entry, int target_tier, uint64_t chunk_bytes, ChunkPool* pool);
  ~Promotion();

  FileEntry& entry() const { return *entry_; }
  int target_tier() const { return target_tier_; }

  // How Read() got its bytes.
  enum class ReadOutcome {
    kShared,    // Every byte was already loaded by someone else.
    kLoaded,    // This read loaded some chunks from the source itself.
    kFellBack,  // A chunk could not be had: the request went to the source.
  };

  // Serves [offset, offset + n) (within the file) from the promotion's
  // chunks, loading those nobody has loaded yet from `source`. If a chunk
  // cannot be had, the request is read from the source directly instead, so
  // the caller gets either the right bytes or the source's error.
  absl::StatusOr<size_t> Read(FetchSource& source, uint64_t offset, char* dst, size_t n,
                              ReadOutcome* outcome);

  // The background copy: streams every chunk into `writer` in order, loading
  // the ones still missing. Stops with Cancelled once `*cancel` is set, with
  // the source's error if a chunk fails to load, or with the writer's error
  // (then `*writer_failed` is set). The caller commits the writer on success
  // and calls Abandon() otherwise.
  absl::Status CopyTo(FetchSource& source, std::shared_ptr<CopyWriter> writer,
                      const std::atomic<bool>& cancel, bool* writer_failed);

  // After a failed copy: readers stop using the writer's bytes.
  void Abandon();

 private:
  enum class ChunkState : uint8_t { kEmpty, kLoading, kReady, kWritten, kFailed };
  struct Chunk {
    ChunkState state = ChunkState::kEmpty;
    char* buffer = nullptr;  // Set while kLoading or kReady.
  };

  uint64_t ChunkOffset(size_t c) const { return c * chunk_bytes_; }
  size_t ChunkLength(size_t c) const;
  // Claims chunk `c` if it is empty (taking a buffer); true if claimed.
  bool ClaimLocked(size_t c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Loads a claimed chunk from the source and marks it ready or failed.
  void Load(FetchSource& source, size_t c);

  FileEntry* const entry_;
  const int target_tier_;
  const uint64_t chunk_bytes_;
  const size_t chunk_count_;
  ChunkPool* const pool_;

  Mutex mu_;
  CondVar chunk_settled_;  // A chunk left kLoading.
  std::vector<Chunk> chunks_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<CopyWriter> writer_ ABSL_GUARDED_BY(mu_);  // Holds the kWritten chunks.
};

}  // namespace monarch

#endif  // MONARCH_PLACEMENT_PROMOTION_H_
