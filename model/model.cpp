#include "model/model.h"

#include <algorithm>

#include "kernels/check.h"

namespace dhp {
namespace {
// Rows of logits materialised at once: bounds the (rows, V) buffer for large vocabularies.
constexpr int64_t kLogitRows = 1024;
}  // namespace

Model::Model(const ModelConfig& cfg, const Ops& ops)
    : cfg_(cfg),
      ops_(ops),
      table_(cfg_),
      params_(Tensor::zeros({table_.total()})),
      grads_(Tensor::zeros({table_.total()})),
      p_(bind_params(table_, cfg_, params_.f32())),
      g_(bind_params(table_, cfg_, grads_.f32())),
      dims_{cfg_.dim, cfg_.heads, cfg_.kv_heads, cfg_.hd(), cfg_.ffn, cfg_.rope_theta},
      vision_(cfg_, ops) {
  acts_.resize(cfg_.layers);
}

void Model::zero_grads() { std::fill_n(grads_.f32(), table_.total(), 0.0f); }

StepStats Model::step(const Batch& b, float loss_scale, bool backward) {
  const int64_t T = b.T, d = cfg_.dim, V = cfg_.vocab_size;
  DHP_ASSERT(int64_t(b.tokens.size()) == T && int64_t(b.targets.size()) == T);
  for (int64_t t = 0; t < T; ++t)
    DHP_CHECK(b.tokens[t] < V && b.targets[t] < V,
              "token id {} at position {} is outside the model's vocabulary ({}): does "
              "model.vocab_size match the tokenizer?",
              std::max(b.tokens[t], b.targets[t]), t, V);

  const std::vector<float>& img = vision_.forward(p_, b);
  const int64_t N = vision_.n_tokens();

  // Decoder input: token embeddings, with image tokens dropped into their positions.
  ids_.resize(T);
  for (int64_t t = 0; t < T; ++t) ids_[t] = b.image_slot[t] >= 0 ? -1 : b.tokens[t];
  x_.resize(T * d);
  ops_.embedding_forward(x_.data(), ids_.data(), p_.tok_embed, T, d);
  for (int64_t t = 0; t < T; ++t)
    if (b.image_slot[t] >= 0) {
      DHP_ASSERT(b.image_slot[t] < N);
      std::copy_n(img.data() + int64_t(b.image_slot[t]) * d, d, x_.data() + t * d);
    }

  // Causal within each document: the pack index orders tokens, doc keeps documents apart.
  idx_.resize(T);
  for (int64_t t = 0; t < T; ++t) idx_[t] = int32_t(t);
  blk_.assign(T, -1);
  const AttnMeta meta{b.doc.data(), idx_.data(), blk_.data()};
  const RopePos rope{b.pos.data(), nullptr, nullptr};
  for (int l = 0; l < cfg_.layers; ++l)
    block_forward(ops_, dims_, p_.layers[l], acts_[l], x_.data(), T, meta, rope);

  x_final_ = x_;
  xf_.resize(T * d);
  rstd_.resize(T);
  ops_.rmsnorm_forward(xf_.data(), rstd_.data(), x_final_.data(), p_.final_norm, T, d);

  // Logits, loss and (when training) their gradient chunk by chunk; x_ becomes d(xf).
  StepStats st;
  const int64_t rows = std::min(T, kLogitRows);
  logits_.resize(rows * V);
  lse_.resize(rows);
  for (int64_t t0 = 0; t0 < T; t0 += kLogitRows) {
    const int64_t n = std::min(kLogitRows, T - t0);
    const float* xf = xf_.data() + t0 * d;
    ops_.linear_forward(logits_.data(), xf, p_.lm_head, nullptr, n, d, V);
    CrossEntropyStats ce =
        ops_.cross_entropy_forward(lse_.data(), logits_.data(), b.targets.data() + t0, n, V);
    st.loss_sum += ce.loss_sum;
    st.targets += ce.count;
    st.correct += ce.correct;
    if (!backward) continue;
    ops_.cross_entropy_backward(logits_.data(), logits_.data(), lse_.data(), b.targets.data() + t0,
                                n, V, loss_scale);
    ops_.linear_backward(x_.data() + t0 * d, g_.lm_head, nullptr, logits_.data(), xf, p_.lm_head,
                         n, d, V, false);
  }
  if (!backward) return st;

  ops_.rmsnorm_backward(xf_.data(), g_.final_norm, x_.data(), x_final_.data(), p_.final_norm,
                        rstd_.data(), T, d);
  std::swap(x_, xf_);  // x_ = d(decoder output)
  for (int l = cfg_.layers - 1; l >= 0; --l)
    block_backward(ops_, dims_, p_.layers[l], g_.layers[l], acts_[l], scratch_, x_.data(), T,
                   meta, rope);

  ops_.embedding_backward(g_.tok_embed, x_.data(), ids_.data(), T, d);
  dimg_.assign(N * d, 0.0f);
  for (int64_t t = 0; t < T; ++t)
    if (b.image_slot[t] >= 0)
      std::copy_n(x_.data() + t * d, d, dimg_.data() + int64_t(b.image_slot[t]) * d);
  vision_.backward(p_, g_, b, dimg_, scratch_);
  return st;
}

}  // namespace dhp
