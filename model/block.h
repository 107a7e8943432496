// The pre-norm transformer block shared by every vision encoder and decoder (model-spec.md):
// h = x + Wo·Attn(RoPE(Wq·N1(x)), RoPE(Wk·N1(x)), Wv·N1(x)); out = h + MLP(N2(h)), its kind
// given by values (types/architecture.h): the norms RMSNorm or LayerNorm (weight and bias),
// the MLP SwiGLU or a GELU MLP fc2(act(fc1·x)), RoPE 1-D, 2-D or none. Biases are where the
// weights have them (a null bias is none): q/k/v (Qwen2), the output projection (Llama's and
// Qwen3's attention_bias), every projection of the Hugging Face towers. Qwen3 adds per-head
// q/k RMSNorms before RoPE.
// Gradient convention: parameter gradients accumulate (+=), activation gradients are written.
// Every buffer is a device pointer carved from the model's activation arena.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "model/attention_seam.h"
#include "model/params.h"
#include "types/architecture.h"
#include "types/recompute.h"

namespace dhp {

struct BlockDims {
  int64_t C;      // model width
  int Hq, Hkv, hd;
  int64_t F;      // SwiGLU hidden size
  RopeSpec rope;  // RoPE's base, and Llama-3.x's frequency scaling (kernels/rope_spec.h)
  float eps;      // the norms' eps
  NormKind norm = NormKind::rms;
  MlpKind mlp = MlpKind::swiglu;
  GeluKind act = GeluKind::Quick;  // the GELU MLP's activation
  bool rope_on = true;             // RoPE on q and k, at the RopePos positions
  // Qwen3: q and k RMSNormed over each head's hd values (weights q_norm, k_norm (hd), eps as
  // above) after their projections and before RoPE; v is not normed. qk_norm_heads heads are
  // normed together: 1 (Qwen3), or all of them (InternViT-6B: weights of the whole width).
  bool qk_norm = false;
  int qk_norm_heads = 1;
  AttnDims attn() const { return {Hq, Hkv, hd}; }
};

// Positions for RoPE: 1-D (pos) in the decoder, 2-D (row, col) in the vision encoder.
struct RopePos {
  const int32_t* pos = nullptr;  // (T)
  const int32_t* row = nullptr;  // (T)
  const int32_t* col = nullptr;  // (T)
};

// What the forward pass keeps for the backward pass, per block and micro-batch. Activations
// are in the ops' storage dtype; the per-row statistics are fp32. Under recompute
// (types/recompute.h) the buffers a layer rebuilds in backward are one set shared by every
// layer of the pass (carve_block_rebuilt): forward writes them and the next layer overwrites
// them; backward rebuilds them just before it reads them.
// A GELU MLP keeps a = fc1's output and g = act(a) (b unused); LayerNorms keep their means
// beside their rstd.
struct BlockActs {
  Act x_in;      // (T, C) block input (the first residual)
  Act xn1;       // (T, C) N1(x_in)
  float* rstd1;  // (T)
  float* mean1 = nullptr;  // (T) LayerNorm only
  float* mean2 = nullptr;  // (T) LayerNorm only
  Act q;         // (T, Hq·hd) after RoPE
  Act k;         // (T, Hkv·hd) after RoPE
  // qk_norm only (else null): q and k as projected, before their norms, and the norms' rstd.
  Act qp;        // (T, Hq·hd)
  Act kp;        // (T, Hkv·hd)
  float* rstd_q = nullptr;  // (T·Hq)
  float* rstd_k = nullptr;  // (T·Hkv)
  Act v;         // (T, Hkv·hd)
  Act att;       // (T, Hq·hd) attention output before Wo
  float* lse;    // (Hq, T)
  Act h;         // (T, C) second residual
  Act xn2;       // (T, C)
  float* rstd2;  // (T)
  Act a;         // (T, F) x·W1
  Act b;         // (T, F) x·W3 (SwiGLU only)
  Act g;         // (T, F) silu(a)·b, or act(a)
};
// The buffers `mode` rebuilds, once per pass (nothing under off).
BlockActs carve_block_rebuilt(Carver& c, const BlockDims& d, int64_t T, DType t, Recompute mode);
// One layer's buffers: those `mode` keeps are its own, the others are `rebuilt`'s.
BlockActs carve_block_acts(Carver& c, const BlockDims& d, int64_t T, DType t,
                           Recompute mode = Recompute::off, const BlockActs& rebuilt = {});

// Scratch buffers of the backward pass, shared by every block of a pass.
struct BlockScratch {
  Act dg, da, db;  // (T, F)
  Act dxn, dtmp;   // (T, C)
  Act datt, dq;    // (T, Hq·hd)
  Act dk, dv;      // (T, Hkv·hd)
};
BlockScratch carve_block_scratch(Carver& c, const BlockDims& d, int64_t T, DType t);

// N(x) of d's norm kind and eps over T rows of C: the output, its statistics (mean for
// LayerNorm only, else unused) and the norm's weight and bias (null for RMSNorm); and its
// backward, which accumulates dw and db.
void norm_forward(const Ops& ops, const BlockDims& d, Act out, float* mean, float* rstd, CAct x, CAct w,
                  CAct b, int64_t T, int64_t C);
void norm_backward(const Ops& ops, const BlockDims& d, Act dx, float* dw, float* db, CAct dout, CAct x,
                   CAct w, const float* mean, const float* rstd, int64_t T, int64_t C);

// Reads the block input from acts.x_in and writes its output to out (T, C).
void block_forward(const Ops& ops, const BlockDims& d, const BlockWeights& w,
                   const BlockActs& acts, Act out, int64_t T, RopePos rope, Attention& attn,
                   int layer);

// dx (T, C) holds d(out) on entry and d(x_in) on return. `mode` is the one the acts were
// carved for: the rebuilt buffers are recomputed first, by the same ops on the same inputs
// as in forward, so the gradients are bit-identical to those of a pass that kept them. Under
// full recompute that reruns the layer's attention forward (a ring's exchange included).
void block_backward(const Ops& ops, const BlockDims& d, const BlockWeights& w,
                    const BlockParams& grad, const BlockActs& acts, const BlockScratch& s, Act dx,
                    int64_t T, RopePos rope, Attention& attn, int layer,
                    Recompute mode = Recompute::off);

}  // namespace dhp
