// The bodies of the CUDA backend's kernels other than attention (kernels/cuda/*_kernels.cuh)
// run on the CPU by the thread emulator (tests/cuda_emulator.h, tests/cuda_emulator_ext.h)
// against the CPU reference, with the grid and block their launchers use (the same launch-shape
// functions): indexing, grid-stride and tail handling, vector paths, barriers and the
// deterministic reductions are checked on machines without a GPU. Shapes are small and odd
// (fibers are slow). Each comparison allows atol + rtol·|ref| with its reason beside it.
// CPU-only: no CUDA library or header.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/rng.h"
#include "kernels/cpu/norm.h"
#include "tests/grad_check.h"

// clang-format off
// The emulator defines CUDA's keywords and built-ins: after every other header, before the
// kernel bodies.
#include "tests/cuda_emulator_ext.h"
#include "kernels/cuda/norm_kernels.cuh"
// clang-format on

namespace dhp {
namespace {

using cuda::LaunchDims;
using testing::random_vec;

struct Tol {
  double atol, rtol;
};

// Same float operations in the same order: the host's expf/tanhf/sqrtf and the compiler's
// contractions differ from the CPU reference's by an ulp or two.
constexpr Tol kPointwise{1e-6, 1e-5};
// Pure copies and permutations: bit for bit.
constexpr Tol kExact{0.0, 0.0};

template <class T>
void expect_close(const std::string& what, const std::vector<T>& got, const std::vector<T>& ref,
                  Tol tol) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double err = std::abs(double(got[i]) - double(ref[i]));
    if (!(err <= tol.atol + tol.rtol * std::abs(double(ref[i])))) {
      if (++bad <= 5) ADD_FAILURE() << what << "[" << i << "]: emulated " << got[i] << " cpu " << ref[i];
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << ref.size() << " values differ";
}

// Runs body on the launcher's grid and block.
void run(const LaunchDims& l, size_t smem_floats, const std::function<void(float*)>& body) {
  emu::launch_dims({l.grid_x, l.grid_y, 1}, {l.block_x, l.block_y, 1}, smem_floats, body);
}

size_t sz(int64_t n) { return size_t(n); }

template <class T>
T& shared_as(float* smem) {
  return *reinterpret_cast<T*>(smem);
}

// Sum of |terms| for a float sum's error bound: a sequential run of n terms is off by at most
// about n·eps·sum|terms|.
constexpr double kEps = 0x1p-24;

// ---- RMSNorm ------------------------------------------------------------------------------

TEST(CudaEmulated, RmsNorm) {
  Rng rng(1);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1}, {3, 7}, {5, 300}, {40, 33}};
  for (auto [T, C] : shapes) {
    const std::string at = " T=" + std::to_string(T) + " C=" + std::to_string(C);
    auto x = random_vec(rng, sz(T * C)), w = random_vec(rng, sz(C));
    auto dy = random_vec(rng, sz(T * C)), dw0 = random_vec(rng, sz(C));
    std::vector<float> y(sz(T * C)), rstd(sz(T)), dx(sz(T * C)), dw = dw0;
    cpu::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), T, C);
    cpu::rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), T, C);

    // Outputs start as garbage: everything must be written.
    std::vector<float> ey(y.size(), 7.0f), er(rstd.size(), 7.0f), edx(dx.size(), 7.0f), edw = dw0;
    run(cuda::norm::rows_launch(T), cuda::norm::kRowSharedFloats, [&](float* s) {
      cuda::norm::forward_block(ey.data(), er.data(), x.data(), w.data(), C, s);
    });
    run(cuda::norm::dw_launch(C), emu::floats_for<cuda::norm::DwShared>(), [&](float* s) {
      cuda::norm::dw_block(edw.data(), dy.data(), x.data(), rstd.data(), T, C,
                           shared_as<cuda::norm::DwShared>(s));
    });
    run(cuda::norm::rows_launch(T), cuda::norm::kRowSharedFloats, [&](float* s) {
      cuda::norm::dx_block(edx.data(), dy.data(), x.data(), w.data(), rstd.data(), C, s);
    });
    // A float sum of C squares in 256 strided lanes against the CPU's double sum.
    expect_close("rstd" + at, er, rstd, Tol{1e-6, 1e-5});
    expect_close("y" + at, ey, y, Tol{1e-6, 1e-5});
    // dx subtracts a row mean of C products: absolute error ~ sqrt(C)·eps of O(1) terms.
    expect_close("dx" + at, edx, dx, Tol{1e-6 * std::sqrt(double(C)), 1e-5});
    // dw: 16 lanes of T/16 rows each, then the 16 lane sums; the CPU sums T rows in order. Both
    // within (T + 16)·eps·sum|terms| of the exact sum, per column.
    for (int64_t c = 0; c < C; ++c) {
      double mag = std::abs(double(dw0[size_t(c)]));
      for (int64_t t = 0; t < T; ++t)
        mag += std::abs(double(dy[size_t(t * C + c)]) * x[size_t(t * C + c)] * rstd[size_t(t)]);
      const double err = std::abs(double(edw[size_t(c)]) - dw[size_t(c)]);
      EXPECT_LE(err, 2.0 * double(T + 16) * kEps * mag) << "dw[" << c << "]" << at;
    }
  }
}

}  // namespace
}  // namespace dhp
