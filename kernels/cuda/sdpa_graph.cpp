#include "kernels/cuda/sdpa_graph.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>

#include "core/check.h"

namespace dhp::cuda::sdpa {

std::string ShapeClass::name() const {
  return fmt::format("{} {} hd{} heads {}/{} {} batch {} q {} k {}",
                     pass == Pass::forward ? "fwd" : "bwd", io == CUDNN_DATA_HALF ? "fp16" : "bf16",
                     hd, Hq, Hkv, causal ? "causal" : "full", batch, sq, skv);
}

size_t ShapeClassHash::operator()(const ShapeClass& c) const {
  size_t h = 0;
  auto mix = [&](int64_t v) { h = h * 1000003u ^ std::hash<int64_t>()(v); };
  for (int64_t v : {int64_t(c.pass), int64_t(c.io), int64_t(c.hd), int64_t(c.Hq), int64_t(c.Hkv),
                    int64_t(c.causal), c.batch, c.sq, c.skv})
    mix(v);
  return h;
}

int64_t bucket(int64_t n, int64_t floor) {
  int64_t b = std::max<int64_t>(1, floor);
  while (b < n) b *= 2;
  return b;
}

ShapeClass shape_class(Pass pass, cudnnDataType_t io, const AttnShape& s, const AttnPartition& p) {
  DHP_ASSERT(p.ok);
  // Lengths bucket from 64 tokens (a tile of the engines), entries from 1: a pack of 3 or 4
  // documents of up to 1,000 tokens is one class.
  return ShapeClass{pass,
                    io,
                    s.hd,
                    s.Hq,
                    s.Hkv,
                    p.causal,
                    bucket(int64_t(p.segs.size()), 1),
                    bucket(p.max_q, 64),
                    bucket(p.max_k, 64)};
}

const Tensor& Graph::tensor(int64_t uid) const {
  for (const Tensor& t : tensors)
    if (t.uid == uid) return t;
  throw Error(fmt::format("sdpa graph: no tensor {}", uid));
}

std::vector<int64_t> Graph::bound() const {
  std::vector<int64_t> out;
  for (const Tensor& t : tensors)
    if (!t.is_virtual) out.push_back(t.uid);
  return out;
}

namespace {

using Dims = std::array<int64_t, 4>;

// Builds one graph: tensors by role, ops in order.
class Builder {
 public:
  explicit Builder(const ShapeClass& c)
      : c_(c), B_(c.batch), H_(c.Hq), G_(c.Hkv), D_(c.hd), Sq_(c.sq), Sk_(c.skv) {}

  Graph take() { return std::move(g_); }

  int64_t bind(int64_t uid, Dims dims, Dims strides, cudnnDataType_t type, int64_t ragged = 0) {
    g_.tensors.push_back(Tensor{uid, dims, strides, type, false, false, ragged});
    return uid;
  }
  int64_t scalar(int64_t uid, cudnnDataType_t type = CUDNN_DATA_FLOAT) {
    g_.tensors.push_back(Tensor{uid, {1, 1, 1, 1}, {1, 1, 1, 1}, type, false, true, 0});
    return uid;
  }
  int64_t virt(Dims dims, Dims strides, cudnnDataType_t type = CUDNN_DATA_FLOAT, int64_t ragged = 0) {
    const int64_t uid = next_virtual_++;
    g_.tensors.push_back(Tensor{uid, dims, strides, type, true, false, ragged});
    return uid;
  }

  // Packed tokens (T, heads, D) as [B, heads, S, D]; `transposed`: as [B, heads, D, S].
  Dims tokens_dims(int64_t heads, int64_t S, bool transposed = false) const {
    return transposed ? Dims{B_, heads, D_, S} : Dims{B_, heads, S, D_};
  }
  Dims tokens_strides(int64_t heads, int64_t S, bool transposed = false) const {
    return transposed ? Dims{S * heads * D_, D_, 1, heads * D_} : Dims{S * heads * D_, D_, heads * D_, 1};
  }
  // (T, Hq) statistics as [B, Hq, Sq, 1].
  Dims stats_dims() const { return {B_, H_, Sq_, 1}; }
  Dims stats_strides() const { return {Sq_ * H_, 1, H_, 1}; }
  // Scores [B, Hq, Sq, Sk] and row reductions [B, Hq, Sq, 1], virtual.
  int64_t scores(cudnnDataType_t type = CUDNN_DATA_FLOAT) {
    return virt({B_, H_, Sq_, Sk_}, {H_ * Sq_ * Sk_, Sq_ * Sk_, Sk_, 1}, type);
  }
  int64_t rows() { return virt({B_, H_, Sq_, 1}, {H_ * Sq_, Sq_, 1, 1}); }
  // The scores transposed, [B, Hq, Sk, Sq], as the A operand of the dV and dK products.
  int64_t scores_t(cudnnDataType_t type) {
    return virt({B_, H_, Sk_, Sq_}, {H_ * Sq_ * Sk_, Sq_ * Sk_, 1, Sk_}, type);
  }

  int64_t pointwise(cudnnPointwiseMode_t mode, int64_t x, int64_t b, int64_t y,
                    cudnnDataType_t prec = CUDNN_DATA_FLOAT, int64_t t = 0, int64_t axis = -1) {
    Op op;
    op.kind = OpKind::pointwise;
    op.mode = mode, op.prec = prec, op.x = x, op.b = b, op.t = t, op.y = y, op.axis = axis;
    g_.ops.push_back(op);
    return y;
  }
  int64_t matmul(int64_t a, int64_t b, int64_t c, int64_t m, int64_t n, int64_t k) {
    Op op;
    op.kind = OpKind::matmul;
    op.x = a, op.b = b, op.y = c, op.m_override = m, op.n_override = n, op.k_override = k;
    g_.ops.push_back(op);
    return c;
  }
  int64_t reduction(cudnnReduceTensorOp_t r, int64_t x, int64_t y) {
    Op op;
    op.kind = OpKind::reduction;
    op.reduce = r, op.x = x, op.y = y;
    g_.ops.push_back(op);
    return y;
  }
  int64_t reshape(int64_t x, int64_t y) {
    Op op;
    op.kind = OpKind::reshape;
    op.x = x, op.y = y;
    g_.ops.push_back(op);
    return y;
  }

  // Scores outside an entry's lengths become -inf: the padding mask that per-entry lengths of
  // packed (ragged) tensors need.
  int64_t padding_mask(int64_t s) {
    const int64_t ri = int_scores(), ci = int_scores();
    pointwise(CUDNN_POINTWISE_GEN_INDEX, s, 0, ri, CUDNN_DATA_INT32, 0, 2);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, s, 0, ci, CUDNN_DATA_INT32, 0, 3);
    const int64_t rok = bool_scores(), cok = bool_scores(), keep = bool_scores();
    pointwise(CUDNN_POINTWISE_CMP_LT, ri, kSeqQ, rok, CUDNN_DATA_BOOLEAN);
    pointwise(CUDNN_POINTWISE_CMP_LT, ci, kSeqKV, cok, CUDNN_DATA_BOOLEAN);
    pointwise(CUDNN_POINTWISE_LOGICAL_AND, rok, cok, keep, CUDNN_DATA_BOOLEAN);
    return pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, neg_inf(), scores(), CUDNN_DATA_FLOAT, keep);
  }
  // Scores above the diagonal (key index > query index within an entry) become -inf: causal,
  // top-left aligned (an entry's queries and keys are the same positions).
  int64_t causal_mask(int64_t s) {
    const int64_t ri = int_scores(), ci = int_scores(), keep = bool_scores();
    pointwise(CUDNN_POINTWISE_GEN_INDEX, s, 0, ri, CUDNN_DATA_INT32, 0, 2);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, s, 0, ci, CUDNN_DATA_INT32, 0, 3);
    pointwise(CUDNN_POINTWISE_CMP_GE, ri, ci, keep, CUDNN_DATA_BOOLEAN);
    return pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, neg_inf(), scores(), CUDNN_DATA_FLOAT, keep);
  }

  // The user tensors both passes share.
  void bind_common() {
    bind(kQ, tokens_dims(H_, Sq_), tokens_strides(H_, Sq_), c_.io, kOffQ);
    bind(kK, tokens_dims(G_, Sk_, true), tokens_strides(G_, Sk_, true), c_.io, kOffK);
    bind(kO, tokens_dims(H_, Sq_), tokens_strides(H_, Sq_), c_.io, kOffQ);
    bind(kStats, stats_dims(), stats_strides(), CUDNN_DATA_FLOAT, kOffStats);
    scalar(kScale);
    bind(kSeqQ, {B_, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_INT32);
    bind(kSeqKV, {B_, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_INT32);
    for (int64_t off : {kOffQ, kOffK, kOffStats}) bind(off, {B_ + 1, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_INT64);
  }

  // The masked, scaled scores Q·Kᵀ·scale of both passes; backward subtracts the statistics
  // between the padding and causal masks, as cuDNN's backward pattern has it.
  int64_t masked_scores(bool minus_stats) {
    int64_t s = matmul(kQ, kK, scores(), kSeqQ, kSeqKV, 0);
    s = pointwise(CUDNN_POINTWISE_MUL, s, kScale, scores());
    s = padding_mask(s);
    if (minus_stats) s = pointwise(CUDNN_POINTWISE_SUB, s, kStats, scores());
    if (c_.causal) s = causal_mask(s);
    return s;
  }

  // x [B, Hq, S, D] summed over each kv group's query heads into y [B, Hkv, S, D] (GQA), or
  // the product written into y directly (MHA): returns where the product goes.
  int64_t per_query_head(int64_t y) {
    if (H_ == G_) return y;
    const int64_t full = virt({B_, H_, Sk_, D_}, {H_ * Sk_ * D_, Sk_ * D_, D_, 1}, c_.io);
    pending_reduction_.push_back({full, y});
    return full;
  }
  void flush_reductions() {
    for (const auto& [x, y] : pending_reduction_) reduction(CUDNN_REDUCE_TENSOR_ADD, x, y);
    pending_reduction_.clear();
  }

  const ShapeClass& c_;
  const int64_t B_, H_, G_, D_, Sq_, Sk_;

 private:
  int64_t int_scores() { return scores(CUDNN_DATA_INT32); }
  int64_t bool_scores() { return scores(CUDNN_DATA_BOOLEAN); }
  int64_t neg_inf() { return scalar(kNegInf + n_neg_inf_++); }

  Graph g_;
  int64_t next_virtual_ = kFirstVirtual;
  int n_neg_inf_ = 0;
  std::vector<std::pair<int64_t, int64_t>> pending_reduction_;
};

void check_class(const ShapeClass& c) {
  DHP_CHECK(c.io == CUDNN_DATA_BFLOAT16 || c.io == CUDNN_DATA_HALF,
            "cuDNN attention stores bf16 or fp16 only");
  DHP_CHECK(c.hd > 0 && c.hd % 8 == 0 && c.hd <= 256,
            "cuDNN attention needs a head dimension that is a multiple of 8, at most 256 (got {})", c.hd);
  DHP_CHECK(c.Hkv > 0 && c.Hq % c.Hkv == 0, "cuDNN attention: {} query heads over {} kv heads", c.Hq, c.Hkv);
  DHP_CHECK(c.batch >= 1 && c.sq >= 1 && c.skv >= 1, "cuDNN attention: empty shape class {}", c.name());
}

}  // namespace

Graph forward_graph(const ShapeClass& c) {
  check_class(c);
  Builder g(c);
  g.bind_common();
  g.bind(kV, g.tokens_dims(g.G_, g.Sk_), g.tokens_strides(g.G_, g.Sk_), c.io, kOffK);
  const int64_t s = g.masked_scores(false);
  // Softmax with its statistics: lse = max + log(sum exp(s - max)), natural log, as dhp's.
  const int64_t m = g.reduction(CUDNN_REDUCE_TENSOR_MAX, s, g.rows());
  const int64_t z = g.pointwise(CUDNN_POINTWISE_SUB, s, m, g.scores());
  const int64_t e = g.pointwise(CUDNN_POINTWISE_EXP, z, 0, g.scores());
  const int64_t l = g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, g.rows());
  const int64_t log_l = g.pointwise(CUDNN_POINTWISE_LOG, l, 0, g.rows());
  g.pointwise(CUDNN_POINTWISE_ADD, m, log_l, kStats);
  // The probabilities in the storage type: the second product's A operand must be.
  const int64_t p = g.pointwise(CUDNN_POINTWISE_DIV, e, l, g.scores(c.io));
  g.matmul(p, kV, kO, kSeqQ, 0, kSeqKV);
  return g.take();
}

Graph backward_graph(const ShapeClass& c) {
  check_class(c);
  Builder g(c);
  const int64_t H = g.H_, G = g.G_, D = g.D_, Sq = g.Sq_, Sk = g.Sk_, B = g.B_;
  g.bind_common();
  // V enters only transposed (dP = dO·Vᵀ).
  g.bind(kV, g.tokens_dims(G, Sk, true), g.tokens_strides(G, Sk, true), c.io, kOffK);
  g.bind(kDO, g.tokens_dims(H, Sq), g.tokens_strides(H, Sq), c.io, kOffQ);
  g.bind(kDQ, g.tokens_dims(H, Sq), g.tokens_strides(H, Sq), c.io, kOffQ);
  g.bind(kDK, g.tokens_dims(G, Sk), g.tokens_strides(G, Sk), c.io, kOffK);
  g.bind(kDV, g.tokens_dims(G, Sk), g.tokens_strides(G, Sk), c.io, kOffK);
  g.scalar(kOne);
  // The caller's fp32 scratch, packed like the statistics and like dQ.
  g.bind(kSoftmaxSum, g.stats_dims(), g.stats_strides(), CUDNN_DATA_FLOAT, kOffStats);
  g.bind(kDQAccum, g.tokens_dims(H, Sq), g.tokens_strides(H, Sq), CUDNN_DATA_FLOAT, kOffQ);

  // D = rowsum(dO·O).
  const int64_t t1 = g.pointwise(CUDNN_POINTWISE_MUL, kDO, kO, g.virt({B, H, Sq, D}, {H * Sq * D, Sq * D, H * D, 1}));
  const int64_t t2 = g.reduction(CUDNN_REDUCE_TENSOR_ADD, t1, g.rows());
  g.pointwise(CUDNN_POINTWISE_MUL, t2, kOne, kSoftmaxSum);
  // P = exp(s·scale - lse), recomputed.
  const int64_t p = g.pointwise(CUDNN_POINTWISE_EXP, g.masked_scores(true), 0, g.scores());
  // dV = Pᵀ·dO.
  const int64_t pt = g.reshape(p, g.scores_t(c.io));
  g.matmul(pt, kDO, g.per_query_head(kDV), kSeqKV, 0, kSeqQ);
  g.flush_reductions();
  // dS = P·(dO·Vᵀ - D)·scale.
  const int64_t dp = g.matmul(kDO, kV, g.scores(), kSeqQ, kSeqKV, 0);
  const int64_t u1 = g.pointwise(CUDNN_POINTWISE_SUB, dp, kSoftmaxSum, g.scores());
  const int64_t u2 = g.pointwise(CUDNN_POINTWISE_MUL, u1, p, g.scores());
  const int64_t ds = g.pointwise(CUDNN_POINTWISE_MUL, u2, kScale, g.scores());
  // dK = dSᵀ·Q.
  const int64_t dst = g.reshape(ds, g.scores_t(c.io));
  g.matmul(dst, kQ, g.per_query_head(kDK), kSeqKV, 0, kSeqQ);
  g.flush_reductions();
  // dQ = dS·K, accumulated in fp32, then stored.
  const int64_t kv = g.reshape(kK, g.virt(g.tokens_dims(G, Sk), g.tokens_strides(G, Sk), CUDNN_DATA_FLOAT, kOffK));
  g.matmul(ds, kv, kDQAccum, kSeqQ, 0, kSeqKV);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, kDQAccum, 0, kDQ);
  return g.take();
}

}  // namespace dhp::cuda::sdpa
