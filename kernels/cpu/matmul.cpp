#include "kernels/cpu/matmul.h"

#include <cblas.h>

#include "kernels/check.h"

namespace dhp::cpu {

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, blasint(M), blasint(N), blasint(K), alpha, A,
              blasint(lda), B, blasint(ldb), beta, C, blasint(ldc));
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
