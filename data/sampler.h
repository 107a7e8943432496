// The global sample order: a pure function of (seed, step), so any rank can compute any step
// without communication, and resuming needs only the step number.
#pragma once

#include <cstdint>
#include <vector>

namespace dhp {

class Sampler {
 public:
  // n: dataset size (> 0).
  Sampler(int64_t n, uint64_t seed);

  // Dataset indices of global batch `step`: positions [step*batch_size, (step+1)*batch_size)
  // of the endless stream perm(0) ++ perm(1) ++ ..., where perm(e) is a seeded permutation of
  // 0..n-1 for epoch e. Within an epoch nothing repeats or is dropped; a batch may straddle
  // two (or, when batch_size > n, more) epochs.
  std::vector<int64_t> batch(int64_t step, int64_t batch_size) const;

  // The permutation of epoch e (Fisher-Yates driven by dhp::Rng).
  std::vector<int64_t> permutation(int64_t epoch) const;

  int64_t size() const { return n_; }

 private:
  int64_t n_;
  uint64_t seed_;
};

}  // namespace dhp
