// The model's own attentions: over a local pack, and over a KV cache for incremental decoding
// (the seam is model/attention_seam.h; ring attention is parallel/ring_attention.h).
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "model/attention_seam.h"

namespace dhp {

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

// Incremental decoding: every pass appends its tokens' keys and values (per layer) and their
// metadata to the cache, and its queries attend to everything cached so far. Forward only.
class KvCacheAttention final : public Attention {
 public:
  // capacity: tokens the cache can hold (prompt plus every generated token).
  KvCacheAttention(Backend& backend, int layers, const AttnDims& d, int64_t capacity);
  void prepare(AttnMeta meta, int64_t T) override;
  void forward(int layer, Act out, float* lse, CAct q, CAct k, CAct v,
               const AttnDims& d) override;
  void backward(int, Act, Act, Act, CAct, CAct, const float*, CAct, CAct, CAct,
                const AttnDims&) override;
  int64_t len() const { return len_; }

 private:
  Backend& backend_;
  DType dtype_;
  int64_t capacity_, kv_width_;
  int64_t len_ = 0, T_ = 0;           // cached tokens including this pass's, this pass's
  DeviceBuffer k_, v_;                // (layers, capacity, Hkv·hd)
  DeviceBuffer doc_, idx_, blk_;      // (capacity) metadata of the cached keys
  AttnMeta meta_{};                   // this pass's queries
};

}  // namespace dhp
