#include "kernels/attention.h"

#include <cmath>

namespace dhp {

AttnShape attn_shape(const AttnDims& d, int64_t Tq, int64_t Tk) {
  return AttnShape{Tq, Tk, d.Hq, d.Hkv, d.hd, float(1.0 / std::sqrt(double(d.hd)))};
}

void LocalAttention::forward(int, Act out, float* lse, CAct q, CAct k, CAct v,
                             const AttnDims& d) {
  ops_.attention_forward(out, lse, q, k, v, meta_, meta_, attn_shape(d, T_, T_));
}

void LocalAttention::backward(int, Act dq, Act dk, Act dv, CAct dout, CAct out,
                              const float* lse, CAct q, CAct k, CAct v, const AttnDims& d) {
  ops_.attention_backward(dq, dk, dv, dout, out, lse, q, k, v, meta_, meta_,
                          attn_shape(d, T_, T_));
}

}  // namespace dhp
