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
  DHP_CHECK(!t.learned_positions || v.pos_grid() > 0,
            "model.vision.image_size ({}) gives no position grid at patch {}", v.image_size, v.patch);
  dims_ = BlockDims{v.dim, v.heads, v.heads, v.head_dim(), v.ffn, t.rope_theta > 0 ? t.rope_theta : cfg.rope_theta,
                    t.norm_eps > 0 ? t.norm_eps : float(v.norm_eps)};
  dims_.norm = t.norm;
  dims_.mlp = t.mlp;
  dims_.act = gelu_kind(v.act);
  dims_.rope_on = t.rope != TowerRope::none;
  dims_.qk_norm = t.qk_norm;
  dims_.qk_norm_heads = v.heads;  // the whole width
  if (t.rope == TowerRope::grid_halves) {
    // Rows over the first hd/4 pairs, columns over the next, each at its own frequencies.
    dims_.rope.mrope_section[1] = dims_.rope.mrope_section[2] = v.head_dim() / 4;
    dims_.rope.mrope_interleaved = false;
    dims_.rope.mrope_restart = true;
  }
  acts_.resize(size_t(layers_run_));
  deep_.resize(v.deepstack.size());
}

VisionPath::Projector VisionPath::carve_projector(Carver& c, int64_t N, Act in, Act out) {
  const int64_t H = cfg_.vision.projector_hidden(cfg_.dim);
  const DType dt = ops_.dtype();
  return Projector{in, c.take(N * H, dt), c.take(N * H, dt), out};
}

void VisionPath::carve(Carver& c, int64_t P, int64_t S, int64_t N, bool backward,
                       bool encoder_grads, Recompute mode) {
  const auto& v = cfg_.vision;
  const TowerTraits& t = v.traits();
  const int64_t dv = v.dim, d = cfg_.dim, md = v.merged_dim(), H = v.projector_hidden(d);
  const int64_t sets = v.image_sets();
  const int64_t rows = t.own_stream() ? S : P;  // the encoder stream
  const DType dt = ops_.dtype();
  patches_ = c.take(P * v.embed_numel(), dt);
  if (t.temporal_patch > 1) frame_ = c.take(P * v.embed_numel(), dt);  // up to every image a pair
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
  merged_ = c.take(N * md, dt);
  if (t.projector_norm) {
    proj_normed_ = c.take(N * md, dt);
    proj_mean_ = c.take<float>(N);
    proj_rstd_ = c.take<float>(N);
  }
  tokens_ = c.take(N * sets * d, dt);
  proj_ = carve_projector(c, N, t.projector_norm ? proj_normed_ : merged_, sets > 1 ? c.take(N * d, dt) : tokens_);
  for (Deepstack& ds : deep_) {
    ds.merged = c.take(N * md, dt);
    ds.mean = c.take<float>(N);
    ds.rstd = c.take<float>(N);
    ds.proj = carve_projector(c, N, c.take(N * md, dt), c.take(N * d, dt));
  }
  if (!backward) return;
  dtokens_ = c.take(N * sets * d, dt);
  dg1_ = c.take(N * H, dt);
  if (sets > 1) dset_ = c.take(N * d, dt);
  // A LayerNorm before a projector (DeepStack's, projector_norm) passes a gradient back whether
  // or not the encoder trains.
  const bool norms = !deep_.empty() || t.projector_norm;
  if (norms) dnormed_ = c.take(N * md, dt);
  if (!encoder_grads && !norms) return;
  dmerged_ = c.take(N * md, dt);
  if (!encoder_grads) return;
  scratch_ = carve_block_scratch(c, dims_, rows, dt);
  dx_ = c.take(rows * dv, dt);
  if (!deep_.empty()) ddeep_ = c.take(P * dv, dt);
  // d(features): its own rows where class rows are dropped, else the top's gradient in place
  // (the final norm's output, free in backward; or the stream's gradient itself).
  if (t.class_row) dfeat_ = c.take(P * dv, dt);
  else dfeat_ = t.final_norm ? normed_ : dx_;
  if (t.pre_norm) dembed_ = c.take(rows * dv, dt);
}

Act VisionPath::top() const { return cfg_.vision.traits().final_norm ? normed_ : x_final_; }

Act VisionPath::features() const { return cfg_.vision.traits().class_row ? feat_ : top(); }

namespace {
// Where the tower's RoPE reads each row's grid position (its row's TowerRope).
RopePos tower_rope(const TowerTraits& t, const DeviceBatch& b) {
  if (t.rope == TowerRope::grid_halves) return RopePos{b.patch_rope, nullptr, nullptr};
  return RopePos{nullptr, b.patch_row, b.patch_col};
}
}  // namespace

void VisionPath::encode(const ModelWeights& p, const DeviceBatch& b) {
  const auto& v = cfg_.vision;
  const TowerTraits& t = v.traits();
  const int64_t dv = v.dim, en = v.embed_numel(), P = b.P;
  const int64_t rows = t.own_stream() ? b.S : P;
  const int g0 = v.pos_grid();
  // The embeddings: the patches' (scattered into the stream around the class rows), plus the
  // learned positions and class rows, then the pre-norm.
  const Act emb = t.pre_norm ? embed_ : stream(0);
  if (t.class_row) {
    ops_.linear_forward(patch_emb_, patches_, p.patch_embed_w, p.patch_embed_b, P, en, dv);
    ops_.scatter_rows(emb, patch_emb_, b.stream_patch, rows, dv);
  } else {
    ops_.linear_forward(emb, patches_, p.patch_embed_w, p.patch_embed_b, P, en, dv);
  }
  if (t.learned_positions)
    ops_.vision_embed_forward(emb, p.pos_embed, p.class_embed, b.pos_images, b.n_images, dv, g0, g0,
                              pos_resize(t.position_resize));
  if (t.pre_norm)
    ops_.layernorm_forward(stream(0), pre_mean_, pre_rstd_, embed_, p.pre_norm_w, p.pre_norm_b, rows, dv,
                           dims_.eps);
  attn_.prepare(t.own_stream() ? b.stream_meta() : b.vision_meta(), rows);
  const RopePos rope = tower_rope(t, b);
  for (int l = 0; l < layers_run_; ++l)
    block_forward(ops_, dims_, p.vision_layers[l], acts_[l], stream(l + 1), rows, rope, attn_, l);
  if (t.final_norm)
    norm_forward(ops_, dims_, normed_, norm_mean_, norm_rstd_, x_final_, p.vision_norm, p.vision_norm_b,
                 rows, dv);
  // hidden_states[feature_layer] without the class rows.
  if (t.class_row) ops_.gather_rows(feat_, top(), b.stream_patch, rows, dv);
}

void VisionPath::projector_forward(CAct fc1_w, CAct fc1_b, CAct fc2_w, CAct fc2_b, const Projector& p,
                                   int64_t N) {
  const auto& v = cfg_.vision;
  const int64_t d = cfg_.dim, H = v.projector_hidden(d);
  ops_.linear_forward(p.f1, p.in, fc1_w, fc1_b, N, v.merged_dim(), H);
  ops_.gelu_forward(p.g1, p.f1, N * H, gelu_kind(v.projector_gelu()));
  ops_.linear_forward(p.out, p.g1, fc2_w, fc2_b, N, H, d);
}

void VisionPath::projector_backward(CAct fc1_w, CAct fc2_w, float* g_fc1_w, float* g_fc1_b, float* g_fc2_w,
                                    float* g_fc2_b, const Projector& p, CAct dout, Act din, int64_t N) {
  const auto& v = cfg_.vision;
  const int64_t d = cfg_.dim, H = v.projector_hidden(d);
  ops_.linear_backward(dg1_, g_fc2_w, g_fc2_b, dout, p.g1, fc2_w, N, H, d, false);
  ops_.gelu_backward(dg1_, dg1_, p.f1, N * H, gelu_kind(v.projector_gelu()));
  ops_.linear_backward(din, g_fc1_w, g_fc1_b, dg1_, p.in, fc1_w, N, v.merged_dim(), H, false);
}

void VisionPath::forward(const ModelWeights& p, const DeviceBatch& b) {
  const auto& v = cfg_.vision;
  const int64_t dv = v.dim, d = cfg_.dim, m = v.merge, pn = v.patch_numel(), md = v.merged_dim();
  const int64_t P = b.P, N = b.N;
  if (P == 0) return;
  // The batch's 8-bit pixels become the encoder's input here, on the device; a patch over
  // several frames repeats an image's one, or takes a frame pair's two.
  const int frames = v.traits().temporal_patch;
  if (frames > 1) {
    ops_.normalize_pixels(frame_, b.pixels, b.pixel_rows * pn, pixel_norm(v));
    ops_.scatter_rows(patches_, frame_, b.frame_dup, frames * P, pn);
  } else {
    ops_.normalize_pixels(patches_, b.pixels, P * pn, pixel_norm(v));
  }
  encode(p, b);
  ops_.patch_merge_forward(merged_, features(), b.merge, b.n_images, dv, int(m));
  if (v.traits().projector_norm)
    ops_.layernorm_forward(proj_normed_, proj_mean_, proj_rstd_, merged_, p.proj_norm_w, p.proj_norm_b, N, md,
                           v.traits().projector_norm_eps);
  projector_forward(p.fc1_w, p.fc1_b, p.fc2_w, p.fc2_b, proj_, N);
  for (size_t j = 0; j < deep_.size(); ++j) {
    const Deepstack& ds = deep_[j];
    const auto& w = p.deepstack[j];
    ops_.patch_merge_forward(ds.merged, stream(v.deepstack[j] + 1), b.merge, b.n_images, dv, int(m));
    ops_.layernorm_forward(ds.proj.in, ds.mean, ds.rstd, ds.merged, w.norm_w, w.norm_b, N, md, dims_.eps);
    projector_forward(w.fc1_w, w.fc1_b, w.fc2_w, w.fc2_b, ds.proj, N);
  }
  // One row of every set per merged token (DeviceBatch::stack_slot).
  if (!deep_.empty()) {
    ops_.gather_rows(tokens_, proj_.out, b.stack_slot, N, d);
    for (size_t j = 0; j < deep_.size(); ++j)
      ops_.gather_rows(tokens_, deep_[j].proj.out, b.stack_slot + (j + 1) * N, N, d);
  }
}

void VisionPath::deepstack_backward(const ModelWeights& p, const ModelParams& g, const DeviceBatch& b, size_t j,
                                    bool encoder) {
  const auto& v = cfg_.vision;
  const int64_t N = b.N, d = cfg_.dim, md = v.merged_dim();
  const Deepstack& ds = deep_[j];
  const auto& w = p.deepstack[j];
  const auto& gw = g.deepstack[j];
  ops_.scatter_rows(dset_, dtokens_, b.stack_slot + (j + 1) * N, N, d);
  projector_backward(w.fc1_w, w.fc2_w, gw.fc1_w, gw.fc1_b, gw.fc2_w, gw.fc2_b, ds.proj, dset_, dnormed_, N);
  ops_.layernorm_backward(dmerged_, gw.norm_w, gw.norm_b, dnormed_, ds.merged, w.norm_w, ds.mean, ds.rstd, N, md);
  if (encoder) ops_.patch_merge_backward(ddeep_, dmerged_, b.merge, b.n_images, v.dim, int(v.merge));
}

void VisionPath::encode_backward(const ModelWeights& p, const ModelParams& g, const DeviceBatch& b) {
  const auto& v = cfg_.vision;
  const TowerTraits& t = v.traits();
  const int64_t dv = v.dim, en = v.embed_numel(), P = b.P;
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
  const RopePos rope = tower_rope(t, b);
  for (int l = layers_run_ - 1; l >= 0; --l) {
    // A DeepStack merger read this layer's output: its gradient joins the stream's.
    for (size_t j = 0; j < deep_.size(); ++j) {
      if (v.deepstack[j] != l) continue;
      deepstack_backward(p, g, b, j, true);
      ops_.add_inplace(dx_, ddeep_, P * dv);
    }
    block_backward(ops_, dims_, p.vision_layers[l], g.vision_layers[l], acts_[l], scratch_, dx_, rows, rope,
                   attn_, l, mode_);
  }
  Act demb = dx_;  // d(embeddings)
  if (t.pre_norm) {
    ops_.layernorm_backward(dembed_, g.pre_norm_w, g.pre_norm_b, dx_, embed_, p.pre_norm_w, pre_mean_,
                            pre_rstd_, rows, dv);
    demb = dembed_;
  }
  if (t.learned_positions)
    ops_.vision_embed_backward(g.pos_embed, g.class_embed, demb, b.pos_images, b.n_images, dv, g0, g0,
                               pos_resize(t.position_resize));
  Act dpatch = demb;  // d(patch embedding)
  if (t.class_row) {
    ops_.gather_rows(dfeat_, demb, b.stream_patch, rows, dv);
    dpatch = dfeat_;
  }
  ops_.linear_backward(nullptr, g.patch_embed_w, g.patch_embed_b, dpatch, patches_, p.patch_embed_w, P, en,
                       dv, false);
}

void VisionPath::backward(const ModelWeights& p, const ModelParams& g, const DeviceBatch& b) {
  const auto& v = cfg_.vision;
  const int64_t dv = v.dim, d = cfg_.dim, m = v.merge;
  const int64_t P = b.P, N = b.N;
  if (P == 0) return;
  // A frozen encoder (null gradients) needs nothing below the projectors' first layers (and
  // the DeepStack mergers' norms).
  const bool encoder = g.patch_embed_w != nullptr;
  CAct dout = dtokens_;
  if (!deep_.empty()) {
    ops_.scatter_rows(dset_, dtokens_, b.stack_slot, N, d);
    dout = dset_;
  }
  const bool norm = v.traits().projector_norm;
  projector_backward(p.fc1_w, p.fc2_w, g.fc1_w, g.fc1_b, g.fc2_w, g.fc2_b, proj_, dout,
                     norm ? dnormed_ : encoder ? dmerged_ : Act(), N);
  if (norm)
    ops_.layernorm_backward(dmerged_, g.proj_norm_w, g.proj_norm_b, dnormed_, merged_, p.proj_norm_w, proj_mean_,
                            proj_rstd_, N, v.merged_dim());
  if (!encoder) {
    for (size_t j = 0; j < deep_.size(); ++j) deepstack_backward(p, g, b, j, false);
    return;
  }
  ops_.patch_merge_backward(dfeat_, dmerged_, b.merge, b.n_images, dv, int(m));
  encode_backward(p, g, b);
}

}  // namespace dhp
