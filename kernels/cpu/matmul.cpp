#include "kernels/cpu/matmul.h"

#include <cblas.h>

#include <algorithm>

#include "core/check.h"

namespace dhp::cpu {

namespace {
// Output tile handed to one thread. The tiling depends on the shapes only, never on the
// thread count, and each tile is one single-threaded sgemm over the full K: the result is the
// same bits for any number of threads (OpenBLAS's own threading is not: it changes the
// summation order with the thread count).
constexpr int64_t kTile = 64;
}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc) {
  if (M == 0 || N == 0) return;
  const auto ta = trans_a ? CblasTrans : CblasNoTrans;
  const auto tb = trans_b ? CblasTrans : CblasNoTrans;
  const bool split_rows = M >= N;
  const int64_t tiles = ((split_rows ? M : N) + kTile - 1) / kTile;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t lo = t * kTile, n = std::min(kTile, (split_rows ? M : N) - lo);
    if (split_rows) {
      // Rows lo.. of op(A): row offset of A, or column offset when A is transposed.
      const float* a = trans_a ? A + lo : A + lo * lda;
      cblas_sgemm(CblasRowMajor, ta, tb, blasint(n), blasint(N), blasint(K), alpha, a,
                  blasint(lda), B, blasint(ldb), beta, C + lo * ldc, blasint(ldc));
    } else {
      // Columns lo.. of op(B): column offset of B, or row offset when B is transposed.
      const float* b = trans_b ? B + lo * ldb : B + lo;
      cblas_sgemm(CblasRowMajor, ta, tb, blasint(M), blasint(n), blasint(K), alpha, A,
                  blasint(lda), b, blasint(ldb), beta, C + lo, blasint(ldc));
    }
  }
}

void linear_forward(float* y, const float* x, const float* W, const float* b, int64_t T,
                    int64_t in, int64_t out) {
  gemm(false, true, T, out, in, 1.0f, x, in, W, in, 0.0f, y, out);
  if (b) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t o = 0; o < out; ++o) y[t * out + o] += b[o];
  }
}

void linear_backward(float* dx, float* dW, float* db, const float* dy, const float* x,
                     const float* W, int64_t T, int64_t in, int64_t out, bool accumulate_dx) {
  if (dx) gemm(false, false, T, in, out, 1.0f, dy, out, W, in, accumulate_dx ? 1.0f : 0.0f, dx, in);
  if (dW) gemm(true, false, out, in, T, 1.0f, dy, out, x, in, 1.0f, dW, in);
  if (db) {
    // Each output column is summed by one thread in a fixed order: deterministic.
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < out; ++o) {
      float s = 0.0f;
      for (int64_t t = 0; t < T; ++t) s += dy[t * out + o];
      db[o] += s;
    }
  }
}

void set_blas_threads(int n) { openblas_set_num_threads(n); }

}  // namespace dhp::cpu
