#include "core/hash.h"

#include <array>
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

}  // namespace

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
