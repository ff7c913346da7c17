// source tier: the dataset on the parallel file system. Read-only.
//
// Monarch never writes, creates or deletes anything here; NewWriter and Remove
// refuse. Descriptors are cached (bounded), so a shard read in many calls
// costs one open on the PFS. Files are opened relative to a held descriptor
// of their directory, so the PFS resolves one name per open rather than
// every component of the path again (on Lustre each component is a lookup
// the MDS may have to answer).

#include <fcntl.h>
#include <sys/mman.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/os.h"
#include "common/process_mappings.h"
#include "common/handle_cache.h"
#include "common/mutex.h"
#include "common/status_macros.h"
#include "drivers/storage_driver.h"

namespace monarch {
namespace {

class SourceDriver final : public StorageDriver, public InMemoryReads, public FileIdentity {
 public:
  SourceDriver(std::string root, int max_open_files)
      : root_(std::move(root)),
        opens_are_local_(OnLocalDisk(root_.fd())),
        descriptors_(max_open_files) {}

  SourceDriver(const SourceDriver&) = delete;
  SourceDriver& operator=(const SourceDriver&) = delete;

  // An extent is read from its file (FileRef::is_extent), through the file's
  // one cached descriptor.
  absl::StatusOr<size_t> Read(const FileRef& part, uint64_t offset, char* dst, size_t n) override {
    const FileRef& file = part.source_file();
    MONARCH_ASSIGN_OR_RETURN(const std::shared_ptr<OpenFile> open, Descriptor(file));
    return PreadFull(open->fd.get(), dst, n, part.part_offset + offset, file.name);
  }

  // A miss asks with RWF_NOWAIT where the file system takes it: one call
  // for the ask and the read. A refused read starts the read-ahead of what
  // it refused (Linux, at least to 6.18), which the miss's copy reads next.
  // Everyone else asks residency first, by cachestat(2), or mincore(2) on a
  // mapping of the file, which read nothing in: a hit would otherwise read
  // the source for bytes its copy serves, and a deferred copy that gives up
  // for bytes nobody reads. RWF_NOWAIT also refuses resident bytes, on a
  // page that marks where read-ahead goes on, so the pages found resident
  // are read plainly: only one evicted between the two calls makes that read
  // wait for the file system. RWF_NOWAIT alone where files cannot be mapped.
  absl::StatusOr<size_t> ReadIfInMemory(const FileRef& part, uint64_t offset, char* dst,
                                        size_t n, Asker asker) override {
    const FileRef& file = part.source_file();
    offset += part.part_offset;
    const bool no_wait = no_wait_works_.load(std::memory_order_relaxed);
    if (!no_wait && !map_works_.load(std::memory_order_relaxed)) {
      return absl::UnimplementedError("the source's file system cannot tell");
    }
    std::shared_ptr<OpenFile> open;
    if (asker == Asker::kHit && !opens_are_local_) {
      open = descriptors_.Find(file.id);
      if (open == nullptr) {
        return absl::UnavailableError(absl::StrCat(file.name, ": not open on a remote source"));
      }
    } else {
      MONARCH_ASSIGN_OR_RETURN(open, Descriptor(file));
    }
    if (!no_wait || asker != Asker::kMiss) {
      switch (Resident(*open, file, offset, n)) {
        case Residency::kNotAll:
          return absl::UnavailableError(absl::StrCat(file.name, ": not all in memory"));
        case Residency::kAll:
          return PreadFull(open->fd.get(), dst, n, offset, file.name);
        case Residency::kUnknown:
          if (!no_wait) return absl::UnimplementedError("the source's file system cannot tell");
          break;
      }
    }
    size_t done = 0;
    while (done < n) {
      const ssize_t got = os::PreadNoWait(open->fd.get(), dst + done, n - done,
                                          static_cast<off_t>(offset + done));
      if (got < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN) {
          return absl::UnavailableError(absl::StrCat(file.name, ": not all in memory"));
        }
        if (errno == EOPNOTSUPP || errno == EINVAL || errno == ENOSYS) {
          // Asked once: the answer is the file system's (FUSE's, most
          // network file systems') or the kernel's (before 4.14).
          no_wait_works_.store(false, std::memory_order_relaxed);
          return ReadIfInMemory(part, offset - part.part_offset, dst, n, asker);
        }
        return ErrnoToStatus(errno, absl::StrCat("read ", file.name));
      }
      if (got == 0) break;  // End of file.
      done += static_cast<size_t>(got);
    }
    return done;
  }

  // The descriptor reads use, so the answer is about the bytes they got
  // (a file replaced by rename keeps being read, and identified, as the old
  // one until its descriptor leaves the cache).
  absl::StatusOr<SourceIdentity> Identify(const FileRef& part,
                                          Clock::time_point opened_since) override {
    const FileRef& file = part.source_file();
    MONARCH_ASSIGN_OR_RETURN(const std::shared_ptr<OpenFile> open, Descriptor(file));
    MONARCH_ASSIGN_OR_RETURN(const Attributes attributes,
                             open->opened >= opened_since ? AttributesOfOpen(open->fd.get(), file)
                                                          : AskedAttributes(open->fd.get(), file));
    // A FIFO, a directory or a device put in the file's place.
    if (!S_ISREG(attributes.mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat(JoinPath(root_.path(), file.name), " is no longer a regular file"));
    }
    return !part.is_extent ? attributes.identity
                           : SourceIdentity::OfExtent(attributes.identity, part);
  }

  absl::StatusOr<std::unique_ptr<CopyWriter>> NewWriter(const FileRef& file) override {
    return absl::PermissionDeniedError(
        absl::StrCat("the source is read-only; refusing to write ", file.name));
  }

  absl::Status Remove(const FileRef& file) override {
    return absl::PermissionDeniedError(
        absl::StrCat("the source is read-only; refusing to delete ", file.name));
  }

 private:
  // Directories held open, at most this many (past it, files open from the
  // root): a dataset has far fewer directories than files.
  static constexpr size_t kMaxDirectories = 1 << 16;

  // A source file's descriptor, and when it was opened (Identify).
  struct OpenFile {
    OpenFile(ScopedFd fd, Clock::time_point opened, std::atomic<int>* mapped_files)
        : fd(std::move(fd)), opened(opened), mapped_files(mapped_files) {}
    ~OpenFile() {
      if (mapping != nullptr) {
        os::Munmap(mapping, mapped_length);
        mapped_files->fetch_sub(1, std::memory_order_relaxed);
      }
    }
    OpenFile(const OpenFile&) = delete;
    OpenFile& operator=(const OpenFile&) = delete;

    ScopedFd fd;
    Clock::time_point opened;
    // For Resident: the file mapped on its first ask and never read
    // through. Mapping costs address space, not memory: its pages are the
    // page cache's own, and none is faulted in.
    std::atomic<int>* const mapped_files;
    Mutex mapping_mu;
    void* mapping ABSL_GUARDED_BY(mapping_mu) = nullptr;
    size_t mapped_length ABSL_GUARDED_BY(mapping_mu) = 0;
  };

  enum class Residency { kAll, kNotAll, kUnknown };

  // A file system on this node's own disks (or memory), where an open asks
  // no server. Any other (FUSE, NFS, Lustre, GPFS, BeeGFS, Ceph, ...) or an
  // unknown one counts as remote.
  static bool OnLocalDisk(int fd) {
    struct statfs fs;
    if (fd < 0 || os::Fstatfs(fd, &fs) != 0) return false;
    switch (static_cast<unsigned long>(fs.f_type)) {
      case EXT4_SUPER_MAGIC:  // Also ext2 and ext3.
      case XFS_SUPER_MAGIC:
      case BTRFS_SUPER_MAGIC:
      case F2FS_SUPER_MAGIC:
      case TMPFS_MAGIC:
      case 0x2fc12fc1:  // ZFS.
        return true;
      default:
        return false;
    }
  }

  // Whether every page of [offset, offset + n) of `file` is in the page
  // cache. kUnknown where the file cannot be mapped (FUSE's direct_io, whose
  // reads skip the page cache anyway), or past MappingBudget() mappings.
  Residency Resident(OpenFile& open, const FileRef& file, uint64_t offset, size_t n) {
    if (n == 0 || !map_works_.load(std::memory_order_relaxed)) return Residency::kUnknown;
    // Past the size the walk saw (the file grew): read the usual way.
    if (offset + n > file.size) return Residency::kNotAll;
    static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    const uint64_t first = offset / page * page;
    const uint64_t pages = (offset + n - first + page - 1) / page;
    // One system call and no mapping (whose mmap and munmap take the
    // process's mmap lock, against every page fault of the tiers' copies),
    // once a first mapping has shown this file system keeps pages at all:
    // cachestat would call every file of FUSE's direct_io "not in memory",
    // where the truth is "cannot tell".
    if (cachestat_works_.load(std::memory_order_relaxed) &&
        can_map_.load(std::memory_order_acquire)) {
      uint64_t cached = 0;
      if (os::Cachestat(open.fd.get(), first, pages * page, &cached) == 0) {
        return cached >= pages ? Residency::kAll : Residency::kNotAll;
      }
      if (errno == ENOSYS || errno == EOPNOTSUPP || errno == EINVAL) {
        cachestat_works_.store(false, std::memory_order_relaxed);  // The kernel's answer.
      }
    }
    char* mapping;
    {
      MutexLock lock(&open.mapping_mu);
      if (open.mapping == nullptr) {
        if (mapped_files_.fetch_add(1, std::memory_order_relaxed) >= MappingBudget()) {
          mapped_files_.fetch_sub(1, std::memory_order_relaxed);
          return Residency::kUnknown;
        }
        void* map = os::Mmap(nullptr, file.size, PROT_READ, MAP_SHARED, open.fd.get(), 0);
        if (map == MAP_FAILED) {
          mapped_files_.fetch_sub(1, std::memory_order_relaxed);
          if (errno == ENODEV || errno == EOPNOTSUPP) {
            map_works_.store(false, std::memory_order_relaxed);  // The file system's answer.
          }
          return Residency::kUnknown;
        }
        open.mapping = map;
        open.mapped_length = file.size;
        can_map_.store(true, std::memory_order_release);
      }
      mapping = static_cast<char*>(open.mapping);
    }
    unsigned char resident[64];  // Asked 64 pages at a time.
    for (uint64_t done = 0; done < pages; done += sizeof(resident)) {
      const uint64_t count = std::min<uint64_t>(sizeof(resident), pages - done);
      if (os::Mincore(mapping + first + done * page, count * page, resident) != 0) {
        return Residency::kUnknown;
      }
      for (uint64_t k = 0; k < count; ++k) {
        if ((resident[k] & 1) == 0) return Residency::kNotAll;
      }
    }
    return Residency::kAll;
  }

  struct Attributes {
    SourceIdentity identity;
    mode_t mode = 0;
  };

  // The file's cached descriptor, opened on first use.
  absl::StatusOr<std::shared_ptr<OpenFile>> Descriptor(const FileRef& file) {
    return descriptors_.Get(file.id, [&]() -> absl::StatusOr<std::shared_ptr<OpenFile>> {
      // Taken before the open, so that attributes the open fetched are
      // never judged newer than they are.
      const Clock::time_point opened = Clock::now();
      MONARCH_ASSIGN_OR_RETURN(std::shared_ptr<ScopedFd> fd, Open(file.name));
      return std::make_shared<OpenFile>(std::move(*fd), opened, &mapped_files_);
    });
  }

  // The attributes the kernel holds for `fd`, with no round trip to the
  // file system's server; fstat's where statx is missing (kernels before
  // 4.11) or leaves out a field the identity needs.
  static absl::StatusOr<Attributes> AttributesOfOpen(int fd, const FileRef& file) {
    constexpr unsigned int kNeeded = STATX_TYPE | STATX_MODE | STATX_INO | STATX_SIZE |
                                     STATX_MTIME | STATX_CTIME;
    struct statx st;
    if (os::Statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, kNeeded, &st) != 0 ||
        (st.stx_mask & kNeeded) != kNeeded) {
      return AskedAttributes(fd, file);
    }
    return Attributes{SourceIdentity::Of(st), st.stx_mode};
  }

  // fstat(): the file system's answer now.
  static absl::StatusOr<Attributes> AskedAttributes(int fd, const FileRef& file) {
    struct stat st;
    if (os::Fstat(fd, &st) != 0) return ErrnoToStatus(errno, absl::StrCat("fstat ", file.name));
    return Attributes{SourceIdentity::Of(st), st.st_mode};
  }

  absl::StatusOr<std::shared_ptr<ScopedFd>> Open(absl::string_view name) {
    const size_t slash = name.rfind('/');
    const int directory =
        slash == absl::string_view::npos ? -1 : Directory(std::string(name.substr(0, slash)));
    if (directory < 0) return root_.OpenShared(name);
    return OpenSharedAt(directory, std::string(name.substr(slash + 1)),
                        JoinPath(root_.path(), name));
  }

  // The held descriptor of dataset directory `relative`, opened on first
  // use; -1 if it cannot be (the open from the root then reports why).
  // Descriptors stay until the driver goes, so callers use them unlocked. A
  // directory renamed during the run keeps being read as the one the walk
  // found, as an open file is.
  int Directory(const std::string& relative) {
    MutexLock lock(&directories_mu_);
    auto it = directories_.find(relative);
    if (it != directories_.end()) return it->second.get();
    if (root_.fd() < 0 || directories_.size() >= kMaxDirectories) return -1;
    const int fd = RetryOnEintr(
        [&] { return os::OpenAt(root_.fd(), relative.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC); });
    if (fd < 0) return -1;
    directories_.emplace(relative, ScopedFd(fd));
    return fd;
  }

  const DirectoryHandle root_;
  // Whether an open costs no round trip to a server (OnLocalDisk).
  const bool opens_are_local_;
  // Each cleared once the file system (or kernel) refuses: RWF_NOWAIT,
  // mapping its files.
  std::atomic<bool> no_wait_works_{true};
  std::atomic<bool> map_works_{true};
  std::atomic<bool> cachestat_works_{true};
  // Set by the first file mapped: the file system keeps files' pages, so
  // cachestat's count is an answer (Resident).
  std::atomic<bool> can_map_{false};
  // Files Resident maps now; declared before the descriptors, whose
  // OpenFiles count themselves out of it as they go.
  std::atomic<int> mapped_files_{0};
  HandleCache<OpenFile> descriptors_;
  Mutex directories_mu_;
  absl::flat_hash_map<std::string, ScopedFd> directories_ ABSL_GUARDED_BY(directories_mu_);
};

}  // namespace

std::unique_ptr<StorageDriver> NewSourceDriver(const std::string& root, int max_open_files) {
  return std::make_unique<SourceDriver>(root, max_open_files);
}

}  // namespace monarch
