// Origin: where the bytes of a file no cache tier holds come from (the
// read-only tiers: the peers, if any, then the source), and the check that
// a copy of them is of the version the namespace walk found.
//
// Apart from the Promoter because it is the one part of placement that
// talks to the origins and not to the cache tiers or the in-flight table:
// promotions read through it, and the handler's reads of files that stay
// on the source do too.
//
// Lives as long as its Promoter; the tiers and namespace must outlive it.
// Thread-safe (its state is atomics).

#ifndef MONARCH_PLACEMENT_ORIGIN_H_
#define MONARCH_PLACEMENT_ORIGIN_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "drivers/tier.h"
#include "metadata/namespace.h"

namespace monarch {

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
  // bytes copied, when the promotion was asked to compute it.
  absl::StatusOr<SourceIdentity> IdentityToCommit(const FileEntry& entry, bool read_source,
                                                  std::optional<uint32_t> content_crc);

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

}  // namespace monarch

#endif  // MONARCH_PLACEMENT_ORIGIN_H_
