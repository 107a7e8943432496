#include "model/attention.h"

#include "core/check.h"

namespace dhp {

void LocalAttention::forward(int, Act out, float* lse, CAct q, CAct k, CAct v,
                             const AttnDims& d) {
  ops_.attention_forward(out, lse, q, k, v, meta_, meta_, attn_shape(d, T_, T_));
}

void LocalAttention::backward(int, Act dq, Act dk, Act dv, CAct dout, CAct out,
                              const float* lse, CAct q, CAct k, CAct v, const AttnDims& d) {
  ops_.attention_backward(dq, dk, dv, dout, out, lse, q, k, v, meta_, meta_,
                          attn_shape(d, T_, T_));
}

KvCacheAttention::KvCacheAttention(Backend& backend, int layers, const AttnDims& d,
                                   int64_t capacity)
    : backend_(backend),
      dtype_(backend.ops().dtype()),
      capacity_(capacity),
      kv_width_(int64_t(d.Hkv) * d.hd),
      k_(backend, dtype_size(dtype_) * size_t(layers) * capacity * kv_width_),
      v_(backend, dtype_size(dtype_) * size_t(layers) * capacity * kv_width_),
      doc_(backend, sizeof(int32_t) * capacity),
      idx_(backend, sizeof(int32_t) * capacity),
      blk_(backend, sizeof(int32_t) * capacity) {}

void KvCacheAttention::prepare(AttnMeta meta, int64_t T) {
  const int64_t at = len_;
  DHP_CHECK(at + T <= capacity_, "the KV cache holds {} tokens; {} more do not fit", capacity_, T);
  backend_.copy(doc_.as<int32_t>() + at, meta.doc, sizeof(int32_t) * T);
  backend_.copy(idx_.as<int32_t>() + at, meta.idx, sizeof(int32_t) * T);
  backend_.copy(blk_.as<int32_t>() + at, meta.blk, sizeof(int32_t) * T);
  meta_ = meta;
  T_ = T;
  len_ = at + T;
}

void KvCacheAttention::forward(int layer, Act out, float* lse, CAct q, CAct k, CAct v,
                               const AttnDims& d) {
  const int64_t at = len_ - T_, bytes = int64_t(dtype_size(dtype_)) * T_ * kv_width_;
  const Act kc = Act(k_.data(), dtype_) + int64_t(layer) * capacity_ * kv_width_;
  const Act vc = Act(v_.data(), dtype_) + int64_t(layer) * capacity_ * kv_width_;
  backend_.copy((kc + at * kv_width_).p, k.p, bytes);
  backend_.copy((vc + at * kv_width_).p, v.p, bytes);
  const AttnMeta keys{doc_.as<int32_t>(), idx_.as<int32_t>(), blk_.as<int32_t>()};
  backend_.ops().attention_forward(out, lse, q, kc, vc, meta_, keys, attn_shape(d, T_, len_));
}

void KvCacheAttention::backward(int, Act, Act, Act, CAct, CAct, const float*, CAct, CAct, CAct,
                                const AttnDims&) {
  DHP_ASSERT(!"KvCacheAttention is for decoding only: it has no backward pass");
}

}  // namespace dhp
