#include "data/sampler.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "data/rng.h"
#include "kernels/check.h"

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

std::vector<int64_t> Sampler::batch(int64_t step, int64_t batch_size) const {
  DHP_CHECK(step >= 0 && batch_size > 0, "sampler: bad step {} or batch size {}", step,
            batch_size);
  std::vector<int64_t> out;
  out.reserve(size_t(batch_size));
  const int64_t begin = step * batch_size, end = begin + batch_size;
  int64_t k = begin;
  while (k < end) {
    const int64_t epoch = k / n_;
    const std::vector<int64_t> perm = permutation(epoch);
    const int64_t stop = std::min(end, (epoch + 1) * n_);
    for (; k < stop; ++k) out.push_back(perm[size_t(k - epoch * n_)]);
  }
  return out;
}

}  // namespace dhp
