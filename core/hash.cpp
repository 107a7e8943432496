#include "core/hash.h"

#include <array>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "core/input.h"

namespace dhp {

namespace {

constexpr std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

constexpr std::array<uint32_t, 256> kCrc32c = crc32c_table();

// Odd 64-bit constants with well-spread bits (each multiply is a bijection that moves low
// bits up); the rotation then brings high bits back down.
constexpr uint64_t kM1 = 0x9e3779b185ebca87ull, kM2 = 0xc2b2ae3d27d4eb4full, kM3 = 0x165667b19e3779f9ull;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

inline uint64_t load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));  // unaligned, little-endian as the files are
  return v;
}

inline uint64_t lane(uint64_t acc, uint64_t word) { return rotl(acc + word * kM2, 31) * kM1; }

// Every input bit to every output bit.
inline uint64_t avalanche(uint64_t h) {
  h ^= h >> 33;
  h *= kM2;
  h ^= h >> 29;
  h *= kM3;
  h ^= h >> 32;
  return h;
}

}  // namespace

uint64_t wide_hash(const void* data, size_t n, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t a = seed + kM1 + kM2, b = seed + kM2, c = seed, d = seed - kM1;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a = lane(a, load64(p + i));
    b = lane(b, load64(p + i + 8));
    c = lane(c, load64(p + i + 16));
    d = lane(d, load64(p + i + 24));
  }
  // The lanes folded in order (rotations differ, so swapping two lanes' data changes the sum).
  uint64_t h = rotl(a, 1) + rotl(b, 7) + rotl(c, 12) + rotl(d, 18);
  for (const uint64_t x : {a, b, c, d}) h = (h ^ lane(0, x)) * kM1 + kM3;
  h += uint64_t(n);
  for (; i + 8 <= n; i += 8) h = rotl(h ^ lane(0, load64(p + i)), 27) * kM1 + kM3;
  for (; i < n; ++i) h = rotl(h ^ (uint64_t(p[i]) * kM3), 11) * kM1;
  return avalanche(h);
}

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = kCrc32c[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint64_t hash_from(const InputFile& in, int64_t offset) {
  std::vector<char> buf(1 << 20);
  uint64_t h = kFnvSeed;
  for (int64_t at = offset;;) {
    const int64_t n = in.read_at(buf.data(), int64_t(buf.size()), at);
    if (n == 0) return h;
    h = fnv1a(buf.data(), size_t(n), h);
    at += n;
  }
}

uint64_t hash_file(const std::string& path) { return hash_from(InputFile("file", path), 0); }

}  // namespace dhp
