// bench_namespace_memory: what the namespace costs per file, and what a
// lookup by name costs, at 1 and 20 million files (issue 41's target: at
// most 100 bytes per file, lookups no slower).
//
// Builds the namespace from a listing (Namespace::FromListing, no file
// system: a 20-million-file tree would take hours to create) of
// ImageNet-21k-like names, "train/nXXXXXXXX/nXXXXXXXX_K.JPEG" over 21,841
// class directories, as bench/scale_model.py's datasets. Memory counted:
//   - the heap the namespace keeps: every C++ allocation with its usable
//     size, through replaced operator new/delete;
//   - its table (metadata/file_table.h), in a memfd, not on the heap;
//   - the tier slots, 4 bytes per entry (from the heap here; the service
//     places them in shared memory).
// In process the namespace costs heap + table; a node service's image is a
// descriptor of that same table (before the table, fca2a64 and earlier, the
// image was a second copy, and the service paid heap + image).
// Lookups: Find() of every name in a shuffled order, after one untimed pass
// (best of 3 passes), and the same names looked up in the image as a node
// service's client does (NamespaceImage::FindId), against a
// flat_hash_map<std::string, uint32_t> of the same names in the same run
// (the baseline: what a plain map would cost); each back to back
// (throughput) and one after another (latency, see NsPerLookup).
//
// usage: bench_namespace_memory [files...]   (default: 1000000 20000000)

#include <malloc.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "metadata/namespace.h"
#include "service/namespace_image.h"

// The same source builds against the namespace before its table (fca2a64
// and earlier: a heap of FileEntry records, and a separate image), for the
// benchmark's before-and-after.
#if __has_include("metadata/file_table.h")
#define MONARCH_NAMESPACE_TABLE 1
#endif

namespace {
std::atomic<long long> live{0};

void* Allocate(size_t n) {
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  live.fetch_add(static_cast<long long>(malloc_usable_size(p)));
  return p;
}
void Free(void* p) {
  if (p == nullptr) return;
  live.fetch_sub(static_cast<long long>(malloc_usable_size(p)));
  std::free(p);
}
}  // namespace

void* operator new(size_t n) { return Allocate(n); }
void* operator new[](size_t n) { return Allocate(n); }
void operator delete(void* p) noexcept { Free(p); }
void operator delete[](void* p) noexcept { Free(p); }
void operator delete(void* p, size_t) noexcept { Free(p); }
void operator delete[](void* p, size_t) noexcept { Free(p); }

namespace {

using Clock = std::chrono::steady_clock;

// Names as bench/scale_model.py's ImageNet-21k-like set: 21,841 classes,
// files spread evenly, "train/<class>/<class>_<k>.JPEG".
struct Listing {
  std::deque<std::string> names;  // Stable addresses: the listing holds views.
  monarch::NamespaceListing listing;
};

void MakeListing(uint64_t files, Listing* out) {
  constexpr uint32_t kClasses = 21841;
  std::mt19937_64 random(42);
  std::vector<std::string> classes;
  out->listing.directories.push_back({"", 0});
  out->listing.directories.push_back({"train", 0});
  for (uint32_t c = 0; c < kClasses; ++c) {
    classes.push_back(absl::StrFormat("n%08u", static_cast<uint32_t>(random() % 100000000)));
    out->listing.directories.push_back({"train/" + classes.back(), 1});
  }
  out->listing.files.reserve(files);
  monarch::FileAttributes attributes;
  attributes.device = 64769;
  attributes.mode = 0100644;
  attributes.link_count = 1;
  attributes.uid = 1000;
  attributes.gid = 1000;
  attributes.block_size = 4096;
  std::lognormal_distribution<double> sizes(std::log(99.0 * 1024), 0.45);
  for (uint64_t i = 0; i < files; ++i) {
    const uint32_t c = static_cast<uint32_t>(i % kClasses);
    out->names.push_back(absl::StrFormat("train/%s/%s_%u.JPEG", classes[c], classes[c],
                                         static_cast<uint32_t>(i / kClasses)));
    const uint64_t size = static_cast<uint64_t>(sizes(random));
    attributes.inode = 1000 + i;
    attributes.atime_ns = 1764000000000000000 + static_cast<int64_t>(random() % 1000000000000);
    attributes.ctime_ns = 1764000000000000000 + static_cast<int64_t>(random() % 1000000000000);
    attributes.blocks = (size + 4095) / 4096 * 8;
    const int64_t mtime_ns =
        1700000000000000000 + static_cast<int64_t>(random() % 1000000000000000);
    out->listing.files.push_back({out->names.back(), c + 2, size, mtime_ns, attributes});
  }
}

// `find(i)`: the id name i was found as (kMissing if not). Throughput: the
// lookups back to back, the CPU overlapping the memory waits of several.
// Latency: each lookup's name depends on the result of the one before, as
// a reader's lookup waits for its own memory alone (a read is not a loop
// of lookups).
constexpr uint32_t kMissing = UINT32_MAX;
double NsPerLookup(const std::vector<uint32_t>& order,
                   const std::function<uint32_t(uint32_t)>& find, bool dependent) {
  double best = 1e300;
  for (int pass = 0; pass < 4; ++pass) {
    const auto start = Clock::now();
    size_t found = 0;
    uint32_t last = 0;
    for (size_t k = 0; k < order.size(); ++k) {
      // `last` is an id below 2^31 (or kMissing, counted below): the shift
      // is 0, but the load of the next index waits for it.
      const uint32_t i =
          dependent ? order[std::min<size_t>(k + (last >> 31), order.size() - 1)] : order[k];
      last = find(i);
      found += last == i ? 1 : 0;
    }
    const double ns =
        std::chrono::duration<double, std::nano>(Clock::now() - start).count() / order.size();
    if (found != order.size()) {
      std::fprintf(stderr, "lookup missed %zu names\n", order.size() - found);
      std::exit(1);
    }
    if (pass > 0) best = std::min(best, ns);  // Pass 0 warms the caches.
  }
  return best;
}

long long FdBytes(int fd) {
  struct stat st;
  return ::fstat(fd, &st) == 0 ? static_cast<long long>(st.st_size) : -1;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<uint64_t> counts;
  for (int i = 1; i < argc; ++i) counts.push_back(std::strtoull(argv[i], nullptr, 10));
  if (counts.empty()) counts = {1000000, 20000000};
  for (uint64_t files : counts) {
    Listing listing;
    MakeListing(files, &listing);
    uint64_t name_chars = 0;
    for (const std::string& name : listing.names) name_chars += name.size();

    const long long before = live.load();
    auto built = monarch::Namespace::FromListing("/data/imagenet", listing.listing, 0);
    if (!built.ok()) {
      std::fprintf(stderr, "%s\n", built.status().ToString().c_str());
      return 1;
    }
    const long long heap = live.load() - before;  // The tier slots included.
    const monarch::Namespace& ns = **built;
    auto image = monarch::service::WriteNamespaceImage(ns);
    const long long image_bytes = image.ok() ? FdBytes(image->get()) : -1;
#ifdef MONARCH_NAMESPACE_TABLE
    const long long table = static_cast<long long>(ns.table_bytes());
    const long long service = heap + table;  // The image is the table itself.
#else
    const long long table = 0;
    const long long service = heap + image_bytes;  // A second copy.
#endif

    std::vector<uint32_t> order(files);
    for (uint32_t i = 0; i < files; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), std::mt19937_64(7));
    auto find = [&](uint32_t i) -> uint32_t {
      const auto entry = ns.Find(listing.names[i]);  // A FileEntry*, or an optional one.
      return entry ? entry->ref.id : kMissing;
    };
    const double find_ns = NsPerLookup(order, find, false);
    const double find_latency = NsPerLookup(order, find, true);
    // A node service's client: the same lookup in the image it maps.
    double image_ns = -1, image_latency = -1;
    if (image.ok()) {
      auto opened = monarch::service::NamespaceImage::Open(*image);
      if (opened.ok()) {
        auto find_id = [&](uint32_t i) -> uint32_t {
          return (*opened)->FindId(listing.names[i]).value_or(kMissing);
        };
        image_ns = NsPerLookup(order, find_id, false);
        image_latency = NsPerLookup(order, find_id, true);
      }
    }
    double map_ns, map_latency;
    {
      absl::flat_hash_map<std::string, uint32_t> map;
      map.reserve(files);
      for (uint32_t i = 0; i < files; ++i) map.emplace(listing.names[i], i);
      auto find_map = [&](uint32_t i) -> uint32_t {
        auto it = map.find(listing.names[i]);
        return it != map.end() ? it->second : kMissing;
      };
      map_ns = NsPerLookup(order, find_map, false);
      map_latency = NsPerLookup(order, find_map, true);
    }
    std::printf(
        "%" PRIu64 " files (mean name %.1f chars): in process %.1f B/file (heap %.1f, table "
        "%.1f); node service %.1f B/file (image %.1f); ns per lookup back to back / one after "
        "another: Find %.1f / %.1f, a client's FindId %.1f / %.1f, flat_hash_map<string> "
        "%.1f / %.1f; exact: heap %lld B, table %lld B, %" PRIu64 " name chars, %zu "
        "directories\n",
        files, static_cast<double>(name_chars) / files,
        static_cast<double>(heap + table) / files, static_cast<double>(heap) / files,
        static_cast<double>(table) / files, static_cast<double>(service) / files,
        static_cast<double>(image_bytes) / files, find_ns, find_latency, image_ns, image_latency,
        map_ns, map_latency, heap, table, name_chars, listing.listing.directories.size());
    std::fflush(stdout);
  }
  return 0;
}
