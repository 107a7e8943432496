// A tiny seeded generator whose output is fixed by this file alone (std::shuffle and the
// std distributions are implementation-defined), so data order and synthetic data are the
// same on every platform and standard library.
#pragma once

#include <cstdint>

namespace dhp {

// splitmix64 (Steele, Lea, Flood 2014): one 64-bit state, passes BigCrush, trivially seekable.
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Derives an independent stream seed from a base seed and a key (epoch, sample index...).
inline uint64_t mix_seed(uint64_t seed, uint64_t key) {
  uint64_t s = seed ^ (key * 0xD1B54A32D192ED03ull);
  splitmix64(s);
  return splitmix64(s);
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() { return splitmix64(state_); }
  // Uniform in [0, n) without modulo bias (Lemire's multiply-shift with rejection).
  uint64_t below(uint64_t n) {
    uint64_t x = next();
    __uint128_t m = __uint128_t(x) * n;
    uint64_t low = uint64_t(m);
    if (low < n) {
      const uint64_t threshold = (0 - n) % n;
      while (low < threshold) {
        x = next();
        m = __uint128_t(x) * n;
        low = uint64_t(m);
      }
    }
    return uint64_t(m >> 64);
  }
  // Uniform integer in [lo, hi].
  int64_t range(int64_t lo, int64_t hi) { return lo + int64_t(below(uint64_t(hi - lo + 1))); }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }

 private:
  uint64_t state_;
};

}  // namespace dhp
