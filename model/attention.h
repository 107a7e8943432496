// Attention over a KV cache, for incremental decoding (the seam is kernels/attention.h).
#pragma once

#include <cstdint>

#include "kernels/attention.h"
#include "kernels/backend.h"

namespace dhp {

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
