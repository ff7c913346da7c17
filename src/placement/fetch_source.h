// FetchSource: where the bytes of a file that no local tier holds come from.
//
// Without peers that is the source tier itself. With peers (src/remote/) it
// is the file's home peer, falling back to the source. Promotions and
// pass-through reads go through it, so everything the placement code does
// (one fetch per chunk however many readers share it, whole-file promotion
// after a partial read) holds for peer fetches too.

#ifndef MONARCH_PLACEMENT_FETCH_SOURCE_H_
#define MONARCH_PLACEMENT_FETCH_SOURCE_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "drivers/tier.h"

namespace monarch {

class FetchSource {
 public:
  virtual ~FetchSource() = default;
  // As StorageDriver::Read: up to `n` bytes of `file` at `offset`.
  virtual absl::StatusOr<size_t> Fetch(const FileRef& file, uint64_t offset, char* dst,
                                       size_t n) = 0;
};

// Fetches straight from the source tier.
class SourceFetch final : public FetchSource {
 public:
  explicit SourceFetch(Tier* source) : source_(source) {}
  absl::StatusOr<size_t> Fetch(const FileRef& file, uint64_t offset, char* dst, size_t n) override {
    return source_->Read(file, offset, dst, n);
  }

 private:
  Tier* const source_;
};

}  // namespace monarch

#endif  // MONARCH_PLACEMENT_FETCH_SOURCE_H_
