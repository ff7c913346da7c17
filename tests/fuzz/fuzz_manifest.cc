// Fuzz target: the namespace manifest parser, monarch::ParseManifest
// (src/metadata/manifest.h), then Namespace::FromListing on what it
// accepts, as a process does with a manifest from dataset.manifest or from
// a rendezvous directory. No file system is touched.
//
// Each input is tried twice: as it is (nearly every mutation then fails the
// checksum, as real damage does), and with its CRC32C trailer recomputed,
// so that mutations reach the structure checks behind it. The corpus holds
// manifests written by `monarch manifest` of small trees.
//
// Besides "no crash, no hang, no leak, no huge allocation": a refusal is
// DataLoss with a short message; an accepted manifest has no more records
// than its bytes can hold, a root first and only plain names; its
// namespace is either refused as InvalidArgument (a name listed twice) or
// encodes back to exactly the bytes it came from (the parser accepts one
// encoding of each namespace, so nothing in it goes unchecked).

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/crc32c.h"
#include "fuzz_check.h"
#include "metadata/manifest.h"
#include "metadata/namespace.h"

namespace monarch {
namespace {

constexpr size_t kMaxMessageBytes = 400;
constexpr size_t kFileRecordBytes = 88;  // The smallest a file takes (manifest.cc).

bool PlainName(absl::string_view name) {
  return !name.empty() && name.front() != '/' && name.back() != '/' &&
         name.find("//") == absl::string_view::npos &&
         name.find('\0') == absl::string_view::npos && name != "." && name != ".." &&
         name.find("/../") == absl::string_view::npos && name.find("/./") == absl::string_view::npos &&
         name.substr(0, 3) != "../" && name.substr(0, 2) != "./" &&
         (name.size() < 3 || name.substr(name.size() - 3) != "/..") &&
         (name.size() < 2 || name.substr(name.size() - 2) != "/.");
}

void Check(absl::string_view bytes) {
  absl::StatusOr<std::unique_ptr<Manifest>> manifest = ParseManifest(bytes);
  if (!manifest.ok()) {
    FUZZ_CHECK(manifest.status().code() == absl::StatusCode::kDataLoss,
               manifest.status().ToString());
    FUZZ_CHECK(!manifest.status().message().empty() &&
                   manifest.status().message().size() <= kMaxMessageBytes,
               absl::StrCat(manifest.status().message().size(), " bytes"));
    return;
  }
  const Manifest& m = **manifest;
  const NamespaceListing& listing = m.listing();
  FUZZ_CHECK(listing.files.size() <= bytes.size() / kFileRecordBytes,
             absl::StrCat(listing.files.size(), " files in ", bytes.size(), " bytes"));
  FUZZ_CHECK(!listing.directories.empty() && listing.directories[0].name.empty(),
             "the first directory is not the root");
  FUZZ_CHECK(!m.origin().root.empty() && m.origin().root[0] == '/', m.origin().root);
  for (size_t d = 1; d < listing.directories.size(); ++d) {
    FUZZ_CHECK(PlainName(listing.directories[d].name) && listing.directories[d].parent < d,
               listing.directories[d].name);
  }
  for (const ListedFile& f : listing.files) {
    FUZZ_CHECK(PlainName(f.name) && f.name.size() <= 4096, std::string(f.name.substr(0, 300)));
    FUZZ_CHECK(f.directory < listing.directories.size(), absl::StrCat(f.directory));
  }
  absl::StatusOr<std::unique_ptr<Namespace>> ns =
      Namespace::FromListing(m.origin().root, listing, 0);
  if (!ns.ok()) {
    // The parser checks each name; only the namespace's maps see duplicates.
    FUZZ_CHECK(ns.status().code() == absl::StatusCode::kInvalidArgument &&
                   ns.status().message().find("listed twice") != absl::string_view::npos,
               ns.status().ToString());
    return;
  }
  FUZZ_CHECK((*ns)->file_count() == listing.files.size(), "files lost");
  const std::string again = EncodeManifest(**ns, m.origin());
  FUZZ_CHECK(again == bytes, absl::StrCat("re-encodes to ", again.size(), " bytes that differ from the ",
                                          bytes.size(), " parsed"));
}

}  // namespace
}  // namespace monarch

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  monarch::Check(bytes);
  if (size >= 4) {
    std::string fixed(bytes);
    const uint32_t crc = monarch::Crc32c(fixed.data(), fixed.size() - 4);
    for (int i = 0; i < 4; ++i) fixed[fixed.size() - 4 + i] = static_cast<char>(crc >> (8 * i));
    monarch::Check(fixed);
  }
  return 0;
}
