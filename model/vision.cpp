#include "model/vision.h"

#include "kernels/cpu/norm.h"

namespace dhp {

PixelNorm pixel_norm() {
  PixelNorm n;
  for (int c = 0; c < 3; ++c) {
    n.mean[c] = kPixelMean[c];
    n.std[c] = kPixelStd[c];
  }
  return n;
}

VisionPath::VisionPath(const ModelConfig& cfg, const Ops& ops)
    : cfg_(cfg), ops_(ops), attn_(ops) {
  const auto& v = cfg.vision;
  dims_ = BlockDims{v.dim, v.heads, v.heads, v.head_dim(), v.ffn, cfg.rope_theta, cpu::kRmsEps};
  acts_.resize(v.layers);
}

void VisionPath::carve(Carver& c, int64_t P, int64_t N, bool backward, bool encoder_grads,
                       Recompute mode) {
  const int64_t dv = cfg_.vision.dim, d = cfg_.dim, m = cfg_.vision.merge;
  const DType t = ops_.dtype();
  patches_ = c.take(P * cfg_.vision.patch_numel(), t);
  mode_ = mode;
  rebuilt_ = carve_block_rebuilt(c, dims_, P, t, mode);
  for (auto& a : acts_) a = carve_block_acts(c, dims_, P, t, mode, rebuilt_);
  x_final_ = c.take(P * dv, t);
  xn_ = c.take(P * dv, t);
  rstd_ = c.take<float>(P);
  merged_ = c.take(N * m * m * dv, t);
  f1_ = c.take(N * d, t);
  g1_ = c.take(N * d, t);
  tokens_ = c.take(N * d, t);
  if (!backward) return;
  dtokens_ = c.take(N * d, t);
  dg1_ = c.take(N * d, t);
  if (!encoder_grads) return;
  scratch_ = carve_block_scratch(c, dims_, P, t);
  dx_ = c.take(P * dv, t);
  dmerged_ = c.take(N * m * m * dv, t);
}

void VisionPath::forward(const ModelWeights& p, const DeviceBatch& b) {
  const auto& v = cfg_.vision;
  const int64_t dv = v.dim, d = cfg_.dim, m = v.merge, pn = v.patch_numel();
  const int64_t P = b.P, N = b.N;
  if (P == 0) return;
  // The batch's 8-bit pixels become the encoder's input here, on the device.
  ops_.normalize_pixels(patches_, b.pixels, P * pn, pixel_norm());
  ops_.linear_forward(stream(0), patches_, p.patch_embed_w, p.patch_embed_b, P, pn, dv);
  attn_.prepare(b.vision_meta(), P);
  const RopePos rope{nullptr, b.patch_row, b.patch_col};
  for (int l = 0; l < v.layers; ++l)
    block_forward(ops_, dims_, p.vision_layers[l], acts_[l], stream(l + 1), P, rope, attn_, l);
  ops_.rmsnorm_forward(xn_, rstd_, x_final_, p.vision_norm, P, dv, cpu::kRmsEps);
  ops_.patch_merge_forward(merged_, xn_, b.merge, b.n_images, dv, int(m));
  ops_.linear_forward(f1_, merged_, p.fc1_w, p.fc1_b, N, m * m * dv, d);
  ops_.gelu_forward(g1_, f1_, N * d, GeluKind::Tanh);
  ops_.linear_forward(tokens_, g1_, p.fc2_w, p.fc2_b, N, d, d);
}

void VisionPath::backward(const ModelWeights& p, const ModelParams& g, const DeviceBatch& b) {
  const auto& v = cfg_.vision;
  const int64_t dv = v.dim, d = cfg_.dim, m = v.merge, pn = v.patch_numel();
  const int64_t P = b.P, N = b.N;
  if (P == 0) return;
  // A frozen encoder (null gradients) needs nothing below the projector's first layer.
  const bool encoder = g.patch_embed_w != nullptr;
  ops_.linear_backward(dg1_, g.fc2_w, g.fc2_b, dtokens_, g1_, p.fc2_w, N, d, d, false);
  ops_.gelu_backward(dg1_, dg1_, f1_, N * d, GeluKind::Tanh);
  ops_.linear_backward(encoder ? dmerged_ : Act(), g.fc1_w, g.fc1_b, dg1_, merged_, p.fc1_w, N,
                       m * m * dv, d, false);
  if (!encoder) return;
  ops_.patch_merge_backward(xn_, dmerged_, b.merge, b.n_images, dv, int(m));  // xn_ = d(xn)
  ops_.rmsnorm_backward(dx_, g.vision_norm, xn_, x_final_, p.vision_norm, rstd_, P, dv);
  const RopePos rope{nullptr, b.patch_row, b.patch_col};
  for (int l = v.layers - 1; l >= 0; --l)
    block_backward(ops_, dims_, p.vision_layers[l], g.vision_layers[l], acts_[l], scratch_, dx_,
                   P, rope, attn_, l, mode_);
  ops_.linear_backward(nullptr, g.patch_embed_w, g.patch_embed_b, dx_, patches_,
                       p.patch_embed_w, P, pn, dv, false);
}

}  // namespace dhp
