#include "model/vision.h"

#include "core/check.h"
#include "kernels/cpu/norm.h"

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
  DHP_CHECK(layers_run_ >= 0 && layers_run_ <= v.layers,
            "model.vision.feature_layer = {} names no hidden state of a {}-layer tower",
            v.feature_layer, v.layers);
  dims_ = BlockDims{v.dim, v.heads, v.heads, v.head_dim(), v.ffn, cfg.rope_theta, cpu::kRmsEps};
  if (v.pretrained()) {
    DHP_CHECK(v.pos_grid() > 0, "model.vision.image_size ({}) gives no position grid at patch {}",
              v.image_size, v.patch);
    dims_.eps = float(v.norm_eps);
    dims_.vit = true;
    dims_.act = gelu_kind(v.act);
  }
  acts_.resize(size_t(layers_run_));
}

void VisionPath::carve(Carver& c, int64_t P, int64_t S, int64_t N, bool backward,
                       bool encoder_grads, Recompute mode) {
  const auto& v = cfg_.vision;
  const int64_t dv = v.dim, d = cfg_.dim, m = v.merge;
  const bool pre = v.pretrained(), cls = v.has_class_row();
  const int64_t rows = pre ? S : P;  // the encoder stream
  const DType t = ops_.dtype();
  patches_ = c.take(P * v.patch_numel(), t);
  mode_ = mode;
  if (cls) {
    xn_ = c.take(P * dv, t);
    embed_ = c.take(S * dv, t);
    pre_mean_ = c.take<float>(S);
    pre_rstd_ = c.take<float>(S);
  }
  rebuilt_ = carve_block_rebuilt(c, dims_, rows, t, mode);
  for (auto& a : acts_) a = carve_block_acts(c, dims_, rows, t, mode, rebuilt_);
  x_final_ = c.take(rows * dv, t);
  if (!pre) {
    xn_ = c.take(P * dv, t);
    rstd_ = c.take<float>(P);
  }
  if (cls) feat_ = c.take(P * dv, t);
  merged_ = c.take(N * m * m * dv, t);
  f1_ = c.take(N * d, t);
  g1_ = c.take(N * d, t);
  tokens_ = c.take(N * d, t);
  if (!backward) return;
  dtokens_ = c.take(N * d, t);
  dg1_ = c.take(N * d, t);
  if (!encoder_grads) return;
  scratch_ = carve_block_scratch(c, dims_, rows, t);
  dx_ = c.take(rows * dv, t);
  dmerged_ = c.take(N * m * m * dv, t);
  if (cls) {
    dfeat_ = c.take(P * dv, t);
    dembed_ = c.take(S * dv, t);
  } else if (pre) {
    dfeat_ = dx_;  // the stream is the patches
  } else {
    dfeat_ = xn_;  // d(xn) of the native tower's final norm
  }
}

Act VisionPath::features() const {
  if (!cfg_.vision.pretrained()) return xn_;
  return cfg_.vision.has_class_row() ? feat_ : x_final_;
}

void VisionPath::encode_native(const ModelWeights& p, const DeviceBatch& b) {
  const auto& v = cfg_.vision;
  const int64_t dv = v.dim, pn = v.patch_numel(), P = b.P;
  ops_.linear_forward(stream(0), patches_, p.patch_embed_w, p.patch_embed_b, P, pn, dv);
  attn_.prepare(b.vision_meta(), P);
  const RopePos rope{nullptr, b.patch_row, b.patch_col};
  for (int l = 0; l < layers_run_; ++l)
    block_forward(ops_, dims_, p.vision_layers[l], acts_[l], stream(l + 1), P, rope, attn_, l);
  ops_.rmsnorm_forward(xn_, rstd_, x_final_, p.vision_norm, P, dv, cpu::kRmsEps);
}

void VisionPath::encode_pretrained(const ModelWeights& p, const DeviceBatch& b) {
  const auto& v = cfg_.vision;
  const int64_t dv = v.dim, pn = v.patch_numel(), P = b.P, S = b.S;
  const int g0 = v.pos_grid();
  if (v.has_class_row()) {
    // Patch embeddings into their stream rows; vision_embed writes the class rows.
    ops_.linear_forward(xn_, patches_, p.patch_embed_w, nullptr, P, pn, dv);
    ops_.scatter_rows(embed_, xn_, b.stream_patch, S, dv);
    ops_.vision_embed_forward(embed_, p.pos_embed, p.class_embed, b.pos_images, b.n_images, dv,
                              g0, g0);
    ops_.layernorm_forward(stream(0), pre_mean_, pre_rstd_, embed_, p.pre_norm_w, p.pre_norm_b, S,
                           dv, dims_.eps);
  } else {
    ops_.linear_forward(stream(0), patches_, p.patch_embed_w, p.patch_embed_b, P, pn, dv);
    ops_.vision_embed_forward(stream(0), p.pos_embed, nullptr, b.pos_images, b.n_images, dv, g0,
                              g0);
  }
  attn_.prepare(b.stream_meta(), S);
  for (int l = 0; l < layers_run_; ++l)
    block_forward(ops_, dims_, p.vision_layers[l], acts_[l], stream(l + 1), S, RopePos{}, attn_, l);
  // hidden_states[feature_layer] without the class rows.
  if (v.has_class_row()) ops_.gather_rows(feat_, x_final_, b.stream_patch, S, dv);
}

void VisionPath::forward(const ModelWeights& p, const DeviceBatch& b) {
  const auto& v = cfg_.vision;
  const int64_t dv = v.dim, d = cfg_.dim, m = v.merge, pn = v.patch_numel();
  const int64_t P = b.P, N = b.N;
  if (P == 0) return;
  // The batch's 8-bit pixels become the encoder's input here, on the device.
  ops_.normalize_pixels(patches_, b.pixels, P * pn, pixel_norm(v));
  if (v.pretrained()) encode_pretrained(p, b);
  else encode_native(p, b);
  ops_.patch_merge_forward(merged_, features(), b.merge, b.n_images, dv, int(m));
  ops_.linear_forward(f1_, merged_, p.fc1_w, p.fc1_b, N, m * m * dv, d);
  ops_.gelu_forward(g1_, f1_, N * d, gelu_kind(v.projector_gelu()));
  ops_.linear_forward(tokens_, g1_, p.fc2_w, p.fc2_b, N, d, d);
}

void VisionPath::encode_native_backward(const ModelWeights& p, const ModelParams& g,
                                        const DeviceBatch& b) {
  const auto& v = cfg_.vision;
  const int64_t dv = v.dim, pn = v.patch_numel(), P = b.P;
  ops_.rmsnorm_backward(dx_, g.vision_norm, dfeat_, x_final_, p.vision_norm, rstd_, P, dv);
  const RopePos rope{nullptr, b.patch_row, b.patch_col};
  for (int l = layers_run_ - 1; l >= 0; --l)
    block_backward(ops_, dims_, p.vision_layers[l], g.vision_layers[l], acts_[l], scratch_, dx_,
                   P, rope, attn_, l, mode_);
  ops_.linear_backward(nullptr, g.patch_embed_w, g.patch_embed_b, dx_, patches_,
                       p.patch_embed_w, P, pn, dv, false);
}

void VisionPath::encode_pretrained_backward(const ModelWeights& p, const ModelParams& g,
                                            const DeviceBatch& b) {
  const auto& v = cfg_.vision;
  const int64_t dv = v.dim, pn = v.patch_numel(), P = b.P, S = b.S;
  const int g0 = v.pos_grid();
  const bool cls = v.has_class_row();
  if (cls) {
    // The class rows were dropped from the features: their gradient starts at zero.
    ops_.fill(dx_, 0.0f, S * dv);
    ops_.scatter_rows(dx_, dfeat_, b.stream_patch, S, dv);
  }
  for (int l = layers_run_ - 1; l >= 0; --l)
    block_backward(ops_, dims_, p.vision_layers[l], g.vision_layers[l], acts_[l], scratch_, dx_,
                   S, RopePos{}, attn_, l, mode_);
  if (cls) {
    ops_.layernorm_backward(dembed_, g.pre_norm_w, g.pre_norm_b, dx_, embed_, p.pre_norm_w,
                            pre_mean_, pre_rstd_, S, dv);
    ops_.vision_embed_backward(g.pos_embed, g.class_embed, dembed_, b.pos_images, b.n_images, dv,
                               g0, g0);
    ops_.gather_rows(dfeat_, dembed_, b.stream_patch, S, dv);  // d(patch embedding)
    ops_.linear_backward(nullptr, g.patch_embed_w, nullptr, dfeat_, patches_, p.patch_embed_w, P,
                         pn, dv, false);
  } else {
    ops_.vision_embed_backward(g.pos_embed, nullptr, dx_, b.pos_images, b.n_images, dv, g0, g0);
    ops_.linear_backward(nullptr, g.patch_embed_w, g.patch_embed_b, dx_, patches_,
                         p.patch_embed_w, P, pn, dv, false);
  }
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
  if (v.pretrained()) encode_pretrained_backward(p, g, b);
  else encode_native_backward(p, g, b);
}

}  // namespace dhp
