// The global sample order: a pure function of (seed, step), so any rank can compute any step
// without communication, and resuming needs only a few integers.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace dhp {

// Where the sample stream stands: the next sample is position `position` of epoch `epoch`'s
// permutation. What a checkpoint saves to continue the exact sequence.
struct SamplerState {
  uint64_t seed = 0;
  int64_t epoch = 0;
  int64_t position = 0;  // 0 .. n-1 within the epoch
  bool operator==(const SamplerState&) const = default;
};

class Sampler {
 public:
  // n: dataset size (> 0).
  Sampler(int64_t n, uint64_t seed);

  // Dataset indices of global batch `step`: positions [step*batch_size, (step+1)*batch_size)
  // of the endless stream perm(0) ++ perm(1) ++ ..., where perm(e) is a seeded permutation of
  // 0..n-1 for epoch e. Within an epoch nothing repeats or is dropped; a batch may straddle
  // two (or, when batch_size > n, more) epochs.
  std::vector<int64_t> batch(int64_t step, int64_t batch_size) const {
    return batch_at(step * batch_size, batch_size);
  }
  // The batch_size samples from stream position `sample_position` on.
  std::vector<int64_t> batch_at(int64_t sample_position, int64_t batch_size) const;

  // Stream position <-> state. state_at(step * batch_size) is the state before that step;
  // resume(state) checks the seed and gives the position to continue from, so a run that
  // changes its batch size on resume still sees every sample of the epoch exactly once.
  SamplerState state_at(int64_t sample_position) const;
  int64_t resume(const SamplerState& state) const;

  // The permutation of epoch e (Fisher-Yates driven by dhp::Rng).
  std::vector<int64_t> permutation(int64_t epoch) const;

  int64_t size() const { return n_; }
  uint64_t seed() const { return seed_; }

 private:
  // One epoch's permutation is O(n) to build; consecutive batches reuse it.
  std::shared_ptr<const std::vector<int64_t>> cached(int64_t epoch) const;

  int64_t n_;
  uint64_t seed_;
  mutable std::mutex mu_;
  mutable int64_t cached_epoch_ = -1;
  mutable std::shared_ptr<const std::vector<int64_t>> cached_perm_;
};

}  // namespace dhp
