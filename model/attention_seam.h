// The attention seam. Transformer blocks call an Attention object instead of the attention
// op, so the layer code is the same for attention over a local pack, a ring of any degree
// across ranks (parallel/ring_attention.h), and incremental decoding over a KV cache
// (model/attention.h).
//
// Shapes: q (T, Hq·hd), k and v (T, Hkv·hd) after RoPE; out (T, Hq·hd); lse (Hq, T), the
// log-sum-exp of each (head, query) row, kept by forward for backward. Gradients dq, dk, dv
// are written (=). T and the tokens' metadata are fixed by prepare() for one forward (and
// backward) pass over all layers.
#pragma once

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

AttnShape attn_shape(const AttnDims& d, int64_t Tq, int64_t Tk);

// Every query of the pass attends to the keys of the same pass (a pack on one rank).
class LocalAttention final : public Attention {
 public:
  explicit LocalAttention(const Ops& ops) : ops_(ops) {}
  void prepare(AttnMeta meta, int64_t T) override {
    meta_ = meta;
    T_ = T;
  }
  void forward(int layer, Act out, float* lse, CAct q, CAct k, CAct v,
               const AttnDims& d) override;
  void backward(int layer, Act dq, Act dk, Act dv, CAct dout, CAct out, const float* lse, CAct q,
                CAct k, CAct v, const AttnDims& d) override;

 private:
  const Ops& ops_;
  AttnMeta meta_{};
  int64_t T_ = 0;
};

}  // namespace dhp
