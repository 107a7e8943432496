#include "model/block.h"

namespace dhp {
namespace {

void rope_apply(const Ops& ops, Act x, int64_t T, int H, const BlockDims& d, RopePos r,
                bool backward) {
  if (r.row) {
    if (backward) ops.rope2d_backward(x, r.row, r.col, T, H, d.hd, d.rope);
    else ops.rope2d_forward(x, r.row, r.col, T, H, d.hd, d.rope);
  } else {
    if (backward) ops.rope_backward(x, r.pos, T, H, d.hd, d.rope);
    else ops.rope_forward(x, r.pos, T, H, d.hd, d.rope);
  }
}

}  // namespace

namespace {
// Which buffers a mode rebuilds in backward. x_in is always kept: it is the one thing a layer
// cannot rebuild.
struct Rebuilt {
  bool norms;      // xn1, rstd1, xn2, rstd2: cheap pointwise ops of kept tensors
  bool swiglu;     // g = silu(a)·b
  bool linears;    // q, k, v, att, lse, h, a, b: the GEMMs' and the attention's outputs (and
                   // with qk_norm q and k before their norms, and the norms' rstd)
};
Rebuilt rebuilt_by(Recompute mode) {
  switch (mode) {
    case Recompute::off: return {false, false, false};
    case Recompute::selective: return {true, true, false};
    case Recompute::full: return {true, true, true};
  }
  return {false, false, false};
}

// Takes each buffer from the carver when `own` says so, else from `from`.
BlockActs carve_some(Carver& c, const BlockDims& d, int64_t T, DType t, Rebuilt own,
                     const BlockActs& from) {
  const int64_t qd = int64_t(d.Hq) * d.hd, kvd = int64_t(d.Hkv) * d.hd;
  BlockActs a = from;
  if (own.norms) {
    a.xn1 = c.take(T * d.C, t);
    a.rstd1 = c.take<float>(T);
    if (d.norm == NormKind::layer) a.mean1 = c.take<float>(T);
  }
  if (own.linears) {
    a.q = c.take(T * qd, t);
    a.k = c.take(T * kvd, t);
    if (d.qk_norm) {
      a.qp = c.take(T * qd, t);
      a.kp = c.take(T * kvd, t);
      a.rstd_q = c.take<float>(T * d.Hq / d.qk_norm_heads);
      a.rstd_k = c.take<float>(T * d.Hkv / d.qk_norm_heads);
    }
    a.v = c.take(T * kvd, t);
    a.att = c.take(T * qd, t);
    a.lse = c.take<float>(int64_t(d.Hq) * T);
    a.h = c.take(T * d.C, t);
  }
  if (own.norms) {
    a.xn2 = c.take(T * d.C, t);
    a.rstd2 = c.take<float>(T);
    if (d.norm == NormKind::layer) a.mean2 = c.take<float>(T);
  }
  if (own.linears) {
    a.a = c.take(T * d.F, t);
    if (d.mlp == MlpKind::swiglu) a.b = c.take(T * d.F, t);
  }
  if (own.swiglu) a.g = c.take(T * d.F, t);
  return a;
}
}  // namespace

BlockActs carve_block_rebuilt(Carver& c, const BlockDims& d, int64_t T, DType t, Recompute mode) {
  return carve_some(c, d, T, t, rebuilt_by(mode), BlockActs{});
}

BlockActs carve_block_acts(Carver& c, const BlockDims& d, int64_t T, DType t, Recompute mode,
                           const BlockActs& rebuilt) {
  const Rebuilt r = rebuilt_by(mode);
  BlockActs a = carve_some(c, d, T, t, Rebuilt{!r.norms, !r.swiglu, !r.linears}, rebuilt);
  a.x_in = c.take(T * d.C, t);
  return a;
}

BlockScratch carve_block_scratch(Carver& c, const BlockDims& d, int64_t T, DType t) {
  const int64_t qd = int64_t(d.Hq) * d.hd, kvd = int64_t(d.Hkv) * d.hd;
  BlockScratch s;
  s.dg = c.take(T * d.F, t);
  s.da = c.take(T * d.F, t);
  if (d.mlp == MlpKind::swiglu) s.db = c.take(T * d.F, t);
  s.dxn = c.take(T * d.C, t);
  s.dtmp = c.take(T * d.C, t);
  s.datt = c.take(T * qd, t);
  s.dq = c.take(T * qd, t);
  s.dk = c.take(T * kvd, t);
  s.dv = c.take(T * kvd, t);
  return s;
}

void norm_forward(const Ops& ops, const BlockDims& d, Act out, float* mean, float* rstd, CAct x, CAct w,
                  CAct b, int64_t T, int64_t C) {
  if (d.norm == NormKind::layer) ops.layernorm_forward(out, mean, rstd, x, w, b, T, C, d.eps);
  else ops.rmsnorm_forward(out, rstd, x, w, T, C, d.eps);
}

void norm_backward(const Ops& ops, const BlockDims& d, Act dx, float* dw, float* db, CAct dout, CAct x,
                   CAct w, const float* mean, const float* rstd, int64_t T, int64_t C) {
  if (d.norm == NormKind::layer) ops.layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, T, C);
  else ops.rmsnorm_backward(dx, dw, dout, x, w, rstd, T, C);
}

namespace {

// g from the MLP's first projection(s): silu(a)·b, or act(a).
void mlp_act_forward(const Ops& ops, const BlockDims& d, const BlockActs& a, int64_t n) {
  if (d.mlp == MlpKind::swiglu) ops.swiglu_forward(a.g, a.a, a.b, n);
  else ops.gelu_forward(a.g, a.a, n, d.act);
}

// The gradient a branch's output Linear (in -> C through W, b) takes: dy itself, or with
// LayerScale `ls` d(ls ⊙ y) = ls ⊙ dy into dxn, and ls's gradient, which needs the output
// before the scale: rebuilt (one GEMM) in dtmp. dxn and dtmp are free until the norms' backward.
CAct layer_scale_backward(const Ops& ops, const BlockScratch& s, CAct ls, float* dls, CAct dy, CAct in, CAct W,
                          CAct b, int64_t T, int64_t K, int64_t C) {
  if (!ls) return dy;
  ops.linear_forward(s.dtmp, in, W, b, T, K, C);
  ops.channel_scale_backward(s.dxn, dls, dy, s.dtmp, ls, T, C);
  return s.dxn;
}

}  // namespace

void block_forward(const Ops& ops, const BlockDims& d, const BlockWeights& w, const BlockActs& a,
                   Act out, int64_t T, RopePos rope, Attention& attn, int layer) {
  const int64_t C = d.C, qd = int64_t(d.Hq) * d.hd, kvd = int64_t(d.Hkv) * d.hd, F = d.F;
  norm_forward(ops, d, a.xn1, a.mean1, a.rstd1, a.x_in, w.attn_norm, w.attn_norm_b, T, C);
  ops.linear_forward(d.qk_norm ? a.qp : a.q, a.xn1, w.wq, w.bq, T, C, qd);
  ops.linear_forward(d.qk_norm ? a.kp : a.k, a.xn1, w.wk, w.bk, T, C, kvd);
  ops.linear_forward(a.v, a.xn1, w.wv, w.bv, T, C, kvd);
  if (d.qk_norm) {
    // Qwen3: every head's hd values RMSNormed (rows of hd), before RoPE; InternViT-6B: all
    // heads together (rows of the whole width).
    const int g = d.qk_norm_heads;
    ops.rmsnorm_forward(a.q, a.rstd_q, a.qp, w.q_norm, T * d.Hq / g, int64_t(d.hd) * g, d.eps);
    ops.rmsnorm_forward(a.k, a.rstd_k, a.kp, w.k_norm, T * d.Hkv / g, int64_t(d.hd) * g, d.eps);
  }
  if (d.rope_on) {
    rope_apply(ops, a.q, T, d.Hq, d, rope, false);
    rope_apply(ops, a.k, T, d.Hkv, d, rope, false);
  }
  attn.forward(layer, a.att, a.lse, a.q, a.k, a.v, d.attn());
  ops.linear_forward(a.h, a.att, w.wo, w.bo, T, qd, C);
  if (w.ls1) ops.channel_scale_forward(a.h, a.h, w.ls1, T, C);
  ops.add_inplace(a.h, a.x_in, T * C);

  norm_forward(ops, d, a.xn2, a.mean2, a.rstd2, a.h, w.mlp_norm, w.mlp_norm_b, T, C);
  ops.linear_forward(a.a, a.xn2, w.w1, w.b1, T, C, F);
  if (d.mlp == MlpKind::swiglu) ops.linear_forward(a.b, a.xn2, w.w3, nullptr, T, C, F);
  mlp_act_forward(ops, d, a, T * F);
  ops.linear_forward(out, a.g, w.w2, w.b2, T, F, C);
  if (w.ls2) ops.channel_scale_forward(out, out, w.ls2, T, C);
  ops.add_inplace(out, a.h, T * C);
}

void block_backward(const Ops& ops, const BlockDims& d, const BlockWeights& w,
                    const BlockParams& gw, const BlockActs& a, const BlockScratch& s, Act dx,
                    int64_t T, RopePos rope, Attention& attn, int layer, Recompute mode) {
  const int64_t C = d.C, qd = int64_t(d.Hq) * d.hd, kvd = int64_t(d.Hkv) * d.hd, F = d.F;
  if (mode == Recompute::full) {
    // The layer's output is not needed again (the next layer's input is kept): dtmp takes it
    // before backward first writes there.
    block_forward(ops, d, w, a, s.dtmp, T, rope, attn, layer);
  } else if (mode == Recompute::selective) {
    norm_forward(ops, d, a.xn1, a.mean1, a.rstd1, a.x_in, w.attn_norm, w.attn_norm_b, T, C);
    norm_forward(ops, d, a.xn2, a.mean2, a.rstd2, a.h, w.mlp_norm, w.mlp_norm_b, T, C);
    mlp_act_forward(ops, d, a, T * F);
  }
  // MLP branch: dx holds d(out) = d(h) through the residual, plus what flows through the MLP.
  const CAct dmlp = layer_scale_backward(ops, s, w.ls2, gw.ls2, dx, a.g, w.w2, w.b2, T, F, C);
  ops.linear_backward(s.dg, gw.w2, gw.b2, dmlp, a.g, w.w2, T, F, C, false);
  if (d.mlp == MlpKind::swiglu) {
    ops.swiglu_backward(s.da, s.db, s.dg, a.a, a.b, T * F);
    ops.linear_backward(s.dxn, gw.w1, nullptr, s.da, a.xn2, w.w1, T, C, F, false);
    ops.linear_backward(s.dxn, gw.w3, nullptr, s.db, a.xn2, w.w3, T, C, F, true);
  } else {
    ops.gelu_backward(s.da, s.dg, a.a, T * F, d.act);
    ops.linear_backward(s.dxn, gw.w1, gw.b1, s.da, a.xn2, w.w1, T, C, F, false);
  }
  norm_backward(ops, d, s.dtmp, gw.mlp_norm, gw.mlp_norm_b, s.dxn, a.h, w.mlp_norm, a.mean2, a.rstd2, T, C);
  ops.add_inplace(dx, s.dtmp, T * C);  // dx = d(h)

  // Attention branch.
  const CAct dproj = layer_scale_backward(ops, s, w.ls1, gw.ls1, dx, a.att, w.wo, w.bo, T, qd, C);
  ops.linear_backward(s.datt, gw.wo, gw.bo, dproj, a.att, w.wo, T, qd, C, false);
  attn.backward(layer, s.dq, s.dk, s.dv, s.datt, a.att, a.lse, a.q, a.k, a.v, d.attn());
  if (d.rope_on) {
    rope_apply(ops, s.dq, T, d.Hq, d, rope, true);
    rope_apply(ops, s.dk, T, d.Hkv, d, rope, true);
  }
  // The biases are added before RoPE (and the q/k norms), so their gradients are those of the
  // projections' outputs. With qk_norm, datt (free once attention's backward has read it; at
  // least Hkv·hd wide) takes d(qp), then d(kp).
  if (d.qk_norm) {
    const int g = d.qk_norm_heads;
    ops.rmsnorm_backward(s.datt, gw.q_norm, s.dq, a.qp, w.q_norm, a.rstd_q, T * d.Hq / g, int64_t(d.hd) * g);
    ops.linear_backward(s.dxn, gw.wq, gw.bq, s.datt, a.xn1, w.wq, T, C, qd, false);
    ops.rmsnorm_backward(s.datt, gw.k_norm, s.dk, a.kp, w.k_norm, a.rstd_k, T * d.Hkv / g, int64_t(d.hd) * g);
    ops.linear_backward(s.dxn, gw.wk, gw.bk, s.datt, a.xn1, w.wk, T, C, kvd, true);
  } else {
    ops.linear_backward(s.dxn, gw.wq, gw.bq, s.dq, a.xn1, w.wq, T, C, qd, false);
    ops.linear_backward(s.dxn, gw.wk, gw.bk, s.dk, a.xn1, w.wk, T, C, kvd, true);
  }
  ops.linear_backward(s.dxn, gw.wv, gw.bv, s.dv, a.xn1, w.wv, T, C, kvd, true);
  norm_backward(ops, d, s.dtmp, gw.attn_norm, gw.attn_norm_b, s.dxn, a.x_in, w.attn_norm, a.mean1, a.rstd1, T, C);
  ops.add_inplace(dx, s.dtmp, T * C);  // dx = d(x_in)
}

}  // namespace dhp
