// How the row-major products of a Linear layer (kernels/cpu/matmul.h: W is (out, in)) map
// onto a column-major GEMM, as cuBLASLt sees them. A row-major (r, c) matrix is a column-major
// (c, r) one with leading dimension c, so each product is computed transposed:
//   y  = x·W^T   ->  y^T  (out, T)  = W_cm^T · x_cm            (A = W, transposed)
//   dx = dy·W    ->  dx^T (in, T)   = W_cm · dy_cm
//   dW += dy^T·x ->  dW^T (in, out) = x_cm · dy_cm^T           (B = dy, transposed)
// Pure host code, so the mapping is tested against the CPU reference without a device.
#pragma once

#include <cstdint>

namespace dhp::cuda {

enum class GemmOp : int { LinearForward, LinearDx, LinearDw };

// C (m, n) = alpha · op(A) · op(B) + beta · C, column-major, op = transpose when the flag is set.
struct GemmLayout {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  // Stored shapes (rows, cols) of A and B as column-major matrices, before op().
  int64_t a_rows = 0, a_cols = 0, b_rows = 0, b_cols = 0;
};

// A is W for the forward and dx products and x for dW; B is x, dy and dy respectively.
inline GemmLayout linear_layout(GemmOp op, int64_t T, int64_t in, int64_t out) {
  GemmLayout g;
  switch (op) {
    case GemmOp::LinearForward:  // A = W (in, out) cm, B = x (in, T) cm, C = y (out, T) cm
      g = GemmLayout{true, false, out, T, in, in, in, out, in, out, in, T};
      break;
    case GemmOp::LinearDx:  // A = W (in, out) cm, B = dy (out, T) cm, C = dx (in, T) cm
      g = GemmLayout{false, false, in, T, out, in, out, in, in, out, out, T};
      break;
    case GemmOp::LinearDw:  // A = x (in, T) cm, B = dy (out, T) cm, C = dW (in, out) cm
      g = GemmLayout{false, true, in, out, T, in, out, in, in, T, out, T};
      break;
  }
  return g;
}

}  // namespace dhp::cuda
