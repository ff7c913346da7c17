// ReadPath: how a read is served, once, for an in-process instance and a
// node-service client alike.
//
// name -> the file -> the tier holding it -> that tier's reader; a copy that
// fails to read is reported and the read goes on; bytes no readable copy
// has are a miss (a promotion and the source in process; the service, for
// a client). What differs between the two lives behind a small adapter, the
// `Files` type, in the manner of the VFS's address_space_operations: the
// adapter knows where files live and how to read them, this code knows the
// order of the steps and the promise that a read never returns bytes that
// differ from the source's (only a complete read of a copy is taken; any
// other outcome goes to the adapter, then to the miss path, which ends at
// the source).
//
// A template, not an interface: a hit costs no call that is not inlined
// (bench_ram_hit, bench_client_hit). `Files` provides:
//
//   using Handle = ...;                 // What Find() returns: a file to read.
//   Handle Find(absl::string_view name);     // Null/empty: not a dataset file.
//   const FileRef& Ref(const Handle& file);
//   bool HasExtents(const Handle& file);     // Cached by extents (metadata/namespace.h):
//   Handle ExtentAt(const Handle& file,      //   the one holding byte `offset`, read
//                   uint64_t offset);        //   as a file of its own;
//   void ReadingRange(const Handle& file,    //   told of each read of such a file
//       uint64_t offset, size_t n);          //   first (read-ahead of scans).
//   void FirstRead(const Handle& file);      // A reader starts the file (offset 0), or
//                                            // reads into an extent (prefetch).
//   int BeginRead(const Handle& file);       // The tier holding it now, pinned until
//   void EndRead(const Handle& file);        //   EndRead where copies are evicted.
//   int source_tier() const;                 // What BeginRead() says when no copy does.
//   StorageDriver* Reader(int tier);         // Reads `tier`'s copies here; null: a miss.
//   // Reads the copy in `tier` with `reader` (or its bytes from wherever the
//   // adapter knows is faster now) and counts a read of all `n` bytes where
//   // it was served.
//   absl::StatusOr<size_t> ReadCopy(StorageDriver& reader, const Handle& file, int tier,
//       uint64_t offset, char* dst, size_t n);
//   // The copy in `tier` did not give `n` bytes (gone, damaged): the adapter
//   // may answer the read itself (from the source, after dropping the copy);
//   // nullopt sends it to Miss().
//   std::optional<absl::StatusOr<size_t>> CopyFailed(const Handle& file, int tier,
//       const absl::StatusOr<size_t>& result, uint64_t offset, char* dst, size_t n);
//   // Bytes no readable copy has. Nullopt: the file was published to a tier
//   // meanwhile, and the read goes round again.
//   std::optional<absl::StatusOr<size_t>> Miss(const Handle& file, uint64_t offset,
//       char* dst, size_t n);
//   // For MapCopiesFound: for each piece (a file or extent) and the tier
//   // holding it, the stamp of its copy if that copy was checked whole
//   // (CopyMapping::MarkMapped, here or in the node service).
//   std::vector<std::optional<SourceIdentity>> CheckedCopies(
//       const std::vector<Handle>& pieces, const std::vector<int>& tiers);
//
// Thread-safe as far as the adapter is: both adapters are.

#ifndef MONARCH_CORE_READ_PATH_H_
#define MONARCH_CORE_READ_PATH_H_

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/counters.h"
#include "common/os.h"
#include "common/status_macros.h"
#include "drivers/storage_driver.h"

namespace monarch {

// pread semantics on a file already found: up to `n` bytes at `offset`,
// short at the end of the file, 0 at or past it.
template <typename Files>
absl::StatusOr<size_t> ReadFound(Files& files, const typename Files::Handle& file, char* dst,
                                 size_t n, uint64_t offset) {
  const uint64_t size = files.Ref(file).size;
  if (offset >= size || n == 0) return 0;
  n = static_cast<size_t>(std::min<uint64_t>(n, size - offset));
  if (files.HasExtents(file)) {
    // Extent by extent, each read as a file is: its copy, its promotion or
    // the source. A piece the source ends early (the file shrank) ends the
    // read short, as pread's; an error fails it.
    files.ReadingRange(file, offset, n);
    size_t done = 0;
    while (done < n) {
      const typename Files::Handle extent = files.ExtentAt(file, offset + done);
      const FileRef& part = files.Ref(extent);
      const uint64_t within = offset + done - part.part_offset;
      const size_t want = static_cast<size_t>(std::min<uint64_t>(n - done, part.size - within));
      files.FirstRead(extent);  // For an order of ranges: each extent a read touches.
      absl::StatusOr<size_t> got = ReadFound(files, extent, dst + done, want, within);
      if (!got.ok()) return got;
      done += *got;
      if (*got < want) break;
    }
    return done;
  }
  for (;;) {
    const int tier = files.BeginRead(file);
    StorageDriver* reader = tier != files.source_tier() ? files.Reader(tier) : nullptr;
    if (reader != nullptr) {
      absl::StatusOr<size_t> got = files.ReadCopy(*reader, file, tier, offset, dst, n);
      files.EndRead(file);
      if (got.ok() && *got == n) return got;
      if (auto answered = files.CopyFailed(file, tier, got, offset, dst, n)) return *answered;
    } else {
      files.EndRead(file);
    }
    if (auto result = files.Miss(file, offset, dst, n)) return *result;
    // Published to a tier meanwhile: go round once more and read it there.
  }
}

// The whole read by name: NotFound for a name outside the dataset.
template <typename Files>
absl::StatusOr<size_t> ReadNamed(Files& files, absl::string_view name, char* dst, size_t n,
                                 uint64_t offset) {
  const typename Files::Handle file = files.Find(name);
  if (!file) return absl::NotFoundError(absl::StrCat("not a dataset file: ", name));
  // A reader's first read of a file: prefetch counts it as consumed.
  if (offset == 0) files.FirstRead(file);
  return ReadFound(files, file, dst, n, offset);
}

// Monarch::MapCopies on a file already found. `mapping` is a private
// mapping of [offset, offset + length) of the file (the source's, mapped
// lazily) that nobody has written to yet; every whole page of it that a
// tier holds a copy of that may be mapped is mapped again, at the same
// address, from that copy: privately, with `protection` and the flags of
// `flags` that say how to map rather than what (MAP_NORESERVE, MAP_LOCKED,
// MAP_POPULATE). Pages are then read from the copy when touched, and every
// process of the node mapping the same copy shares them: a file tier's
// through the page cache, a RAM tier's as the tier's own memory. What no
// such copy holds stays as it was: a copy not checked whole yet, a RAM copy
// under 1 MiB (it does not start on a page), the part of a last page past
// the end of a piece (a file copy's trailer, or the next RAM copy, follows
// its bytes there, and a mapping must read zeros).
//
// Why only checked copies: a page fault reads the copy with no checksum
// check, so a file tier's copy is mapped only if every one of its blocks
// was checked and it is still that inode. From then on the mapping trusts
// it, as any mapping trusts its file: a copy written in place after it was
// mapped (by someone with write access to the tier's directory) would show
// through. A RAM copy is sealed memory; its tier holds it, once removed,
// until no process maps it (SharedCopies::HeldBytes).
//
// Each copy is mapped at a new address first and moved over the range
// (mremap) only if its tier vouched for it and it is still the piece's
// copy then (CopyMapping::StillCopyOf): a RAM copy removed before its
// tier was asked may be reused, and that range stays as it was.
//
// Returns the bytes mapped from copies. An error leaves the range mapped
// in part from copies, in part not, and perhaps a hole where a remapping
// failed: the caller unmaps the whole range.
template <typename Files>
absl::StatusOr<uint64_t> MapCopiesFound(Files& files, const typename Files::Handle& file,
                                        char* mapping, uint64_t offset, uint64_t length,
                                        int protection, int flags) {
  using Handle = typename Files::Handle;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t size = files.Ref(file).size;
  if (offset % page != 0 || reinterpret_cast<uintptr_t>(mapping) % page != 0) {
    return absl::InvalidArgumentError("a mapping starts on a page boundary");
  }
  const uint64_t end = std::min<uint64_t>(size, offset + length);
  if (offset >= end) return 0;
  // The pieces the range touches that a tier other than the source holds,
  // if its reader here maps copies.
  std::vector<Handle> pieces;
  std::vector<int> tiers;
  std::vector<uint64_t> bases;  // Where each piece starts in the file.
  std::vector<CopyMapping*> mappers;
  std::vector<std::optional<CopyMapping*>> mapper_of(files.source_tier());  // Asked once a tier.
  auto consider = [&](const Handle& piece, uint64_t base) {
    const int tier = files.BeginRead(piece);
    files.EndRead(piece);  // The descriptor opened below holds the copy.
    if (tier < 0 || tier >= files.source_tier()) return;
    if (!mapper_of[tier]) {
      StorageDriver* reader = files.Reader(tier);
      mapper_of[tier] = reader != nullptr ? reader->capabilities().mapping : nullptr;
    }
    if (CopyMapping* mapper = *mapper_of[tier]; mapper != nullptr) {
      pieces.push_back(piece);
      tiers.push_back(tier);
      bases.push_back(base);
      mappers.push_back(mapper);
    }
  };
  if (files.HasExtents(file)) {
    // Each remapped piece is a mapping of its own to the kernel, and a
    // process has at most vm.max_map_count (65,530 by default): past this
    // many pieces a range stays on the source.
    constexpr size_t kMaxPieces = 8192;
    for (uint64_t at = offset; at < end && pieces.size() < kMaxPieces;) {
      const Handle extent = files.ExtentAt(file, at);
      const uint64_t base = files.Ref(extent).part_offset;
      consider(extent, base);
      at = base + files.Ref(extent).size;
    }
  } else {
    consider(file, 0);
  }
  if (pieces.empty()) return 0;
  const int keep = flags & (MAP_NORESERVE | MAP_LOCKED | MAP_POPULATE);
  // Each piece's mapping, made at an address of its own first.
  struct Staged {
    void* at = nullptr;
    uint64_t from = 0, to = 0;  // The range of the file it maps.
    CopyMapping::MappableCopy copy;
  };
  std::vector<Staged> staged(pieces.size());
  // Unmaps what is still staged, on every way out.
  auto unstage = [&staged] {
    for (Staged& s : staged) {
      if (s.at != nullptr) os::Munmap(s.at, s.to - s.from);
      s.at = nullptr;
    }
  };
  auto stage = [&](size_t i, const SourceIdentity* vouched) -> absl::Status {
    const FileRef& piece = files.Ref(pieces[i]);
    const uint64_t base = bases[i];
    if (base % page != 0) return absl::OkStatus();  // Extents of a size pages do not divide.
    const uint64_t from = std::max(offset, base);
    const uint64_t to = std::min(base + piece.size / page * page, end / page * page);
    if (to <= from) return absl::OkStatus();
    absl::StatusOr<CopyMapping::MappableCopy> copy = mappers[i]->OpenCheckedCopy(piece, vouched);
    if (!copy.ok()) return absl::OkStatus();  // Changed or gone: the range stays as it was.
    void* at = os::Mmap(nullptr, to - from, protection, MAP_PRIVATE | keep, copy->fd,
                        static_cast<off_t>(copy->offset + (from - base)));
    if (at == MAP_FAILED) {
      return ErrnoToStatus(errno, absl::StrCat("mapping a copy of ", piece.name));
    }
    staged[i] = Staged{at, from, to, *std::move(copy)};
    return absl::OkStatus();
  };
  // A RAM copy is mapped before its tier is asked (it opens with no word
  // yet), so that the mapping exists when the tier starts holding the copy
  // for it: a walk of the mappings that starts later sees it. A file
  // tier's copy is opened once its tier vouched for that inode.
  for (size_t i = 0; i < pieces.size(); ++i) {
    absl::Status made = stage(i, nullptr);
    if (!made.ok()) {
      unstage();
      return made;
    }
  }
  const std::vector<std::optional<SourceIdentity>> checked = files.CheckedCopies(pieces, tiers);
  uint64_t mapped = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const bool vouched = i < checked.size() && checked[i].has_value();
    if (staged[i].at == nullptr && vouched) {
      absl::Status made = stage(i, &*checked[i]);
      if (!made.ok()) {
        unstage();
        return made;
      }
    }
    Staged& s = staged[i];
    if (s.at == nullptr) continue;
    if (!vouched || !mappers[i]->StillCopyOf(files.Ref(pieces[i]), s.copy)) {
      os::Munmap(s.at, s.to - s.from);
      s.at = nullptr;
      continue;
    }
    if (os::Mremap(s.at, s.to - s.from, s.to - s.from, MREMAP_MAYMOVE | MREMAP_FIXED,
                   mapping + (s.from - offset)) == MAP_FAILED) {
      const int error = errno;
      unstage();
      return ErrnoToStatus(error, absl::StrCat("moving a mapping of a copy of ",
                                               files.Ref(pieces[i]).name));
    }
    s.at = nullptr;  // Moved: the caller's now.
    mapped += s.to - s.from;
  }
  return mapped;
}

}  // namespace monarch

#endif  // MONARCH_CORE_READ_PATH_H_
