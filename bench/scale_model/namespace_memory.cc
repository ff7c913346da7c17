// namespace_memory: what the real namespace costs in memory, for the scale
// model (bench/scale_model.py --measure-namespace).
//
// Builds monarch::Namespace over DIR with the real code and reports, as one
// JSON line: the heap it keeps (every C++ allocation counted with its usable
// size, through replaced operator new/delete), the peak during the build
// (the walk's temporary lists included), the size of the node service's
// namespace image written from it, and the sizes of the per-file structs.
//
// usage: namespace_memory DIR [threads]

#include <malloc.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>

#include "metadata/namespace.h"
#include "service/namespace_image.h"

namespace {
std::atomic<long long> live{0};
std::atomic<long long> peak{0};

void* Allocate(size_t n) {
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  long long now = live.fetch_add(static_cast<long long>(malloc_usable_size(p))) +
                  static_cast<long long>(malloc_usable_size(p));
  long long seen = peak.load();
  while (now > seen && !peak.compare_exchange_weak(seen, now)) {
  }
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

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: namespace_memory DIR [threads]\n");
    return 2;
  }
  const int threads = argc > 2 ? std::atoi(argv[2]) : 1;
  const long long before = live.load();
  peak.store(before);
  auto ns = monarch::Namespace::Build(argv[1], "", 0, threads);
  if (!ns.ok()) {
    std::fprintf(stderr, "%s\n", ns.status().ToString().c_str());
    return 1;
  }
  const long long kept = live.load() - before;
  const long long peak_during = peak.load() - before;
  unsigned long long name_chars = 0;
  for (uint32_t id = 0; id < (*ns)->file_count(); ++id) name_chars += (*ns)->entry(id).ref.name.size();
  auto image = monarch::service::WriteNamespaceImage(**ns);
  long long image_bytes = -1;
  if (image.ok()) {
    struct stat st;
    if (::fstat(image->get(), &st) == 0) image_bytes = st.st_size;
  }
  std::printf(
      "{\"files\": %u, \"name_chars\": %llu, \"heap_bytes\": %lld, \"peak_bytes\": %lld, "
      "\"image_bytes\": %lld, \"sizeof_file_entry\": %zu, \"sizeof_file_attributes\": %zu, "
      "\"sizeof_tier_slot\": %zu, \"threads\": %d}\n",
      (*ns)->file_count(), name_chars, kept, peak_during, image_bytes, sizeof(monarch::FileEntry),
      sizeof(monarch::FileAttributes), sizeof(monarch::TierSlot), threads);
  return 0;
}
