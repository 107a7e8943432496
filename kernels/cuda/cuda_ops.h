// The op interface on a CUDA device: each op launches the kernels of its family (one .cu file
// each, launchers declared in the family's header) on the backend's stream, and the Linear
// layers run through cuBLASLt (gemm.h). Besides the GEMM workspace, the ops own two small
// scratch buffers for their deterministic reductions, allocated once here: no op allocates.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "kernels/backend.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/gemm.h"

namespace dhp {

class CudaOps final : public Ops {
 public:
  // Allocates the GEMM workspace and the scratch buffers through `backend`.
  CudaOps(Backend& backend, cudaStream_t stream, const std::string& precision);

  std::string name() const override { return "cuda"; }
  void linear_forward(float* y, const float* x, const float* W, const float* b, int64_t T,
                      int64_t in, int64_t out) const override;
  void linear_backward(float* dx, float* dW, float* db, const float* dy, const float* x,
                       const float* W, int64_t T, int64_t in, int64_t out,
                       bool accumulate_dx) const override;
  void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t T,
                       int64_t C) const override;
  void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                        const float* rstd, int64_t T, int64_t C) const override;
  void rope_forward(float* x, const int32_t* pos, int64_t T, int H, int hd,
                    double theta) const override;
  void rope_backward(float* dx, const int32_t* pos, int64_t T, int H, int hd,
                     double theta) const override;
  void rope2d_forward(float* x, const int32_t* row, const int32_t* col, int64_t T, int H, int hd,
                      double theta) const override;
  void rope2d_backward(float* dx, const int32_t* row, const int32_t* col, int64_t T, int H, int hd,
                       double theta) const override;
  void swiglu_forward(float* h, const float* a, const float* b, int64_t n) const override;
  void swiglu_backward(float* da, float* db, const float* dh, const float* a, const float* b,
                       int64_t n) const override;
  void gelu_forward(float* y, const float* x, int64_t n) const override;
  void gelu_backward(float* dx, const float* dy, const float* x, int64_t n) const override;
  void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                         AttnMeta qm, AttnMeta km, const AttnShape& s) const override;
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                          const float* lse, const float* q, const float* k, const float* v,
                          AttnMeta qm, AttnMeta km, const AttnShape& s) const override;
  void cross_entropy_forward(float* lse, CrossEntropyStats* stats, const float* logits,
                             const int32_t* targets, int64_t T, int64_t V) const override;
  void attention_merge(float* out, float* lse, const float* part_out, const float* part_lse,
                       int64_t T, int H, int hd) const override;
  void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                              const int32_t* targets, int64_t T, int64_t V,
                              float scale) const override;
  void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t T,
                         int64_t C) const override;
  void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t T,
                          int64_t C) const override;
  void patch_merge_forward(float* out, const float* in, const MergeImage* images, int n_images,
                           int64_t C, int m) const override;
  void patch_merge_backward(float* din, const float* dout, const MergeImage* images, int n_images,
                            int64_t C, int m) const override;
  void add_inplace(float* y, const float* x, int64_t n) const override;
  void scale_inplace(float* y, float s, int64_t n) const override;
  void fill(float* y, float value, int64_t n) const override;
  void sum_squares(double* out, const float* x, int64_t n) const override;
  void scatter_rows(float* y, const float* src, const int32_t* slot, int64_t T,
                    int64_t C) const override;
  void gather_rows(float* dsrc, const float* dy, const int32_t* slot, int64_t T,
                   int64_t C) const override;
  void adamw_update(float* p, const float* g, float* m, float* v, int64_t n,
                    const AdamWStep& s) const override;

  // cuBLASLt plans made so far (one per shape, op and alignment), for tests and benches.
  size_t gemm_plans() const { return gemm_->cached_plans(); }

 private:
  cudaStream_t stream_;
  // Attention's products on tensor cores (TF32) unless the precision is fp32, as the GEMMs.
  cuda::AttnMath attn_math_;
  DeviceBuffer workspace_;    // cuBLASLt workspace
  DeviceBuffer ce_rows_;      // (kCrossEntropyRows) CrossEntropyRow
  DeviceBuffer sum_partial_;  // (kSumSquaresBlocks) double
  // The plan cache grows on first use of a shape, behind the const op interface.
  std::unique_ptr<cuda::Gemm> gemm_;
};

}  // namespace dhp
