// Dense matrix products on the CPU (OpenBLAS sgemm). Row-major throughout; a Linear weight is
// stored (out_features, in_features) as in the common ML ecosystem.
// Gradient convention: parameter gradients accumulate (+=), activation gradients are written (=)
// unless the caller asks to accumulate.
#pragma once

#include <cstdint>

namespace dhp::cpu {

// C (M, N) = alpha · op(A) · op(B) + beta · C, op = transpose when the flag is set.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc);

// y (T, out) = x (T, in) · W^T + b;  W (out, in), b (out) or null.
void linear_forward(float* y, const float* x, const float* W, const float* b, int64_t T,
                    int64_t in, int64_t out);

// dx (T, in) = dy · W   (written, or added when accumulate_dx);  dx may be null.
// dW (out, in) += dy^T · x;  db (out) += column sums of dy (db may be null).
void linear_backward(float* dx, float* dW, float* db, const float* dy, const float* x,
                     const float* W, int64_t T, int64_t in, int64_t out, bool accumulate_dx = false);

// Sets the BLAS library's own threads; the backend keeps it at 1 and parallelises over tiles.
void set_blas_threads(int n);

}  // namespace dhp::cpu
