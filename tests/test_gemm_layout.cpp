// The row-major to column-major mapping of the CUDA backend's Linear GEMMs
// (kernels/cuda/gemm_layout.h), checked on the host: a plain column-major GEMM driven by each
// layout must give what the CPU reference gives. Needs no device and links no CUDA library.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cuda/gemm_layout.h"
#include "tests/grad_check.h"

namespace dhp {
namespace {

using cuda::GemmLayout;
using cuda::GemmOp;

// C = op(A)·op(B) + beta·C, column-major, as cuBLASLt computes it from the layout.
void colmajor_gemm(const GemmLayout& g, const float* A, const float* B, float* C, float beta) {
  for (int64_t j = 0; j < g.n; ++j)
    for (int64_t i = 0; i < g.m; ++i) {
      double s = 0.0;
      for (int64_t p = 0; p < g.k; ++p) {
        const float a = g.trans_a ? A[p + i * g.lda] : A[i + p * g.lda];
        const float b = g.trans_b ? B[j + p * g.ldb] : B[p + j * g.ldb];
        s += double(a) * b;
      }
      C[i + j * g.ldc] = float(s + beta * C[i + j * g.ldc]);
    }
}

void expect_near_all(const std::vector<float>& got, const std::vector<float>& ref,
                     const char* what) {
  ASSERT_EQ(got.size(), ref.size());
  // Double accumulation here against OpenBLAS's float: short dot products of O(1) values.
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(got[i], ref[i], 1e-4) << what << " " << i;
}

TEST(GemmLayout, StoredShapesCoverTheOperands) {
  const int64_t T = 3, in = 5, out = 7;
  for (GemmOp op : {GemmOp::LinearForward, GemmOp::LinearDx, GemmOp::LinearDw}) {
    const GemmLayout g = cuda::linear_layout(op, T, in, out);
    // op(A) is (m, k) and op(B) is (k, n); leading dimensions are the stored row counts.
    EXPECT_EQ(g.trans_a ? g.a_cols : g.a_rows, g.m);
    EXPECT_EQ(g.trans_a ? g.a_rows : g.a_cols, g.k);
    EXPECT_EQ(g.trans_b ? g.b_cols : g.b_rows, g.k);
    EXPECT_EQ(g.trans_b ? g.b_rows : g.b_cols, g.n);
    EXPECT_EQ(g.lda, g.a_rows);
    EXPECT_EQ(g.ldb, g.b_rows);
    EXPECT_EQ(g.ldc, g.m);
  }
}

TEST(GemmLayout, ColumnMajorProductsMatchTheRowMajorReference) {
  Rng rng(5);
  for (auto [T, in, out] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {4, 3, 5}, {9, 16, 7}}) {
    auto x = testing::random_vec(rng, T * in), W = testing::random_vec(rng, out * in);
    auto dy = testing::random_vec(rng, T * out), dx0 = testing::random_vec(rng, T * in);
    auto dW0 = testing::random_vec(rng, out * in);

    std::vector<float> y_ref(T * out), y(T * out);
    cpu::linear_forward(y_ref.data(), x.data(), W.data(), nullptr, T, in, out);
    colmajor_gemm(cuda::linear_layout(GemmOp::LinearForward, T, in, out), W.data(), x.data(),
                  y.data(), 0.0f);
    expect_near_all(y, y_ref, "y");

    auto dx_ref = dx0, dx = dx0, dW_ref = dW0, dW = dW0;
    cpu::linear_backward(dx_ref.data(), dW_ref.data(), nullptr, dy.data(), x.data(), W.data(), T,
                         in, out, true);
    colmajor_gemm(cuda::linear_layout(GemmOp::LinearDx, T, in, out), W.data(), dy.data(),
                  dx.data(), 1.0f);
    colmajor_gemm(cuda::linear_layout(GemmOp::LinearDw, T, in, out), x.data(), dy.data(),
                  dW.data(), 1.0f);
    expect_near_all(dx, dx_ref, "dx");
    expect_near_all(dW, dW_ref, "dW");
  }
}

}  // namespace
}  // namespace dhp
