// CRC32C: hardware (SSE4.2) with three interleaved streams, table fallback.

#include "common/crc32c.h"

#include <array>
#include <cstring>

namespace monarch {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78;  // Castagnoli, reflected.

struct Table {
  std::array<uint32_t, 256> entries;
  Table() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (kPolynomial & (0u - (c & 1)));
      entries[i] = c;
    }
  }
};

uint32_t SoftwareCrc(const unsigned char* p, size_t n, uint32_t crc) {
  static const Table table;
  for (size_t i = 0; i < n; ++i) crc = table.entries[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc;
}

// Multiplies a and b as polynomials over GF(2) modulo the (reflected)
// polynomial: what shifting a CRC past zero bytes amounts to.
uint32_t MultiplyModP(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t mask = 0x80000000u; mask != 0; mask >>= 1) {
    if (a & mask) product ^= b;
    b = (b >> 1) ^ (kPolynomial & (0u - (b & 1)));
  }
  return product;
}

// x^(8 * bytes) mod P, in the reflected representation: the factor that
// moves a CRC over `bytes` zero bytes.
uint32_t ShiftFactor(uint64_t bytes) {
  uint32_t result = 0x80000000u;  // x^0.
  uint32_t power = 0x40000000u;   // x^1, squared up to x^(2^k).
  for (uint64_t bits = bytes * 8; bits != 0; bits >>= 1) {
    if (bits & 1) result = MultiplyModP(result, power);
    power = MultiplyModP(power, power);
  }
  return result;
}

#if defined(__x86_64__)
// The interleaved streams' length: a 4 KiB block (the copies' checksum
// block) is three stripes and 16 bytes. Measured on 4 KiB blocks: 15 GB/s,
// against 12 GB/s with 1 KiB stripes and 7 GB/s with one stream.
constexpr size_t kStripe = 1360;

struct Shifts {
  uint32_t one = ShiftFactor(kStripe);
  uint32_t two = ShiftFactor(2 * kStripe);
};

// With kCopy, also stores every word it reads to `out`: the CRC is then
// of the bytes as written there, whatever happens to `p` meanwhile.
template <bool kCopy>
__attribute__((target("sse4.2"))) uint32_t HardwareCrc(const unsigned char* p, size_t n,
                                                       uint32_t crc, unsigned char* out) {
  static const Shifts shifts;
  uint64_t c0 = crc;
  // Three streams over consecutive stripes, combined by shifting the
  // earlier ones' CRCs past the later stripes.
  while (n >= 3 * kStripe) {
    uint64_t c1 = 0;
    uint64_t c2 = 0;
    for (size_t i = 0; i < kStripe; i += 8) {
      uint64_t w0, w1, w2;
      std::memcpy(&w0, p + i, 8);
      std::memcpy(&w1, p + kStripe + i, 8);
      std::memcpy(&w2, p + 2 * kStripe + i, 8);
      if constexpr (kCopy) {
        std::memcpy(out + i, &w0, 8);
        std::memcpy(out + kStripe + i, &w1, 8);
        std::memcpy(out + 2 * kStripe + i, &w2, 8);
      }
      c0 = __builtin_ia32_crc32di(c0, w0);
      c1 = __builtin_ia32_crc32di(c1, w1);
      c2 = __builtin_ia32_crc32di(c2, w2);
    }
    const uint32_t shifted = MultiplyModP(static_cast<uint32_t>(c0), shifts.two) ^
                             MultiplyModP(static_cast<uint32_t>(c1), shifts.one) ^
                             static_cast<uint32_t>(c2);
    c0 = shifted;
    p += 3 * kStripe;
    if constexpr (kCopy) out += 3 * kStripe;
    n -= 3 * kStripe;
  }
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    if constexpr (kCopy) {
      std::memcpy(out, &w, 8);
      out += 8;
    }
    c0 = __builtin_ia32_crc32di(c0, w);
  }
  uint32_t c = static_cast<uint32_t>(c0);
  for (; n > 0; --n, ++p) {
    const unsigned char byte = *p;
    if constexpr (kCopy) *out++ = byte;
    c = __builtin_ia32_crc32qi(c, byte);
  }
  return c;
}

bool HasCrcInstruction() {
  static const bool hardware = __builtin_cpu_supports("sse4.2");
  return hardware;
}
#endif

}  // namespace

uint32_t Crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
#if defined(__x86_64__)
  if (HasCrcInstruction()) return ~HardwareCrc<false>(p, n, crc, nullptr);
#endif
  return ~SoftwareCrc(p, n, crc);
}

uint32_t Crc32cCopy(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  if (HasCrcInstruction()) {
    return ~HardwareCrc<true>(static_cast<const unsigned char*>(src), n, ~0u,
                              static_cast<unsigned char*>(dst));
  }
#endif
  std::memcpy(dst, src, n);
  return Crc32c(dst, n);
}

// The conditioning (start from ~0, invert at the end) cancels out, so
// Crc32c(A B) = shift(Crc32c(A), |B|) ^ Crc32c(B), shift being a product
// with x^(8 |B|).
uint32_t Crc32cConcat(uint32_t crc_a, uint32_t crc_b, uint64_t length_b) {
  // A product with a fixed factor is linear in the other operand: one
  // table of 256 products per byte of it makes it four lookups. Kept for
  // the copies' 4 KiB blocks, which a range of a copy is made of.
  struct BlockShift {
    uint32_t products[4][256];
    BlockShift() {
      const uint32_t factor = ShiftFactor(4096);
      for (int k = 0; k < 4; ++k) {
        for (uint32_t b = 0; b < 256; ++b) products[k][b] = MultiplyModP(b << (8 * k), factor);
      }
    }
  };
  static const BlockShift block;
  if (length_b == 4096) {
    return block.products[0][crc_a & 0xFF] ^ block.products[1][(crc_a >> 8) & 0xFF] ^
           block.products[2][(crc_a >> 16) & 0xFF] ^ block.products[3][crc_a >> 24] ^ crc_b;
  }
  return MultiplyModP(crc_a, ShiftFactor(length_b)) ^ crc_b;
}

}  // namespace monarch
