// The pre-norm transformer block shared by the vision encoder and the decoder
// (model-spec.md): h = x + Attn(RMSNorm(x)); out = h + SwiGLU-MLP(RMSNorm(h)).
// Gradient convention: parameter gradients accumulate (+=), activation gradients are written.
// Every buffer is a device pointer carved from the model's activation arena.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/attention.h"
#include "model/params.h"

namespace dhp {

struct BlockDims {
  int64_t C;      // model width
  int Hq, Hkv, hd;
  int64_t F;      // SwiGLU hidden size
  double theta;   // RoPE base
  AttnDims attn() const { return {Hq, Hkv, hd}; }
};

// Positions for RoPE: 1-D (pos) in the decoder, 2-D (row, col) in the vision encoder.
struct RopePos {
  const int32_t* pos = nullptr;  // (T)
  const int32_t* row = nullptr;  // (T)
  const int32_t* col = nullptr;  // (T)
};

// What the forward pass keeps for the backward pass, per block and micro-batch.
struct BlockActs {
  float* x_in;   // (T, C) block input (the first residual)
  float* xn1;    // (T, C) RMSNorm(x_in)
  float* rstd1;  // (T)
  float* q;      // (T, Hq·hd) after RoPE
  float* k;      // (T, Hkv·hd) after RoPE
  float* v;      // (T, Hkv·hd)
  float* att;    // (T, Hq·hd) attention output before Wo
  float* lse;    // (Hq, T)
  float* h;      // (T, C) second residual
  float* xn2;    // (T, C)
  float* rstd2;  // (T)
  float* a;      // (T, F) x·W1
  float* b;      // (T, F) x·W3
  float* g;      // (T, F) silu(a)·b
};
BlockActs carve_block_acts(Carver& c, const BlockDims& d, int64_t T);

// Scratch buffers of the backward pass, shared by every block of a pass.
struct BlockScratch {
  float *dg, *da, *db;  // (T, F)
  float *dxn, *dtmp;    // (T, C)
  float *datt, *dq;     // (T, Hq·hd)
  float *dk, *dv;       // (T, Hkv·hd)
};
BlockScratch carve_block_scratch(Carver& c, const BlockDims& d, int64_t T);

// Reads the block input from acts.x_in and writes its output to out (T, C).
void block_forward(const Ops& ops, const BlockDims& d, const BlockParams& w, const BlockActs& acts,
                   float* out, int64_t T, RopePos rope, Attention& attn, int layer);

// dx (T, C) holds d(out) on entry and d(x_in) on return.
void block_backward(const Ops& ops, const BlockDims& d, const BlockParams& w,
                    const BlockParams& grad, const BlockActs& acts, const BlockScratch& s,
                    float* dx, int64_t T, RopePos rope, Attention& attn, int layer);

}  // namespace dhp
