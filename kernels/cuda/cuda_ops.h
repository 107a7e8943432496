// The op interface on a CUDA device: each op launches the kernels of its family (one .cu file
// each, launchers declared in kernels/cuda/launch.h) on the backend's stream, and the Linear
// layers run through cuBLASLt (gemm.h). Activations and working weights are stored in fp32, or
// in bf16 when the precision is "bf16" (Ops::dtype); each op dispatches to the kernels of that
// storage. Besides the GEMM workspace, the ops own two small
// scratch buffers for their deterministic reductions, allocated once here: no op allocates.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/attention_select.h"
#include "kernels/cuda/gemm.h"

namespace dhp {

class CudaOps final : public Ops {
 public:
  // Allocates the GEMM workspace and the scratch buffers through `backend`.
  // attention: train.attention (kernels/cuda/attention_select.h).
  CudaOps(Backend& backend, cudaStream_t stream, Precision precision,
          AttentionImpl attention = AttentionImpl::automatic);
  ~CudaOps() override;

  std::string name() const override { return "cuda"; }
  DType dtype() const override { return dtype_; }
  void linear_forward(Act y, CAct x, CAct W, CAct b, int64_t T, int64_t in,
                      int64_t out) const override;
  void linear_backward(Act dx, float* dW, float* db, CAct dy, CAct x, CAct W, int64_t T,
                       int64_t in, int64_t out, bool accumulate_dx) const override;
  void rmsnorm_forward(Act y, float* rstd, CAct x, CAct w, int64_t T, int64_t C,
                       float eps) const override;
  void rmsnorm_backward(Act dx, float* dw, CAct dy, CAct x, CAct w, const float* rstd, int64_t T,
                        int64_t C) const override;
  void rope_forward(Act x, const int32_t* pos, int64_t T, int H, int hd,
                    const RopeSpec& rope) const override;
  void rope_backward(Act dx, const int32_t* pos, int64_t T, int H, int hd,
                     const RopeSpec& rope) const override;
  void rope2d_forward(Act x, const int32_t* row, const int32_t* col, int64_t T, int H, int hd,
                      const RopeSpec& rope) const override;
  void rope2d_backward(Act dx, const int32_t* row, const int32_t* col, int64_t T, int H, int hd,
                       const RopeSpec& rope) const override;
  void swiglu_forward(Act h, CAct a, CAct b, int64_t n) const override;
  void swiglu_backward(Act da, Act db, CAct dh, CAct a, CAct b, int64_t n) const override;
  void gelu_forward(Act y, CAct x, int64_t n, GeluKind k) const override;
  void gelu_backward(Act dx, CAct dy, CAct x, int64_t n, GeluKind k) const override;
  void layernorm_forward(Act y, float* mean, float* rstd, CAct x, CAct w, CAct b, int64_t T,
                         int64_t C, float eps) const override;
  void layernorm_backward(Act dx, float* dw, float* db, CAct dy, CAct x, CAct w,
                          const float* mean, const float* rstd, int64_t T,
                          int64_t C) const override;
  void channel_scale_forward(Act y, CAct x, CAct w, int64_t T, int64_t C) const override;
  void channel_scale_backward(Act dx, float* dw, CAct dy, CAct x, CAct w, int64_t T,
                              int64_t C) const override;
  void vision_embed_forward(Act x, CAct table, CAct cls, const PosImage* images, int n_images,
                            int64_t C, int g0h, int g0w, PosResize resize) const override;
  void vision_embed_backward(float* dtable, float* dcls, CAct dx, const PosImage* images,
                             int n_images, int64_t C, int g0h, int g0w, PosResize resize) const override;
  void attention_forward(Act out, float* lse, CAct q, CAct k, CAct v, AttnMeta qm, AttnMeta km,
                         const AttnShape& s) const override;
  void attention_backward(Act dq, Act dk, Act dv, CAct dout, CAct out, const float* lse, CAct q,
                          CAct k, CAct v, AttnMeta qm, AttnMeta km,
                          const AttnShape& s) const override;
  void cross_entropy_forward(float* lse, CrossEntropyStats* stats, CAct logits,
                             const int32_t* targets, int64_t T, int64_t V) const override;
  void attention_merge(float* out, float* lse, CAct part_out, const float* part_lse, int64_t T,
                       int H, int hd) const override;
  void cross_entropy_backward(Act dlogits, CAct logits, const float* lse, const int32_t* targets,
                              int64_t T, int64_t V, float scale) const override;
  void embedding_forward(Act out, const int32_t* ids, CAct table, int64_t T,
                         int64_t C) const override;
  void embedding_backward(float* dtable, CAct dout, const int32_t* ids, int64_t T,
                          int64_t C) const override;
  void normalize_pixels(Act out, const uint8_t* pixels, int64_t n,
                        const PixelNorm& norm) const override;
  void patch_merge_forward(Act out, CAct in, const MergeImage* images, int n_images, int64_t C,
                           int m) const override;
  void patch_merge_backward(Act din, CAct dout, const MergeImage* images, int n_images, int64_t C,
                            int m) const override;
  void add_inplace(Act y, CAct x, int64_t n) const override;
  void accumulate(float* acc, CAct x, int64_t n) const override;
  void scale_inplace(float* y, float s, int64_t n) const override;
  void fill(Act y, float value, int64_t n) const override;
  void cast(Act y, const float* x, int64_t n) const override;
  void sum_squares(double* out, const float* x, int64_t n) const override;
  void scatter_rows(Act y, CAct src, const int32_t* slot, int64_t T, int64_t C) const override;
  void gather_rows(Act dsrc, CAct dy, const int32_t* slot, int64_t T, int64_t C) const override;
  void adamw_update(float* p, const float* g, float* m, float* v, int64_t n,
                    const AdamWStep& s) const override;

  // cuBLASLt plans made so far (one per shape, op and alignment), for tests and benches.
  size_t gemm_plans() const { return gemm_->cached_plans(); }
  // Which attention runs which call; its cuDNN side (null where cuDNN is unusable).
  cuda::AttentionSelect& attention_select() const { return *attn_; }
  std::vector<AttnTiming> take_attention_timings() const;
  void agree_attention(const std::vector<AttnTiming>& everyone) const;

 private:
  // Calls f with a value of the storage type (float or cuda::bf16) of this precision.
  template <class F>
  void with_storage(F&& f) const;
  // The check of a library's first result on a shape class against the own kernel's
  // (AttentionSelect::Verify): `outputs` (pointer, elements) in this precision's storage.
  cuda::AttentionSelect::Verify verify(std::vector<std::pair<CAct, int64_t>> outputs) const;

  Backend& backend_;
  cudaStream_t stream_;
  DType dtype_;
  // Attention's products on tensor cores (TF32) unless the precision is fp32, as the GEMMs.
  cuda::AttnMath attn_math_;
  DeviceBuffer workspace_;    // cuBLASLt workspace
  DeviceBuffer ce_rows_;      // (kCrossEntropyRows) CrossEntropyRow
  DeviceBuffer sum_partial_;  // (kSumSquaresBlocks) double
  DeviceBuffer norm_partial_; // (kNormDwPartialFloats) float: RMSNorm dw's row slices
  // The plan cache grows on first use of a shape, behind the const op interface.
  std::unique_ptr<cuda::Gemm> gemm_;
  // Grows its plan cache and scratch on first use of a shape, behind the const interface too.
  std::unique_ptr<cuda::AttentionSelect> attn_;
  // The library's outputs set aside, and the fp32 difference and its two sums, while a class's
  // first call is checked (grown then, on first calls only).
  mutable DeviceBuffer verify_saved_, verify_diff_;
};

}  // namespace dhp
