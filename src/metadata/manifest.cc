// Manifest: encoding, hostile-input-safe parsing, checks against the
// dataset, and the wait for rank 0's.
//
// Layout, little-endian, no padding; names are their last component only
// (a directory's and a file's full name is its directory's plus "/name"):
//
//   header (56 bytes)
//     0  magic "MONMANIF"          8  version (u32) = 1
//     12 symlinks (u32: 0 follow, 1 inside, 2 skip)
//     16 total bytes of the file, trailer included (u64)
//     24 st_dev of the root at the walk (u64)
//     32 root bytes (u32)          36 file_regex bytes (u32)
//     40 directories (u32)         44 stamps (u32)
//     48 files (u32)               52 reserved, 0 (u32)
//   root, file_regex
//   directories: parent (u32), name bytes (u32), name.  The first is the
//                root: parent 0, no name; a parent comes before its children.
//   stamps:      directory (u32), reserved 0 (u32), mtime_ns (i64)
//   files:       directory (u32), name bytes (u32), size (u64), mtime_ns,
//                device, inode, atime_ns, ctime_ns, blocks (64-bit each),
//                mode, link_count, uid, gid, block_size, via_symlink (u32
//                each), name.  In file id order.
//   trailer:     CRC32C of every byte before it (u32)

#include "metadata/manifest.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/os.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"

namespace monarch {
namespace {

constexpr absl::string_view kMagic = "MONMANIF";
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 56;
constexpr size_t kTrailerBytes = 4;
constexpr size_t kDirectoryRecordBytes = 8;  // Without the name.
constexpr size_t kStampRecordBytes = 16;
constexpr size_t kFileRecordBytes = 88;  // Without the name.
// Limits of Linux paths: a longer name cannot be a file's, so a manifest
// holding one is lying (and could otherwise make full names explode).
constexpr size_t kMaxComponentBytes = 255;  // NAME_MAX.
constexpr size_t kMaxPathBytes = 4096;      // PATH_MAX.
constexpr size_t kMaxRegexBytes = 1 << 20;  // A config is at most 1 MiB.
// The walk never lists it at the root: file-backed tiers keep their
// temporaries under that name (drivers/copy_tree.h).
constexpr absl::string_view kReserved = ".monarch";

void Put32(std::string* out, uint32_t v) {
  char b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<char>(v >> (8 * i));
  out->append(b, 4);
}
void Put64(std::string* out, uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(v >> (8 * i));
  out->append(b, 8);
}

uint32_t SymlinkCode(SymlinkPolicy p) {
  return p == SymlinkPolicy::kInside ? 1 : p == SymlinkPolicy::kSkip ? 2 : 0;
}

absl::string_view LastComponent(absl::string_view name) {
  const size_t slash = name.rfind('/');
  return slash == absl::string_view::npos ? name : name.substr(slash + 1);
}

// Reads fixed-width fields and names from the bytes, refusing to go past
// their end: every read is checked against what is left.
class Reader {
 public:
  explicit Reader(absl::string_view bytes) : bytes_(bytes) {}
  size_t left() const { return bytes_.size() - at_; }
  size_t position() const { return at_; }
  bool U32(uint32_t* v) {
    if (left() < 4) return false;
    *v = 0;
    for (int i = 0; i < 4; ++i) *v |= uint32_t{static_cast<uint8_t>(bytes_[at_ + i])} << (8 * i);
    at_ += 4;
    return true;
  }
  bool U64(uint64_t* v) {
    if (left() < 8) return false;
    *v = 0;
    for (int i = 0; i < 8; ++i) *v |= uint64_t{static_cast<uint8_t>(bytes_[at_ + i])} << (8 * i);
    at_ += 8;
    return true;
  }
  bool I64(int64_t* v) {
    uint64_t u;
    if (!U64(&u)) return false;
    *v = static_cast<int64_t>(u);
    return true;
  }
  bool Bytes(size_t n, absl::string_view* out) {
    if (left() < n) return false;
    *out = bytes_.substr(at_, n);
    at_ += n;
    return true;
  }

 private:
  absl::string_view bytes_;
  size_t at_ = 0;
};

absl::Status Malformed(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("not a valid manifest: ", what));
}

// A name component as the walk could have found it.
bool PlainComponent(absl::string_view name) {
  return !name.empty() && name.size() <= kMaxComponentBytes && name != "." && name != ".." &&
         name.find_first_of(absl::string_view("/\0", 2)) == absl::string_view::npos;
}

}  // namespace

ManifestOrigin ManifestOriginOf(const std::string& root, const std::string& file_regex,
                                SymlinkPolicy symlinks) {
  ManifestOrigin origin{root, file_regex, symlinks};
  while (origin.root.size() > 1 && origin.root.back() == '/') origin.root.pop_back();
  return origin;
}

ManifestOrigin ManifestOriginOf(const DatasetConfig& dataset) {
  return ManifestOriginOf(dataset.path, dataset.file_regex, dataset.symlinks);
}

std::string EncodeManifest(const Namespace& ns, const ManifestOrigin& origin) {
  size_t name_bytes = 0;
  for (uint32_t d = 0; d < ns.directory_count(); ++d) {
    name_bytes += LastComponent(ns.directory_name(d)).size();
  }
  for (uint32_t id = 0; id < ns.file_count(); ++id) {
    name_bytes += LastComponent(ns.entry(id).ref.name).size();
  }
  std::string out;
  out.reserve(kHeaderBytes + origin.root.size() + origin.file_regex.size() +
              ns.directory_count() * kDirectoryRecordBytes +
              ns.stamps().size() * kStampRecordBytes + ns.file_count() * kFileRecordBytes +
              name_bytes + kTrailerBytes);
  out.append(kMagic.data(), kMagic.size());
  Put32(&out, kVersion);
  Put32(&out, SymlinkCode(origin.symlinks));
  const size_t total_at = out.size();
  Put64(&out, 0);  // The total, filled in below.
  Put64(&out, ns.root_device());
  Put32(&out, static_cast<uint32_t>(origin.root.size()));
  Put32(&out, static_cast<uint32_t>(origin.file_regex.size()));
  Put32(&out, ns.directory_count());
  Put32(&out, static_cast<uint32_t>(ns.stamps().size()));
  Put32(&out, ns.file_count());
  Put32(&out, 0);
  out += origin.root;
  out += origin.file_regex;
  for (uint32_t d = 0; d < ns.directory_count(); ++d) {
    const absl::string_view name = LastComponent(ns.directory_name(d));
    Put32(&out, d == 0 ? 0 : ns.directory_parent(d));
    Put32(&out, static_cast<uint32_t>(name.size()));
    out.append(name.data(), name.size());
  }
  for (const DirectoryStamp& stamp : ns.stamps()) {
    Put32(&out, stamp.directory);
    Put32(&out, 0);
    Put64(&out, static_cast<uint64_t>(stamp.mtime_ns));
  }
  for (uint32_t id = 0; id < ns.file_count(); ++id) {
    const FileRef& ref = ns.entry(id).ref;
    const FileAttributes a = ns.attributes(id);
    const absl::string_view name = LastComponent(ref.name);
    Put32(&out, ns.directory_of(id));
    Put32(&out, static_cast<uint32_t>(name.size()));
    Put64(&out, ref.size);
    Put64(&out, static_cast<uint64_t>(ref.mtime_ns));
    Put64(&out, a.device);
    Put64(&out, a.inode);
    Put64(&out, static_cast<uint64_t>(a.atime_ns));
    Put64(&out, static_cast<uint64_t>(a.ctime_ns));
    Put64(&out, a.blocks);
    for (uint32_t v : {a.mode, a.link_count, a.uid, a.gid, a.block_size, a.via_symlink}) {
      Put32(&out, v);
    }
    out.append(name.data(), name.size());
  }
  const uint64_t total = out.size() + kTrailerBytes;
  for (int i = 0; i < 8; ++i) out[total_at + i] = static_cast<char>(total >> (8 * i));
  Put32(&out, Crc32c(out.data(), out.size()));
  return out;
}

absl::Status WriteManifest(const Namespace& ns, const ManifestOrigin& origin,
                           const std::string& path) {
  const std::string bytes = EncodeManifest(ns, origin);
  // Unique per process and call: ranks of several jobs, or two writers in
  // one process, never share a temporary.
  static std::atomic<uint64_t> serial{0};
  const std::string temp = absl::StrCat(path, ".tmp.", ::getpid(), ".", serial.fetch_add(1));
  if (absl::Status written = WriteSmallFile(temp, bytes); !written.ok()) {
    os::Unlink(temp.c_str());
    return written;
  }
  if (os::Rename(temp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    os::Unlink(temp.c_str());
    return ErrnoToStatus(error, absl::StrCat("rename ", temp, " to ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Manifest>> ParseManifest(absl::string_view bytes) {
  if (bytes.size() < kHeaderBytes + kTrailerBytes) {
    return Malformed(absl::StrCat(bytes.size(), " bytes, shorter than a header"));
  }
  if (bytes.substr(0, kMagic.size()) != kMagic) return Malformed("no MONMANIF magic at the start");
  Reader in(bytes);
  absl::string_view skip;
  in.Bytes(kMagic.size(), &skip);
  uint32_t version, symlinks, root_bytes, regex_bytes, directory_count, stamp_count, file_count,
      reserved;
  uint64_t total, root_device;
  // The header fits (checked above), so these reads cannot fail.
  in.U32(&version);
  in.U32(&symlinks);
  in.U64(&total);
  in.U64(&root_device);
  in.U32(&root_bytes);
  in.U32(&regex_bytes);
  in.U32(&directory_count);
  in.U32(&stamp_count);
  in.U32(&file_count);
  in.U32(&reserved);
  if (version != kVersion) {
    return Malformed(absl::StrCat("format version ", version, "; this build reads version ",
                                  kVersion, " (write it again with `monarch manifest`)"));
  }
  // The length first: a truncated file is the likely accident, and says so.
  if (total != bytes.size()) {
    return Malformed(absl::StrCat(bytes.size(), " bytes where the header says ", total,
                                  total > bytes.size() ? " (truncated)" : ""));
  }
  uint32_t stored_crc = 0;
  for (int i = 0; i < 4; ++i) {
    stored_crc |= uint32_t{static_cast<uint8_t>(bytes[bytes.size() - 4 + i])} << (8 * i);
  }
  if (Crc32c(bytes.data(), bytes.size() - kTrailerBytes) != stored_crc) {
    return Malformed("checksum mismatch (the file is damaged)");
  }
  if (symlinks > 2 || reserved != 0) return Malformed("unknown values in the header");
  // Every record takes at least its fixed bytes: counts that do not fit in
  // what is left are lies, refused before anything is sized by them.
  const uint64_t body = bytes.size() - kHeaderBytes - kTrailerBytes;
  const uint64_t least = uint64_t{root_bytes} + regex_bytes +
                         uint64_t{directory_count} * kDirectoryRecordBytes +
                         uint64_t{stamp_count} * kStampRecordBytes +
                         uint64_t{file_count} * kFileRecordBytes;
  if (least > body) {
    return Malformed(absl::StrCat("its counts (", directory_count, " directories, ", stamp_count,
                                  " stamps, ", file_count, " files) need more than its ", body,
                                  " bytes"));
  }
  if (directory_count == 0) return Malformed("no root directory");
  if (root_bytes == 0 || root_bytes > kMaxPathBytes || regex_bytes > kMaxRegexBytes) {
    return Malformed("a dataset root or file_regex of impossible length");
  }

  std::unique_ptr<Manifest> manifest(new Manifest());
  absl::string_view root, regex;
  in.Bytes(root_bytes, &root);
  in.Bytes(regex_bytes, &regex);
  if (root[0] != '/' || root.find('\0') != absl::string_view::npos) {
    return Malformed("the dataset root is not an absolute path");
  }
  manifest->origin_.root = std::string(root);
  manifest->origin_.file_regex = std::string(regex);
  manifest->origin_.symlinks = symlinks == 1   ? SymlinkPolicy::kInside
                               : symlinks == 2 ? SymlinkPolicy::kSkip
                                               : SymlinkPolicy::kFollow;
  NamespaceListing& listing = manifest->listing_;
  listing.root_device = root_device;

  listing.directories.reserve(directory_count);
  // Directories' full names, built from (parent, component) records, could
  // otherwise grow to kMaxPathBytes per 9-byte record: bound them like the
  // files' names below.
  const uint64_t max_directory_name_bytes = 64 * uint64_t{bytes.size()};
  uint64_t directory_name_bytes = 0;
  for (uint32_t d = 0; d < directory_count; ++d) {
    uint32_t parent, name_bytes;
    absl::string_view name;
    if (!in.U32(&parent) || !in.U32(&name_bytes) || !in.Bytes(name_bytes, &name)) {
      return Malformed(absl::StrCat("directory ", d, " runs past the end"));
    }
    if (d == 0) {
      if (parent != 0 || !name.empty()) return Malformed("the first directory is not the root");
      listing.directories.push_back({"", 0});
      continue;
    }
    if (parent >= d) return Malformed(absl::StrCat("directory ", d, "'s parent is not before it"));
    if (!PlainComponent(name) || (parent == 0 && name == kReserved)) {
      return Malformed(absl::StrCat("directory ", d, " is named ", QuoteForError(name)));
    }
    const std::string& parent_name = listing.directories[parent].name;
    if (parent_name.size() + 1 + name.size() > kMaxPathBytes) {
      return Malformed(absl::StrCat("directory ", d, "'s path is longer than ", kMaxPathBytes));
    }
    directory_name_bytes += parent_name.size() + 1 + name.size();
    if (directory_name_bytes > max_directory_name_bytes) {
      return Malformed("its directories' paths are far longer than the file itself");
    }
    listing.directories.push_back(
        {parent == 0 ? std::string(name) : absl::StrCat(parent_name, "/", name), parent});
  }

  listing.stamps.reserve(stamp_count);
  for (uint32_t s = 0; s < stamp_count; ++s) {
    DirectoryStamp stamp;
    uint32_t zero;
    // The names before may have taken the bytes the counts left for these.
    if (!in.U32(&stamp.directory) || !in.U32(&zero) || !in.I64(&stamp.mtime_ns)) {
      return Malformed(absl::StrCat("stamp ", s, " runs past the end"));
    }
    if (stamp.directory >= directory_count || zero != 0) {
      return Malformed(absl::StrCat("stamp ", s, " names no directory"));
    }
    listing.stamps.push_back(stamp);
  }

  // Names are assembled into one arena sized first, so the listing's views
  // into it never move. Full names are at most kMaxPathBytes each, so the
  // arena is at most ~46 times the manifest's own size.
  struct Pending {
    absl::string_view name;
    ListedFile file;
  };
  std::vector<Pending> files;
  files.reserve(file_count);
  uint64_t arena_bytes = 0;
  for (uint32_t id = 0; id < file_count; ++id) {
    Pending p;
    uint32_t name_bytes;
    FileAttributes& a = p.file.attributes;
    if (!in.U32(&p.file.directory) || !in.U32(&name_bytes) || !in.U64(&p.file.size) ||
        !in.I64(&p.file.mtime_ns) || !in.U64(&a.device) || !in.U64(&a.inode) ||
        !in.I64(&a.atime_ns) || !in.I64(&a.ctime_ns) || !in.U64(&a.blocks) || !in.U32(&a.mode) ||
        !in.U32(&a.link_count) || !in.U32(&a.uid) || !in.U32(&a.gid) ||
        !in.U32(&a.block_size) || !in.U32(&a.via_symlink) || !in.Bytes(name_bytes, &p.name)) {
      return Malformed(absl::StrCat("file ", id, " runs past the end"));
    }
    if (p.file.directory >= directory_count) {
      return Malformed(absl::StrCat("file ", id, " is in no directory"));
    }
    if (!PlainComponent(p.name) || (p.file.directory == 0 && p.name == kReserved)) {
      return Malformed(absl::StrCat("file ", id, " is named ", QuoteForError(p.name)));
    }
    const std::string& directory = listing.directories[p.file.directory].name;
    const size_t full = directory.empty() ? p.name.size() : directory.size() + 1 + p.name.size();
    if (full > kMaxPathBytes) {
      return Malformed(absl::StrCat("file ", id, "'s path is longer than ", kMaxPathBytes));
    }
    if (a.via_symlink > 1) return Malformed(absl::StrCat("file ", id, " has unknown flags"));
    arena_bytes += full;
    files.push_back(p);
  }
  if (in.left() != kTrailerBytes) {
    return Malformed(in.left() > kTrailerBytes
                         ? absl::StrCat(in.left() - kTrailerBytes, " bytes after the last file")
                         : std::string("its last record runs into the checksum"));
  }

  std::string& arena = manifest->names_;
  arena.reserve(arena_bytes);
  listing.files.reserve(files.size());
  for (Pending& p : files) {
    const std::string& directory = listing.directories[p.file.directory].name;
    const size_t start = arena.size();
    if (!directory.empty()) absl::StrAppend(&arena, directory, "/");
    arena.append(p.name.data(), p.name.size());
    p.file.name = absl::string_view(arena).substr(start);
    listing.files.push_back(p.file);
  }
  return manifest;
}

absl::StatusOr<std::unique_ptr<Manifest>> ReadManifest(const std::string& path) {
  MONARCH_ASSIGN_OR_RETURN(ScopedFd fd, OpenForRead(path));
  struct stat st;
  if (os::Fstat(fd.get(), &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat ", path));
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a regular file"));
  }
  if (static_cast<uint64_t>(st.st_size) > kMaxManifestBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(path, " is ", st.st_size,
                                                     " bytes; manifests over ", kMaxManifestBytes,
                                                     " bytes are refused"));
  }
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  MONARCH_ASSIGN_OR_RETURN(size_t got, PreadFull(fd.get(), bytes.data(), bytes.size(), 0, path));
  bytes.resize(got);  // Shorter if it shrank meanwhile: then the length check refuses it.
  absl::StatusOr<std::unique_ptr<Manifest>> manifest = ParseManifest(bytes);
  if (!manifest.ok()) {
    return absl::Status(manifest.status().code(),
                        absl::StrCat(path, ": ", manifest.status().message()));
  }
  return manifest;
}

absl::Status CheckOrigin(const Manifest& manifest, const ManifestOrigin& expected) {
  const ManifestOrigin& got = manifest.origin();
  if (got.root != expected.root) {
    return absl::FailedPreconditionError(
        absl::StrCat("it lists dataset ", QuoteForError(got.root), ", expected ",
                     QuoteForError(expected.root), " (dataset.path)"));
  }
  if (got.file_regex != expected.file_regex) {
    return absl::FailedPreconditionError(
        absl::StrCat("it was walked with file_regex ", QuoteForError(got.file_regex),
                     ", expected ", QuoteForError(expected.file_regex), " (dataset.file_regex)"));
  }
  if (got.symlinks != expected.symlinks) {
    return absl::FailedPreconditionError(
        absl::StrCat("it was walked with symlinks '", NameOf(got.symlinks), "', expected '",
                     NameOf(expected.symlinks), "' (dataset.symlinks)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> CheckDirectories(const Manifest& manifest, int threads) {
  const std::vector<DirectoryStamp>& stamps = manifest.listing().stamps;
  const std::string& root = manifest.origin().root;
  std::vector<absl::Status> results(stamps.size());
  uint64_t root_device = manifest.listing().root_device;
  // On a PFS each stat is a metadata round trip; a dataset with thousands
  // of directories is checked by several threads.
  ForEachInParallel(stamps.size(), threads, 16, [&](size_t i) {
    const std::string& name = manifest.listing().directories[stamps[i].directory].name;
    const std::string shown =
        name.empty() ? absl::StrCat("the dataset root ", QuoteForError(root))
                     : absl::StrCat("directory ", QuoteForError(name));
    struct stat st;
    if (os::Stat((name.empty() ? root : absl::StrCat(root, "/", name)).c_str(), &st) != 0) {
      results[i] = absl::FailedPreconditionError(absl::StrCat(
          "the dataset changed since the manifest was written: ", shown, " is gone (",
          std::strerror(errno), ")"));
      return;
    }
    const int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 +
                          st.st_mtim.tv_nsec;
    if (!S_ISDIR(st.st_mode) || mtime != stamps[i].mtime_ns) {
      results[i] = absl::FailedPreconditionError(absl::StrCat(
          "the dataset changed since the manifest was written: ", shown,
          S_ISDIR(st.st_mode) ? " has a new mtime (entries were added, removed or renamed in it)"
                              : " is no longer a directory"));
      return;
    }
    if (name.empty()) root_device = st.st_dev;  // Only the root's call writes it.
  });
  for (const absl::Status& result : results) MONARCH_RETURN_IF_ERROR(result);
  return root_device;
}

absl::StatusOr<std::unique_ptr<Namespace>> NamespaceFromManifest(
    Manifest& manifest, const ManifestOrigin& expected, int source_tier,
    const Namespace::TierSlotAllocator& allocate, int threads, const ExtentLayout& extents) {
  MONARCH_RETURN_IF_ERROR(CheckOrigin(manifest, expected));
  MONARCH_ASSIGN_OR_RETURN(uint64_t device, CheckDirectories(manifest, threads));
  NamespaceListing& listing = manifest.listing_;
  if (device != listing.root_device) {
    for (ListedFile& file : listing.files) {
      if (file.attributes.device == listing.root_device) file.attributes.device = device;
    }
    listing.root_device = device;
  }
  return Namespace::FromListing(manifest.origin().root, listing, source_tier, allocate, extents);
}

absl::StatusOr<std::unique_ptr<Namespace>> AwaitSharedManifest(
    const std::string& path, const ManifestOrigin& expected, double timeout_seconds,
    int source_tier, const Namespace::TierSlotAllocator& allocate, int threads,
    const ExtentLayout& extents) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  auto pause = std::chrono::milliseconds(2);
  std::string problem = "none was written";
  // The file last refused, so that a stale one is not read again and again
  // while rank 0 is still walking.
  struct stat refused {};
  bool have_refused = false;
  for (;;) {
    struct stat st;
    const bool present = os::Stat(path.c_str(), &st) == 0;
    const bool same_as_refused = present && have_refused && st.st_ino == refused.st_ino &&
                                 st.st_dev == refused.st_dev && st.st_size == refused.st_size &&
                                 st.st_mtim.tv_sec == refused.st_mtim.tv_sec &&
                                 st.st_mtim.tv_nsec == refused.st_mtim.tv_nsec;
    if (present && !same_as_refused) {
      absl::StatusOr<std::unique_ptr<Manifest>> manifest = ReadManifest(path);
      absl::Status status = manifest.status();
      if (manifest.ok()) {
        absl::StatusOr<std::unique_ptr<Namespace>> ns =
            NamespaceFromManifest(**manifest, expected, source_tier, allocate, threads, extents);
        if (ns.ok()) return ns;
        status = ns.status();
      }
      if (!absl::IsNotFound(status)) {  // NotFound: replaced between stat and open.
        problem = std::string(status.message());
        refused = st;
        have_refused = true;
      }
    }
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(pause);  // Gentle on a PFS's metadata server.
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "remote: waited ", timeout_seconds, " s (remote.rendezvous_timeout) for rank 0's namespace "
      "manifest ", QuoteForError(path), "; the last one seen was refused or missing: ", problem));
}

namespace {

// How many files the check of a kept namespace stats: a file rewritten in
// place changes no directory, so a few are looked at directly. A dataset
// this small is checked whole.
constexpr uint32_t kKeptSampleFiles = 64;

std::string KeptDirectory(const NamespacePlan& plan) {
  return plan.kept.substr(0, plan.kept.rfind('/'));
}

// The namespace kept on the node (dataset.keep_namespace), or null when
// there is none or it no longer describes the dataset.
std::unique_ptr<Namespace> FromKeptNamespace(const NamespacePlan& plan,
                                             const Namespace::TierSlotAllocator& slots) {
  // Only from a directory no other user can write to.
  absl::Status own = MakePrivateDirectory(KeptDirectory(plan), "dataset.keep_namespace");
  absl::StatusOr<std::unique_ptr<Manifest>> manifest =
      own.ok() ? ReadManifest(plan.kept) : absl::StatusOr<std::unique_ptr<Manifest>>(own);
  absl::StatusOr<std::unique_ptr<Namespace>> ns =
      manifest.ok() ? NamespaceFromManifest(**manifest, plan.origin, plan.source_tier, slots,
                                            plan.scan_threads, plan.extents)
                    : manifest.status();
  if (ns.ok()) {
    const uint32_t files = (*ns)->file_count();
    std::mt19937 random{std::random_device{}()};
    for (uint32_t i = 0; i < std::min(files, kKeptSampleFiles) && ns.ok(); ++i) {
      const uint32_t id = files <= kKeptSampleFiles ? i : random() % files;
      if (!(*ns)->SourceUnchanged(id)) {
        ns = absl::FailedPreconditionError(absl::StrCat(
            QuoteForError((*ns)->file_name(id)), " changed since the namespace was kept"));
      }
    }
  }
  if (ns.ok()) return std::move(*ns);
  if (!absl::IsNotFound(ns.status())) {
    MONARCH_LOG(kInfo, "walking the dataset: the namespace kept on the node does not describe it "
                       "now (", ns.status().message(), ")");
  }
  return nullptr;
}

// Keeps a walk's namespace for the next start; a failure only costs that
// start a walk. A directory changed within 2 s before the walk is not kept:
// on a file system with whole-second times a change later in that second
// would leave its mtime as stamped (git's "racily clean" entries).
void KeepNamespace(const Namespace& ns, const NamespacePlan& plan, int64_t walk_began_ns) {
  for (const DirectoryStamp& stamp : ns.stamps()) {
    if (stamp.mtime_ns >= walk_began_ns - 2'000'000'000) return;
  }
  absl::Status kept = MakePrivateDirectory(KeptDirectory(plan), "dataset.keep_namespace");
  if (kept.ok()) kept = WriteManifest(ns, plan.origin, plan.kept);
  if (!kept.ok()) MONARCH_LOG(kInfo, "the namespace is not kept on the node: ", kept.message());
}

}  // namespace

absl::StatusOr<BuiltNamespace> BuildNamespace(const NamespacePlan& plan,
                                              const Namespace::TierSlotAllocator& slots) {
  const auto began = std::chrono::steady_clock::now();
  BuiltNamespace built;
  if (!plan.manifest.empty()) {
    absl::StatusOr<std::unique_ptr<Manifest>> manifest = ReadManifest(plan.manifest);
    absl::StatusOr<std::unique_ptr<Namespace>> ns =
        manifest.ok() ? NamespaceFromManifest(**manifest, plan.origin, plan.source_tier, slots,
                                              plan.scan_threads, plan.extents)
                      : manifest.status();
    if (!ns.ok()) {
      return absl::Status(
          ns.status().code(),
          absl::StrCat("dataset.manifest: ", manifest.ok() ? absl::StrCat(plan.manifest, ": ") : "",
                       ns.status().message(),
                       "; write a new one with `monarch manifest --config FILE`"));
    }
    built.ns = std::move(*ns);
  } else if (!plan.shared_manifest.empty() && !plan.publishes) {
    absl::StatusOr<std::unique_ptr<Namespace>> ns =
        AwaitSharedManifest(plan.shared_manifest, plan.origin, plan.await_seconds,
                            plan.source_tier, slots, plan.scan_threads, plan.extents);
    if (ns.ok()) {
      built.ns = std::move(*ns);
    } else if (absl::IsDeadlineExceeded(ns.status())) {
      MONARCH_LOG(kWarning, ns.status().message(), "; walking the dataset here instead");
    } else {
      return ns.status();
    }
  }
  if (built.ns == nullptr && !plan.kept.empty()) built.ns = FromKeptNamespace(plan, slots);
  const bool walks = built.ns == nullptr;
  if (walks) {
    // One a crashed earlier job left must not be taken for this walk's.
    if (plan.publishes) os::Unlink(plan.shared_manifest.c_str());
    const int64_t began_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count();
    MONARCH_ASSIGN_OR_RETURN(built.ns, Namespace::Build(plan.origin.root, plan.origin.file_regex,
                                                        plan.source_tier, plan.scan_threads, slots,
                                                        plan.origin.symlinks, plan.extents));
    if (!plan.kept.empty()) KeepNamespace(*built.ns, plan, began_ns);
  }
  if (plan.publishes) {  // Walked or kept: the other ranks wait for it either way.
    if (absl::Status written = WriteManifest(*built.ns, plan.origin, plan.shared_manifest);
        !written.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "remote.rendezvous_dir: cannot publish the namespace manifest: ", written.message()));
    }
    built.published = plan.shared_manifest;
  }
  built.ns->RecordBuild(!walks, static_cast<uint64_t>(
                                    std::chrono::duration_cast<std::chrono::milliseconds>(
                                        std::chrono::steady_clock::now() - began)
                                        .count()));
  return built;
}

}  // namespace monarch
