#include "model/vision.h"

#include <algorithm>

#include "kernels/check.h"

namespace dhp {

VisionPath::VisionPath(const ModelConfig& cfg, const Ops& ops) : cfg_(cfg), ops_(ops) {
  const auto& v = cfg.vision;
  dims_ = BlockDims{v.dim, v.heads, v.heads, v.head_dim(), v.ffn, cfg.rope_theta};
  acts_.resize(v.layers);
}

const std::vector<float>& VisionPath::forward(const ModelParams& p, const Batch& b) {
  const auto& v = cfg_.vision;
  const int64_t dv = v.dim, d = cfg_.dim, m = v.merge, pn = v.patch_numel();
  const int64_t P = b.n_patches();
  n_patches_ = P;
  n_tokens_ = P / (m * m);
  DHP_ASSERT(int64_t(b.patches.size()) == P * pn);

  // Every image is its own document and one bidirectional block: it sees all of itself and
  // nothing else. idx is irrelevant under a full block; 0 keeps the tiles' bounds tight.
  doc_.resize(P);
  idx_.assign(P, 0);
  row_.resize(P);
  col_.resize(P);
  merge_images_.clear();
  for (size_t i = 0; i < b.images.size(); ++i) {
    const auto& im = b.images[i];
    DHP_ASSERT(im.grid_h % m == 0 && im.grid_w % m == 0);
    for (int r = 0; r < im.grid_h; ++r)
      for (int c = 0; c < im.grid_w; ++c) {
        int64_t k = im.patch_offset + int64_t(r) * im.grid_w + c;
        doc_[k] = int32_t(i);
        row_[k] = r;
        col_[k] = c;
      }
    merge_images_.push_back(MergeImage{im.patch_offset, im.grid_h, im.grid_w});
  }
  tokens_.resize(n_tokens_ * d);
  if (P == 0) return tokens_;

  x_.resize(P * dv);
  ops_.linear_forward(x_.data(), b.patches.data(), p.patch_embed_w, p.patch_embed_b, P, pn, dv);
  const AttnMeta meta{doc_.data(), idx_.data(), doc_.data()};
  const RopePos rope{nullptr, row_.data(), col_.data()};
  for (int l = 0; l < v.layers; ++l)
    block_forward(ops_, dims_, p.vision_layers[l], acts_[l], x_.data(), P, meta, rope);
  x_final_ = x_;
  xn_.resize(P * dv);
  rstd_.resize(P);
  ops_.rmsnorm_forward(xn_.data(), rstd_.data(), x_final_.data(), p.vision_norm, P, dv);
  merged_.resize(P * dv);
  ops_.patch_merge_forward(merged_.data(), xn_.data(), merge_images_.data(),
                           int(merge_images_.size()), dv, int(m));
  f1_.resize(n_tokens_ * d);
  g1_.resize(n_tokens_ * d);
  ops_.linear_forward(f1_.data(), merged_.data(), p.fc1_w, p.fc1_b, n_tokens_, m * m * dv, d);
  ops_.gelu_forward(g1_.data(), f1_.data(), n_tokens_ * d);
  ops_.linear_forward(tokens_.data(), g1_.data(), p.fc2_w, p.fc2_b, n_tokens_, d, d);
  return tokens_;
}

void VisionPath::backward(const ModelParams& p, const ModelParams& g, const Batch& b,
                          const std::vector<float>& dtok, BlockScratch& scratch) {
  const auto& v = cfg_.vision;
  const int64_t dv = v.dim, d = cfg_.dim, m = v.merge, pn = v.patch_numel();
  const int64_t P = n_patches_, N = n_tokens_;
  if (P == 0) return;
  dg1_.resize(N * d);
  ops_.linear_backward(dg1_.data(), g.fc2_w, g.fc2_b, dtok.data(), g1_.data(), p.fc2_w, N, d, d, false);
  ops_.gelu_backward(dg1_.data(), dg1_.data(), f1_.data(), N * d);
  dmerged_.resize(N * m * m * dv);
  ops_.linear_backward(dmerged_.data(), g.fc1_w, g.fc1_b, dg1_.data(), merged_.data(), p.fc1_w, N,
                       m * m * dv, d, false);
  ops_.patch_merge_backward(xn_.data(), dmerged_.data(), merge_images_.data(),
                            int(merge_images_.size()), dv, int(m));  // xn_ now holds d(xn)
  ops_.rmsnorm_backward(x_.data(), g.vision_norm, xn_.data(), x_final_.data(), p.vision_norm,
                        rstd_.data(), P, dv);
  const AttnMeta meta{doc_.data(), idx_.data(), doc_.data()};
  const RopePos rope{nullptr, row_.data(), col_.data()};
  for (int l = v.layers - 1; l >= 0; --l)
    block_backward(ops_, dims_, p.vision_layers[l], g.vision_layers[l], acts_[l], scratch,
                   x_.data(), P, meta, rope);
  ops_.linear_backward(nullptr, g.patch_embed_w, g.patch_embed_b, x_.data(), b.patches.data(),
                       p.patch_embed_w, P, pn, dv, false);
}

}  // namespace dhp
