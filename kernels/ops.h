// The op interface the model is written against. Pointers are device pointers of the backend
// that implements it (kernels/backend.h); shapes and conventions are those of the CPU
// reference in kernels/cpu/ (one header per op family, forward and backward side by side).
// An op never allocates and never returns a value to the host: results land in device
// buffers that the caller reads when it chooses to synchronise.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/op_types.h"

namespace dhp {

class Ops {
 public:
  virtual ~Ops() = default;
  virtual std::string name() const = 0;
  // The storage of every Act / CAct these ops are given: activations and the working copy of
  // the weights. Statistics (rstd, lse), gradients of parameters and optimizer state are fp32.
  virtual DType dtype() const { return DType::F32; }

  // Weight and bias gradients (dW, db) are fp32 and accumulate; the bias is in the activation
  // dtype, as the weights. A null gradient (dW, db, dw, or dx of linear_backward) is not
  // computed: a frozen parameter, or an input nothing trainable lies below.
  virtual void linear_forward(Act y, CAct x, CAct W, CAct b, int64_t T, int64_t in,
                              int64_t out) const = 0;
  virtual void linear_backward(Act dx, float* dW, float* db, CAct dy, CAct x, CAct W, int64_t T,
                               int64_t in, int64_t out, bool accumulate_dx) const = 0;
  // eps: model.rms_norm_eps in the decoder (Hugging Face checkpoints bring their own),
  // cpu::kRmsEps in the vision encoder. Qwen3's q/k norms are this op over rows of one head:
  // T·H rows of C = hd.
  virtual void rmsnorm_forward(Act y, float* rstd, CAct x, CAct w, int64_t T, int64_t C,
                               float eps) const = 0;
  virtual void rmsnorm_backward(Act dx, float* dw, CAct dy, CAct x, CAct w, const float* rstd,
                                int64_t T, int64_t C) const = 0;
  // RoPE in place on x (T, H, hd) by pos (T); the frequencies are rope_inv_freq of `rope`
  // (kernels/rope_spec.h: a base, and Llama-3.x's scaling where the model has it; under its
  // M-RoPE sections pos is (T, 3), a temporal, height and width position a token). Backward
  // rotates back. The 2-D form (vision encoder) rotates each head's halves by row and col.
  virtual void rope_forward(Act x, const int32_t* pos, int64_t T, int H, int hd,
                            const RopeSpec& rope) const = 0;
  virtual void rope_backward(Act dx, const int32_t* pos, int64_t T, int H, int hd,
                             const RopeSpec& rope) const = 0;
  virtual void rope2d_forward(Act x, const int32_t* row, const int32_t* col, int64_t T, int H,
                              int hd, const RopeSpec& rope) const = 0;
  virtual void rope2d_backward(Act dx, const int32_t* row, const int32_t* col, int64_t T, int H,
                               int hd, const RopeSpec& rope) const = 0;
  virtual void swiglu_forward(Act h, CAct a, CAct b, int64_t n) const = 0;
  virtual void swiglu_backward(Act da, Act db, CAct dh, CAct a, CAct b, int64_t n) const = 0;
  // The GELU family (op_types.h GeluKind). dx may alias dy.
  virtual void gelu_forward(Act y, CAct x, int64_t n, GeluKind k) const = 0;
  virtual void gelu_backward(Act dx, CAct dy, CAct x, int64_t n, GeluKind k) const = 0;
  // LayerNorm over C with weight and bias, as Hugging Face's nn.LayerNorm: biased variance, eps
  // inside the square root. x, y (T, C); w, b (C); mean and rstd (T, fp32) are saved for the
  // backward pass. dw and db (fp32) accumulate, null for a frozen parameter; dx is written and
  // may alias dy.
  virtual void layernorm_forward(Act y, float* mean, float* rstd, CAct x, CAct w, CAct b,
                                 int64_t T, int64_t C, float eps) const = 0;
  virtual void layernorm_backward(Act dx, float* dw, float* db, CAct dy, CAct x, CAct w,
                                  const float* mean, const float* rstd, int64_t T,
                                  int64_t C) const = 0;
  // LayerScale: y = x · w per column (y may alias x); its backward writes dx = dy · w (dx may
  // alias dy) and accumulates dw += sum over rows of dy · x (kernels/cpu/channel_scale.h).
  virtual void channel_scale_forward(Act y, CAct x, CAct w, int64_t T, int64_t C) const = 0;
  virtual void channel_scale_backward(Act dx, float* dw, CAct dy, CAct x, CAct w, int64_t T,
                                      int64_t C) const = 0;
  // The position embeddings of a pretrained ViT (CLIP, SigLIP), added to an encoder stream
  // x (rows, C) whose patch rows already hold the patch embedding (kernels/cpu/vision_embed.h
  // has the exact arithmetic). table (n_pos, C), n_pos = (cls ? 1 : 0) + g0h·g0w: with cls,
  // row 0 is the class position and the g0h x g0w grid follows row-major. Per image (images is
  // a device array): with cls (C), x[row] = cls + table[0] (written) and the patches start at
  // row + 1; patch (r, c) += the grid resized to (grid_h, grid_w) by `resize`
  // (kernels/pos_resize.h: PyTorch's bicubic F.interpolate, or Qwen3-VL's bilinear).
  virtual void vision_embed_forward(Act x, CAct table, CAct cls, const PosImage* images,
                                    int n_images, int64_t C, int g0h, int g0w, PosResize resize) const = 0;
  // The transpose: dtable (n_pos, C) and dcls (C) accumulate (fp32, null = frozen), from dx.
  // The class row is taken to exist exactly when dcls is given: the class embedding and the
  // table are one parameter group, frozen together. Deterministic for any thread count.
  virtual void vision_embed_backward(float* dtable, float* dcls, CAct dx, const PosImage* images,
                                     int n_images, int64_t C, int g0h, int g0w, PosResize resize) const = 0;
  virtual void attention_forward(Act out, float* lse, CAct q, CAct k, CAct v, AttnMeta qm,
                                 AttnMeta km, const AttnShape& s) const = 0;
  virtual void attention_backward(Act dq, Act dk, Act dv, CAct dout, CAct out, const float* lse,
                                  CAct q, CAct k, CAct v, AttnMeta qm, AttnMeta km,
                                  const AttnShape& s) const = 0;
  // Adds the rows' statistics to *stats (a device buffer).
  virtual void cross_entropy_forward(float* lse, CrossEntropyStats* stats, CAct logits,
                                     const int32_t* targets, int64_t T, int64_t V) const = 0;
  // Merges a partial attention result over other keys into (out, lse): see
  // kernels/cpu/attention_merge.h. out (T, H·hd) is an fp32 running result in any storage
  // (ring attention rounds it once, after its last merge); lse (H, T).
  virtual void attention_merge(float* out, float* lse, CAct part_out, const float* part_lse,
                               int64_t T, int H, int hd) const = 0;
  virtual void cross_entropy_backward(Act dlogits, CAct logits, const float* lse,
                                      const int32_t* targets, int64_t T, int64_t V,
                                      float scale) const = 0;
  virtual void embedding_forward(Act out, const int32_t* ids, CAct table, int64_t T,
                                 int64_t C) const = 0;
  virtual void embedding_backward(float* dtable, CAct dout, const int32_t* ids, int64_t T,
                                  int64_t C) const = 0;
  // out (n, activation dtype) = the pixels (n, channel fastest) normalised by channel, in
  // fp32 then rounded once: (x / 255 - mean) / std, as model-spec.md's preprocessing.
  virtual void normalize_pixels(Act out, const uint8_t* pixels, int64_t n,
                                const PixelNorm& norm) const = 0;
  virtual void patch_merge_forward(Act out, CAct in, const MergeImage* images, int n_images,
                                   int64_t C, int m) const = 0;
  virtual void patch_merge_backward(Act din, CAct dout, const MergeImage* images, int n_images,
                                    int64_t C, int m) const = 0;
  virtual void add_inplace(Act y, CAct x, int64_t n) const = 0;
  // acc (fp32) += x (activation dtype): sums that must not round at every term, such as ring
  // attention's dK/dV accumulators.
  virtual void accumulate(float* acc, CAct x, int64_t n) const = 0;
  virtual void scale_inplace(float* y, float s, int64_t n) const = 0;
  virtual void fill(Act y, float value, int64_t n) const = 0;
  // y (activation dtype) = x (fp32), rounded to nearest even: the working copy of the weights
  // and the pixels of a batch.
  virtual void cast(Act y, const float* x, int64_t n) const = 0;
  // *out (a device double) = sum of x², in an order independent of the thread count.
  virtual void sum_squares(double* out, const float* x, int64_t n) const = 0;
  // y[t] = src[slot[t]] where slot[t] >= 0; and its inverse, dsrc[slot[t]] = dy[t] (written).
  virtual void scatter_rows(Act y, CAct src, const int32_t* slot, int64_t T, int64_t C) const = 0;
  virtual void gather_rows(Act dsrc, CAct dy, const int32_t* slot, int64_t T,
                           int64_t C) const = 0;
  virtual void adamw_update(float* p, const float* g, float* m, float* v, int64_t n,
                            const AdamWStep& s) const = 0;
};

}  // namespace dhp
