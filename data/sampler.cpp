#include "data/sampler.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "core/check.h"
#include "core/rng.h"

namespace dhp {

Sampler::Sampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {
  DHP_CHECK(n > 0, "the sampler needs a non-empty dataset");
}

std::vector<int64_t> Sampler::permutation(int64_t epoch) const {
  DHP_ASSERT(epoch >= 0);
  std::vector<int64_t> perm(static_cast<size_t>(n_));  // (n)
  std::iota(perm.begin(), perm.end(), int64_t(0));
  Rng rng(mix_seed(seed_, uint64_t(epoch)));
  for (int64_t i = n_ - 1; i > 0; --i)
    std::swap(perm[size_t(i)], perm[rng.below(uint64_t(i) + 1)]);
  return perm;
}

std::shared_ptr<const std::vector<int64_t>> Sampler::cached(int64_t epoch) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (epoch != cached_epoch_) {
    cached_perm_ = std::make_shared<const std::vector<int64_t>>(permutation(epoch));
    cached_epoch_ = epoch;
  }
  return cached_perm_;
}

std::vector<int64_t> Sampler::batch_at(int64_t sample_position, int64_t batch_size) const {
  DHP_CHECK(sample_position >= 0 && batch_size > 0,
            "sampler: bad stream position {} or batch size {}", sample_position, batch_size);
  std::vector<int64_t> out;
  out.reserve(size_t(batch_size));
  const int64_t end = sample_position + batch_size;
  int64_t k = sample_position;
  while (k < end) {
    const int64_t epoch = k / n_;
    const auto perm = cached(epoch);
    const int64_t stop = std::min(end, (epoch + 1) * n_);
    for (; k < stop; ++k) out.push_back((*perm)[size_t(k - epoch * n_)]);
  }
  return out;
}

SamplerState Sampler::state_at(int64_t sample_position) const {
  DHP_CHECK(sample_position >= 0, "sampler: bad stream position {}", sample_position);
  return {seed_, sample_position / n_, sample_position % n_};
}

int64_t Sampler::resume(const SamplerState& st) const {
  DHP_CHECK(st.seed == seed_,
            "cannot resume the sample order: it was drawn with seed {}, this run has {}",
            st.seed, seed_);
  DHP_CHECK(st.epoch >= 0 && st.position >= 0 && st.position < n_,
            "cannot resume the sample order at epoch {} position {}: the data set has {} "
            "samples (did it change?)",
            st.epoch, st.position, n_);
  return st.epoch * n_ + st.position;
}

}  // namespace dhp
