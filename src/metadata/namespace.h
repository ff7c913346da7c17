// Namespace: the in-memory view of the dataset, built once at start-up.
//
// Walks the dataset directory (optionally keeping only names that fully
// match a regex), or rebuilds the same view from a listing another process
// walked (a manifest, metadata/manifest.h), and records, per file, its
// dataset-relative name, size, source mtime, the fastest tier holding a
// complete copy, and its placement state. The set of files and directories never changes after Build(), so
// lookups take no lock and scale across reader threads; only each file's
// tier and state change, and those are atomics.
//
// What never changes after Build() (names, sizes, the rest of stat(), the
// lookup by name) lives in one compact, position-independent region, the
// FileTable (metadata/file_table.h), in a memfd: a node service sends that
// memfd to its clients as the namespace image, so a node keeps one copy of
// the names however many processes read them.
//
// Each file's tier index lives in an array of its own, which a node service
// places in shared memory (src/service): its clients then see where every
// file is without asking.
//
// Extents. A file larger than ExtentLayout::threshold is cached by extents:
// aligned ranges of `extent_bytes` (the last one shorter), each an entry of
// its own after the files (ids file_count() .. entry_count() - 1), with its
// own tier slot and placement state. Promotion, eviction, pins and stats
// then work per extent as they do per file, and a reader of the file reads
// its extents (core/read_path.h). An extent's FileRef names its file
// (file_id, file_name, part_offset), which only the source reads by. Its name,
// ".monarch/extents/<extent_bytes>/<file>/<index>", is what tiers store its
// copy under: inside the reserved ".monarch", so no dataset file has it, and
// with the extent size, so a copy made with another size is never taken
// for this range. Lookups by name (Find, List) see files only; FindCopy
// also resolves extent names.

#ifndef MONARCH_METADATA_NAMESPACE_H_
#define MONARCH_METADATA_NAMESPACE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/container/flat_hash_map.h"
#include "monarch/config.h"  // SymlinkPolicy: dataset.symlinks' values.
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/counters.h"
#include "common/shared_memory.h"
#include "drivers/storage_driver.h"
#include "metadata/file_table.h"
#include "monarch/monarch.h"

namespace monarch {

enum class PlacementState : uint8_t {
  kOnSource,       // Only the source holds it; the next read may promote it.
  kPromoting,      // A promotion is in flight.
  kInTier,         // `tier` holds a complete copy.
  kStaysOnSource,  // No tier had room, or its promotion failed: not retried.
};

// A tier index, as stored per file. Lock-free and address-free, so it may
// live in memory shared between processes.
using TierSlot = std::atomic<int32_t>;
static_assert(TierSlot::is_always_lock_free, "tier slots are shared between processes");

// The rest of what the walk's stat() said about a file (size and mtime are
// in its FileRef): answers stat() without touching the source. Plain data,
// so the service can publish it in the namespace image as is.
struct FileAttributes {
  uint64_t device = 0;
  uint64_t inode = 0;
  int64_t atime_ns = 0;
  int64_t ctime_ns = 0;
  uint64_t blocks = 0;
  uint32_t mode = 0;
  uint32_t link_count = 0;
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint32_t block_size = 0;
  uint32_t via_symlink = 0;  // 1: the name is a symlink to the file.
};

// What Monarch::Stat returns for a file.
Monarch::FileStat MakeFileStat(const FileRef& ref, const FileAttributes& attributes);

// One entry of the namespace, a file or an extent, as a small value made
// when asked for: what never changes comes from the namespace's table, and
// the two things that do (the tier holding a copy, the placement state)
// are pointers to the namespace's atomics. Cheap to copy; valid as long as
// its namespace.
struct FileEntry {
  FileRef ref;
  // A file cached by extents: its first extent's id and how many it has.
  uint32_t first_extent = 0;
  uint32_t extent_count = 0;
  // Index (in the tier list) of the fastest tier with a complete copy. Set
  // with release order only after the copy is complete, so a reader that
  // loads it with acquire order can read that copy. One of the namespace's
  // tier slots.
  TierSlot* tier = nullptr;
  std::atomic<PlacementState>* state = nullptr;
};

// Turns `name` (dataset-relative, or absolute inside `root`) into the
// canonical dataset-relative form ("a/b"), using `scratch` only when it has
// to be rewritten. False if it lies outside the root (".." never resolves).
bool CanonicalDatasetName(absl::string_view root, absl::string_view name, std::string* scratch,
                          absl::string_view* out);

// The id of the file `name` (as CanonicalDatasetName takes it) names in
// `table`, a dataset rooted at `root`, and with `stored` the table's view of
// its name; nullopt if it names none. Every lookup by name goes through it.
//
// The table holds canonical names only (FromListing refuses any other), so
// a relative name it has as given is canonical: a hit needs no
// CanonicalDatasetName, which was a quarter of an in-process lookup's
// instructions (133 of 530 for an ImageNet name, callgrind on
// bench_namespace_memory). Inline for the same reason: the call cost
// another 40. Other spellings (absolute ones too) take FindRespelledFile.
std::optional<uint32_t> FindRespelledFile(const FileTable& table, absl::string_view root,
                                          absl::string_view name, absl::string_view* stored);
inline std::optional<uint32_t> FindDatasetFile(const FileTable& table, absl::string_view root,
                                               absl::string_view name,
                                               absl::string_view* stored = nullptr) {
  if (!name.empty() && name[0] != '/') {
    if (std::optional<uint32_t> id = table.FindFile(name, stored)) return id;
  }
  return FindRespelledFile(table, root, name, stored);
}

// A namespace as plain data, files in id order: what a walk finds, and
// what a manifest (metadata/manifest.h) stores so that other processes can
// rebuild the same namespace without walking.
struct ListedFile {
  // Dataset-relative and canonical ("a/b.jpg"). A view: whoever builds the
  // listing keeps the bytes alive until FromListing returns.
  absl::string_view name;
  uint32_t directory = 0;  // Index of the directory holding it.
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  FileAttributes attributes;
};
struct ListedDirectory {
  std::string name;     // Dataset-relative; the root ("") is always first.
  uint32_t parent = 0;  // An earlier index; the root's is 0.
};
// A directory's mtime as the walk read it, just before listing it. Adding,
// removing or renaming an entry changes a directory's mtime, so these tell
// cheaply (one stat each) whether a listing still describes the dataset.
// The walk stamps every directory: checking them costs a metadata operation
// per directory, not per file. A file rewritten in place changes no
// directory's mtime.
struct DirectoryStamp {
  uint32_t directory = 0;
  int64_t mtime_ns = 0;
};
struct NamespaceListing {
  std::vector<ListedDirectory> directories;
  std::vector<ListedFile> files;
  std::vector<DirectoryStamp> stamps;
  uint64_t root_device = 0;  // st_dev of the root when it was walked.
};


// Which files are cached by extents, and how large those are: files larger
// than `threshold`, when `extent_bytes` is not 0.
struct ExtentLayout {
  uint64_t extent_bytes = 0;
  uint64_t threshold = 0;
  bool Splits(uint64_t file_size) const { return extent_bytes != 0 && file_size > threshold; }
};

// The dataset's names as the generic half of a Monarch asks them
// (core/front.h): the Namespace below, and the node service's shared image
// of it that a client maps (service/namespace_image.h). The read path does
// not go through it: each adapter finds a read's file its own way, inlined.
// Thread-safe: the set of names never changes once built.
class NamespaceView {
 public:
  virtual ~NamespaceView() = default;
  // The dataset's root: an absolute path.
  virtual const std::string& root() const = 0;
  // The file's id, or nullopt if `name` (dataset-relative, or absolute
  // inside the root) is not a dataset file.
  virtual std::optional<uint32_t> FindId(absl::string_view name) const = 0;
  // Dataset files: ids 0 .. file_count() - 1.
  virtual uint32_t file_count() const = 0;
  // File `id`'s dataset-relative name, and what stat() said of it.
  virtual absl::string_view file_name(uint32_t id) const = 0;
  virtual Monarch::FileStat Stat(uint32_t id) const = 0;

  // Directory calls, from the file names alone. True for the root and every
  // directory holding a dataset file.
  bool IsDirectory(absl::string_view name) const;
  // Sorted names directly inside `dir`; NotFound if it is not a directory.
  absl::StatusOr<std::vector<std::string>> List(absl::string_view dir) const;

 private:
  // Directory name -> sorted names directly inside it, built at the first
  // directory call: most jobs never make one, and it costs memory per file.
  using Directories = absl::flat_hash_map<std::string, std::vector<std::string>>;
  const Directories& directories() const;

  mutable absl::once_flag directories_once_;
  mutable std::unique_ptr<Directories> directories_;
};

// A sample of an announced order, its file by id (below file_count()).
struct FileRange {
  uint32_t file_id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;  // 0: to the end of the file.
};

class Namespace final : public NamespaceView {
 public:
  // Memory for `count` tier slots (zeroed or not), valid for the namespace's
  // life; null = a failure, reported as ResourceExhausted.
  using TierSlotAllocator = std::function<TierSlot*(uint32_t count)>;

  // Walks `root` (an absolute directory) with `threads` threads. Every file
  // starts on `source_tier`. `file_regex` may be empty (keep everything).
  // The tier slots come from `allocate` if given, else from the heap.
  static absl::StatusOr<std::unique_ptr<Namespace>> Build(
      const std::string& root, const std::string& file_regex, int source_tier, int threads = 8,
      const TierSlotAllocator& allocate = {}, SymlinkPolicy symlinks = SymlinkPolicy::kFollow,
      const ExtentLayout& extents = {});

  // The namespace `listing` describes, rooted at `root`, without touching
  // the file system: file ids are the listing's order. InvalidArgument if
  // the listing is not a tree (a parent index out of range or not earlier,
  // a name that is not its directory's plus one component, a duplicate).
  // The tier slots (and entries) are entry_count(): files, then extents.
  static absl::StatusOr<std::unique_ptr<Namespace>> FromListing(
      const std::string& root, const NamespaceListing& listing, int source_tier,
      const TierSlotAllocator& allocate = {}, const ExtentLayout& extents = {});

  // The entry for `name` (dataset-relative, or absolute inside the root),
  // or nullopt if it is not a dataset file.
  std::optional<FileEntry> Find(absl::string_view name) const;

  // NamespaceView.
  std::optional<uint32_t> FindId(absl::string_view name) const override;
  uint32_t file_count() const override { return table_.file_count(); }
  absl::string_view file_name(uint32_t id) const override { return table_.name(id); }
  Monarch::FileStat Stat(uint32_t id) const override {
    return MakeFileStat(entry(id).ref, attributes(id));
  }
  const std::string& root() const override { return root_; }

  // Files and extents: every id a tier slot, a pin or a copy may have.
  uint32_t entry_count() const { return table_.entry_count(); }
  uint64_t total_bytes() const { return table_.total_bytes(); }
  // Entry `id` (< entry_count()): a file, or an extent.
  FileEntry entry(uint32_t id) const;
  TierSlot& tier(uint32_t id) const { return slots_[id]; }
  std::atomic<PlacementState>& state(uint32_t id) const { return states_[id]; }
  // A file's or an extent's (its file's).
  FileAttributes attributes(uint32_t id) const { return table_.attributes(id); }
  // The region holding the names, sizes and attributes (what a node
  // service sends its clients as the namespace image), and its size.
  const ScopedFd& table_fd() const { return table_region_.fd; }
  uint64_t table_bytes() const { return table_.table_bytes(); }
  // The source file holding `id` as the walk found it: what its copies (an
  // extent's too) must be of.
  SourceIdentity identity(uint32_t id) const;
  const ExtentLayout& extent_layout() const { return extent_layout_; }
  // `file`'s extent that holds byte `offset` (file.extent_count > 0).
  FileEntry ExtentAt(const FileEntry& file, uint64_t offset) const {
    return entry(file.first_extent +
                 static_cast<uint32_t>(offset / extent_layout_.extent_bytes));
  }
  // The entry a tier's copy named `name` is of: a file, or an extent by its
  // name (see above). Nullopt if none.
  std::optional<FileEntry> FindCopy(absl::string_view name) const;

  // The directory tree, for writing a manifest: index 0 is the root.
  uint32_t directory_count() const { return static_cast<uint32_t>(directory_names_.size()); }
  const std::string& directory_name(uint32_t d) const { return directory_names_[d]; }
  uint32_t directory_parent(uint32_t d) const { return directory_parents_[d]; }
  // The directory holding file `id`.
  uint32_t directory_of(uint32_t id) const;
  const std::vector<DirectoryStamp>& stamps() const { return stamps_; }
  uint64_t root_device() const { return table_.root_device(); }

  // How it was built, for the stats (namespace_*): set once by whoever
  // built it, before it is shared.
  void RecordBuild(bool from_manifest, uint64_t milliseconds) {
    built_from_manifest_ = from_manifest;
    build_milliseconds_ = milliseconds;
  }
  bool built_from_manifest() const { return built_from_manifest_; }
  void ReportCounters(CounterSink& sink) const;

  // Whether the source file of `id` still stats as the namespace has it
  // (one stat): what a namespace built from a manifest checks before it
  // trusts a file it cannot see rewritten in place.
  bool SourceUnchanged(uint32_t id) const;

 private:
  Namespace() = default;
  // entry(id), given its name (the table's view of it).
  FileEntry EntryNamed(uint32_t id, absl::string_view name) const;

  std::string root_;
  WriteSealedRegion table_region_;
  FileTable table_;  // A view of table_region_.
  TierSlot* slots_ = nullptr;  // entry_count(), from the allocator or own_tier_slots_.
  std::unique_ptr<TierSlot[]> own_tier_slots_;  // When no allocator was given.
  std::unique_ptr<std::atomic<PlacementState>[]> states_;  // entry_count().
  ExtentLayout extent_layout_;

  std::vector<std::string> directory_names_;  // "" is the root.
  std::vector<uint32_t> directory_parents_;
  absl::flat_hash_map<absl::string_view, uint32_t> directory_by_name_;
  std::vector<DirectoryStamp> stamps_;
  bool built_from_manifest_ = false;
  uint64_t build_milliseconds_ = 0;
};

}  // namespace monarch

#endif  // MONARCH_METADATA_NAMESPACE_H_
