// Namespace: dataset walk and lock-free lookups.

#include "metadata/namespace.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <new>
#include <optional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/os.h"
#include "common/status_macros.h"
#include "config/file_regex.h"
#include "metadata/file_table_writer.h"

namespace monarch {
namespace {

struct WalkedFile {
  std::string name;  // Dataset-relative.
  uint32_t directory;
  uint64_t size;
  int64_t mtime_ns;
  FileAttributes attributes;
};

int64_t Nanoseconds(const struct timespec& t) {
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

struct WalkedDirectory {
  std::string name;  // Dataset-relative; "" for the root.
  uint32_t parent;   // Index of the parent; the root's is itself.
  bool stamped = false;  // mtime_ns is set (its fstat worked).
  int64_t mtime_ns = 0;
};

// Walks a tree with several threads, each reading whole directories taken
// from a shared queue. On a parallel file system every readdir and stat is a
// metadata round trip of a millisecond or so, so a serial walk of a million
// files would take a quarter of an hour; with N threads it takes 1/N of that.
class ParallelWalk {
 public:
  // `real_root`: the root's realpath, for SymlinkPolicy::kInside.
  ParallelWalk(const std::string& root, std::string real_root, const FileRegex* filter,
               SymlinkPolicy symlinks)
      : root_(root), real_root_(std::move(real_root)), filter_(filter), symlinks_(symlinks) {}

  void Run(int threads) {
    {
      MutexLock lock(&mu_);  // No worker yet; taken for the analysis's sake.
      directories_.push_back({"", 0, false, 0});
      queue_.push_back(0);
    }
    files_.resize(threads);
    std::vector<std::thread> workers;
    for (int w = 0; w < threads; ++w) workers.emplace_back([this, w] { Work(&files_[w]); });
    for (std::thread& worker : workers) worker.join();
  }

  // Valid once Run() has returned.
  std::vector<WalkedDirectory>& directories() { return directories_; }
  std::vector<std::vector<WalkedFile>>& files() { return files_; }
  uint64_t root_device() const { return root_device_; }

 private:
  void Work(std::vector<WalkedFile>* files) {
    for (;;) {
      uint32_t index;
      std::string relative;
      {
        MutexLock lock(&mu_);
        // Ends when a busy worker queues a directory or finishes its own
        // (one readdir and its stats).
        while (queue_.empty() && busy_ > 0) changed_.Wait(&mu_);
        if (queue_.empty()) return;  // Nothing queued and nobody can queue more.
        index = queue_.front();
        queue_.pop_front();
        relative = directories_[index].name;
        ++busy_;
      }
      std::vector<std::string> subdirectories;
      std::optional<int64_t> stamp;
      ReadDirectory(index, relative, files, &subdirectories, &stamp);
      {
        MutexLock lock(&mu_);
        if (stamp.has_value()) {
          directories_[index].stamped = true;
          directories_[index].mtime_ns = *stamp;
        }
        for (std::string& name : subdirectories) {
          queue_.push_back(static_cast<uint32_t>(directories_.size()));
          directories_.push_back({std::move(name), index, false, 0});
        }
        --busy_;
      }
      changed_.SignalAll();
    }
  }

  void ReadDirectory(uint32_t index, const std::string& relative, std::vector<WalkedFile>* files,
                     std::vector<std::string>* subdirectories, std::optional<int64_t>* stamp) {
    const std::string path = relative.empty() ? root_ : absl::StrCat(root_, "/", relative);
    DIR* dir = os::OpenDir(path.c_str());
    if (dir == nullptr) {
      MONARCH_LOG(kWarning, "skipping unreadable directory ", path, ": ", std::strerror(errno));
      return;
    }
    const int dir_fd = ::dirfd(dir);
    // Every directory is stamped (DirectoryStamp), before it is listed: an
    // entry added while the walk lists it then shows as a change later,
    // never the other way round. An fstat of an open directory: no lookup.
    struct stat st;
    if (os::Fstat(dir_fd, &st) == 0) {
      *stamp = Nanoseconds(st.st_mtim);
      if (index == 0) root_device_ = st.st_dev;  // Read after Run() joins the workers.
    }
    while (struct dirent* d = os::ReadDir(dir)) {
      absl::string_view base = d->d_name;
      if (base == "." || base == "..") continue;
      // Reserved: file-backed tiers keep their temporaries in "<tier>/.monarch"
      // (drivers/copy_tree.h), where a copy of it could not live.
      if (relative.empty() && base == ".monarch") continue;
      std::string name = relative.empty() ? std::string(base) : absl::StrCat(relative, "/", base);
      if (d->d_type == DT_DIR) {
        subdirectories->push_back(std::move(name));
        continue;
      }
      if (d->d_type == DT_REG && !Keep(name)) continue;  // Spare the stat.
      struct stat st;
      bool symlink = d->d_type == DT_LNK;
      if (d->d_type == DT_UNKNOWN) {  // File systems without d_type.
        if (os::FstatAt(dir_fd, d->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        symlink = S_ISLNK(st.st_mode);
      }
      if (symlink && !KeepSymlink(path, d->d_name, name)) continue;
      // Follows symlinks to files; a symlinked directory is skipped rather
      // than followed, so a link cycle cannot trap the walk.
      if (os::FstatAt(dir_fd, d->d_name, &st, 0) != 0) continue;
      if (S_ISDIR(st.st_mode)) {
        if (d->d_type == DT_UNKNOWN) {
          subdirectories->push_back(std::move(name));  // File systems without d_type.
        } else {
          MONARCH_LOG(kInfo, "not following symlinked directory ", name);
        }
        continue;
      }
      if (!S_ISREG(st.st_mode) || (d->d_type != DT_REG && !Keep(name))) continue;
      FileAttributes attributes;
      attributes.device = st.st_dev;
      attributes.inode = st.st_ino;
      attributes.atime_ns = Nanoseconds(st.st_atim);
      attributes.ctime_ns = Nanoseconds(st.st_ctim);
      attributes.blocks = static_cast<uint64_t>(st.st_blocks);
      attributes.mode = st.st_mode;
      attributes.link_count = static_cast<uint32_t>(st.st_nlink);
      attributes.uid = st.st_uid;
      attributes.gid = st.st_gid;
      attributes.block_size = static_cast<uint32_t>(st.st_blksize);
      attributes.via_symlink = symlink ? 1 : 0;
      files->push_back({std::move(name), index, static_cast<uint64_t>(st.st_size),
                        Nanoseconds(st.st_mtim), attributes});
    }
    os::CloseDir(dir);
  }

  // Whether the policy serves the symlink `base` in directory `path`.
  bool KeepSymlink(const std::string& path, const char* base, const std::string& name) const {
    if (symlinks_ == SymlinkPolicy::kFollow) return true;
    if (symlinks_ == SymlinkPolicy::kInside) {
      char* target = os::RealPath(absl::StrCat(path, "/", base).c_str(), nullptr);
      const bool inside = target != nullptr && absl::StartsWith(target, real_root_) &&
                          target[real_root_.size()] == '/';
      std::free(target);
      if (inside) return true;
      MONARCH_LOG(kInfo, "dataset.symlinks: inside; skipping ", name,
                  ", a symlink to outside the dataset");
      return false;
    }
    return false;
  }

  const std::string& root_;
  const std::string real_root_;
  const FileRegex* const filter_;  // Null: every name is kept.

  bool Keep(const std::string& name) const {
    return filter_ == nullptr || filter_->Matches(name);
  }
  const SymlinkPolicy symlinks_;
  Mutex mu_;
  CondVar changed_;  // The queue grew, or a worker finished a directory.
  std::deque<uint32_t> queue_ ABSL_GUARDED_BY(mu_);
  int busy_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<WalkedDirectory> directories_;    // Guarded by mu_ while workers run.
  std::vector<std::vector<WalkedFile>> files_;  // One list per worker.
  uint64_t root_device_ = 0;                    // Written by the worker that reads the root.
};

// True if `name` is `parent` plus one more component (a plain name: not
// empty, ".", ".." or with a NUL), e.g. "a/b" and "a/b/c", "" and "c".
bool IsChildName(absl::string_view parent, absl::string_view name) {
  absl::string_view base = name;
  if (!parent.empty()) {
    if (name.size() <= parent.size() + 1 || !absl::StartsWith(name, parent) ||
        name[parent.size()] != '/') {
      return false;
    }
    base = name.substr(parent.size() + 1);
  }
  return !base.empty() && base != "." && base != ".." &&
         base.find_first_of(absl::string_view("/\0", 2)) == absl::string_view::npos;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Namespace>> Namespace::Build(const std::string& root,
                                                            const std::string& file_regex,
                                                            int source_tier, int threads,
                                                            const TierSlotAllocator& allocate,
                                                            SymlinkPolicy symlinks,
                                                            const ExtentLayout& extents) {
  std::unique_ptr<FileRegex> filter;
  if (!file_regex.empty()) {
    MONARCH_ASSIGN_OR_RETURN(filter, FileRegex::Compile(file_regex));
  }

  std::string top_path = root;
  while (top_path.size() > 1 && top_path.back() == '/') top_path.pop_back();
  DIR* top = os::OpenDir(top_path.c_str());
  if (top == nullptr) return ErrnoToStatus(errno, absl::StrCat("dataset.path: open ", top_path));
  os::CloseDir(top);

  std::string real_root = top_path;
  if (char* real = os::RealPath(top_path.c_str(), nullptr)) {
    real_root = real;
    std::free(real);
  }
  ParallelWalk walk(top_path, std::move(real_root), filter.get(), symlinks);
  walk.Run(std::max(1, threads));

  NamespaceListing listing;
  listing.root_device = walk.root_device();
  listing.directories.reserve(walk.directories().size());
  for (uint32_t i = 0; i < walk.directories().size(); ++i) {
    WalkedDirectory& d = walk.directories()[i];
    listing.directories.push_back({std::move(d.name), d.parent});
    if (d.stamped) listing.stamps.push_back({i, d.mtime_ns});
  }
  size_t count = 0;
  for (const auto& list : walk.files()) count += list.size();
  listing.files.reserve(count);
  // Each worker's list is freed once copied, so that a walk of millions of
  // files does not hold its results twice; the names move to a deque, whose
  // elements never move, for the listing's views.
  std::deque<std::string> names;
  for (auto& list : walk.files()) {
    for (WalkedFile& f : list) {
      names.push_back(std::move(f.name));
      listing.files.push_back({names.back(), f.directory, f.size, f.mtime_ns, f.attributes});
    }
    std::vector<WalkedFile>().swap(list);
  }
  return FromListing(top_path, listing, source_tier, allocate, extents);
}

absl::StatusOr<std::unique_ptr<Namespace>> Namespace::FromListing(
    const std::string& root, const NamespaceListing& listing, int source_tier,
    const TierSlotAllocator& allocate, const ExtentLayout& extents) {
  auto refuse = [](auto&&... what) {
    return absl::InvalidArgumentError(absl::StrCat("namespace listing: ", what...));
  };
  const std::vector<ListedDirectory>& directories = listing.directories;
  const std::vector<ListedFile>& files = listing.files;
  if (directories.empty() || !directories[0].name.empty()) {
    return refuse("the first directory is not the root");
  }
  // Ids are 32-bit, and all-ones is no id.
  if (directories.size() >= UINT32_MAX || files.size() >= UINT32_MAX) {
    return refuse("more than 2^32-2 files or directories");
  }
  std::unique_ptr<Namespace> ns(new Namespace());
  ns->root_ = root;
  while (ns->root_.size() > 1 && ns->root_.back() == '/') ns->root_.pop_back();

  // Reserved up front: the lookup map holds views into these strings.
  ns->directory_names_.reserve(directories.size());
  ns->directory_parents_.assign(directories.size(), 0);
  for (uint32_t i = 0; i < directories.size(); ++i) {
    const ListedDirectory& d = directories[i];
    if (i > 0) {
      if (d.parent >= i) return refuse("directory ", i, "'s parent ", d.parent, " is not before it");
      if (!IsChildName(directories[d.parent].name, d.name)) {
        return refuse("directory ", QuoteForError(d.name), " is not a directory of ",
                      QuoteForError(directories[d.parent].name));
      }
      if (d.parent == 0 && d.name == ".monarch") return refuse("'.monarch' is reserved");
      ns->directory_parents_[i] = d.parent;
    }
    ns->directory_names_.push_back(d.name);
  }
  for (uint32_t i = 0; i < ns->directory_names_.size(); ++i) {
    if (!ns->directory_by_name_.emplace(ns->directory_names_[i], i).second) {
      return refuse("directory ", QuoteForError(ns->directory_names_[i]), " is listed twice");
    }
  }
  for (const DirectoryStamp& stamp : listing.stamps) {
    if (stamp.directory >= directories.size()) return refuse("a stamp of no directory");
  }
  ns->stamps_ = listing.stamps;

  for (uint32_t id = 0; id < files.size(); ++id) {
    const ListedFile& f = files[id];
    if (f.directory >= directories.size() || !IsChildName(directories[f.directory].name, f.name)) {
      return refuse("file ", QuoteForError(f.name), " is not in directory ",
                    f.directory < directories.size()
                        ? QuoteForError(directories[f.directory].name)
                        : absl::StrCat(f.directory, " of ", directories.size()));
    }
    if (f.directory == 0 && f.name == ".monarch") return refuse("'.monarch' is reserved");
    if (ns->directory_by_name_.contains(f.name)) {
      return refuse(QuoteForError(f.name), " is listed twice");
    }
  }
  // The table refuses two files of one name, and more ids than 32 bits hold.
  ns->extent_layout_ = extents;
  MONARCH_ASSIGN_OR_RETURN(ns->table_region_, FileTableWriter::Write(ns->root_, listing, extents));
  const MappedRegion& table = ns->table_region_.writable;
  MONARCH_ASSIGN_OR_RETURN(ns->table_, FileTable::Open(table.data(), table.size()));
  const uint32_t entry_count = ns->table_.entry_count();
  if (allocate) {
    ns->slots_ = allocate(entry_count);
    if (ns->slots_ == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("no memory for the tier slots of ", entry_count, " files and extents"));
    }
  } else {
    ns->own_tier_slots_ = std::make_unique<TierSlot[]>(entry_count);
    ns->slots_ = ns->own_tier_slots_.get();
  }
  for (uint32_t id = 0; id < entry_count; ++id) new (&ns->slots_[id]) TierSlot(source_tier);
  ns->states_ = std::make_unique<std::atomic<PlacementState>[]>(entry_count);
  for (uint32_t id = 0; id < entry_count; ++id) {
    ns->states_[id].store(PlacementState::kOnSource, std::memory_order_relaxed);
  }
  return ns;
}

FileEntry Namespace::entry(uint32_t id) const { return EntryNamed(id, table_.name(id)); }

FileEntry Namespace::EntryNamed(uint32_t id, absl::string_view name) const {
  if (id < table_.file_count()) {
    // A file, on every lookup: each field given once, in FileRef's and
    // FileEntry's order. Default-constructing the entry first and setting
    // the fields after made GCC zero all of it with a `rep stos`, which
    // cost lookups back to back about a fifth of their throughput
    // (bench/results/namespace_memory.md).
    const uint32_t first_extent = table_.first_extent(id);
    return FileEntry{FileRef{/*id=*/id, /*name=*/name, /*size=*/table_.size(id),
                             /*mtime_ns=*/table_.mtime_ns(id), /*is_extent=*/false,
                             /*file_id=*/0, /*file_name=*/{}, /*file_size=*/0,
                             /*part_offset=*/0},
                     /*first_extent=*/first_extent,
                     /*extent_count=*/first_extent == 0 ? 0 : table_.extent_count(id),
                     /*tier=*/&slots_[id], /*state=*/&states_[id]};
  }
  // An extent.
  FileEntry entry;
  entry.ref.id = id;
  entry.ref.name = name;
  entry.ref.size = table_.size(id);
  entry.tier = &slots_[id];
  entry.state = &states_[id];
  const uint32_t file = table_.source_file(id);
  entry.ref.is_extent = true;
  entry.ref.file_id = file;
  entry.ref.file_name = table_.name(file);
  entry.ref.file_size = table_.size(file);
  entry.ref.mtime_ns = table_.mtime_ns(file);
  entry.ref.part_offset = table_.part_offset(id);
  return entry;
}

uint32_t Namespace::directory_of(uint32_t id) const {
  const absl::string_view name = table_.name(id);
  const size_t slash = name.rfind('/');
  if (slash == absl::string_view::npos) return 0;
  auto it = directory_by_name_.find(name.substr(0, slash));
  return it == directory_by_name_.end() ? 0 : it->second;
}

void Namespace::ReportCounters(CounterSink& sink) const {
  sink.Gauge("namespace_built_from_manifest", built_from_manifest_ ? 1 : 0,
             "1: the namespace was built from a manifest (dataset.manifest, or the one rank 0 "
             "wrote to remote.rendezvous_dir), not by walking the dataset.");
  sink.Gauge("namespace_build_ms", build_milliseconds_,
             "Milliseconds spent building the namespace at start-up: the walk, or reading and "
             "checking a manifest.");
}

Monarch::FileStat MakeFileStat(const FileRef& ref, const FileAttributes& a) {
  Monarch::FileStat stat;
  stat.size = ref.size;
  stat.mtime_ns = ref.mtime_ns;
  stat.atime_ns = a.atime_ns;
  stat.ctime_ns = a.ctime_ns;
  stat.device = a.device;
  stat.inode = a.inode;
  stat.blocks = a.blocks;
  stat.mode = a.mode;
  stat.link_count = a.link_count;
  stat.uid = a.uid;
  stat.gid = a.gid;
  stat.block_size = a.block_size;
  stat.via_symlink = a.via_symlink != 0;
  return stat;
}

bool CanonicalDatasetName(absl::string_view root, absl::string_view name, std::string* scratch,
                          absl::string_view* out) {
  if (name == "/") name = "";  // The dataset root, as front ends spell it.
  if (!name.empty() && name[0] == '/') {
    if (!absl::StartsWith(name, root)) return false;
    name.remove_prefix(root.size());
    if (!name.empty() && name[0] != '/' && root != "/") return false;  // "/data2" vs "/data".
  }
  // Fast path, on every read: already canonical, each component neither
  // empty nor "." nor "..", seen in one pass.
  bool clean = true;
  for (const char *part = name.data(), *end = part + name.size(); part != end;) {
    const char* slash = static_cast<const char*>(std::memchr(part, '/', end - part));
    const size_t length = (slash == nullptr ? end : slash) - part;
    if (length == 0 || (part[0] == '.' && (length == 1 || (length == 2 && part[1] == '.')))) {
      clean = false;
      break;
    }
    if (slash == nullptr) break;
    part = slash + 1;
    clean = part != end;  // A trailing slash.
  }
  if (clean) {
    *out = name;
    return true;
  }
  scratch->clear();
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find('/', start);
    if (end == absl::string_view::npos) end = name.size();
    absl::string_view part = name.substr(start, end - start);
    if (part == "..") return false;  // Never resolve out of the dataset.
    if (!part.empty() && part != ".") {
      if (!scratch->empty()) scratch->push_back('/');
      scratch->append(part.data(), part.size());
    }
    start = end + 1;
  }
  *out = *scratch;
  return true;
}

SourceIdentity Namespace::identity(uint32_t id) const {
  const uint32_t file = table_.source_file(id);
  const FileAttributes attributes = table_.attributes(file);
  SourceIdentity identity;
  identity.device = attributes.device;
  identity.inode = attributes.inode;
  identity.size = table_.size(id);  // An extent's: see SourceIdentity::OfExtent.
  identity.mtime_ns = table_.mtime_ns(file);
  identity.ctime_ns = attributes.ctime_ns;
  return identity;
}

bool Namespace::SourceUnchanged(uint32_t id) const {
  const uint32_t file = table_.source_file(id);
  struct stat st;
  return os::Stat(absl::StrCat(root_, "/", table_.name(file)).c_str(), &st) == 0 &&
         SourceIdentity::Of(st) == identity(file);
}

std::optional<FileEntry> Namespace::FindCopy(absl::string_view name) const {
  if (std::optional<FileEntry> file = Find(name)) return file;
  if (extent_layout_.extent_bytes == 0) return std::nullopt;
  const std::string prefix = absl::StrCat(".monarch/extents/", extent_layout_.extent_bytes, "/");
  if (!absl::ConsumePrefix(&name, prefix)) return std::nullopt;
  const size_t slash = name.rfind('/');
  uint32_t index;
  if (slash == absl::string_view::npos || !absl::SimpleAtoi(name.substr(slash + 1), &index)) {
    return std::nullopt;
  }
  std::optional<FileEntry> file = Find(name.substr(0, slash));
  if (!file.has_value() || index >= file->extent_count) return std::nullopt;
  FileEntry extent = entry(file->first_extent + index);
  // "007" parses as 7: only the name exactly as built is this extent's.
  if (extent.ref.name != absl::StrCat(prefix, file->ref.name, "/", index)) return std::nullopt;
  return extent;
}

std::optional<uint32_t> FindRespelledFile(const FileTable& table, absl::string_view root,
                                          absl::string_view name, absl::string_view* stored) {
  std::string scratch;
  absl::string_view canonical;
  // A relative name was tried as given (FindDatasetFile): not again.
  if (!CanonicalDatasetName(root, name, &scratch, &canonical) || canonical.empty() ||
      canonical == name) {
    return std::nullopt;
  }
  return table.FindFile(canonical, stored);
}

std::optional<uint32_t> Namespace::FindId(absl::string_view name) const {
  return FindDatasetFile(table_, root_, name);
}

std::optional<FileEntry> Namespace::Find(absl::string_view name) const {
  absl::string_view stored;  // The name the lookup just compared: no second computation.
  const std::optional<uint32_t> id = FindDatasetFile(table_, root_, name, &stored);
  if (!id.has_value()) return std::nullopt;
  return EntryNamed(*id, stored);
}

const NamespaceView::Directories& NamespaceView::directories() const {
  absl::call_once(directories_once_, [this] {
    auto dirs = std::make_unique<Directories>();
    (*dirs)[""];  // The root, even for an empty dataset.
    for (uint32_t id = 0; id < file_count(); ++id) {
      absl::string_view name = file_name(id);
      // Register the file in its directory, then each directory in its parent.
      size_t slash = name.find_last_of('/');
      std::string parent(slash == absl::string_view::npos ? "" : name.substr(0, slash));
      std::string base(slash == absl::string_view::npos ? name : name.substr(slash + 1));
      for (;;) {
        auto [it, created] = dirs->try_emplace(parent);
        it->second.push_back(base);
        if (!created || parent.empty()) break;
        slash = parent.find_last_of('/');
        base = slash == std::string::npos ? parent : parent.substr(slash + 1);
        parent = slash == std::string::npos ? "" : parent.substr(0, slash);
      }
    }
    for (auto& [dir, names] : *dirs) std::sort(names.begin(), names.end());
    directories_ = std::move(dirs);
  });
  return *directories_;
}

bool NamespaceView::IsDirectory(absl::string_view name) const {
  std::string scratch;
  absl::string_view canonical;
  return CanonicalDatasetName(root(), name, &scratch, &canonical) &&
         directories().contains(canonical);
}

absl::StatusOr<std::vector<std::string>> NamespaceView::List(absl::string_view dir) const {
  std::string scratch;
  absl::string_view canonical;
  if (CanonicalDatasetName(root(), dir, &scratch, &canonical)) {
    auto it = directories().find(canonical);
    if (it != directories().end()) return it->second;
  }
  return absl::NotFoundError(absl::StrCat("not a dataset directory: ", dir));
}

}  // namespace monarch
