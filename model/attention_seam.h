// The attention seam. Transformer blocks call an Attention object instead of the attention
// op, so the layer code is the same for attention over a local pack, a ring of any degree
// across ranks (parallel/ring_attention.h), and incremental decoding over a KV cache
// (KvCacheAttention); the local one is LocalAttention (both model/attention.h).
//
// Shapes: q (T, Hq·hd), k and v (T, Hkv·hd) after RoPE; out (T, Hq·hd); lse (Hq, T), the
// log-sum-exp of each (head, query) row, kept by forward for backward. Gradients dq, dk, dv
// are written (=). T and the tokens' metadata are fixed by prepare() for one forward (and
// backward) pass over all layers.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/backend.h"

namespace dhp {

struct AttnDims {
  int Hq, Hkv, hd;
};

class Attention {
 public:
  virtual ~Attention() = default;
  // Once per pass, before the first layer: the metadata of this rank's T tokens (device
  // pointers that stay valid for the pass).
  virtual void prepare(AttnMeta meta, int64_t T) = 0;
  virtual void forward(int layer, Act out, float* lse, CAct q, CAct k, CAct v,
                       const AttnDims& d) = 0;
  virtual void backward(int layer, Act dq, Act dk, Act dv, CAct dout, CAct out,
                        const float* lse, CAct q, CAct k, CAct v, const AttnDims& d) = 0;
};

inline AttnShape attn_shape(const AttnDims& d, int64_t Tq, int64_t Tk) {
  return AttnShape{Tq, Tk, d.Hq, d.Hkv, d.hd, float(1.0 / std::sqrt(double(d.hd)))};
}

}  // namespace dhp
