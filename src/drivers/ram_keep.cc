// The kept RAM arena's directory and journal.

#include "drivers/ram_keep.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <climits>
#include <cstddef>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/crc32c.h"
#include "common/log.h"
#include "common/mount_table.h"
#include "common/os.h"
#include "common/status_macros.h"

namespace monarch {
namespace {

constexpr char kMagic[8] = {'M', 'O', 'N', 'R', 'A', 'M', 'J', '1'};
constexpr uint32_t kVersion = 1;
enum Kind : uint32_t { kCommit = 1, kRemove = 2 };

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t stripes;
  uint64_t capacity;
  uint32_t reserved;
  uint32_t crc;  // Of the bytes before it.
};
static_assert(sizeof(Header) == 32, "no padding");

// A record is this, then `name_len` bytes of name.
struct RecordHead {
  uint32_t crc;    // Of the record's bytes after it.
  uint32_t bytes;  // The whole record's.
  uint32_t kind;
  uint32_t stripe;
  uint64_t offset, length, device, inode, size;
  int64_t mtime_ns, ctime_ns;
  uint32_t data_crc;
  uint32_t name_len;
};
static_assert(sizeof(RecordHead) == 80, "no padding");

// The runtime directory's path, '%' and '/' escaped: one name per
// directory, which a user (or a test) can tell from the path.
std::string KeptPath(const std::string& ram_dir, const std::string& runtime_dir) {
  std::string name;
  for (char c : runtime_dir) name += c == '%' ? "%25" : c == '/' ? "%2F" : std::string(1, c);
  return absl::StrFormat("%s/monarch-%d/%s", ram_dir, ::geteuid(), name);
}

std::string Serialize(Kind kind, const KeptCopy& copy) {
  RecordHead head{};
  head.bytes = static_cast<uint32_t>(sizeof(head) + copy.name.size());
  head.kind = kind;
  head.stripe = copy.stripe;
  head.offset = copy.offset;
  head.length = copy.length;
  head.device = copy.source.device;
  head.inode = copy.source.inode;
  head.size = copy.source.size;
  head.mtime_ns = copy.source.mtime_ns;
  head.ctime_ns = copy.source.ctime_ns;
  head.data_crc = copy.crc32c;
  head.name_len = static_cast<uint32_t>(copy.name.size());
  std::string record(reinterpret_cast<const char*>(&head), sizeof(head));
  record += copy.name;
  const uint32_t crc = Crc32c(record.data() + 4, record.size() - 4);
  std::memcpy(record.data(), &crc, 4);
  return record;
}

bool WriteAll(int fd, const std::string& bytes) {
  return os::Write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size());
}

// Removes `dir` and what it holds, `depth` levels of directories deep.
void RemoveTree(const std::string& dir, int depth) {
  DIR* d = os::OpenDir(dir.c_str());
  if (d == nullptr) return;
  while (struct dirent* entry = os::ReadDir(d)) {
    if (std::strcmp(entry->d_name, ".") == 0 || std::strcmp(entry->d_name, "..") == 0) continue;
    const std::string path = JoinPath(dir, entry->d_name);
    if (entry->d_type == DT_DIR && depth > 0) {
      RemoveTree(path, depth - 1);
    } else {
      os::Unlink(path.c_str());
    }
  }
  os::CloseDir(d);
  os::UnlinkAt(AT_FDCWD, dir.c_str(), AT_REMOVEDIR);
}

// A runtime directory carries a random token while it lives (kKeptToken),
// and its kept arena records it: a directory made again at the same path
// has none. (Its device and inode could not tell: a file system hands a
// freed inode number to the next directory made.)
constexpr char kKeptToken[] = "kept-ram.token";

// Whether `kept` holds what runtime directory `runtime_dir`, as it is now,
// kept. `unknown` if `kept` does not say whose it is (yet: it is being made).
bool KeptFor(const std::string& runtime_dir, const std::string& kept, bool unknown = false) {
  absl::StatusOr<std::string> owner = ReadSmallFile(JoinPath(kept, "runtime-dir"), 64);
  if (!owner.ok()) return unknown;
  absl::StatusOr<std::string> token = ReadSmallFile(JoinPath(runtime_dir, kKeptToken), 64);
  return token.ok() && *owner == *token;
}

}  // namespace

absl::StatusOr<std::string> KeptRamDirectory(const std::string& ram_dir,
                                             const std::string& runtime_dir) {
  struct statfs fs;
  if (::statfs(ram_dir.c_str(), &fs) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("node.ram_dir '", ram_dir, "': ", std::strerror(errno)));
  }
  if (fs.f_type != TMPFS_MAGIC) {
    return absl::FailedPreconditionError(
        absl::StrCat("node.ram_dir '", ram_dir, "' is not on a tmpfs"));
  }
  const std::string dir = KeptPath(ram_dir, runtime_dir);
  const std::string root = dir.substr(0, dir.rfind('/'));
  // What runtime directories that are gone kept (tests', benchmarks') goes.
  if (DIR* d = os::OpenDir(root.c_str())) {
    while (struct dirent* entry = os::ReadDir(d)) {
      std::string path = entry->d_name;
      for (size_t at = 0; (at = path.find('%', at)) != std::string::npos; ++at) {
        path.replace(at, 3, path.compare(at, 3, "%2F") == 0 ? "/" : "%");
      }
      if (path[0] == '/' && !KeptFor(path, JoinPath(root, entry->d_name), true)) {
        RemoveTree(JoinPath(root, entry->d_name), 1);
      }
    }
    os::CloseDir(d);
  }
  // Kept for this runtime directory only, not for one made again at the
  // same path (a benchmark's or a test's, which expects a cold start). The
  // caller holds the directory's service lock: nobody else writes these.
  struct stat st;
  if (os::Stat(runtime_dir.c_str(), &st) != 0) return ErrnoToStatus(errno, runtime_dir);
  const bool ours = KeptFor(runtime_dir, dir);
  if (!ours) RemoveTree(dir, 1);
  MONARCH_RETURN_IF_ERROR(MakePrivateDirectory(root, "node.keep_ram"));
  MONARCH_RETURN_IF_ERROR(MakePrivateDirectory(dir, "node.keep_ram"));
  if (!ours) {
    std::random_device random;
    const std::string token = absl::StrFormat("%08x%08x", random(), random());
    MONARCH_RETURN_IF_ERROR(WriteSmallFile(JoinPath(runtime_dir, kKeptToken), token));
    MONARCH_RETURN_IF_ERROR(WriteSmallFile(JoinPath(dir, "runtime-dir"), token));
  }
  return dir;
}

void DiscardKeptRam(const std::string& ram_dir, const std::string& runtime_dir) {
  RemoveTree(KeptPath(ram_dir, runtime_dir), 1);
}

std::string KeptRamPath(const std::string& ram_dir, const std::string& runtime_dir) {
  return KeptPath(ram_dir, runtime_dir);
}

bool HoldsKeptRam(const std::string& ram_dir, const std::string& runtime_dir) {
  return KeptFor(runtime_dir, KeptPath(ram_dir, runtime_dir));
}

uint64_t TmpfsPageSize(absl::string_view mountinfo, absl::string_view dir, bool advised) {
  // The innermost mount holding `dir`; of two at one point, the later (it
  // lies on top).
  const MountEntry* holder = nullptr;
  const std::vector<MountEntry> mounts = ParseMountinfo(mountinfo);
  for (const MountEntry& mount : mounts) {
    if (MountHolds(mount.mount_point, dir) &&
        (holder == nullptr || mount.mount_point.size() >= holder->mount_point.size())) {
      holder = &mount;
    }
  }
  if (holder == nullptr || holder->fs_type != "tmpfs") return 0;
  for (const std::string& option : holder->super_options) {
    if (option == "huge=always" || option == "huge=within_size" ||
        (advised && option == "huge=advise")) {
      return 2 << 20;
    }
  }
  return 4096;
}

uint64_t TmpfsPageSize(absl::string_view dir, bool advised) {
  // /proc/<pid>/root/<path> is <path> in that process's mount namespace.
  absl::string_view rest = dir;
  int pid = 0;
  if (absl::ConsumePrefix(&rest, "/proc/") &&
      absl::SimpleAtoi(rest.substr(0, rest.find('/')), &pid) && pid > 0 &&
      absl::ConsumePrefix(&rest, absl::StrCat(pid, "/root/"))) {
    absl::StatusOr<std::string> theirs =
        ReadSmallFile(absl::StrCat("/proc/", pid, "/mountinfo"), 16 << 20);
    return theirs.ok() ? TmpfsPageSize(*theirs, absl::StrCat("/", rest), advised) : 0;
  }
  absl::StatusOr<std::string> mountinfo = ReadSmallFile("/proc/self/mountinfo", 16 << 20);
  if (!mountinfo.ok()) return 0;
  char resolved[PATH_MAX];
  const std::string path(dir);
  const char* real = os::RealPath(path.c_str(), resolved);
  return TmpfsPageSize(*mountinfo, real != nullptr ? absl::string_view(real) : dir, advised);
}

absl::StatusOr<std::map<std::string, KeptCopy>> RamJournal::Read() const {
  ScopedFd fd(os::Open(path_.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoToStatus(errno, "no journal");
  struct stat st;
  if (os::Fstat(fd.get(), &st) != 0) return ErrnoToStatus(errno, "fstat the journal");
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  MONARCH_ASSIGN_OR_RETURN(size_t got, PreadFull(fd.get(), bytes.data(), bytes.size(), 0, path_));
  if (got != bytes.size()) return absl::DataLossError("journal cut short while read");
  Header header;
  if (bytes.size() < sizeof(header)) return absl::DataLossError("journal shorter than its header");
  std::memcpy(&header, bytes.data(), sizeof(header));
  if (std::memcmp(header.magic, kMagic, sizeof(kMagic)) != 0 ||
      header.crc != Crc32c(&header, offsetof(Header, crc))) {
    return absl::DataLossError("journal header damaged");
  }
  if (header.version != kVersion) {
    return absl::FailedPreconditionError(absl::StrCat("journal version ", header.version));
  }
  if (header.stripes != stripes_ || header.capacity != capacity_) {
    return absl::FailedPreconditionError(
        absl::StrCat("the RAM tier changed: ", header.stripes, " stripes of a ", header.capacity,
                     "-byte tier kept, ", stripes_, " of a ", capacity_, "-byte one now"));
  }
  std::map<std::string, KeptCopy> copies;
  for (size_t at = sizeof(header); at < bytes.size();) {
    RecordHead head;
    if (bytes.size() - at < sizeof(head)) return absl::DataLossError("journal record cut short");
    std::memcpy(&head, bytes.data() + at, sizeof(head));
    if (head.bytes != sizeof(head) + uint64_t{head.name_len} || head.bytes > bytes.size() - at ||
        head.crc != Crc32c(bytes.data() + at + 4, head.bytes - 4) ||
        (head.kind != kCommit && head.kind != kRemove)) {
      return absl::DataLossError(absl::StrCat("journal record at byte ", at, " damaged"));
    }
    std::string name = bytes.substr(at + sizeof(head), head.name_len);
    at += head.bytes;
    if (head.kind == kRemove) {
      copies.erase(name);
      continue;
    }
    KeptCopy& copy = copies[name];
    copy.name = std::move(name);
    copy.source = SourceIdentity{head.device, head.inode, head.size, head.mtime_ns, head.ctime_ns};
    copy.stripe = head.stripe;
    copy.offset = head.offset;
    copy.length = head.length;
    copy.crc32c = head.data_crc;
  }
  return copies;
}

void RamJournal::GiveUp(const std::string& why) {
  MONARCH_LOG(kWarning, "RAM tier: ", why, ": ", std::strerror(errno),
              "; its copies will not be kept for the next service");
  fd_ = ScopedFd();
  os::Unlink(path_.c_str());
  live_.clear();
}

void RamJournal::Rewrite(absl::flat_hash_map<uint32_t, KeptCopy> copies) {
  fd_ = ScopedFd();
  const std::string temporary = path_ + ".new";
  ScopedFd fd(os::Open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd.valid()) {
    // The directory is gone: an idle exit discards the kept arena while the
    // tier may still evict.
    if (errno != ENOENT) GiveUp(absl::StrCat("cannot write ", temporary));
    return;
  }
  Header header{};
  std::memcpy(header.magic, kMagic, sizeof(kMagic));
  header.version = kVersion;
  header.stripes = stripes_;
  header.capacity = capacity_;
  header.crc = Crc32c(&header, offsetof(Header, crc));
  std::string bytes(reinterpret_cast<const char*>(&header), sizeof(header));
  live_bytes_ = 0;
  for (const auto& [id, copy] : copies) {
    const std::string record = Serialize(kCommit, copy);
    live_bytes_ += record.size();
    bytes += record;
  }
  if (!WriteAll(fd.get(), bytes) || os::Rename(temporary.c_str(), path_.c_str()) != 0) {
    os::Unlink(temporary.c_str());
    GiveUp(absl::StrCat("cannot write ", path_));
    return;
  }
  fd_ = std::move(fd);
  bytes_ = bytes.size();
  live_ = std::move(copies);
}

void RamJournal::Append(const std::string& record) {
  if (!fd_.valid()) return;
  if (!WriteAll(fd_.get(), record)) return GiveUp(absl::StrCat("cannot append to ", path_));
  bytes_ += record.size();
  // Bounded: rewritten with only the live copies once it is twice their size.
  if (bytes_ > 2 * live_bytes_ + (64 << 10)) Rewrite(std::move(live_));
}

void RamJournal::Committed(uint32_t id, KeptCopy copy) {
  if (!fd_.valid()) return;
  std::string record = Serialize(kCommit, copy);
  live_bytes_ += record.size();
  live_[id] = std::move(copy);
  Append(record);
}

void RamJournal::Removed(uint32_t id) {
  auto it = live_.find(id);
  if (it == live_.end()) return;
  const std::string record = Serialize(kRemove, it->second);
  live_bytes_ -= record.size();
  live_.erase(it);
  Append(record);
}

}  // namespace monarch