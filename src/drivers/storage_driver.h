// StorageDriver: the one interface every storage tier implements.
//
// A driver holds whole-file copies of dataset files (or, for the source, the
// dataset itself) and knows nothing about placement, capacity or other tiers:
// those live in Tier (tier.h) and the placement handler. Concrete drivers are
// hidden in their .cc files and built by the factories at the bottom.
//
// Threading: every method, the capabilities' included, may be called
// concurrently, except KeptCopies' adoption (ScanCopies() to
// AdoptionDone()), which runs once at start-up before any other call, on
// one thread. A caller never stores or removes the same file concurrently
// with itself within one process.

#ifndef MONARCH_DRIVERS_STORAGE_DRIVER_H_
#define MONARCH_DRIVERS_STORAGE_DRIVER_H_

#include <sys/stat.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/counters.h"
#include "common/file_util.h"
#include "common/process_mappings.h"
#include "monarch/config.h"  // VerifyPolicy: placement.verify's values.

namespace monarch {

// What a driver needs to know about a dataset file. A small value, made
// from the namespace's table when asked for (metadata/namespace.h).
struct FileRef {
  uint32_t id = 0;         // Dense namespace id, stable for the instance's life.
  absl::string_view name;  // Dataset-relative path, e.g. "train/a.jpg".
  uint64_t size = 0;       // Size on the source at start-up.
  int64_t mtime_ns = 0;    // Modification time on the source at start-up.
  // An extent, a range of a big file cached as a file of its own
  // (metadata/namespace.h), names here the file it is part of and where in
  // it it starts; a whole file has none. Tiers hold an extent's copy under
  // its own name; only the source reads through these.
  bool is_extent = false;
  uint32_t file_id = 0;         // An extent's file: its id, name and size.
  absl::string_view file_name;
  uint64_t file_size = 0;
  uint64_t part_offset = 0;

  // The file on the source that holds these bytes, and where they start.
  FileRef source_file() const {
    if (!is_extent) return *this;
    FileRef file;
    file.id = file_id;
    file.name = file_name;
    file.size = file_size;
    file.mtime_ns = mtime_ns;
    return file;
  }
};

// Which version of a source file a copy holds: what stat() said of the
// source file. Any write to the file, in place or by replacing it, changes
// its ctime or inode, so a copy is of the current file only while all five
// still match.
struct SourceIdentity {
  uint64_t device = 0;
  uint64_t inode = 0;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;

  // Only what a FileRef knows (size and mtime): for tests and tools that
  // store copies without a source file behind them.
  static SourceIdentity Of(const FileRef& file) {
    SourceIdentity identity;
    identity.size = file.size;
    identity.mtime_ns = file.mtime_ns;
    return identity;
  }
  // What fstat() says of a file (the source's, or a copy's own inode).
  static SourceIdentity Of(const struct stat& st);
  static SourceIdentity Of(const struct statx& st);
  // An extent's (FileRef::is_extent): its file's identity, `file`, with the
  // extent's length for `size` while the file is as long as the walk found
  // it. An extent's copy records, and a copy's trailer then checks, how
  // many bytes it holds; any change to the file also changes its ctime.
  static SourceIdentity OfExtent(SourceIdentity file, const FileRef& extent) {
    if (file.size == extent.file_size) file.size = extent.size;
    return file;
  }
  bool operator==(const SourceIdentity& o) const {
    return device == o.device && inode == o.inode && size == o.size && mtime_ns == o.mtime_ns &&
           ctime_ns == o.ctime_ns;
  }
  bool operator!=(const SourceIdentity& o) const { return !(*this == o); }
};


// A copy of one file being written into a tier. The placement handler
// streams the file through it chunk by chunk, so a promotion never needs the
// whole file in memory, then commits it. Until Commit() succeeds the copy is
// invisible to Read(); destroying an uncommitted writer deletes everything it
// wrote.
//
// Threading: Write() may be called concurrently from several threads for
// disjoint ranges (a reader writing the chunk it loaded while a placement
// thread writes another). ReadBack() may be called concurrently with both,
// for ranges whose Write() has returned. Commit() is called once, after every
// Write() has returned, and not concurrently with anything but ReadBack().
class CopyWriter {
 public:
  virtual ~CopyWriter() = default;

  // Writes `n` bytes at `offset`. `offset` is a multiple of 4096 and `data`
  // is 4096-aligned and readable up to `n` rounded up to 4096, so drivers may
  // use O_DIRECT. Errors: ResourceExhausted (ENOSPC), DataLoss (EIO).
  virtual absl::Status Write(uint64_t offset, const char* data, size_t n) = 0;

  // Reads back bytes already written, for readers that arrive while the
  // copy is in flight.
  virtual absl::StatusOr<size_t> ReadBack(uint64_t offset, char* dst, size_t n) = 0;

  // Makes the complete copy visible to Read(), atomically, as a copy of
  // `source` (file tiers store it with the copy's checksums).
  virtual absl::Status Commit(const SourceIdentity& source) = 0;
};

struct DriverCapabilities;

// What every tier does. What only some do is a capability, a small
// interface below that a driver has if it inherits it: a caller asks once
// (capabilities(), which Tier keeps), and calls none it was not given, as
// the VFS calls no address_space_operations entry a file system left NULL.
class StorageDriver {
 public:
  virtual ~StorageDriver() = default;

  // Reads up to `n` bytes of the driver's copy of `file` at `offset` into
  // `dst`; returns the bytes read, fewer than `n` only at the end of the copy.
  // NotFound if the driver holds no copy. I/O errors come back as statuses
  // (EIO -> DataLoss, ...), never as retries.
  virtual absl::StatusOr<size_t> Read(const FileRef& file, uint64_t offset, char* dst,
                                      size_t n) = 0;

  // Starts a new copy of `file` (its size and mtime are in `file`). File
  // tiers write a temporary name and rename it on Commit(), so a crash or an
  // error never leaves a partial copy under the real name. The source refuses
  // with PermissionDenied. The caller owns the writer; it must not outlive
  // the driver.
  virtual absl::StatusOr<std::unique_ptr<CopyWriter>> NewWriter(const FileRef& file) = 0;

  // Deletes the copy of `file`. NotFound if there is none; PermissionDenied
  // for the source.
  virtual absl::Status Remove(const FileRef& file) = 0;

  // Blocks until the driver's background work is done for every copy
  // committed or adopted so far (the file tiers open and check each ahead
  // of its first read). Others: returns at once.
  virtual void WaitForBackgroundWork() {}

  // The driver's own counters, reported with its tier's (Tier::ReportCounters
  // passes the tier's sink): the file tiers' opens, trailer reads and blocks
  // checked. Others: none.
  virtual void ReportTierCounters(CounterSink& sink) const { (void)sink; }

  // The interfaces below that the driver's class inherits, by default.
  virtual DriverCapabilities capabilities();
};

// Mapping copies in place (Monarch::MapCopies). A page fault reads a mapped
// copy with no check, so only a copy that needs none may be mapped.
class CopyMapping {
 public:
  // Marks the copy of `file` mapped (the caller mapped it, or is about to)
  // and returns the stamp a mapping of it may trust; nullopt if none may.
  // File tiers: the stamp of the copy (its inode as fstat() saw it,
  // CopyState::Stamp) if every block of it was checked against its
  // checksum and remembered; if not, nullopt, and the copy is queued to be
  // checked in the background, so that a later mapping finds it checked.
  // Under placement.verify: every-read, never (a mapping cannot check each
  // access); under off, once the trailer was read. The RAM tier: its
  // copies are sealed memory and need no check, so SourceIdentity::Of(file)
  // for any copy of 1 MiB or more it holds, which is maybe mapped
  // (SharedCopies::MayBeMapped) from then on, until a walk of the mappings
  // finds nobody mapping it: removed meanwhile, it is held, not reused. A
  // client's view of it: nullopt (the service marks it: kCheckedCopies).
  virtual std::optional<SourceIdentity> MarkMapped(const FileRef& file) = 0;

  // The copy of `file` opened to be mapped read-only and privately: its
  // first byte is at `offset` of `fd`. File tiers: once the tier vouched
  // for it (`checked`: what MarkMapped() said, in this process or in the
  // node service), if it is still that inode; FailedPrecondition if it
  // changed or `checked` is null, NotFound if it is gone. The RAM tier (the
  // service's, in a client): before the tier is asked (`checked` null;
  // FailedPrecondition otherwise), where the copy lies in the arena now, if
  // it starts on a page (copies of 1 MiB or more do); FailedPrecondition
  // in a process that is not dumpable (no walk could see its mapping). It
  // must be mapped before MarkMapped() is asked about it: the tier holds a
  // copy for the mappings that existed when it was asked, as a walk of
  // them sees.
  struct MappableCopy {
    int fd = -1;
    std::shared_ptr<ScopedFd> owner;  // Keeps `fd` open, if it was opened for this.
    uint64_t offset = 0;
    uint64_t generation = 0;  // What StillCopyOf() compares.
  };
  virtual absl::StatusOr<MappableCopy> OpenCheckedCopy(const FileRef& file,
                                                       const SourceIdentity* checked) = 0;
  // Asked once a mapping of `copy` exists and the tier vouched for it:
  // whether it is still `file`'s copy. A RAM copy removed before its tier
  // was asked may have been reused (one removed after is held while it is
  // mapped). A file tier's copy is an inode the mapping keeps: always.
  virtual bool StillCopyOf(const FileRef& file, const MappableCopy& copy) = 0;
};

// Reading only what is in memory (the source), so that a miss on bytes in
// its page cache is served at the cost of a plain read (cached_source).
class InMemoryReads {
 public:
  // Who asks, which decides what the asking may cost:
  // - kMiss, a reader's miss: if the bytes are not in memory, its copy
  //   reads them next, so the ask may open the file and may start the
  //   read-ahead that fetches them (RWF_NOWAIT: one call for the ask and
  //   the read, where the file system takes it).
  // - kDeferredCopy, a copy that gives up if its bytes left memory: may
  //   open the file, must read nothing in.
  // - kHit, a read a copy serves: must read nothing in, and opens the file
  //   only where an open is local (a disk file system), as on a network or
  //   FUSE one it is a metadata round trip to the PFS for bytes the copy
  //   holds.
  enum class Asker { kMiss, kDeferredCopy, kHit };
  // StorageDriver::Read(), if every byte asked for is in memory already:
  // Unavailable if one would have to come from the device or the network
  // (for kHit, also a file not open on a remote source), Unimplemented if
  // the file system cannot tell. Never waits for I/O.
  virtual absl::StatusOr<size_t> ReadIfInMemory(const FileRef& file, uint64_t offset, char* dst,
                                                size_t n, Asker asker) = 0;
};

// Backing memory ahead, and giving it back: the RAM tier, for memory.watch.
class MemoryBacking {
 public:
  // Memory the tier may allocate ahead of need (back_ahead) until told again.
  virtual void AllowMemoryAhead(uint64_t bytes) = 0;
  // Gives the memory of removed copies back to the kernel (a tier made
  // releasable, when memory pressure shrinks it); returns the bytes.
  virtual uint64_t ReleaseFreeMemory() = 0;
};

// Identity: what a file on the source is now, which a promotion checks
// before it commits a copy of it.
class FileIdentity {
 public:
  // The identity of the file the descriptor reads use: its fstat(), one
  // metadata round trip on a network file system. But if that descriptor
  // was opened at or after `opened_since`, the attributes the kernel
  // fetched with the open (statx with AT_STATX_DONT_SYNC; local file
  // systems always answer with the inode as it is): an open on NFS (its
  // close-to-open check), Lustre (the open intent's reply) or FUSE (the
  // lookup, when entries are not cached) fetches them, so they describe
  // the file as of the open, for no round trip. A file system that caches
  // entries but not attributes may answer older ones; a restart's walk
  // still finds the change and drops the copy. `kAlwaysAsk`: fstat().
  // The open's errors (NotFound, ...); FailedPrecondition if it is no
  // longer a regular file.
  using Clock = std::chrono::steady_clock;
  static constexpr Clock::time_point kAlwaysAsk = Clock::time_point::max();
  virtual absl::StatusOr<SourceIdentity> Identify(const FileRef& file,
                                                  Clock::time_point opened_since) = 0;
};

// Copies kept across runs: the file tiers, and a RAM tier whose memory is
// kept (RamTierOptions::kept_dir).
class KeptCopies {
 public:
  // Calls `visit` for every copy an earlier run left: its dataset-relative
  // name and the source identity stored with it, or null when the copy
  // carries no valid record (not written by Monarch, cut short, damaged).
  // Deletes temporaries left by processes that are no longer alive. Errors:
  // the directory's.
  using CopyVisitor =
      absl::FunctionRef<void(absl::string_view name, const SourceIdentity* source)>;
  virtual absl::Status ScanCopies(CopyVisitor visit) = 0;
  // A copy ScanCopies() found was adopted as the copy of `file` (during the
  // scan or after it, before AdoptionDone()): readied ahead of its first
  // read (WaitForBackgroundWork). A copy it found is otherwise removed.
  virtual void CopyAdopted(const FileRef& file) = 0;
  // Every copy found was adopted or removed: a kept RAM tier frees the
  // memory of those it found and nobody adopted (another dataset's).
  virtual void AdoptionDone() {}
};

// Memory other processes share (the RAM tier): clients read its copies
// (NewRamReader), processes map them, peers are sent them where they rest.
// Who maps what is not the tier's to find out: the instance that hands
// mappings out walks the node's processes (MappingWatch) and tells it.
class SharedCopies {
 public:
  // The descriptors a node service hands its clients; owned by the driver.
  virtual std::vector<int> SharedMemoryDescriptors() const = 0;
  // Calls `visit` with [offset, offset + n) of the copy of `file` where the
  // bytes rest, and returns OK if they were that copy's throughout the call
  // (NotFound if there is none, or it was removed meanwhile; OutOfRange if
  // the range passes its end). The bytes may change once it returns, if the
  // copy is removed and its memory reused: a caller that goes on using them
  // must be able to tell (the peers send them with their CRC32C, which the
  // requester checks). Lets a peer send a copy without a staging copy.
  struct InMemoryBytes {
    const char* data;
    // Their CRC32C, when the driver kept the copy's block checksums
    // (computed as the copy was written) and the range is whole 4 KiB
    // blocks, the last one possibly ending the file: then nobody reads the
    // bytes to send them.
    std::optional<uint32_t> crc32c;
  };
  virtual absl::Status VisitInMemory(const FileRef& file, uint64_t offset, size_t n,
                                     absl::FunctionRef<void(const InMemoryBytes& bytes)> visit) = 0;
  // Bytes of removed copies held because some process may map them; they
  // count against the tier's capacity.
  virtual uint64_t HeldBytes() const = 0;
  // Whether a process may map the copy of `file` now (it was marked mapped
  // since the last walk of the mappings, or that walk found it mapped).
  // Eviction passes over such copies: removing one would free no room,
  // only hold it.
  virtual bool MayBeMapped(const FileRef& file) = 0;
  // Frees the held copies that `walk` (every process's private mappings of
  // the tier's memory files, first handed out at `since`) finds nobody
  // mapping, and returns their bytes; a file whose copy it finds nobody
  // mapping is no longer maybe mapped, unless marked since it started.
  // Calls `walk` once, only while some copy is held or marked (else 0); a
  // walk that fails (it could not rule a process out) frees nothing.
  virtual uint64_t ReleaseUnmapped(MappingWalk walk) = 0;
};

// A driver's capabilities, null where it has none; they live as long as it.
struct DriverCapabilities {
  CopyMapping* mapping = nullptr;       // Mapping copies in place: RAM, posix, pmem.
  InMemoryReads* in_memory = nullptr;   // Reading only what is in memory: the source.
  MemoryBacking* memory = nullptr;      // Backing memory ahead, giving it back: RAM.
  FileIdentity* identity = nullptr;     // What a file is now: the source.
  KeptCopies* kept = nullptr;           // Copies kept across runs: posix, pmem, a kept RAM tier.
  SharedCopies* shared = nullptr;       // Memory other processes share: the RAM tier.
};

// Factories. `max_open_files` bounds the descriptors (or mappings) kept open
// between reads.
struct RamTierOptions {
  // A home of peers: SharedCopies::VisitInMemory gives whole-block ranges'
  // CRC32C.
  bool keep_block_sums = false;
  bool huge_pages = false;  // TierConfig::huge_pages.
  // Its memory is not sealed against writes, so that
  // MemoryBacking::ReleaseFreeMemory() can give it back (memory.watch).
  bool releasable = false;
  uint64_t back_ahead = 0;  // TierConfig::back_ahead.
  // Not empty: the tier's memory is files in this directory on a tmpfs
  // (KeptRamDirectory), kept for the next driver made on it, which adopts
  // the copies its journal lists (KeptCopies: ram_keep.h).
  std::string kept_dir;
};
// A RAM tier named `name` of `capacity` bytes for a namespace of
// `file_count` files (ids 0..file_count-1).
absl::StatusOr<std::unique_ptr<StorageDriver>> NewRamDriver(const std::string& name,
                                                            uint64_t capacity, uint32_t file_count,
                                                            const RamTierOptions& options = {});
// A read-only view, in a client of the node service, of the service's RAM
// tier: `fds` are a reopening of its SharedCopies::SharedMemoryDescriptors(),
// in order.
// Without `map_from_start`, it copies with pread() until this process reads
// a file again (ram_driver.cc says why). NewWriter and Remove fail with
// PermissionDenied.
absl::StatusOr<std::unique_ptr<StorageDriver>> NewRamReader(std::vector<ScopedFd> fds,
                                                            uint32_t file_count,
                                                            bool map_from_start);
// How a posix tier writes copies. Buffered copies stay in the page cache, so
// the epoch after a copy was written reads it from memory, as fast as the
// source it came from; direct (O_DIRECT) copies bypass the cache, for data
// that could not stay cached anyway and would only push other pages out.
struct PosixWriteOptions {
  enum class Mode { kAuto, kBuffered, kDirect };
  Mode mode = Mode::kAuto;
  // kAuto: copies are buffered while the bytes written buffered so far fit
  // in this budget; beyond it, files of 1 MiB and more are written direct.
  uint64_t buffered_budget_bytes = 0;
  VerifyPolicy verify = VerifyPolicy::kFirstRead;
};
std::unique_ptr<StorageDriver> NewPosixDriver(const std::string& root, int max_open_files,
                                              const PosixWriteOptions& options = {});
std::unique_ptr<StorageDriver> NewPmemDriver(const std::string& root, int max_open_files,
                                             VerifyPolicy verify = VerifyPolicy::kFirstRead);
// The dataset on the PFS. Read-only: Store and Remove fail with PermissionDenied.
std::unique_ptr<StorageDriver> NewSourceDriver(const std::string& root, int max_open_files);

// Writes `n` bytes (at `data`, 4096-aligned and readable up to `n` rounded up
// to 4096) as the whole copy of `file` through a writer, as a copy of
// `source` (by default, what `file` knows of it): a convenience for tests and
// tools.
absl::Status StoreCopy(StorageDriver& driver, const FileRef& file, const char* data, size_t n);
absl::Status StoreCopy(StorageDriver& driver, const FileRef& file, const char* data, size_t n,
                       const SourceIdentity& source);

}  // namespace monarch

#endif  // MONARCH_DRIVERS_STORAGE_DRIVER_H_
