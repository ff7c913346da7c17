// CopyBytes: memcpy that steps around a slow case of the CPU's string copy.
//
// Why. On the AMD EPYC machines this project is measured on, `rep movsb`
// runs 10-16 times slower when the destination lies 1 to 31 bytes past the
// source, modulo 4 KiB: 110 KB take 35-60 us instead of 2-4 us
// (bench/results/copy_aliasing.md). glibc's memcpy uses `rep movsb` for
// copies above about 2 KiB, and the kernel uses it for every read() into
// user memory. A file's bytes at offset 0 start a page of the page cache,
// and a buffer from malloc() above 128 KiB (a `std::vector<char>` of 256 KiB,
// say) starts 16 bytes into its page: reading a file from its start into
// such a buffer hits the slow case on every read, plain reads and Monarch's
// alike. A reader's buffer is not ours to move, so the copies that serve a
// read go around it: when the distance is in the slow range, and this CPU
// was measured slow there (once per process, about 0.2 ms), a copy goes in
// pieces small enough for glibc's vector loop (below the size at which
// glibc stops using `rep movsb` itself), and a read goes through a
// bounce buffer placed 2 KiB away from both ends (two fast copies instead
// of one slow one: 6-7 us for those 110 KB). Anywhere else, one subtraction
// and a compare.

#ifndef MONARCH_COMMON_COPY_BYTES_H_
#define MONARCH_COMMON_COPY_BYTES_H_

#include <cstddef>
#include <cstdint>

#include <sys/types.h>

namespace monarch {

// Whether a copy from `src` to `dst` falls in the slow range: `dst` 1 to 63
// bytes past `src`, modulo 4 KiB (31 measured; 63 leaves a margin for
// other cores). For a read, `src` is the file offset: the page cache holds a
// file in whole, aligned pages.
inline bool NearAliased(uintptr_t dst, uintptr_t src) {
  const uintptr_t distance = (dst - src) & 4095;
  return distance != 0 && distance < 64;
}

// memcpy, around the slow range where this CPU has it.
void CopyBytes(void* dst, const void* src, size_t n);

// One pread(2) of up to `n` bytes at `offset` into `dst`, around the slow
// range where this CPU has it: returns what pread returns, errno set on -1.
ssize_t PreadAroundAliasing(int fd, char* dst, size_t n, uint64_t offset);

// What the one-time measurement found: whether this CPU's user-space copy
// (memcpy) and the kernel's copy into user memory (pread) are slow in the
// range, and the ratio that decided it (slow / fast, minimum of 5 tries).
struct AliasingProbe {
  bool copy_slow = false;
  bool read_slow = false;
  double copy_ratio = 0;
  double read_ratio = 0;
};
const AliasingProbe& ProbeAliasing();

// Tests: force the detours on or off (true/false), or back to what the
// probe found (unset). Not for concurrent use with copies.
enum class AliasingDetour { kProbe, kAlways, kNever };
void SetAliasingDetourForTesting(AliasingDetour mode);

}  // namespace monarch

#endif  // MONARCH_COMMON_COPY_BYTES_H_
