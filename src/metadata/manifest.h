// Manifest: a walked namespace in one compact file, so that a job walks its
// dataset once (or never: `monarch manifest` writes one ahead of time, and
// the config's dataset.manifest names it) and every other process rebuilds
// the same namespace, same names and ids, without touching the files.
//
// A manifest holds every file's dataset-relative name, size, mtime and the
// rest of its stat (FileAttributes), the directory tree, what the walk was
// built with (root, file_regex, symlink policy), the mtime of every
// directory (DirectoryStamp), and a CRC32C of all of it. The
// byte layout is at the top of manifest.cc.
//
// Using one is two checks: CheckOrigin (built with the same root, regex and
// symlink policy) and CheckDirectories (the stamped directories have the
// mtimes they had: one stat each, never one per file). Parsing treats the
// bytes as hostile: a truncated, corrupted or lying manifest is refused with
// a message, and allocations stay proportional to its size.
//
// Functions are thread-safe; a Manifest is not shared between threads while
// it is changed.

#ifndef MONARCH_METADATA_MANIFEST_H_
#define MONARCH_METADATA_MANIFEST_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "metadata/namespace.h"
#include "monarch/config.h"

namespace monarch {

// The settings a namespace was walked with. `root` as the config gives it,
// trailing slashes removed (ManifestOriginOf).
struct ManifestOrigin {
  std::string root;
  std::string file_regex;
  SymlinkPolicy symlinks = SymlinkPolicy::kFollow;
};
ManifestOrigin ManifestOriginOf(const std::string& root, const std::string& file_regex,
                                SymlinkPolicy symlinks);
// The same from the config's dataset section (validated: its symlinks is
// one of follow, inside, skip).
ManifestOrigin ManifestOriginOf(const DatasetConfig& dataset);

// What the rendezvous directory's manifest is called (remote.bootstrap:
// directory): rank 0 writes it, the other ranks build from it.
inline constexpr absl::string_view kSharedManifestName = "namespace.manifest";

// Larger manifests are refused before anything is allocated: at ~100 bytes
// per file, 16 GiB is 150 million files.
inline constexpr uint64_t kMaxManifestBytes = 16ull << 30;

// A parsed manifest: the origin and the listing, whose file names point
// into this object. Not copyable (the views would dangle).
class Manifest {
 public:
  Manifest(const Manifest&) = delete;
  Manifest& operator=(const Manifest&) = delete;

  const ManifestOrigin& origin() const { return origin_; }
  const NamespaceListing& listing() const { return listing_; }

 private:
  friend absl::StatusOr<std::unique_ptr<Manifest>> ParseManifest(absl::string_view bytes);
  friend absl::StatusOr<std::unique_ptr<Namespace>> NamespaceFromManifest(
      Manifest& manifest, const ManifestOrigin& expected, int source_tier,
      const Namespace::TierSlotAllocator& allocate, int threads, const ExtentLayout& extents);
  Manifest() = default;

  ManifestOrigin origin_;
  std::string names_;  // Every file's full name, end to end; never resized after parsing.
  NamespaceListing listing_;
};

// The bytes of a manifest of `ns`, walked with `origin`.
std::string EncodeManifest(const Namespace& ns, const ManifestOrigin& origin);

// Writes EncodeManifest's bytes to `path` atomically: to a temporary next
// to it, then renamed over it, so a reader sees the old file or the new
// one, whole. Errors name the path.
absl::Status WriteManifest(const Namespace& ns, const ManifestOrigin& origin,
                           const std::string& path);

// Parses manifest bytes. DataLoss saying what is wrong (bad magic or
// version, truncated, checksum mismatch, counts larger than the bytes, a
// name that is empty, "." or "..", holds '/' or NUL, or is too long). A
// successful parse is a tree of plain names; duplicates are left to
// Namespace::FromListing, which finds them with the lookup maps it builds
// anyway.
absl::StatusOr<std::unique_ptr<Manifest>> ParseManifest(absl::string_view bytes);

// Reads and parses the manifest at `path`. NotFound if there is none; other
// errors name the path.
absl::StatusOr<std::unique_ptr<Manifest>> ReadManifest(const std::string& path);

// FailedPrecondition saying what differs if `manifest` was not walked with
// `expected` (another root, regex or symlink policy).
absl::Status CheckOrigin(const Manifest& manifest, const ManifestOrigin& expected);

// Stats each stamped directory (every directory of the walk; with up to
// `threads` threads) under `manifest`'s root. FailedPrecondition
// naming the first one that is gone or whose mtime changed; on success, the
// root's device number here.
absl::StatusOr<uint64_t> CheckDirectories(const Manifest& manifest, int threads);

// CheckOrigin, CheckDirectories, then the namespace (Namespace::FromListing).
// A device number may differ from one node to the next for the same file
// system, so the files the walk found on the root's device are given this
// node's device of the root: tier copies check it against the source.
// Errors do not name a config key: the caller knows which one it is.
absl::StatusOr<std::unique_ptr<Namespace>> NamespaceFromManifest(
    Manifest& manifest, const ManifestOrigin& expected, int source_tier,
    const Namespace::TierSlotAllocator& allocate, int threads, const ExtentLayout& extents = {});

// The namespace from the manifest rank 0 of a job writes at `path` (in the
// rendezvous directory), waiting for one that was built with `expected` and
// still matches the dataset's directories, polling (2 ms, doubling to
// 200 ms) for up to `timeout_seconds`. A manifest an earlier job left there
// is used if it passes both checks (it then describes this dataset); any
// other is waited past. DeadlineExceeded naming remote.rendezvous_timeout,
// and why the last manifest seen was refused, if none came.
absl::StatusOr<std::unique_ptr<Namespace>> AwaitSharedManifest(
    const std::string& path, const ManifestOrigin& expected, double timeout_seconds,
    int source_tier, const Namespace::TierSlotAllocator& allocate, int threads,
    const ExtentLayout& extents = {});

// Where a job's namespace comes from, resolved from the config once
// (core/monarch_core.cc) so that BuildNamespace asks nothing more of it.
struct NamespacePlan {
  ManifestOrigin origin;  // The root, file_regex and symlink policy to walk with.
  int scan_threads = 1;
  ExtentLayout extents;
  int source_tier = 0;
  std::string manifest;  // dataset.manifest, expanded; "": none.
  // With ranks meeting in a rendezvous directory: the manifest there, which
  // rank 0 (`publishes`, its directory made) walks and writes, and the
  // others await for up to `await_seconds`. "": this process walks alone.
  std::string shared_manifest;
  bool publishes = false;
  double await_seconds = 0;
  // dataset.keep_namespace: where a walk's namespace is kept on the node,
  // and built from at the next start when it passes the checks. "": never.
  std::string kept;
};

struct BuiltNamespace {
  std::unique_ptr<Namespace> ns;
  std::string published;  // The shared manifest this process wrote: its to remove.
};

// The namespace, in one pass and with at most one walk of the dataset per
// job: from the manifest the plan names (every process reads it, no one
// walks); else, with a shared manifest, rank 0 publishes its namespace and
// the others build from it (walking themselves if it does not come in
// time: rank 0 may still be walking a large dataset); else from the one
// kept on the node, when every directory and a sample of files are as they
// were; else by a walk, which is then kept.
absl::StatusOr<BuiltNamespace> BuildNamespace(const NamespacePlan& plan,
                                              const Namespace::TierSlotAllocator& slots);

}  // namespace monarch

#endif  // MONARCH_METADATA_MANIFEST_H_
