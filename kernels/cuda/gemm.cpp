#include "kernels/cuda/gemm.h"

#include "core/check.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cublaslt_lib.h"
#include "kernels/cuda/launch.h"

namespace dhp::cuda {
namespace {

// The largest power of two up to 16 dividing the address: what the heuristic may assume.
int alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int align = 16;
  while (align > 1 && a % uintptr_t(align) != 0) align /= 2;
  return align;
}

template <class T>
void set(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& value) {
  DHP_CUBLAS_CHECK(cublaslt().desc_set(d, attr, &value, sizeof(value)));
}

template <class T>
void set(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const T& value) {
  DHP_CUBLAS_CHECK(cublaslt().pref_set(p, attr, &value, sizeof(value)));
}

}  // namespace

cublasComputeType_t compute_type(Precision precision) {
  switch (precision) {
    case Precision::tf32: return CUBLAS_COMPUTE_32F_FAST_TF32;
    // bf16 operands are stored in bf16: plain fp32 accumulation runs them on tensor cores.
    case Precision::fp32:
    case Precision::bf16: return CUBLAS_COMPUTE_32F;
    case Precision::automatic: break;  // resolved by BackendRegistry::make
  }
  DHP_ASSERT(false);
  return CUBLAS_COMPUTE_32F;
}

Gemm::Gemm(cudaStream_t stream, Precision precision, void* workspace,
           size_t workspace_bytes)
    : stream_(stream),
      compute_(compute_type(precision)),
      workspace_(workspace),
      workspace_bytes_(workspace_bytes) {
  DHP_CUBLAS_CHECK(cublaslt().create(&handle_));
}

Gemm::~Gemm() {
  for (auto& [key, p] : plans_) {
    cublaslt().layout_destroy(p.a);
    cublaslt().layout_destroy(p.b);
    cublaslt().layout_destroy(p.c);
    cublaslt().desc_destroy(p.desc);
  }
  if (handle_) cublaslt().destroy(handle_);
}

const Gemm::Plan& Gemm::plan(GemmOp op, int64_t T, int64_t in, int64_t out, bool bias,
                             bool beta_zero, const void* A, const void* B, const void* C,
                             cudaDataType_t ab, cudaDataType_t c) {
  const Key key{int(op),     T,          in,           out,   bias, beta_zero, alignment(A),
                alignment(B), alignment(C), int(ab), int(c)};
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;

  const GemmLayout g = linear_layout(op, T, in, out);
  Plan p;
  DHP_CUBLAS_CHECK(cublaslt().desc_create(&p.desc, compute_, CUDA_R_32F));
  set(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, int32_t(g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N));
  set(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, int32_t(g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N));
  if (bias) {
    set(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
    set(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(ab));  // the weights' storage
  }
  DHP_CUBLAS_CHECK(
      cublaslt().layout_create(&p.a, ab, uint64_t(g.a_rows), uint64_t(g.a_cols), g.lda));
  DHP_CUBLAS_CHECK(
      cublaslt().layout_create(&p.b, ab, uint64_t(g.b_rows), uint64_t(g.b_cols), g.ldb));
  DHP_CUBLAS_CHECK(cublaslt().layout_create(&p.c, c, uint64_t(g.m), uint64_t(g.n), g.ldc));

  cublasLtMatmulPreference_t pref = nullptr;
  DHP_CUBLAS_CHECK(cublaslt().pref_create(&pref));
  set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(workspace_bytes_));
  set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, uint32_t(std::get<6>(key)));
  set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, uint32_t(std::get<7>(key)));
  set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, uint32_t(std::get<8>(key)));
  set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, uint32_t(std::get<8>(key)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublaslt().heuristic(handle_, p.desc, p.a, p.b, p.c, p.c,
                                                           pref, 1, &result, &found);
  cublaslt().pref_destroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    cublaslt().layout_destroy(p.a);
    cublaslt().layout_destroy(p.b);
    cublaslt().layout_destroy(p.c);
    cublaslt().desc_destroy(p.desc);
    DHP_CUBLAS_CHECK(st);
    throw Error(fmt::format("cuBLASLt has no algorithm for a {}x{}x{} product (op {})", g.m, g.n,
                            g.k, int(op)));
  }
  p.algo = result.algo;
  return plans_.emplace(key, p).first->second;
}

void Gemm::run(GemmOp op, int64_t T, int64_t in, int64_t out, const void* A, const void* B,
               void* C, const void* bias, float beta, cudaDataType_t ab, cudaDataType_t c) {
  const Plan& p = plan(op, T, in, out, bias != nullptr, beta == 0.0f, A, B, C, ab, c);
  // The bias pointer changes between layers of the same shape; setting it is a host-side store.
  if (bias) set(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  const float alpha = 1.0f;
  DHP_CUBLAS_CHECK(cublaslt().matmul(handle_, p.desc, &alpha, A, p.a, B, p.b, &beta, C, p.c, C, p.c,
                                  &p.algo, workspace_, workspace_bytes_, stream_));
}

void Gemm::linear_forward(void* y, const void* x, const void* W, const void* b, int64_t T,
                          int64_t in, int64_t out, cudaDataType_t t) {
  DHP_ASSERT(in > 0 && out > 0);
  if (T == 0) return;
  // The bias epilogue reads the bias with vector loads: it needs 16-byte alignment (the
  // parameter table keeps tensors 64-byte aligned; other callers get a separate pass).
  const bool epilogue = b && alignment(b) == 16;
  run(GemmOp::LinearForward, T, in, out, W, x, y, epilogue ? b : nullptr, 0.0f, t, t);
  if (b && !epilogue) {
    if (t == CUDA_R_16BF)
      add_row_bias(stream_, static_cast<bf16*>(y), static_cast<const bf16*>(b), T, out);
    else
      add_row_bias(stream_, static_cast<float*>(y), static_cast<const float*>(b), T, out);
  }
}

void Gemm::linear_backward(void* dx, float* dW, const void* dy, const void* x, const void* W,
                           int64_t T, int64_t in, int64_t out, bool accumulate_dx,
                           cudaDataType_t t) {
  DHP_ASSERT(in > 0 && out > 0);
  if (T == 0) return;
  if (dx)
    run(GemmOp::LinearDx, T, in, out, W, dy, dx, nullptr, accumulate_dx ? 1.0f : 0.0f, t, t);
  // The weight gradient accumulates in fp32 straight from the stored operands.
  if (dW) run(GemmOp::LinearDw, T, in, out, x, dy, dW, nullptr, 1.0f, t, CUDA_R_32F);
}

}  // namespace dhp::cuda
