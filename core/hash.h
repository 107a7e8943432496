// FNV-1a, 64 bit: a fixed, dependency-free checksum for detecting damaged data and changed
// inputs (not a cryptographic hash). Any flipped, missing or extra byte changes it. A faster
// one for large arrays, and CRC-32C, the checksum other programs' formats require
// (TensorBoard's record framing).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dhp {

inline constexpr uint64_t kFnvSeed = 0xcbf29ce484222325ull;

inline uint64_t fnv1a(const void* data, size_t n, uint64_t h = kFnvSeed) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// A 64-bit checksum of the same purpose as fnv1a over large arrays, 5.6x faster here:
// four independent lanes take 8 bytes each per 32-byte block (multiply, rotate, multiply: the
// lanes let the multiplies overlap, where FNV-1a's one multiply per byte waits on the one
// before), then the lanes, the length and the last bytes are folded and mixed so that every
// input bit reaches every output bit. Checkpoints use it for their arrays (gigabytes a save,
// where FNV-1a's 0.9 GB/s took more time than the disk; bench_checkpoint measures both). Not a
// cryptographic hash.
uint64_t wide_hash(const void* data, size_t n, uint64_t seed = 0);

// CRC-32C (Castagnoli: reflected polynomial 0x82F63B78, initial and final value ~0), as
// RFC 3720 defines it; crc32c("123456789") is 0xE3069283. `crc` continues an earlier call's
// result over more bytes.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

class InputFile;

// Hash of an open file's bytes from `offset` to its end.
uint64_t hash_from(const InputFile& in, int64_t offset);

// Hash of a whole file's bytes; throws dhp::Error when it cannot be read or is not a regular
// file.
uint64_t hash_file(const std::string& path);

}  // namespace dhp
