// The pre-norm transformer block shared by the vision encoder and the decoder
// (model-spec.md): h = x + Attn(RMSNorm(x)); out = h + SwiGLU-MLP(RMSNorm(h)). Hugging Face
// decoders add, where their checkpoints have them: biases on q/k/v (Qwen2) and on the output
// projection (Llama's and Qwen3's attention_bias), and Qwen3's per-head q/k RMSNorm before RoPE.
// The pretrained towers' kind (BlockDims::vit: clip, siglip) is Hugging Face's encoder layer:
// h = x + Wo·Attn(LN1(x)) + bo with biased q/k/v and no RoPE; out = h + fc2(act(fc1(LN2(h)))),
// LayerNorms with weight and bias.
// Gradient convention: parameter gradients accumulate (+=), activation gradients are written.
// Every buffer is a device pointer carved from the model's activation arena.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "model/attention_seam.h"
#include "model/params.h"
#include "types/recompute.h"

namespace dhp {

struct BlockDims {
  int64_t C;      // model width
  int Hq, Hkv, hd;
  int64_t F;      // SwiGLU hidden size
  RopeSpec rope;  // RoPE's base, and Llama-3.x's frequency scaling (kernels/rope_spec.h)
  float eps;      // RMSNorm eps; LayerNorm eps of the vit kind
  bool vit = false;              // LayerNorm, biases, GELU MLP, no RoPE (clip, siglip)
  GeluKind act = GeluKind::Quick;  // the vit kind's MLP activation
  // Qwen3: q and k RMSNormed over each head's hd values (weights q_norm, k_norm (hd), eps as
  // above) after their projections and before RoPE; v is not normed.
  bool qk_norm = false;
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
// The vit kind keeps the same buffers: a = fc1's output, g = act(a), b unused, and the
// LayerNorms' means beside their rstd.
struct BlockActs {
  Act x_in;      // (T, C) block input (the first residual)
  Act xn1;       // (T, C) RMSNorm(x_in)
  float* rstd1;  // (T)
  float* mean1 = nullptr;  // (T) vit kind only
  float* mean2 = nullptr;  // (T) vit kind only
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
  Act b;         // (T, F) x·W3
  Act g;         // (T, F) silu(a)·b
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
