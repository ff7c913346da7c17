// bench_tier_write: what one copy of a dataset into a tier costs, with no
// Monarch in the way. bench/do_no_harm.py uses it for the bounds it reports
// beside Monarch's epoch-1 ratios.
//
//   bench_tier_write --dataset DIR --tier ram|posix --dir SCRATCH
//
// Prints one JSON object:
//   memcpy_seconds      one memcpy of every file's bytes, from a buffer in the
//                       CPU cache into memory that is already mapped but not
//                       in the cache: the second pass over the bytes that a
//                       copy into any tier makes and a plain read does not;
//   tier_write_seconds  the cheapest fresh copy the tier allows: for ram,
//                       memcpy into never-touched anonymous memory (the kernel
//                       must supply and zero every page; the better of 4 KiB
//                       and transparent huge pages); for posix, one new file
//                       per dataset file in SCRATCH (open, pwrite, close;
//                       buffered), with no temporary name or rename.
// One thread; the source bytes come from memory, so neither figure includes
// reading the source.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "metadata/namespace.h"

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr,
               "bench_tier_write: %s\nusage: bench_tier_write --dataset DIR --tier ram|posix "
               "--dir SCRATCH\n",
               why);
  std::exit(2);
}

constexpr uint64_t kPage = 4096;
uint64_t RoundUp(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

// Copies `sizes` back to back from `src` into `arena` (64-byte aligned starts).
void CopyAll(char* arena, const char* src, const std::vector<uint64_t>& sizes) {
  uint64_t offset = 0;
  for (uint64_t size : sizes) {
    std::memcpy(arena + offset, src, size);
    offset += RoundUp(size, 64);
  }
}

double FreshAnonymousCopy(const char* src, const std::vector<uint64_t>& sizes, uint64_t total,
                          bool huge) {
  const uint64_t length = RoundUp(total + 64 * sizes.size(), 2 << 20) + (2 << 20);
  void* mapped = ::mmap(nullptr, length, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mapped == MAP_FAILED) Usage("mmap failed");
  char* arena = reinterpret_cast<char*>(RoundUp(reinterpret_cast<uintptr_t>(mapped), 2 << 20));
  if (huge) ::madvise(arena, length - (2 << 20), MADV_HUGEPAGE);
  const auto start = Clock::now();
  CopyAll(arena, src, sizes);
  const double seconds = Since(start);
  ::munmap(mapped, length);
  return seconds;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dataset, tier, dir;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--dataset") {
      dataset = argv[i + 1];
    } else if (flag == "--tier") {
      tier = argv[i + 1];
    } else if (flag == "--dir") {
      dir = argv[i + 1];
    } else {
      Usage("unknown flag");
    }
  }
  if (dataset.empty() || dir.empty() || (tier != "ram" && tier != "posix")) Usage("bad arguments");
  absl::StatusOr<std::unique_ptr<monarch::Namespace>> ns =
      monarch::Namespace::Build(dataset, "", 1, 8);
  if (!ns.ok()) Usage(ns.status().ToString().c_str());
  std::vector<uint64_t> sizes;
  uint64_t total = 0, largest = 0;
  for (uint32_t id = 0; id < (*ns)->file_count(); ++id) {
    sizes.push_back((*ns)->entry(id).ref.size);
    total += sizes.back();
    largest = std::max(largest, sizes.back());
  }
  std::vector<char> src(RoundUp(largest, kPage) + kPage, 'x');

  // Memory that is mapped and populated, then flushed out of the CPU caches
  // by touching an unrelated buffer larger than them.
  const uint64_t arena_bytes = RoundUp(total + 64 * sizes.size(), kPage);
  char* arena = static_cast<char*>(::mmap(nullptr, arena_bytes, PROT_READ | PROT_WRITE,
                                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0));
  if (arena == MAP_FAILED) Usage("mmap failed");
  std::vector<char> evict(64 << 20, 1);
  for (size_t i = 0; i < evict.size(); i += 64) evict[i]++;
  auto start = Clock::now();
  CopyAll(arena, src.data(), sizes);
  const double memcpy_seconds = Since(start);
  ::munmap(arena, arena_bytes);

  double tier_seconds = 0;
  std::string how;
  if (tier == "ram") {
    const double small_pages = FreshAnonymousCopy(src.data(), sizes, total, false);
    const double huge_pages = FreshAnonymousCopy(src.data(), sizes, total, true);
    tier_seconds = std::min(small_pages, huge_pages);
    how = absl::StrCat("memcpy into fresh anonymous memory: 4 KiB pages ", small_pages,
                       " s, transparent huge pages ", huge_pages, " s");
  } else {
    start = Clock::now();
    for (uint32_t id = 0; id < (*ns)->file_count(); ++id) {
      const std::string path = monarch::JoinPath(dir, (*ns)->entry(id).ref.name);
      const std::string parent = path.substr(0, path.find_last_of('/'));
      if (!monarch::MakeDirectories(parent).ok()) Usage("mkdir failed");
      int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd < 0) Usage("create failed");
      if (!monarch::PwriteFull(fd, src.data(), sizes[id], 0, path).ok()) Usage("write failed");
      ::close(fd);
    }
    tier_seconds = Since(start);
    how = "one buffered file per dataset file: open, pwrite, close";
  }
  std::printf(
      "{\"files\": %zu, \"bytes\": %llu, \"memcpy_seconds\": %.6f, \"tier_write_seconds\": %.6f, "
      "\"how\": \"%s\"}\n",
      sizes.size(), static_cast<unsigned long long>(total), memcpy_seconds, tier_seconds,
      how.c_str());
  return 0;
}
