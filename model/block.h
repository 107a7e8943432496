// The pre-norm transformer block shared by the vision encoder and the decoder
// (model-spec.md): h = x + Attn(RMSNorm(x)); out = h + SwiGLU-MLP(RMSNorm(h)).
// Gradient convention: parameter gradients accumulate (+=), activation gradients are written.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/ops.h"
#include "model/params.h"

namespace dhp {

struct BlockDims {
  int64_t C;      // model width
  int Hq, Hkv, hd;
  int64_t F;      // SwiGLU hidden size
  double theta;   // RoPE base
};

// Positions for RoPE: 1-D (pos) in the decoder, 2-D (row, col) in the vision encoder.
struct RopePos {
  const int32_t* pos = nullptr;  // (T)
  const int32_t* row = nullptr;  // (T)
  const int32_t* col = nullptr;  // (T)
};

// What the forward pass keeps for the backward pass, per block and micro-batch.
struct BlockActs {
  std::vector<float> x_in;   // (T, C) block input (the first residual)
  std::vector<float> xn1;    // (T, C) RMSNorm(x_in)
  std::vector<float> rstd1;  // (T)
  std::vector<float> q;      // (T, Hq·hd) after RoPE
  std::vector<float> k;      // (T, Hkv·hd) after RoPE
  std::vector<float> v;      // (T, Hkv·hd)
  std::vector<float> att;    // (T, Hq·hd) attention output before Wo
  std::vector<float> lse;    // (Hq, T)
  std::vector<float> h;      // (T, C) second residual
  std::vector<float> xn2;    // (T, C)
  std::vector<float> rstd2;  // (T)
  std::vector<float> a, b;   // (T, F) x·W1 and x·W3
  std::vector<float> g;      // (T, F) silu(a)·b
};

// Scratch buffers of the backward pass, reused by every block.
struct BlockScratch {
  std::vector<float> dg, da, db;      // (T, F)
  std::vector<float> dxn, dtmp;       // (T, C)
  std::vector<float> datt, dq;        // (T, Hq·hd)
  std::vector<float> dk, dv;          // (T, Hkv·hd)
};

// Keys and values of earlier tokens for incremental decoding, one per layer.
struct LayerCache {
  std::vector<float> k, v;  // (L, Hkv·hd) after RoPE
};

// x (T, C) is replaced by the block's output. With a cache, the block appends its new keys
// and values to it and its queries attend to every cached key (described by cache_meta,
// which already covers the new tokens) instead of only to the T new ones.
void block_forward(const Ops& ops, const BlockDims& d, const BlockParams& w, BlockActs& acts,
                   float* x, int64_t T, AttnMeta meta, RopePos rope,
                   LayerCache* cache = nullptr, AttnMeta cache_meta = {});

// dx (T, C) holds d(out) on entry and d(x) on return.
void block_backward(const Ops& ops, const BlockDims& d, const BlockParams& w,
                    const BlockParams& grad, const BlockActs& acts, BlockScratch& s, float* dx,
                    int64_t T, AttnMeta meta, RopePos rope);

}  // namespace dhp
