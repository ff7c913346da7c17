#include "remote/checksum.h"

#include <cstring>
#include <initializer_list>

namespace monarch {
namespace {

// Running state, so a checksum can be computed block by block.
struct Sums {
  uint64_t a[4] = {1, 2, 3, 4};
  uint64_t b[4] = {0, 0, 0, 0};
  uint64_t length = 0;

  // `n` must be a multiple of 32 except in the last call.
  void Add(const char* data, size_t n) {
    length += n;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
      uint64_t w[4];
      std::memcpy(w, data + i, sizeof(w));
      for (int lane = 0; lane < 4; ++lane) {
        a[lane] += w[lane];
        b[lane] += a[lane];
      }
    }
    if (i < n) {  // Tail: zero-padded to a whole block.
      uint64_t w[4] = {0, 0, 0, 0};
      std::memcpy(w, data + i, n - i);
      for (int lane = 0; lane < 4; ++lane) {
        a[lane] += w[lane];
        b[lane] += a[lane];
      }
    }
  }

  uint64_t Finish() const {
    // Fold the lanes and the length through a multiply-xorshift mixer.
    uint64_t h = length * 0x9E3779B97F4A7C15ull;
    for (int lane = 0; lane < 4; ++lane) {
      for (uint64_t v : {a[lane], b[lane]}) {
        h ^= v;
        h *= 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
      }
    }
    return h;
  }
};

}  // namespace

uint64_t Checksum(const char* data, size_t n) {
  Sums sums;
  sums.Add(data, n);
  return sums.Finish();
}

uint64_t CopyWithChecksum(char* dst, const char* src, size_t n) {
  constexpr size_t kBlock = 16 << 10;  // Fits L1/L2: summed while still hot.
  Sums sums;
  for (size_t done = 0; done < n; done += kBlock) {
    const size_t len = n - done < kBlock ? n - done : kBlock;
    std::memcpy(dst + done, src + done, len);
    sums.Add(dst + done, len);
  }
  return sums.Finish();
}

}  // namespace monarch
