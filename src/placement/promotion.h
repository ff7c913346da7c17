// Promotion: one file on its way from the source to a faster tier.
//
// The file moves in fixed-size chunks. Whoever first needs a chunk claims it
// and reads it from the source into a staging buffer, in its own thread: a
// reader that misses loads the chunks of its request itself and is answered
// from them at once; the placement thread loads the chunks nobody asked for.
// Every chunk is read from the source once, however many readers share it,
// and a partial read of a shard still brings the whole file up.
//
// A loaded chunk is "staged" until someone writes it into the tier's copy.
// Normally a placement thread does, off the reader's path: the reader
// "parks" the chunks it loaded. Staging memory never exceeds its budget (the
// host's ChunkPool): a chunk's buffer is reserved before the chunk is
// loaded, however many threads load at once, and
// - when the parked chunks fill their part of the budget (the placement
//   threads are falling behind, e.g. on a busy CPU), the reader writes the
//   chunks it loaded itself before it returns;
// - a reader that finds no room for a chunk's buffer first deals with the
//   chunks it holds (serves its bytes from them, parks or writes them), and
//   only then waits for room, which threads loading or writing right now
//   return (the parked chunks cannot fill the readers' share);
// - a placement thread takes its buffer from a part of the budget kept for
//   the placement threads, one chunk each.
// The work gets done either way, staging memory stays bounded, every chunk
// is still read from the source once, and nothing waits on a thread that
// does not get CPU time. The tier's copy is only ever written from staging
// buffers, never from a caller's memory (in the node service that is a
// buffer the client can write to).
//
// Whoever writes the last chunk hands the copy to the host to commit
// (PromotionHost::CommitLater), and the commit reports the outcome
// (PromotionHost::PromotionDone), once. The copy is committed only if the
// source file is still the one the namespace walk found
// (Origin::IdentityToCommit), so a copy never mixes two versions; a copy
// of one chunk is checked as of its descriptor's open (Promotion::Commit).
// A failure (the source, the tier, or cancellation) abandons the copy:
// readers are then served from the source, and the temporary copy is
// deleted.
//
// Thread-safe. Shared (std::shared_ptr) by the handler's in-flight table,
// the placement task and the readers inside it.

#ifndef MONARCH_PLACEMENT_PROMOTION_H_
#define MONARCH_PLACEMENT_PROMOTION_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "drivers/tier.h"
#include "metadata/namespace.h"
#include "placement/chunk_pool.h"

namespace monarch {

class Promotion;

// How a promotion cuts its file into chunks. Immutable: read without a lock.
struct ChunkLayout {
  uint64_t file_bytes;
  uint64_t chunk_bytes;
  size_t count() const { return (file_bytes + chunk_bytes - 1) / chunk_bytes; }
  uint64_t Offset(size_t c) const { return c * chunk_bytes; }
  size_t Length(size_t c) const {
    return static_cast<size_t>(std::min<uint64_t>(chunk_bytes, file_bytes - Offset(c)));
  }
};

// The chunks of one promotion: each chunk's state and staging buffer, with
// the staging pool's accounting that goes with them (a buffer parked and
// unparked, and returned, once each) and the chunks' CRC32Cs. Apart from
// Promotion so that a chunk's state machine and its buffer's accounting
// change in one place, while Promotion decides which thread loads, writes
// or waits. Not thread-safe: its promotion's mutex guards it; it calls only
// the pool, which takes its own lock last.
class ChunkTable {
 public:
  enum class State : uint8_t {
    kEmpty,    // Nobody has it.
    kLoading,  // A thread is reading it from the source into its buffer.
    kStaged,   // In its buffer, not yet in the tier.
    kWriting,  // In its buffer, being written to the tier (buffer still readable).
    kWritten,  // In the tier's copy; buffer returned.
    kFailed,   // Could not be loaded.
  };

  // `checksum`: keep each loaded chunk's CRC32C (Stage) for ContentCrc().
  ChunkTable(ChunkLayout layout, ChunkPool* pool, bool checksum);
  ~ChunkTable();  // Returns every buffer still held.

  State state(size_t c) const { return chunks_[c].state; }
  // Set in kLoading, kStaged and kWriting.
  char* buffer(size_t c) const { return chunks_[c].buffer; }

  // kEmpty -> kLoading with `buffer`, reserved by the caller.
  void ClaimLoad(size_t c, char* buffer) { chunks_[c] = {State::kLoading, false, buffer}; }
  // kLoading -> kStaged; `crc` is the chunk's CRC32C, with checksum.
  void Stage(size_t c, uint32_t crc) {
    chunks_[c].state = State::kStaged;
    if (!crcs_.empty()) crcs_[c] = crc;
  }
  // Parks a staged chunk in the pool, for a placement thread to write;
  // false if the parked chunks have no room for it.
  bool Park(size_t c) { return chunks_[c].parked = pool_->TryPark(layout_.Length(c)); }
  // kStaged -> kWriting (no longer parked); false if the chunk was not
  // staged.
  bool ClaimWrite(size_t c);
  // kWriting -> kWritten, returning the buffer; true if it was the last.
  bool MarkWritten(size_t c);
  // Returns the chunk's buffer, if any: kFailed.
  void Release(size_t c) {
    ReturnBuffer(c);
    chunks_[c].state = State::kFailed;
  }
  // Release() of every chunk not kLoading or kWriting: the threads loading
  // and writing own those chunks' buffers until they finish.
  void ReleaseSettled();

  // Some chunk is still to be loaded or written by whoever finishes the
  // promotion (kEmpty or kStaged).
  bool HasUnclaimed() const {
    return std::any_of(chunks_.begin(), chunks_.end(), [](const Chunk& chunk) {
      return chunk.state == State::kEmpty || chunk.state == State::kStaged;
    });
  }
  int CountIn(State state) const {
    return std::count_if(chunks_.begin(), chunks_.end(),
                         [state](const Chunk& chunk) { return chunk.state == state; });
  }
  // The CRC32C of the whole file, from the chunks' (with checksum).
  uint32_t ContentCrc() const;

 private:
  struct Chunk {
    State state = State::kEmpty;
    bool parked = false;  // kStaged and counted as parked in the pool.
    char* buffer = nullptr;
  };
  void Unpark(size_t c);
  void ReturnBuffer(size_t c);

  const ChunkLayout layout_;
  ChunkPool* const pool_;
  std::vector<Chunk> chunks_;
  std::vector<uint32_t> crcs_;  // With checksum, per loaded chunk.
  size_t written_ = 0;
};

// Origin: where the bytes of a file no cache tier holds come from (the
// read-only tiers: the peers, if any, then the source), and the check that
// a copy of them is of the version the namespace walk found. Apart from the
// Promoter because it is the one part of placement that talks to the
// origins, not to the cache tiers or the in-flight table: promotions read
// through it, and so do the handler's reads of files left on the source.
// Thread-safe (its state is atomics); the tiers and namespace outlive it.
class Origin {
 public:
  // `tiers`: the cache tiers, then the read-only ones, the source last.
  // `remember_content`: keep each file's CRC32C from its first committed
  // copy (see IdentityToCommit).
  Origin(const std::vector<std::unique_ptr<Tier>>* tiers, const Namespace* ns,
         bool remember_content);

  int source_index() const { return source_index_; }

  // Reads bytes of a file no cache tier holds: from the file's home peer
  // when there are peers, else (or failing that) the source. As
  // StorageDriver::Read. `from_source`, if given, is set when the source
  // answered.
  absl::StatusOr<size_t> Read(const FileRef& file, uint64_t offset, char* dst, size_t n,
                              bool* from_source = nullptr);
  // The same from the source, if every byte is in its memory already
  // (InMemoryReads::ReadIfInMemory): Unavailable or Unimplemented if not.
  absl::StatusOr<size_t> ReadSourceIfInMemory(const FileRef& file, uint64_t offset, char* dst,
                                              size_t n);
  // What the copy about to be committed is a copy of: the source file as
  // the namespace walk found it. When `read_source` (some chunk came from
  // the source rather than a peer), a file changed since the walk (size,
  // times, or replaced) is Aborted: its chunks may mix versions, or be of
  // a version the namespace never saw. `content_crc` is the CRC32C of the
  // bytes copied, when the promotion was asked to compute it. The source
  // is asked as FileIdentity::Identify with `opened_since`.
  absl::StatusOr<SourceIdentity> IdentityToCommit(const FileEntry& entry, bool read_source,
                                                  std::optional<uint32_t> content_crc,
                                                  FileIdentity::Clock::time_point opened_since);

  // Counters, for the Promoter's report.
  uint64_t bytes_from_memory() const { return bytes_from_memory_.load(); }
  uint64_t source_changed() const { return source_changed_.load(); }
  uint64_t identified_by_content() const { return identified_by_content_.load(); }

 private:
  const std::vector<std::unique_ptr<Tier>>* const tiers_;
  const Namespace* const namespace_;
  const int source_index_;
  const int first_origin_;  // The first read-only tier.

  // The CRC32C of each file's bytes as its first committed copy had them,
  // with kContentKnown set; 0 until then (allocated only with
  // `remember_content`, i.e. with eviction). With eviction a file is
  // promoted again each time its copy was evicted, and comparing the bytes
  // with these spares the source a metadata operation per promotion (an
  // fstat is a getattr on the PFS's metadata server).
  static constexpr uint64_t kContentKnown = uint64_t{1} << 32;
  std::unique_ptr<std::atomic<uint64_t>[]> content_crcs_;

  std::atomic<uint64_t> bytes_from_memory_{0};
  std::atomic<uint64_t> source_changed_{0};
  std::atomic<uint64_t> identified_by_content_{0};
};

// What a promotion needs from its owner. Everything here outlives it.
class PromotionHost {
 public:
  virtual ~PromotionHost() = default;
  // Where the file's bytes come from, and the check of the copy's version.
  virtual Origin& origin() = 0;
  // Staging buffers, within the staging budget.
  virtual ChunkPool& chunk_pool() = 0;
  virtual bool cancelled() const = 0;
  // A chunk went into the tier, written by a reader or a placement thread.
  virtual void ChunkWritten(bool by_reader) = 0;
  // Every chunk is written: the copy is to be committed (Promotion::Commit),
  // on a thread of the host's choosing. Committing checks the source file
  // (a metadata round trip to the PFS), so neither the reader nor the
  // placement thread that wrote the last chunk waits for it.
  virtual void CommitLater(std::shared_ptr<Promotion> promotion) = 0;
  // The copy was committed (ok) or abandoned. Called once per promotion, by
  // the thread that finished it, with no promotion lock held.
  // `tier_failed`: the error came from the tier, not the source.
  virtual void PromotionDone(Promotion& promotion, const absl::Status& status,
                             bool tier_failed) = 0;
};

class Promotion : public std::enable_shared_from_this<Promotion> {
 public:
  // `checksum`: compute the CRC32C of the file's bytes as its chunks load,
  // for Origin::IdentityToCommit. `began`: when the miss that starts it
  // began, before it asked the source what it holds in memory, which opens
  // the descriptor this promotion then reads (see Commit).
  Promotion(PromotionHost* host, const FileEntry& entry, Tier* tier, int tier_index,
            uint64_t chunk_bytes, bool checksum, FileIdentity::Clock::time_point began);
  Promotion(const Promotion&) = delete;
  Promotion& operator=(const Promotion&) = delete;

  const FileEntry& entry() const { return entry_; }
  int target_tier() const { return tier_index_; }

  // How Read() got its bytes.
  enum class ReadOutcome {
    kShared,    // Every byte was already loaded by someone else.
    kLoaded,    // This read loaded some chunks from the source itself.
    kFellBack,  // The promotion failed or a chunk could not be had: read from the source.
  };

  // Serves [offset, offset + n) (within the file): loads the chunks nobody
  // has claimed, waits only for chunks another thread is loading (and for
  // staging memory that threads loading or writing return), copies.
  // If the promotion cannot serve it, the range is read from the source
  // instead, so the caller gets the right bytes or the source's error.
  absl::StatusOr<size_t> Read(uint64_t offset, char* dst, size_t n, ReadOutcome* outcome);

  // True once, if chunks remain to be loaded or written and nobody has taken
  // the job of finishing them: the caller must then run RunToCompletion() on
  // a placement thread.
  bool ClaimBackgroundTask();

  // The placement thread's part: loads every chunk nobody loaded, writes
  // every staged chunk, in file order. Returns when nothing is left to do
  // (the last chunk may still be finishing in a reader's thread).
  // `memory_only`: load only bytes the source holds in memory; if one is
  // not, give the promotion up (gave_up_not_in_memory()) rather than read
  // the source's device or network (DeferredCopies).
  void RunToCompletion(bool memory_only = false);
  // RunToCompletion(memory_only) gave up: the file is still worth promoting
  // at its next miss.
  bool gave_up_not_in_memory() const {
    return gave_up_not_in_memory_.load(std::memory_order_acquire);
  }

  // Commits the copy once every chunk is written (PromotionHost::CommitLater
  // calls it): checks the source file (Origin::IdentityToCommit) and
  // publishes it, or abandons it when the source changed or the host is
  // shutting down.
  // Reports the outcome (PromotionHost::PromotionDone).
  void Commit();

  // Abandons the promotion (shutdown): Cancelled is reported to the host
  // unless it has already finished. Threads loading or writing a chunk
  // notice at their next chunk boundary; threads waiting for a chunk are
  // woken and read the source instead.
  void Cancel();

  // What the promotion is doing, for a shutdown that gave up waiting on it:
  // the file and how many chunks are being loaded and written now.
  std::string Describe();

 private:
  // Reads a claimed chunk from the source: kStaged, or kFailed (the
  // promotion then fails).
  void Load(size_t c, bool memory_only = false);
  // Writes a claimed chunk into the tier: kWritten, or fails the promotion.
  // Commits the copy if it was the last one.
  void Write(size_t c, bool by_reader);
  // Read()'s copy of [from, end) of its range into `dst`, from staging
  // buffers and the tier's copy; false if a chunk could not be had.
  bool CopyOut(uint64_t offset, char* dst, size_t n, size_t from, size_t end);
  // Parks each chunk of `loaded` (a reader's) that is still staged, or
  // writes it if the parked chunks have no room for it.
  void ParkOrWrite(const std::vector<size_t>& loaded);
  // The tier's writer, created by the first thread that needs it.
  absl::StatusOr<std::shared_ptr<CopyWriter>> GetWriter();
  void Fail(const absl::Status& status, bool tier_failed);

  PromotionHost* const host_;
  const FileEntry entry_;
  Tier* const tier_;
  const int tier_index_;
  const ChunkLayout layout_;
  const bool checksum_;
  const FileIdentity::Clock::time_point began_;

  Mutex writer_mu_;  // Serializes creating the writer; taken before mu_, never inside it.

  Mutex mu_;
  CondVar chunk_settled_;  // A chunk left kLoading.
  ChunkTable chunks_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<CopyWriter> writer_ ABSL_GUARDED_BY(mu_);
  bool background_claimed_ ABSL_GUARDED_BY(mu_) = false;
  bool committing_ ABSL_GUARDED_BY(mu_) = false;  // Every chunk written: too late to fail.
  bool done_ ABSL_GUARDED_BY(mu_) = false;        // Committed or failed; reported to the host.
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  bool read_source_ ABSL_GUARDED_BY(mu_) = false;  // Some chunk came from the source.
  std::atomic<bool> gave_up_not_in_memory_{false};
};

}  // namespace monarch

#endif  // MONARCH_PLACEMENT_PROMOTION_H_
