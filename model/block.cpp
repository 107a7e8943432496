#include "model/block.h"

#include <algorithm>
#include <cmath>

namespace dhp {
namespace {

void rope_apply(const Ops& ops, float* x, int64_t T, int H, const BlockDims& d, RopePos r,
                bool backward) {
  if (r.row) {
    if (backward) ops.rope2d_backward(x, r.row, r.col, T, H, d.hd, d.theta);
    else ops.rope2d_forward(x, r.row, r.col, T, H, d.hd, d.theta);
  } else {
    if (backward) ops.rope_backward(x, r.pos, T, H, d.hd, d.theta);
    else ops.rope_forward(x, r.pos, T, H, d.hd, d.theta);
  }
}

AttnShape attn_shape(const BlockDims& d, int64_t T) {
  return AttnShape{T, T, d.Hq, d.Hkv, d.hd, float(1.0 / std::sqrt(double(d.hd)))};
}

}  // namespace

void block_forward(const Ops& ops, const BlockDims& d, const BlockParams& w, BlockActs& a,
                   float* x, int64_t T, AttnMeta meta, RopePos rope, LayerCache* cache,
                   AttnMeta cache_meta) {
  const int64_t C = d.C, qd = int64_t(d.Hq) * d.hd, kvd = int64_t(d.Hkv) * d.hd, F = d.F;
  a.x_in.assign(x, x + T * C);
  a.xn1.resize(T * C);
  a.rstd1.resize(T);
  a.q.resize(T * qd);
  a.k.resize(T * kvd);
  a.v.resize(T * kvd);
  a.att.resize(T * qd);
  a.lse.resize(int64_t(d.Hq) * T);
  a.h.resize(T * C);
  a.xn2.resize(T * C);
  a.rstd2.resize(T);
  a.a.resize(T * F);
  a.b.resize(T * F);
  a.g.resize(T * F);

  ops.rmsnorm_forward(a.xn1.data(), a.rstd1.data(), x, w.attn_norm, T, C);
  ops.linear_forward(a.q.data(), a.xn1.data(), w.wq, nullptr, T, C, qd);
  ops.linear_forward(a.k.data(), a.xn1.data(), w.wk, nullptr, T, C, kvd);
  ops.linear_forward(a.v.data(), a.xn1.data(), w.wv, nullptr, T, C, kvd);
  rope_apply(ops, a.q.data(), T, d.Hq, d, rope, false);
  rope_apply(ops, a.k.data(), T, d.Hkv, d, rope, false);
  if (cache) {
    cache->k.insert(cache->k.end(), a.k.begin(), a.k.end());
    cache->v.insert(cache->v.end(), a.v.begin(), a.v.end());
    AttnShape sh = attn_shape(d, T);
    sh.Tk = int64_t(cache->k.size()) / kvd;
    ops.attention_forward(a.att.data(), a.lse.data(), a.q.data(), cache->k.data(),
                          cache->v.data(), meta, cache_meta, sh);
  } else {
    ops.attention_forward(a.att.data(), a.lse.data(), a.q.data(), a.k.data(), a.v.data(), meta,
                          meta, attn_shape(d, T));
  }
  ops.linear_forward(a.h.data(), a.att.data(), w.wo, nullptr, T, qd, C);
  ops.add_inplace(a.h.data(), a.x_in.data(), T * C);

  ops.rmsnorm_forward(a.xn2.data(), a.rstd2.data(), a.h.data(), w.mlp_norm, T, C);
  ops.linear_forward(a.a.data(), a.xn2.data(), w.w1, nullptr, T, C, F);
  ops.linear_forward(a.b.data(), a.xn2.data(), w.w3, nullptr, T, C, F);
  ops.swiglu_forward(a.g.data(), a.a.data(), a.b.data(), T * F);
  ops.linear_forward(x, a.g.data(), w.w2, nullptr, T, F, C);
  ops.add_inplace(x, a.h.data(), T * C);
}

void block_backward(const Ops& ops, const BlockDims& d, const BlockParams& w,
                    const BlockParams& gw, const BlockActs& a, BlockScratch& s, float* dx,
                    int64_t T, AttnMeta meta, RopePos rope) {
  const int64_t C = d.C, qd = int64_t(d.Hq) * d.hd, kvd = int64_t(d.Hkv) * d.hd, F = d.F;
  s.dg.resize(T * F);
  s.da.resize(T * F);
  s.db.resize(T * F);
  s.dxn.resize(T * C);
  s.dtmp.resize(T * C);
  s.datt.resize(T * qd);
  s.dq.resize(T * qd);
  s.dk.resize(T * kvd);
  s.dv.resize(T * kvd);

  // MLP branch: dx holds d(out) = d(h) through the residual, plus what flows through the MLP.
  ops.linear_backward(s.dg.data(), gw.w2, nullptr, dx, a.g.data(), w.w2, T, F, C, false);
  ops.swiglu_backward(s.da.data(), s.db.data(), s.dg.data(), a.a.data(), a.b.data(), T * F);
  ops.linear_backward(s.dxn.data(), gw.w1, nullptr, s.da.data(), a.xn2.data(), w.w1, T, C, F, false);
  ops.linear_backward(s.dxn.data(), gw.w3, nullptr, s.db.data(), a.xn2.data(), w.w3, T, C, F, true);
  ops.rmsnorm_backward(s.dtmp.data(), gw.mlp_norm, s.dxn.data(), a.h.data(), w.mlp_norm,
                       a.rstd2.data(), T, C);
  ops.add_inplace(dx, s.dtmp.data(), T * C);  // dx = d(h)

  // Attention branch.
  ops.linear_backward(s.datt.data(), gw.wo, nullptr, dx, a.att.data(), w.wo, T, qd, C, false);
  ops.attention_backward(s.dq.data(), s.dk.data(), s.dv.data(), s.datt.data(), a.att.data(),
                         a.lse.data(), a.q.data(), a.k.data(), a.v.data(), meta, meta,
                         attn_shape(d, T));
  rope_apply(ops, s.dq.data(), T, d.Hq, d, rope, true);
  rope_apply(ops, s.dk.data(), T, d.Hkv, d, rope, true);
  ops.linear_backward(s.dxn.data(), gw.wq, nullptr, s.dq.data(), a.xn1.data(), w.wq, T, C, qd, false);
  ops.linear_backward(s.dxn.data(), gw.wk, nullptr, s.dk.data(), a.xn1.data(), w.wk, T, C, kvd, true);
  ops.linear_backward(s.dxn.data(), gw.wv, nullptr, s.dv.data(), a.xn1.data(), w.wv, T, C, kvd, true);
  ops.rmsnorm_backward(s.dtmp.data(), gw.attn_norm, s.dxn.data(), a.x_in.data(), w.attn_norm,
                       a.rstd1.data(), T, C);
  ops.add_inplace(dx, s.dtmp.data(), T * C);  // dx = d(x_in)
}

}  // namespace dhp
