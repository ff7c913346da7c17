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
//   int Pin(const Handle& file);             // The tier holding it now, kept until
//   void Unpin(const Handle& file);          //   Unpin (eviction waits for pins).
//   int source_tier() const;                 // What Pin() says when no copy holds it.
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
//
// Thread-safe as far as the adapter is: both adapters are.

#ifndef MONARCH_CORE_READ_PATH_H_
#define MONARCH_CORE_READ_PATH_H_

#include <algorithm>
#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/counters.h"
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
    const int tier = files.Pin(file);
    StorageDriver* reader = tier != files.source_tier() ? files.Reader(tier) : nullptr;
    if (reader != nullptr) {
      absl::StatusOr<size_t> got = files.ReadCopy(*reader, file, tier, offset, dst, n);
      files.Unpin(file);
      if (got.ok() && *got == n) return got;
      if (auto answered = files.CopyFailed(file, tier, got, offset, dst, n)) return *answered;
    } else {
      files.Unpin(file);
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

}  // namespace monarch

#endif  // MONARCH_CORE_READ_PATH_H_
