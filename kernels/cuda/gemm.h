// cuBLASLt matrix products for the Linear layers, with the precision chosen at run time:
// "fp32" (fp32 storage, CUBLAS_COMPUTE_32F, matches the CPU reference), "tf32" (fp32 storage,
// tensor cores on inputs rounded to TF32) or "bf16" (bf16 activations and weights on tensor
// cores). Accumulation is fp32 always, and weight gradients are fp32 whatever the storage.
// Descriptors, layouts and the heuristic's algorithm are made once per shape and kept; the
// workspace is one buffer given at construction. Gradient convention as kernels/cpu/matmul.h:
// dW and db accumulate, dx is written or accumulated on request.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "kernels/backend.h"
#include "kernels/cuda/gemm_layout.h"

namespace dhp::cuda {

// The cuBLASLt compute type of a precision.
cublasComputeType_t compute_type(Precision precision);

class Gemm {
 public:
  Gemm(cudaStream_t stream, Precision precision, void* workspace, size_t workspace_bytes);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // y (T, out) = x (T, in) · W^T + b;  W (out, in), b (out) or null (bias epilogue). Every
  // operand in the storage `t` (CUDA_R_32F or CUDA_R_16BF).
  void linear_forward(void* y, const void* x, const void* W, const void* b, int64_t T, int64_t in,
                      int64_t out, cudaDataType_t t);
  // dx (T, in) = dy · W (or += with accumulate_dx) in the storage t; dW (out, in, fp32) +=
  // dy^T · x. Either may be null.
  void linear_backward(void* dx, float* dW, const void* dy, const void* x, const void* W,
                       int64_t T, int64_t in, int64_t out, bool accumulate_dx, cudaDataType_t t);

  size_t cached_plans() const { return plans_.size(); }

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  // Shape, op, bias epilogue, whether beta is 0, the alignment of the A, B and C pointers
  // (the heuristic's choice depends on each), and the storage of A/B and of C.
  using Key = std::tuple<int, int64_t, int64_t, int64_t, bool, bool, int, int, int, int, int>;

  const Plan& plan(GemmOp op, int64_t T, int64_t in, int64_t out, bool bias, bool beta_zero,
                   const void* A, const void* B, const void* C, cudaDataType_t ab,
                   cudaDataType_t c);
  void run(GemmOp op, int64_t T, int64_t in, int64_t out, const void* A, const void* B, void* C,
           const void* bias, float beta, cudaDataType_t ab, cudaDataType_t c);

  cudaStream_t stream_;
  cublasComputeType_t compute_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_;
  size_t workspace_bytes_;
  std::map<Key, Plan> plans_;
};

}  // namespace dhp::cuda
