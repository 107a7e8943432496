#include "model/vision.h"

#include "core/check.h"

namespace dhp {

PixelNorm pixel_norm(const VisionConfig& v) {
  PixelNorm n;
  for (int c = 0; c < 3; ++c) {
    n.mean[c] = float(v.pixel_mean[size_t(c)]);
    n.std[c] = float(v.pixel_std[size_t(c)]);
  }
  return n;
}

GeluKind gelu_kind(VisionAct a) {
  switch (a) {
    case VisionAct::gelu_tanh: return GeluKind::Tanh;
    case VisionAct::gelu: return GeluKind::Erf;
    case VisionAct::quick_gelu: return GeluKind::Quick;
  }
  return GeluKind::Tanh;
}

PosResize pos_resize(PositionResize r) {
  return r == PositionResize::bilinear_corners ? PosResize::bilinear_corners : PosResize::bicubic;
}

GeluKind gelu_kind(ProjectorAct a) {
  switch (a) {
    case ProjectorAct::gelu: return GeluKind::Erf;
    case ProjectorAct::quick_gelu: return GeluKind::Quick;
    case ProjectorAct::automatic:
    case ProjectorAct::gelu_tanh: return GeluKind::Tanh;
  }
  return GeluKind::Tanh;
}

VisionPath::VisionPath(const ModelConfig& cfg, const Ops& ops)
    : cfg_(cfg), ops_(ops), layers_run_(cfg.vision.layers_run()), attn_(ops) {
  const auto& v = cfg.vision;
  const TowerTraits& t = v.traits();
  DHP_CHECK(layers_run_ >= 0 && layers_run_ <= v.layers,
            "model.vision.feature_layer = {} names no hidden state of a {}-layer tower",
            v.feature_layer, v.layers);
  DHP_CHECK(t.positions != TowerPositions::learned || v.pos_grid() > 0,
            "model.vision.image_size ({}) gives no position grid at patch {}", v.image_size, v.patch);
  dims_ = BlockDims{v.dim, v.heads, v.heads, v.head_dim(), v.ffn, cfg.rope_theta,
                    t.norm_eps > 0 ? t.norm_eps : float(v.norm_eps)};
  dims_.norm = t.norm;
  dims_.mlp = t.mlp;
  dims_.act = gelu_kind(v.act);
  dims_.rope_on = t.positions == TowerPositions::rope2d;
  acts_.resize(size_t(layers_run_));
}

void VisionPath::carve(Carver& c, int64_t P, int64_t S, int64_t N, bool backward,
                       bool encoder_grads, Recompute mode) {
  const auto& v = cfg_.vision;
  const TowerTraits& t = v.traits();
  const int64_t dv = v.dim, d = cfg_.dim, m = v.merge;
  const int64_t rows = t.own_stream() ? S : P;  // the encoder stream
  const DType dt = ops_.dtype();
  patches_ = c.take(P * v.patch_numel(), dt);
  mode_ = mode;
  if (t.class_row) patch_emb_ = c.take(P * dv, dt);
  if (t.pre_norm) {
    embed_ = c.take(rows * dv, dt);
    pre_mean_ = c.take<float>(rows);
    pre_rstd_ = c.take<float>(rows);
  }
  rebuilt_ = carve_block_rebuilt(c, dims_, rows, dt, mode);
  for (auto& a : acts_) a = carve_block_acts(c, dims_, rows, dt, mode, rebuilt_);
  x_final_ = c.take(rows * dv, dt);
  if (t.final_norm) {
    normed_ = c.take(rows * dv, dt);
    norm_rstd_ = c.take<float>(rows);
    if (t.norm == NormKind::layer) norm_mean_ = c.take<float>(rows);
  }
  if (t.class_row) feat_ = c.take(P * dv, dt);
  merged_ = c.take(N * m * m * dv, dt);
  f1_ = c.take(N * d, dt);
  g1_ = c.take(N * d, dt);
  tokens_ = c.take(N * d, dt);
  if (!backward) return;
  dtokens_ = c.take(N * d, dt);
  dg1_ = c.take(N * d, dt);
  if (!encoder_grads) return;
  scratch_ = carve_block_scratch(c, dims_, rows, dt);
  dx_ = c.take(rows * dv, dt);
  dmerged_ = c.take(N * m * m * dv, dt);
  // d(features): its own rows where class rows are dropped, else the top's gradient in place
  // (the final norm's output, free in backward; or the stream's gradient itself).
  if (t.class_row) dfeat_ = c.take(P * dv, dt);
  else dfeat_ = t.final_norm ? normed_ : dx_;
  if (t.pre_norm) dembed_ = c.take(rows * dv, dt);
}

Act VisionPath::top() const { return cfg_.vision.traits().final_norm ? normed_ : x_final_; }

Act VisionPath::features() const { return cfg_.vision.traits().class_row ? feat_ : top(); }

void VisionPath::encode(const ModelWeights& p, const DeviceBatch& b) {
  const auto& v = cfg_.vision;
  const TowerTraits& t = v.traits();
  const int64_t dv = v.dim, pn = v.patch_numel(), P = b.P;
  const int64_t rows = t.own_stream() ? b.S : P;
  const int g0 = v.pos_grid();
  // The embeddings: the patches' (scattered into the stream around the class rows), plus the
  // learned positions and class rows, then the pre-norm.
  const Act emb = t.pre_norm ? embed_ : stream(0);
  if (t.class_row) {
    ops_.linear_forward(patch_emb_, patches_, p.patch_embed_w, p.patch_embed_b, P, pn, dv);
    ops_.scatter_rows(emb, patch_emb_, b.stream_patch, rows, dv);
  } else {
    ops_.linear_forward(emb, patches_, p.patch_embed_w, p.patch_embed_b, P, pn, dv);
  }
  if (t.positions == TowerPositions::learned)
    ops_.vision_embed_forward(emb, p.pos_embed, p.class_embed, b.pos_images, b.n_images, dv, g0, g0,
                              pos_resize(t.position_resize));
  if (t.pre_norm)
    ops_.layernorm_forward(stream(0), pre_mean_, pre_rstd_, embed_, p.pre_norm_w, p.pre_norm_b, rows, dv,
                           dims_.eps);
  attn_.prepare(t.own_stream() ? b.stream_meta() : b.vision_meta(), rows);
  const RopePos rope{nullptr, b.patch_row, b.patch_col};
  for (int l = 0; l < layers_run_; ++l)
    block_forward(ops_, dims_, p.vision_layers[l], acts_[l], stream(l + 1), rows, rope, attn_, l);
  if (t.final_norm)
    norm_forward(ops_, dims_, normed_, norm_mean_, norm_rstd_, x_final_, p.vision_norm, p.vision_norm_b,
                 rows, dv);
  // hidden_states[feature_layer] without the class rows.
  if (t.class_row) ops_.gather_rows(feat_, top(), b.stream_patch, rows, dv);
}

void VisionPath::forward(const ModelWeights& p, const DeviceBatch& b) {
  const auto& v = cfg_.vision;
  const int64_t dv = v.dim, d = cfg_.dim, m = v.merge, pn = v.patch_numel();
  const int64_t P = b.P, N = b.N;
  if (P == 0) return;
  // The batch's 8-bit pixels become the encoder's input here, on the device.
  ops_.normalize_pixels(patches_, b.pixels, P * pn, pixel_norm(v));
  encode(p, b);
  ops_.patch_merge_forward(merged_, features(), b.merge, b.n_images, dv, int(m));
  ops_.linear_forward(f1_, merged_, p.fc1_w, p.fc1_b, N, m * m * dv, d);
  ops_.gelu_forward(g1_, f1_, N * d, gelu_kind(v.projector_gelu()));
  ops_.linear_forward(tokens_, g1_, p.fc2_w, p.fc2_b, N, d, d);
}

void VisionPath::encode_backward(const ModelWeights& p, const ModelParams& g, const DeviceBatch& b) {
  const auto& v = cfg_.vision;
  const TowerTraits& t = v.traits();
  const int64_t dv = v.dim, pn = v.patch_numel(), P = b.P;
  const int64_t rows = t.own_stream() ? b.S : P;
  const int g0 = v.pos_grid();
  // d(top): the class rows were dropped from the features, so their gradient starts at zero.
  const Act dtop = t.final_norm ? normed_ : dx_;
  if (t.class_row) {
    ops_.fill(dtop, 0.0f, rows * dv);
    ops_.scatter_rows(dtop, dfeat_, b.stream_patch, rows, dv);
  }
  if (t.final_norm)
    norm_backward(ops_, dims_, dx_, g.vision_norm, g.vision_norm_b, dtop, x_final_, p.vision_norm, norm_mean_,
                  norm_rstd_, rows, dv);
  const RopePos rope{nullptr, b.patch_row, b.patch_col};
  for (int l = layers_run_ - 1; l >= 0; --l)
    block_backward(ops_, dims_, p.vision_layers[l], g.vision_layers[l], acts_[l], scratch_, dx_, rows, rope,
                   attn_, l, mode_);
  Act demb = dx_;  // d(embeddings)
  if (t.pre_norm) {
    ops_.layernorm_backward(dembed_, g.pre_norm_w, g.pre_norm_b, dx_, embed_, p.pre_norm_w, pre_mean_,
                            pre_rstd_, rows, dv);
    demb = dembed_;
  }
  if (t.positions == TowerPositions::learned)
    ops_.vision_embed_backward(g.pos_embed, g.class_embed, demb, b.pos_images, b.n_images, dv, g0, g0,
                               pos_resize(t.position_resize));
  Act dpatch = demb;  // d(patch embedding)
  if (t.class_row) {
    ops_.gather_rows(dfeat_, demb, b.stream_patch, rows, dv);
    dpatch = dfeat_;
  }
  ops_.linear_backward(nullptr, g.patch_embed_w, g.patch_embed_b, dpatch, patches_, p.patch_embed_w, P, pn,
                       dv, false);
}

void VisionPath::backward(const ModelWeights& p, const ModelParams& g, const DeviceBatch& b) {
  const auto& v = cfg_.vision;
  const int64_t dv = v.dim, d = cfg_.dim, m = v.merge;
  const int64_t P = b.P, N = b.N;
  if (P == 0) return;
  // A frozen encoder (null gradients) needs nothing below the projector's first layer.
  const bool encoder = g.patch_embed_w != nullptr;
  ops_.linear_backward(dg1_, g.fc2_w, g.fc2_b, dtokens_, g1_, p.fc2_w, N, d, d, false);
  ops_.gelu_backward(dg1_, dg1_, f1_, N * d, gelu_kind(v.projector_gelu()));
  ops_.linear_backward(encoder ? dmerged_ : Act(), g.fc1_w, g.fc1_b, dg1_, merged_, p.fc1_w, N,
                       m * m * dv, d, false);
  if (!encoder) return;
  ops_.patch_merge_backward(dfeat_, dmerged_, b.merge, b.n_images, dv, int(m));
  encode_backward(p, g, b);
}

}  // namespace dhp
