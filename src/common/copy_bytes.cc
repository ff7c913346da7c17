// CopyBytes and PreadAroundAliasing: see copy_bytes.h for why.

#include "common/copy_bytes.h"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "common/os.h"

namespace monarch {
namespace {

// Below glibc's `rep movsb` threshold (x86_rep_movsb_threshold: 2,112 bytes
// on these machines, and never below 2 KiB by default), so each piece is
// copied by the vector loop, which has no slow range: 3.0 us for 110 KB
// against 36 for one memcpy (bench/results/copy_aliasing.md).
constexpr size_t kPieceBytes = 1024;
// A read's detour: the bytes go through this much of a per-thread buffer at
// a time, one pread(2) per piece.
constexpr size_t kBounceBytes = 256 << 10;
constexpr uintptr_t kPage = 4096;

// Copies this large glibc makes without `rep movsb` (its
// rep_movsb_stop_threshold: the L2 cache's size on AMD; 512 KiB here, where
// a 512 KiB copy 16 bytes ahead takes 1.07x the time of one 2 KiB ahead,
// and a 384 KiB one 13.8x): no detour, which would only cost more.
size_t LargestSlowCopy() {
  static const size_t bytes = [] {
    const long l2 = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 ? static_cast<size_t>(l2) : size_t{512} << 10;
  }();
  return bytes;
}

std::atomic<int> g_mode{static_cast<int>(AliasingDetour::kProbe)};

// glibc's memcpy, called, never inlined: for a copy of at most kPieceBytes
// the compiler would otherwise emit `rep movsq` in place, the very string
// copy whose slow range this goes around (10 us for 110 KB instead of 2.5).
void* (*const volatile g_memcpy)(void*, const void*, size_t) = &std::memcpy;

void CopyInPieces(char* dst, const char* src, size_t n) {
  for (size_t done = 0; done < n; done += kPieceBytes) {
    g_memcpy(dst + done, src + done, std::min(kPieceBytes, n - done));
  }
}

// Fastest of five, in nanoseconds, of `copy()`.
template <typename Copy>
double FastestNs(Copy copy) {
  double best = 1e18;
  for (int i = 0; i < 5; ++i) {
    const auto start = std::chrono::steady_clock::now();
    copy();
    best = std::min<double>(
        best, std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start)
                  .count());
  }
  return best;
}

AliasingProbe Probe() {
  AliasingProbe probe;
  // 32 KiB: above any `rep movsb` threshold, below the sizes where glibc
  // switches to non-temporal stores; the buffers stay in the CPU cache, so
  // the ratio is the copy's alone. Slow means twice the time: the slow range
  // measured 10-16x, a fast CPU ~1x.
  constexpr size_t kProbeBytes = 32 << 10;
  constexpr double kSlowRatio = 2.0;
  void* memory = std::aligned_alloc(kPage, 4 * kProbeBytes);
  if (memory == nullptr) return probe;
  char* src = static_cast<char*>(memory);
  char* dst = src + 2 * kProbeBytes;
  std::memset(memory, 1, 4 * kProbeBytes);
  auto copy_at = [&](size_t distance) {
    return FastestNs([&] {
      std::memcpy(dst + distance, src, kProbeBytes);
      std::atomic_signal_fence(std::memory_order_seq_cst);  // Keep the copy.
    });
  };
  probe.copy_ratio = copy_at(16) / std::max(1.0, copy_at(2048));
  probe.copy_slow = probe.copy_ratio > kSlowRatio;
  // The kernel's copy, from a memfd's page (anonymous memory: not a file
  // call, and no Env fault injection may fail it).
  const int fd = ::memfd_create("monarch-aliasing-probe", MFD_CLOEXEC);
  if (fd >= 0) {
    os::Env* direct = os::Env::Default();
    if (::write(fd, src, kProbeBytes) == static_cast<ssize_t>(kProbeBytes)) {
      auto read_at = [&](size_t distance) {
        return FastestNs([&] { (void)direct->Pread(fd, dst + distance, kProbeBytes, 0); });
      };
      probe.read_ratio = read_at(16) / std::max(1.0, read_at(2048));
      probe.read_slow = probe.read_ratio > kSlowRatio;
    }
    ::close(fd);
  }
  std::free(memory);
  return probe;
}

bool Detour(bool probed_slow) {
  switch (static_cast<AliasingDetour>(g_mode.load(std::memory_order_relaxed))) {
    case AliasingDetour::kAlways:
      return true;
    case AliasingDetour::kNever:
      return false;
    case AliasingDetour::kProbe:
      break;
  }
  return probed_slow;
}

// The calling thread's bounce buffer, made at its first detour.
char* Bounce() {
  struct Buffer {
    ~Buffer() { std::free(memory); }
    void* memory = nullptr;
  };
  thread_local Buffer buffer;
  if (buffer.memory == nullptr) buffer.memory = std::aligned_alloc(kPage, kBounceBytes + kPage);
  return static_cast<char*>(buffer.memory);
}

}  // namespace

const AliasingProbe& ProbeAliasing() {
  static const AliasingProbe probe = Probe();
  return probe;
}

namespace {
// A fork while another thread runs the probe would leave the child waiting
// forever on the probe's initialisation guard, which only that thread, not
// in the child, would release (seen: a client forking while its reader
// thread made its first copy). The forking thread finishes the probe first;
// glibc runs this before it takes its own locks for the fork.
[[maybe_unused]] const int kProbeBeforeFork = [] {
  ::pthread_atfork([] { (void)ProbeAliasing(); }, nullptr, nullptr);
  return 0;
}();
}  // namespace

void SetAliasingDetourForTesting(AliasingDetour mode) {
  g_mode.store(static_cast<int>(mode), std::memory_order_relaxed);
}

void CopyBytes(void* dst, const void* src, size_t n) {
  if (n > 2 * kPieceBytes && n < LargestSlowCopy() &&
      NearAliased(reinterpret_cast<uintptr_t>(dst), reinterpret_cast<uintptr_t>(src)) &&
      Detour(ProbeAliasing().copy_slow)) {
    CopyInPieces(static_cast<char*>(dst), static_cast<const char*>(src), n);
    return;
  }
  std::memcpy(dst, src, n);
}

ssize_t PreadAroundAliasing(int fd, char* dst, size_t n, uint64_t offset) {
  if (n <= 2 * kPieceBytes || !NearAliased(reinterpret_cast<uintptr_t>(dst), offset) ||
      !Detour(ProbeAliasing().read_slow)) {
    return os::Pread(fd, dst, n, static_cast<off_t>(offset));
  }
  char* bounce = Bounce();
  if (bounce == nullptr) return os::Pread(fd, dst, n, static_cast<off_t>(offset));
  // 2 KiB past the offset's place in its page: the kernel copies into the
  // bounce buffer at a distance of 2 KiB, and the bounce buffer is 2 KiB
  // short of the caller's distance from it, well outside the slow range.
  char* at = bounce + ((offset + kPage / 2) & (kPage - 1));
  const ssize_t got =
      os::Pread(fd, at, std::min(n, kBounceBytes), static_cast<off_t>(offset));
  if (got > 0) CopyBytes(dst, at, static_cast<size_t>(got));
  return got;
}

}  // namespace monarch
