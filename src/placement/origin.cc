// Origin: reads from the read-only tiers, and the source check of a copy.

#include "placement/origin.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "placement/placement_policy.h"

namespace monarch {

Origin::Origin(const std::vector<std::unique_ptr<Tier>>* tiers, const Namespace* ns,
               bool remember_content)
    : tiers_(tiers),
      namespace_(ns),
      source_index_(static_cast<int>(tiers->size()) - 1),
      first_origin_(FirstReadOnlyTier(*tiers)) {
  if (remember_content) {
    const uint32_t files = std::max<uint32_t>(ns->entry_count(), 1);
    content_crcs_.reset(new std::atomic<uint64_t>[files]());
  }
}

absl::StatusOr<size_t> Origin::Read(const FileRef& file, uint64_t offset, char* dst, size_t n,
                                    bool* from_source) {
  for (int t = first_origin_;; ++t) {
    Tier& tier = *(*tiers_)[t];
    if (from_source != nullptr) *from_source = t == source_index_;
    absl::StatusOr<size_t> result = tier.Read(file, offset, dst, n);
    if (result.ok()) return result;
    // The source has the last word; a peer that does not have the file
    // (NotFound: this node is its home, or the home is down) is no error.
    if (t == source_index_ || !absl::IsNotFound(result.status())) tier.CountReadError();
    if (t == source_index_) return result;
  }
}

absl::StatusOr<size_t> Origin::ReadSourceIfInMemory(const FileRef& file, uint64_t offset,
                                                    char* dst, size_t n) {
  // Not counted as the source's reads: those are what readers were served
  // and what came from its device or network, and these bytes were read
  // from the source once already, by the reader whose miss queued the copy.
  Tier& source = *(*tiers_)[source_index_];
  InMemoryReads* in_memory = source.can().in_memory;
  if (in_memory == nullptr) return absl::UnimplementedError("cannot tell what is in memory");
  absl::StatusOr<size_t> result = in_memory->ReadIfInMemory(file, offset, dst, n);
  if (result.ok()) {
    bytes_from_memory_.fetch_add(*result, std::memory_order_relaxed);
  } else if (!absl::IsUnavailable(result.status()) && !absl::IsUnimplemented(result.status())) {
    source.CountReadError();
  }
  return result;
}

absl::StatusOr<SourceIdentity> Origin::IdentityToCommit(
    const FileEntry& entry, bool read_source, std::optional<uint32_t> content_crc) {
  const SourceIdentity identity = namespace_->identity(entry.ref.id);
  std::atomic<uint64_t>* known =
      content_crc.has_value() && content_crcs_ != nullptr ? &content_crcs_[entry.ref.id] : nullptr;
  if (read_source && known != nullptr) {
    // Copied before: the same bytes are the same version, which the first
    // copy's check found to be the walk's. Any change to the file since,
    // before or during this copy, shows as other bytes (a CRC32C misses a
    // change with odds of 2^-32).
    const uint64_t first = known->load(std::memory_order_acquire);
    if ((first & kContentKnown) != 0) {
      if (static_cast<uint32_t>(first) != *content_crc) {
        source_changed_.fetch_add(1, std::memory_order_relaxed);
        return absl::AbortedError(absl::StrCat(
            entry.ref.name, " changed on the source since it was first copied; not copied"));
      }
      identified_by_content_.fetch_add(1, std::memory_order_relaxed);
      return identity;
    }
  }
  // Without `read_source` the home peer checked its own copy's source.
  if (read_source) {
    FileIdentity* source = (*tiers_)[source_index_]->can().identity;
    if (source == nullptr) return absl::UnimplementedError("the source identifies no file");
    MONARCH_ASSIGN_OR_RETURN(SourceIdentity now, source->Identify(entry.ref));
    if (now != identity) {
      source_changed_.fetch_add(1, std::memory_order_relaxed);
      return absl::AbortedError(absl::StrCat(
          entry.ref.name, " changed on the source since the namespace walk; not copied"));
    }
  }
  if (known != nullptr) known->store(kContentKnown | *content_crc, std::memory_order_release);
  return identity;
}

}  // namespace monarch
