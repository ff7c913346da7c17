// bench_fill_memory: the ways a RAM tier can fill memory it has not touched
// before, timed against each other in one run. The figures behind the RAM
// tier's design (memfd written with pwrite, in several stripes); see
// bench/results/profile.md.
//
//   bench_fill_memory [MiB (1024)] [rounds (3)]
//
// Each round fills MiB of fresh memory, 1 MiB at a time from a buffer in the
// CPU cache, five ways:
//   anonymous stores      memcpy into never-touched private anonymous memory
//   memfd mapping stores  memcpy into a never-touched shared mapping of a memfd
//   memfd pwrite          pwrite into a memfd, one thread
//   memfd pwrite x2       two threads, one memfd (they share its inode lock)
//   2 memfds pwrite x2    two threads, one memfd each
//   sealed arena          the RAM tier's own RamArena::Write, one thread: stores
//                         into a write-sealed memfd's one writable mapping,
//                         after MADV_POPULATE_WRITE (src/drivers/ram_arena.h)
//   backed ahead          the same, into an arena whose back-ahead thread
//                         (tiers[i].back_ahead) allocated the pages first,
//                         untimed: what a copy costs once the pages are there
// and prints the seconds each took, sealed arena / memfd pwrite, and sealed
// arena / backed ahead. Free memory on a VM may be returned to
// the host, so absolute times swing between rounds: compare within a round.

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <memory>
#include <vector>

#include "drivers/ram_arena.h"

namespace {

constexpr size_t kChunk = 1 << 20;

double Time(const std::function<void()>& work) {
  const auto start = std::chrono::steady_clock::now();
  work();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int NewMemfd(size_t bytes) {
  int fd = ::memfd_create("bench", MFD_CLOEXEC);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    std::perror("memfd");
    std::exit(1);
  }
  return fd;
}

void Pwrite(int fd, const char* src, size_t begin, size_t end, size_t step) {
  for (size_t offset = begin; offset < end; offset += step) {
    if (::pwrite(fd, src, kChunk, static_cast<off_t>(offset)) != static_cast<ssize_t>(kChunk)) {
      std::perror("pwrite");
      std::exit(1);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const size_t bytes = (argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1024) << 20;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 3;
  std::vector<char> src(kChunk, 'x');
  std::printf("fresh memory, %zu MiB per fill, seconds:\n", bytes >> 20);
  std::printf("%-6s %16s %20s %14s %16s %18s %13s %13s %14s %14s\n", "round", "anonymous stores",
              "memfd mapping stores", "memfd pwrite", "memfd pwrite x2", "2 memfds pwrite x2",
              "sealed arena", "backed ahead", "sealed/pwrite", "sealed/backed");
  for (int round = 1; round <= rounds; ++round) {
    double anonymous, mapping, one, two_shared, two_own, sealed, backed;
    {
      char* p = static_cast<char*>(
          ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
      anonymous = Time([&] {
        for (size_t o = 0; o < bytes; o += kChunk) std::memcpy(p + o, src.data(), kChunk);
      });
      ::munmap(p, bytes);
    }
    {
      int fd = NewMemfd(bytes);
      char* p = static_cast<char*>(
          ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
      mapping = Time([&] {
        for (size_t o = 0; o < bytes; o += kChunk) std::memcpy(p + o, src.data(), kChunk);
      });
      ::munmap(p, bytes);
      ::close(fd);
    }
    {
      int fd = NewMemfd(bytes);
      one = Time([&] { Pwrite(fd, src.data(), 0, bytes, kChunk); });
      ::close(fd);
    }
    {
      int fd = NewMemfd(bytes);
      two_shared = Time([&] {
        std::thread other([&] { Pwrite(fd, src.data(), kChunk, bytes, 2 * kChunk); });
        Pwrite(fd, src.data(), 0, bytes, 2 * kChunk);
        other.join();
      });
      ::close(fd);
    }
    {
      int a = NewMemfd(bytes / 2), b = NewMemfd(bytes / 2);
      two_own = Time([&] {
        std::thread other([&] { Pwrite(b, src.data(), 0, bytes / 2, kChunk); });
        Pwrite(a, src.data(), 0, bytes / 2, kChunk);
        other.join();
      });
      ::close(a);
      ::close(b);
    }
    {
      auto arena = monarch::RamArena::Create(bytes, 1, "bench");
      if (!arena.ok()) {
        std::fprintf(stderr, "%s\n", arena.status().ToString().c_str());
        return 1;
      }
      auto extent = (*arena)->Allocate(bytes);
      if (!extent.ok()) return 1;
      sealed = Time([&] {
        for (size_t o = 0; o < bytes; o += kChunk) {
          if (!(*arena)->Write(*extent, o, src.data(), kChunk).ok()) std::exit(1);
        }
      });
    }
    {
      monarch::RamArena::Options options;
      options.back_ahead = bytes;
      auto arena = monarch::RamArena::Create(bytes, 1, "bench", options);
      if (!arena.ok() || !(*arena)->WaitUntilBackedAhead(std::chrono::minutes(2))) return 1;
      auto extent = (*arena)->Allocate(bytes);
      if (!extent.ok()) return 1;
      backed = Time([&] {
        for (size_t o = 0; o < bytes; o += kChunk) {
          if (!(*arena)->Write(*extent, o, src.data(), kChunk).ok()) std::exit(1);
        }
      });
    }
    std::printf("%-6d %16.3f %20.3f %14.3f %16.3f %18.3f %13.3f %13.3f %13.2fx %13.2fx\n", round,
                anonymous, mapping, one, two_shared, two_own, sealed, backed, sealed / one,
                sealed / backed);
  }
  return 0;
}
