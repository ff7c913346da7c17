// Monarch: the standalone read API.
//
// A Monarch instance serves a training job's reads of one dataset from the
// fastest storage tier holding each file, and copies whole files up from the
// source (the parallel file system) into faster tiers in background threads.
//
//   auto monarch = monarch::Monarch::Create(monarch::DefaultConfig("/lustre/imagenet"));
//   if (!monarch.ok()) ...;
//   absl::StatusOr<size_t> n = (*monarch)->Read("train/n01440764/0001.JPEG", buf, size, 0);
//
// Threading: every method may be called concurrently from any number of
// threads, except that nothing may be called once the destructor has begun.
// No method throws.
//
// Names: files are named by their dataset-relative path ("train/a.jpg"). An
// absolute path inside the dataset directory ("/lustre/imagenet/train/a.jpg")
// is accepted too and means the same file.

#ifndef MONARCH_MONARCH_H_
#define MONARCH_MONARCH_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "monarch/config.h"
#include "monarch/sampled_order.h"
#include "monarch/stats.h"

namespace monarch {

class Monarch {
 public:
  // Builds the namespace by walking the dataset directory, opens the tiers
  // (reusing valid copies an earlier run left in file-backed tiers and
  // discarding stale ones) and starts the placement threads. Fails with
  // InvalidArgument for a bad config, NotFound for a missing dataset.
  static absl::StatusOr<std::unique_ptr<Monarch>> Create(const Config& config);
  // From a YAML config. `share_node_by_default`, for a front end whose
  // readers are other processes (monarch.torch's DataLoader workers, any
  // program that forks readers): node.shared is true unless the config sets
  // it, so that the readers of a node share one cache across processes.
  static absl::StatusOr<std::unique_ptr<Monarch>> CreateFromYamlFile(
      const std::string& path, bool share_node_by_default = false);
  static absl::StatusOr<std::unique_ptr<Monarch>> CreateFromYamlString(
      std::string_view yaml, bool share_node_by_default = false);

  // Shuts down (cancelling queued promotions) if Shutdown() was not called.
  virtual ~Monarch() = default;

  Monarch(const Monarch&) = delete;
  Monarch& operator=(const Monarch&) = delete;

  // pread semantics: reads up to `n` bytes of `name` at `offset` into
  // `buffer` and returns how many were read: short at the end of the file,
  // 0 at or past it. NotFound if `name` is not a dataset file; the source's
  // error status if the source read fails. Never returns bytes that differ
  // from the source's.
  virtual absl::StatusOr<size_t> Read(std::string_view name, void* buffer, size_t n,
                                      uint64_t offset) = 0;

  // Maps tier copies in place, for front ends that map dataset files
  // (the preload library's mmap, the Python package's Monarch.mmap).
  // `mapping` is the caller's private mapping of bytes [offset, offset +
  // length) of `name`, made lazily from the source file (mmap of it with
  // MAP_PRIVATE), page-aligned, that nobody has written to yet. Each whole
  // page of it that a tier holds a copy of that may be mapped is mapped
  // again at the same address from that copy, with `protection` (and
  // MAP_NORESERVE, MAP_LOCKED, MAP_POPULATE if `flags` has them), so that
  // touching it reads the node's copy instead of the source. Returns the
  // bytes so mapped; the rest stays on the source. A posix or pmem copy is
  // mapped once checked whole, since a page fault checks nothing: one not
  // checked yet is queued to be, for a later mapping. A RAM copy of 1 MiB
  // or more is mapped as the tier's own memory, which the tier then holds
  // until no process maps it, even once the copy is removed. An error
  // leaves parts of the range remapped, or unmapped: the caller must unmap
  // all of it.
  virtual absl::StatusOr<uint64_t> MapCopies(std::string_view name, void* mapping,
                                             uint64_t offset, uint64_t length, int protection,
                                             int flags) = 0;

  // Namespace queries, answered from memory (no I/O).
  // Size of a file; NotFound if it is not a dataset file.
  virtual absl::StatusOr<uint64_t> FileSize(std::string_view name) const = 0;
  // Size and source modification time (as seen at start-up).
  struct FileStat {
    uint64_t size = 0;
    int64_t mtime_ns = 0;  // Nanoseconds since the Unix epoch.
    // The rest of what stat() said, for front ends that answer stat() from
    // memory (the preload library): the same values the file system gives.
    int64_t atime_ns = 0;
    int64_t ctime_ns = 0;
    uint64_t device = 0;
    uint64_t inode = 0;
    uint64_t blocks = 0;  // 512-byte units.
    uint32_t mode = 0;    // Type and permission bits.
    uint32_t link_count = 0;
    uint32_t uid = 0;
    uint32_t gid = 0;
    uint32_t block_size = 0;
    bool via_symlink = false;  // The name is a symlink to the file: lstat() differs.
  };
  virtual absl::StatusOr<FileStat> Stat(std::string_view name) const = 0;
  virtual bool FileExists(std::string_view name) const = 0;
  // True for the dataset root ("" or "/"), and every directory holding at
  // least one dataset file.
  virtual bool IsDirectory(std::string_view name) const = 0;
  // Names (not paths) of the files and directories directly inside `dir`,
  // sorted. NotFound if `dir` is not a directory of the dataset.
  virtual absl::StatusOr<std::vector<std::string>> ListDirectory(std::string_view dir) const = 0;
  // Dataset-relative names of every file, sorted.
  virtual std::vector<std::string> ListFiles() const = 0;
  // The absolute dataset directory, without a trailing slash.
  virtual const std::string& dataset_root() const = 0;

  // A consistent-enough snapshot of the counters (each counter is exact; the
  // set is not taken atomically).
  virtual Stats GetStats() const = 0;

  enum class ShutdownMode {
    kDrain,   // Finish the queued and running promotions, for at most
              // placement.shutdown_timeout; then cancel the rest.
    kCancel,  // Drop queued promotions, let running ones stop at a safe point.
  };
  // Stops background placement, prefetch and the peers. Nothing half-written
  // ever becomes visible and counters stay consistent. Reads keep working
  // afterwards (from wherever each file already is); they just no longer
  // start promotions. Idempotent.
  //
  // Always returns: after the drain (if any), it waits a few seconds for
  // the threads still inside a read or write to notice the cancellation. A
  // thread blocked in a file system that stopped answering is logged and
  // left behind, with what it uses, so that the process can still exit.
  virtual void Shutdown(ShutdownMode mode) = 0;

  // Blocks until no promotion is queued or running, and the file tiers have
  // opened and checked the copies written (see placement.verify). For tests
  // and tools that want a fully promoted dataset before timing the next
  // epoch.
  virtual void WaitForPlacement() = 0;

  // Clairvoyant prefetch: announces the order in which this process will
  // read files (dataset-relative names or paths inside the dataset), e.g. an
  // epoch's shuffled order, before it starts reading. Background streams
  // (config `prefetch`) then read ahead of this process in that order and
  // promote the files, at most `prefetch.lookahead` bytes ahead. Reads need
  // not follow the order: one that does not is served as usual. A new call
  // replaces the previous order; an empty one withdraws it. With the node
  // service, each process announces its own share (one rank, one DataLoader
  // worker) and the service merges them. NotFound names the first name
  // that is not a dataset file; nothing is announced then.
  virtual absl::Status AnnounceOrder(const std::vector<std::string>& names) = 0;

  // The same, with the order given as a seeded sampler
  // (monarch/sampled_order.h): `files[i]` is the file sample i reads, and
  // the order announced is what rank `how.rank` reads in epochs
  // how.first_epoch .. how.first_epoch + how.epochs - 1, concatenated. So
  // several epochs can be announced at once, and eviction (placement.policy
  // lru) sees when each file is read next beyond the coming epoch. The
  // streams fetch each file once: later epochs' entries only inform
  // eviction unless a file was dropped in between. InvalidArgument names
  // the field of `how` that is out of range (or `files` when empty);
  // otherwise as AnnounceOrder. Builds the whole list first: memory is
  // about a name per announced sample, until AnnounceOrder returns.
  absl::Status AnnounceSampledOrder(const std::vector<std::string>& files,
                                    const SampledOrder& how);

  // A sample that is a range of a file: `length` bytes at `offset` (0: to
  // the end of the file). A record inside a big file.
  struct SampleRange {
    std::string file;
    uint64_t offset = 0;
    uint64_t length = 0;
  };
  // AnnounceOrder with samples given as ranges: for a file cached by
  // extents (placement.extent_bytes), the streams fetch the extents that
  // hold each range, in the order given, and next-use eviction sees when
  // each extent is read next; a file cached whole is fetched whole.
  // OutOfRange names a range that starts past its file's end; otherwise as
  // AnnounceOrder. Through the node service, the service does the same for
  // the node, and the extents a process's reads touch count against its
  // order.
  virtual absl::Status AnnounceRanges(const std::vector<SampleRange>& samples);

 protected:
  Monarch() = default;
};

}  // namespace monarch

#endif  // MONARCH_MONARCH_H_
