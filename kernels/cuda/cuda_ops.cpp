#include "kernels/cuda/cuda_ops.h"

#include "kernels/check.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/patch_merge.h"
#include "kernels/cuda/rope.h"

namespace dhp {
namespace {
// cuBLASLt's recommended workspace on Hopper; enough for every algorithm of our shapes.
constexpr size_t kGemmWorkspace = size_t(32) << 20;
}  // namespace

CudaOps::CudaOps(Backend& backend, cudaStream_t stream, const std::string& precision)
    : stream_(stream),
      attn_math_(precision == "fp32" ? cuda::AttnMath::fp32 : cuda::AttnMath::tf32),
      workspace_(backend, kGemmWorkspace),
      ce_rows_(backend, sizeof(cuda::CrossEntropyRow) * cuda::kCrossEntropyRows),
      sum_partial_(backend, sizeof(double) * cuda::kSumSquaresBlocks),
      gemm_(std::make_unique<cuda::Gemm>(stream, precision, workspace_.data(), kGemmWorkspace)) {}

void CudaOps::linear_forward(float* y, const float* x, const float* W, const float* b, int64_t T,
                             int64_t in, int64_t out) const {
  gemm_->linear_forward(y, x, W, b, T, in, out);
}

void CudaOps::linear_backward(float* dx, float* dW, float* db, const float* dy, const float* x,
                              const float* W, int64_t T, int64_t in, int64_t out,
                              bool accumulate_dx) const {
  gemm_->linear_backward(dx, dW, dy, x, W, T, in, out, accumulate_dx);
  // db accumulates (+=), which cuBLASLt's BGRADB epilogue (it writes) cannot do without a
  // second buffer; a deterministic column sum costs one read of dy.
  if (db) cuda::column_sum_add(stream_, db, dy, T, out);
}

void CudaOps::rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t T,
                              int64_t C) const {
  cuda::rmsnorm_forward(stream_, y, rstd, x, w, T, C);
}

void CudaOps::rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x,
                               const float* w, const float* rstd, int64_t T, int64_t C) const {
  cuda::rmsnorm_backward(stream_, dx, dw, dy, x, w, rstd, T, C);
}

void CudaOps::rope_forward(float* x, const int32_t* pos, int64_t T, int H, int hd,
                           double theta) const {
  cuda::rope_forward(stream_, x, pos, T, H, hd, theta);
}

void CudaOps::rope_backward(float* dx, const int32_t* pos, int64_t T, int H, int hd,
                            double theta) const {
  cuda::rope_backward(stream_, dx, pos, T, H, hd, theta);
}

void CudaOps::rope2d_forward(float* x, const int32_t* row, const int32_t* col, int64_t T, int H,
                             int hd, double theta) const {
  cuda::rope2d_forward(stream_, x, row, col, T, H, hd, theta);
}

void CudaOps::rope2d_backward(float* dx, const int32_t* row, const int32_t* col, int64_t T, int H,
                              int hd, double theta) const {
  cuda::rope2d_backward(stream_, dx, row, col, T, H, hd, theta);
}

void CudaOps::swiglu_forward(float* h, const float* a, const float* b, int64_t n) const {
  cuda::swiglu_forward(stream_, h, a, b, n);
}

void CudaOps::swiglu_backward(float* da, float* db, const float* dh, const float* a,
                              const float* b, int64_t n) const {
  cuda::swiglu_backward(stream_, da, db, dh, a, b, n);
}

void CudaOps::gelu_forward(float* y, const float* x, int64_t n) const {
  cuda::gelu_forward(stream_, y, x, n);
}

void CudaOps::gelu_backward(float* dx, const float* dy, const float* x, int64_t n) const {
  cuda::gelu_backward(stream_, dx, dy, x, n);
}

void CudaOps::attention_forward(float* out, float* lse, const float* q, const float* k,
                                const float* v, AttnMeta qm, AttnMeta km,
                                const AttnShape& s) const {
  cuda::attention_forward(stream_, out, lse, q, k, v, qm, km, s, attn_math_);
}

void CudaOps::attention_backward(float* dq, float* dk, float* dv, const float* dout,
                                 const float* out, const float* lse, const float* q,
                                 const float* k, const float* v, AttnMeta qm, AttnMeta km,
                                 const AttnShape& s) const {
  cuda::attention_backward(stream_, dq, dk, dv, dout, out, lse, q, k, v, qm, km, s, attn_math_);
}

void CudaOps::attention_merge(float* out, float* lse, const float* part_out,
                              const float* part_lse, int64_t T, int H, int hd) const {
  cuda::attention_merge(stream_, out, lse, part_out, part_lse, T, H, hd);
}

void CudaOps::cross_entropy_forward(float* lse, CrossEntropyStats* stats, const float* logits,
                                    const int32_t* targets, int64_t T, int64_t V) const {
  cuda::cross_entropy_forward(stream_, lse, stats, ce_rows_.as<cuda::CrossEntropyRow>(), logits,
                              targets, T, V);
}

void CudaOps::cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                                     const int32_t* targets, int64_t T, int64_t V,
                                     float scale) const {
  cuda::cross_entropy_backward(stream_, dlogits, logits, lse, targets, T, V, scale);
}

void CudaOps::embedding_forward(float* out, const int32_t* ids, const float* table, int64_t T,
                                int64_t C) const {
  cuda::embedding_forward(stream_, out, ids, table, T, C);
}

void CudaOps::embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t T,
                                 int64_t C) const {
  cuda::embedding_backward(stream_, dtable, dout, ids, T, C);
}

void CudaOps::patch_merge_forward(float* out, const float* in, const MergeImage* images,
                                  int n_images, int64_t C, int m) const {
  cuda::patch_merge_forward(stream_, out, in, images, n_images, C, m);
}

void CudaOps::patch_merge_backward(float* din, const float* dout, const MergeImage* images,
                                   int n_images, int64_t C, int m) const {
  cuda::patch_merge_backward(stream_, din, dout, images, n_images, C, m);
}

void CudaOps::add_inplace(float* y, const float* x, int64_t n) const {
  cuda::add_inplace(stream_, y, x, n);
}

void CudaOps::scale_inplace(float* y, float s, int64_t n) const {
  cuda::scale_inplace(stream_, y, s, n);
}

void CudaOps::fill(float* y, float value, int64_t n) const { cuda::fill(stream_, y, value, n); }

void CudaOps::sum_squares(double* out, const float* x, int64_t n) const {
  cuda::sum_squares(stream_, out, sum_partial_.as<double>(), x, n);
}

void CudaOps::scatter_rows(float* y, const float* src, const int32_t* slot, int64_t T,
                           int64_t C) const {
  cuda::scatter_rows(stream_, y, src, slot, T, C);
}

void CudaOps::gather_rows(float* dsrc, const float* dy, const int32_t* slot, int64_t T,
                          int64_t C) const {
  cuda::gather_rows(stream_, dsrc, dy, slot, T, C);
}

void CudaOps::adamw_update(float* p, const float* g, float* m, float* v, int64_t n,
                           const AdamWStep& s) const {
  cuda::adamw_update(stream_, p, g, m, v, n, s);
}

}  // namespace dhp
