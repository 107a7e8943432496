// Every launcher of the CUDA backend's kernels, one declaration per op, so that CudaOps and a
// new op's .cu file meet in one place. Each launcher queues its kernels on `stream`, never
// allocates and never synchronises; the CPU reference named beside each family
// (kernels/cpu/*.h) is its contract. S is the storage of activations and working weights,
// float or bf16 (kernels/cuda/storage.cuh); statistics, parameter gradients and optimizer state
// stay fp32. The kernel bodies are in <family>_kernels.cuh, the launchers in <family>.cu.
//
// Attention's per-head-dimension launches stay in attention_launch.h: that header is the
// contract between attention.cu and the instance files (kernels/cuda/instances/), with
// templates over the head dimension and extern instantiations, not an op's entry point.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/scratch.h"
#include "kernels/cuda/storage.cuh"
#include "kernels/op_types.h"

namespace dhp::cuda {

// ---- RMSNorm (kernels/cpu/norm.h): y = x · rstd · w, rstd = 1 / sqrt(mean(x²) + eps) ------

// x, y (T, C); w (C); rstd (T).
template <class S>
void rmsnorm_forward(cudaStream_t stream, S* y, float* rstd, const S* x, const S* w, int64_t T,
                     int64_t C, float eps);
// dx is written; dw (fp32) accumulates, reduced over rows column by column in a fixed order
// (no atomics): deterministic. partial: kNormDwPartialFloats of scratch (scratch.h).
template <class S>
void rmsnorm_backward(cudaStream_t stream, S* dx, float* dw, float* partial, const S* dy, const S* x,
                      const S* w, const float* rstd, int64_t T, int64_t C);

// ---- LayerNorm (kernels/cpu/layernorm.h): y = (x - mean) · rstd · w + b, biased variance,
// eps inside the square root ----------------------------------------------------------------

// x, y (T, C); w, b (C); mean, rstd (T). One block per row, two passes over it.
template <class S>
void layernorm_forward(cudaStream_t stream, S* y, float* mean, float* rstd, const S* x,
                       const S* w, const S* b, int64_t T, int64_t C, float eps);
// dx is written (it may alias dy); dw and db (fp32, null = frozen) accumulate, reduced over
// rows column by column in a fixed order (no atomics): deterministic.
template <class S>
void layernorm_backward(cudaStream_t stream, S* dx, float* dw, float* db, const S* dy, const S* x,
                        const S* w, const float* mean, const float* rstd, int64_t T, int64_t C);

// ---- LayerScale (kernels/cpu/channel_scale.h): y = x · w per column ------------------------

// x, y (T, C), w (C); y may alias x.
template <class S>
void channel_scale_forward(cudaStream_t stream, S* y, const S* x, const S* w, int64_t T, int64_t C);
// dx = dy · w (it may alias dy); dw (fp32, null = frozen) += sum over rows of dy · x, reduced
// column by column in a fixed order (no atomics): deterministic.
template <class S>
void channel_scale_backward(cudaStream_t stream, S* dx, float* dw, const S* dy, const S* x, const S* w,
                            int64_t T, int64_t C);

// ---- Rotary position embedding, in place (kernels/cpu/rope.h: half-split pairs, angles in
// double, the backward pass is the inverse rotation) -----------------------------------------

// x (T, H, hd); the span [offset, offset + span) of every head rotates by pos (T).
// sign = +1 forward, -1 backward.
template <class S>
void rope_rotate(cudaStream_t stream, S* x, const int32_t* pos, int64_t T, int H, int hd,
                 int offset, int span, const RopeSpec& rope, float sign);
template <class S>
void rope_forward(cudaStream_t stream, S* x, const int32_t* pos, int64_t T, int H, int hd,
                  const RopeSpec& rope);
template <class S>
void rope_backward(cudaStream_t stream, S* dx, const int32_t* pos, int64_t T, int H, int hd,
                   const RopeSpec& rope);
// 2-D: the first half of each head by row, the second by col.
template <class S>
void rope2d_forward(cudaStream_t stream, S* x, const int32_t* row, const int32_t* col,
                    int64_t T, int H, int hd, const RopeSpec& rope);
template <class S>
void rope2d_backward(cudaStream_t stream, S* dx, const int32_t* row, const int32_t* col,
                     int64_t T, int H, int hd, const RopeSpec& rope);

// ---- Activations (kernels/cpu/activation.h: SwiGLU's silu gate, the GELU family);
// gradients of inputs are written ------------------------------------------------------------

template <class S>
void swiglu_forward(cudaStream_t stream, S* h, const S* a, const S* b, int64_t n);
// da may alias dh.
template <class S>
void swiglu_backward(cudaStream_t stream, S* da, S* db, const S* dh, const S* a,
                     const S* b, int64_t n);
template <class S>
void gelu_forward(cudaStream_t stream, S* y, const S* x, int64_t n, GeluKind k);
// dx may alias dy.
template <class S>
void gelu_backward(cudaStream_t stream, S* dx, const S* dy, const S* x, int64_t n, GeluKind k);

// ---- Attention over packed variable-length sequences (kernels/cpu/attention.h explains the
// per-token masks and the log-sum-exp; ring attention merges these results unchanged) --------

// How the products are computed. fp32: plain fp32 arithmetic, as exact as the CPU reference.
// tf32: tensor cores (mma.sync) on operands rounded to TF32 (10 mantissa bits, relative error
// up to 2^-11 per operand) with fp32 accumulation; masks and softmax as in fp32.
enum class AttnMath { fp32, tf32 };

// q (Tq, Hq, hd), k and v (Tk, Hkv, hd) -> out (Tq, Hq, hd), lse (Hq, Tq). Rows that see no
// key get out = 0 and lse = -inf. Tiles the mask hides entirely are not computed. bf16
// storage always takes the tensor-core path (bf16 values are exact in TF32).
template <class S>
void attention_forward(cudaStream_t stream, S* out, float* lse, const S* q, const S* k,
                       const S* v, AttnMeta qm, AttnMeta km, const AttnShape& s,
                       AttnMath math = AttnMath::fp32);
// dq (Tq, Hq, hd), dk and dv (Tk, Hkv, hd) are written (=), from the forward's out and lse.
template <class S>
void attention_backward(cudaStream_t stream, S* dq, S* dk, S* dv, const S* dout, const S* out,
                        const float* lse, const S* q, const S* k, const S* v, AttnMeta qm,
                        AttnMeta km, const AttnShape& s, AttnMath math = AttnMath::fp32);
// Merges part b (part_out (T, H, hd), part_lse (H, T)) into a (out, lse) in place
// (kernels/cpu/attention_merge.h). out and lse are the fp32 running result.
template <class S>
void attention_merge(cudaStream_t stream, float* out, float* lse, const S* part_out,
                     const float* part_lse, int64_t T, int H, int hd);

// ---- Softmax cross-entropy over rows of logits (kernels/cpu/cross_entropy.h); a target < 0
// means "no loss at this row" --------------------------------------------------------------

// logits (T, V); targets (T); lse (T) written. One fused pass per row finds the max, the
// argmax and the sum of exponentials (online); the rows' statistics are then added to *stats
// in row-independent fixed order, kCrossEntropyRows rows at a time through `rows`
// (kernels/cuda/scratch.h).
template <class S>
void cross_entropy_forward(cudaStream_t stream, float* lse, CrossEntropyStats* stats,
                           CrossEntropyRow* rows, const S* logits, const int32_t* targets,
                           int64_t T, int64_t V);
// dlogits (T, V) = scale · (softmax - onehot(target)) on rows with a target, 0 elsewhere,
// from the forward's lse: one read of the logits, one write. dlogits may alias logits.
template <class S>
void cross_entropy_backward(cudaStream_t stream, S* dlogits, const S* logits, const float* lse,
                            const int32_t* targets, int64_t T, int64_t V, float scale);

// ---- Token embedding (kernels/cpu/embedding.h); an id < 0 gives a zero row and sends no
// gradient ------------------------------------------------------------------------------------

// out (T, C) = table[ids]; table (V, C).
template <class S>
void embedding_forward(cudaStream_t stream, S* out, const int32_t* ids, const S* table, int64_t T,
                       int64_t C);
// dtable (V, C) += scatter of dout (T, C) by ids. The first row holding an id adds every row
// holding it, in row order: deterministic and free of atomics.
template <class S>
void embedding_backward(cudaStream_t stream, float* dtable, const S* dout, const int32_t* ids,
                        int64_t T, int64_t C);

// ---- Pixels (kernels/cpu/pixels.h): a batch travels as 8-bit pixels, a quarter of the bytes
// of fp32 patches, and becomes the vision encoder's input here -------------------------------

// y (n) from pixels (n, channel fastest).
template <class S>
void normalize_pixels(cudaStream_t stream, S* y, const uint8_t* pixels, int64_t n,
                      const PixelNorm& norm);

// ---- The vision path's m x m patch merge (kernels/cpu/patch_merge.h): a permutation of rows,
// its backward the inverse gather (written) ---------------------------------------------------

// in (P, C) -> out (P / m², m²·C); images (n_images) is a device array.
template <class S>
void patch_merge_forward(cudaStream_t stream, S* out, const S* in, const MergeImage* images,
                         int n_images, int64_t C, int m);
template <class S>
void patch_merge_backward(cudaStream_t stream, S* din, const S* dout, const MergeImage* images,
                          int n_images, int64_t C, int m);

// ---- A pretrained ViT's position embeddings, resized bicubically to each image's grid
// (kernels/cpu/vision_embed.h: PyTorch's F.interpolate, align_corners=False, in double) ------

// x (rows, C) += the resized table at each image's patch rows; with cls, the class row is
// written cls + table[0]. images (n_images) is a device array.
template <class S>
void vision_embed_forward(cudaStream_t stream, S* x, const S* table, const S* cls,
                          const PosImage* images, int n_images, int64_t C, int g0h, int g0w, PosResize resize);
// dtable and dcls (fp32, null = frozen) accumulate the transpose; the class row exists exactly
// when dcls is given. Each table row gathers its terms in one fixed order: deterministic.
template <class S>
void vision_embed_backward(cudaStream_t stream, float* dtable, float* dcls, const S* dx,
                           const PosImage* images, int n_images, int64_t C, int g0h, int g0w, PosResize resize);

// ---- Small vector operations (kernels/cpu/elementwise.h) -----------------------------------

template <class S>
void add_inplace(cudaStream_t stream, S* y, const S* x, int64_t n);  // y += x
// acc (fp32) += x.
template <class S>
void accumulate(cudaStream_t stream, float* acc, const S* x, int64_t n);
void scale_inplace(cudaStream_t stream, float* y, float s, int64_t n);  // y *= s
template <class S>
void fill(cudaStream_t stream, S* y, float value, int64_t n);
// y = x, rounded to nearest even.
void cast(cudaStream_t stream, bf16* y, const float* x, int64_t n);
// dst (cols, rows) = src (rows, cols) transposed: cuDNN's (T, H) softmax statistics and dhp's
// (H, T) lse.
void transpose(cudaStream_t stream, float* dst, const float* src, int64_t rows, int64_t cols);

// *out = sum of x² in double; `partial` holds kSumSquaresBlocks doubles (kernels/cuda/scratch.h).
// Two stages with a fixed grid: each block sums a fixed strided share, then one block adds the
// partials in order, so the result never depends on timing.
void sum_squares(cudaStream_t stream, double* out, double* partial, const float* x, int64_t n);

// y[t] = src[slot[t]] where slot[t] >= 0; dsrc[slot[t]] = dy[t] (written). (T, C) rows.
template <class S>
void scatter_rows(cudaStream_t stream, S* y, const S* src, const int32_t* slot, int64_t T,
                  int64_t C);
template <class S>
void gather_rows(cudaStream_t stream, S* dsrc, const S* dy, const int32_t* slot, int64_t T,
                 int64_t C);

// y (T, C) += b (C) on every row.
template <class S>
void add_row_bias(cudaStream_t stream, S* y, const S* b, int64_t T, int64_t C);
// db (C, fp32) += column sums of x (T, C), each column summed in a fixed order (no atomics).
template <class S>
void column_sum_add(cudaStream_t stream, float* db, const S* x, int64_t T, int64_t C);

// ---- AdamW (kernels/cpu/elementwise.h adamw_update), one fused pass over the parameter arena

// p -= lr·(m̂ / (sqrt(v̂) + eps) + wd·p); m, v updated in place. p, g, m, v (n).
void adamw_update(cudaStream_t stream, float* p, const float* g, float* m, float* v, int64_t n,
                  const AdamWStep& s);

}  // namespace dhp::cuda
