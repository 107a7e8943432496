// The attention seam. Blocks call an Attention object instead of the attention op, so the
// layer code is the same for attention over a local pack, a ring of any degree across ranks
// (parallel/), and incremental decoding over a KV cache.
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
  virtual void forward(int layer, float* out, float* lse, const float* q, const float* k,
                       const float* v, const AttnDims& d) = 0;
  virtual void backward(int layer, float* dq, float* dk, float* dv, const float* dout,
                        const float* out, const float* lse, const float* q, const float* k,
                        const float* v, const AttnDims& d) = 0;
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
  void forward(int layer, float* out, float* lse, const float* q, const float* k, const float* v,
               const AttnDims& d) override;
  void backward(int layer, float* dq, float* dk, float* dv, const float* dout, const float* out,
                const float* lse, const float* q, const float* k, const float* v,
                const AttnDims& d) override;

 private:
  const Ops& ops_;
  AttnMeta meta_{};
  int64_t T_ = 0;
};

// Incremental decoding: every pass appends its tokens' keys and values (per layer) and their
// metadata to the cache, and its queries attend to everything cached so far. Forward only.
class KvCacheAttention final : public Attention {
 public:
  // capacity: tokens the cache can hold (prompt plus every generated token).
  KvCacheAttention(Backend& backend, int layers, const AttnDims& d, int64_t capacity);
  void prepare(AttnMeta meta, int64_t T) override;
  void forward(int layer, float* out, float* lse, const float* q, const float* k, const float* v,
               const AttnDims& d) override;
  void backward(int, float*, float*, float*, const float*, const float*, const float*,
                const float*, const float*, const float*, const AttnDims&) override;
  int64_t len() const { return len_; }

 private:
  Backend& backend_;
  int64_t capacity_, kv_width_;
  int64_t len_ = 0, T_ = 0;           // cached tokens including this pass's, this pass's
  DeviceBuffer k_, v_;                // (layers, capacity, Hkv·hd)
  DeviceBuffer doc_, idx_, blk_;      // (capacity) metadata of the cached keys
  AttnMeta meta_{};                   // this pass's queries
};

}  // namespace dhp
