// Finite-difference gradient checking shared by the kernel and model tests (ggml
// test-backend-ops' grad mode): central differences at randomly chosen coordinates.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/rng.h"

namespace dhp::testing {

inline std::vector<float> random_vec(Rng& rng, size_t n, float scale = 1.0f) {
  std::vector<float> v(n);
  for (auto& x : v) x = float((rng.uniform() * 2.0 - 1.0) * scale);
  return v;
}

struct Tolerance {
  double eps;   // finite-difference step
  double atol;  // absolute tolerance
  double rtol;  // relative tolerance on |analytic|
};

// Float32 forward passes with a central difference of step 1e-2: truncation error is
// O(eps²·f''') ~ 1e-4 and rounding error ~ 1e-7/eps ~ 1e-5 on O(1) losses.
constexpr Tolerance kDefaultTol{1e-2, 3e-4, 5e-3};

// Compares `analytic` (d loss / d x) with central differences of `loss` at `probes`
// coordinates of x (all of them when x is small). `loss` must read x afresh on every call.
inline void expect_gradient(const std::string& what, std::vector<float>& x,
                            const std::vector<float>& analytic,
                            const std::function<double()>& loss, int probes = 40,
                            Tolerance tol = kDefaultTol, uint64_t seed = 99) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  Rng rng(seed);
  const bool all = int64_t(x.size()) <= probes;
  const int n = all ? int(x.size()) : probes;
  int bad = 0;
  for (int k = 0; k < n; ++k) {
    const size_t i = all ? size_t(k) : size_t(rng.below(x.size()));
    const float saved = x[i];
    x[i] = float(saved + tol.eps);
    const double up = loss();
    x[i] = float(saved - tol.eps);
    const double down = loss();
    x[i] = saved;
    const double numeric = (up - down) / (2.0 * tol.eps);
    const double err = std::abs(numeric - analytic[i]);
    if (err > tol.atol + tol.rtol * std::abs(analytic[i])) {
      if (++bad <= 5)
        ADD_FAILURE() << what << "[" << i << "]: analytic " << analytic[i] << " numeric "
                      << numeric;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << n << " coordinates disagree";
}

// sum(r · y) in double: the scalar whose gradient with respect to y is r.
inline double weighted_sum(const std::vector<float>& y, const std::vector<float>& r) {
  double s = 0.0;
  for (size_t i = 0; i < y.size(); ++i) s += double(y[i]) * r[i];
  return s;
}

}  // namespace dhp::testing
