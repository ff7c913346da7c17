// The CPU's slow copy range and Monarch's way around it (common/copy_bytes.h).
//
// For a 110 KB copy (an ImageNet-like file) and a 1 MiB one, into a
// destination 0, 16 and 2048 bytes past the source modulo 4 KiB, the time
// of: memcpy against CopyBytes, and pread(2) from a file in the page cache
// against PreadFull, which takes the detour. Each figure is the fastest of
// 9 rounds of 200 copies, in microseconds per copy, with the ratio to the
// plain call at distance 0 of the same run.
//
// usage: bench_copy_aliasing [FILE]   (default: a 1 MiB temporary file)

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

#include "common/copy_bytes.h"
#include "common/file_util.h"

namespace {

double FastestUs(const std::function<void()>& copy) {
  double best = 1e18;
  for (int round = 0; round < 9; ++round) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 200; ++i) copy();
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count() / 200;
    best = std::min(best, us);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  using monarch::CopyBytes;
  using monarch::PreadFull;
  std::string path = argc > 1 ? argv[1] : "";
  char* src = static_cast<char*>(std::aligned_alloc(4096, 2 << 20));
  char* dst = static_cast<char*>(std::aligned_alloc(4096, (2 << 20) + 4096));
  std::memset(src, 7, 2 << 20);
  std::memset(dst, 0, (2 << 20) + 4096);
  bool temporary = false;
  if (path.empty()) {
    char name[] = "/tmp/bench-copy-aliasing-XXXXXX";
    const int fd = ::mkstemp(name);
    if (fd < 0 || ::write(fd, src, 1 << 20) != (1 << 20)) {
      std::perror("temporary file");
      return 1;
    }
    ::close(fd);
    path = name;
    temporary = true;
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    std::perror(path.c_str());
    return 1;
  }
  const monarch::AliasingProbe& probe = monarch::ProbeAliasing();
  std::printf("probe: memcpy %.1fx, pread %.1fx slower 16 bytes ahead than 2 KiB; detours %s/%s\n",
              probe.copy_ratio, probe.read_ratio, probe.copy_slow ? "on" : "off",
              probe.read_slow ? "on" : "off");
  std::printf("%-9s %-8s %12s %12s %12s %12s %9s %9s\n", "bytes", "distance", "memcpy us",
              "CopyBytes us", "pread us", "PreadFull us", "copy x", "read x");
  for (size_t n : {size_t{110000}, size_t{1} << 20}) {
    double copy_base = 0, read_base = 0;
    for (size_t distance : {0, 16, 2048}) {
      char* to = dst + distance;
      const double plain_copy = FastestUs([&] {
        std::memcpy(to, src, n);
        asm volatile("" : : "r"(to) : "memory");
      });
      const double our_copy = FastestUs([&] {
        CopyBytes(to, src, n);
        asm volatile("" : : "r"(to) : "memory");
      });
      const double plain_read = FastestUs([&] { (void)::pread(fd, to, n, 0); });
      const double our_read = FastestUs([&] { (void)PreadFull(fd, to, n, 0, path); });
      if (distance == 0) {
        copy_base = plain_copy;
        read_base = plain_read;
      }
      std::printf("%-9zu %-8zu %12.1f %12.1f %12.1f %12.1f %9.2f %9.2f\n", n, distance,
                  plain_copy, our_copy, plain_read, our_read, our_copy / copy_base,
                  our_read / read_base);
    }
  }
  std::printf("(copy x, read x: CopyBytes and PreadFull against memcpy and pread at distance 0)\n");
  ::close(fd);
  if (temporary) ::unlink(path.c_str());
  std::free(src);
  std::free(dst);
  return 0;
}
