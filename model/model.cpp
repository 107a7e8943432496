#include "model/model.h"

#include <algorithm>
#include <cmath>

#include "data/rng.h"
#include "kernels/check.h"

namespace dhp {
namespace {
// Rows of logits materialised at once: bounds the (rows, V) buffer for large vocabularies.
constexpr int64_t kLogitRows = 1024;

// Greedy at temperature 0; otherwise samples from the smallest set of most likely tokens whose
// probability reaches top_p (nucleus sampling). Ties break towards the lower id.
int32_t pick_token(const std::vector<float>& logits, double temperature, double top_p, Rng& rng) {
  const int64_t V = int64_t(logits.size());
  if (temperature <= 0.0) return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const float mx = *std::max_element(logits.begin(), logits.end());
  std::vector<std::pair<double, int32_t>> p(V);  // (probability, id)
  double sum = 0.0;
  for (int64_t v = 0; v < V; ++v) {
    p[v] = {std::exp((double(logits[v]) - mx) / temperature), int32_t(v)};
    sum += p[v].first;
  }
  std::sort(p.begin(), p.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  double kept = 0.0;
  size_t n = 0;
  while (n < p.size() && kept < top_p * sum) kept += p[n++].first;
  double r = rng.uniform() * kept;
  for (size_t i = 0; i < n; ++i) {
    r -= p[i].first;
    if (r < 0.0) return p[i].second;
  }
  return p[n - 1].second;
}
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

void Model::forward_hidden(const Batch& b, KvCache* cache) {
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
  const int64_t base = cache ? cache->len() : 0;
  idx_.resize(T);
  for (int64_t t = 0; t < T; ++t) idx_[t] = int32_t(base + t);
  blk_.assign(T, -1);
  const AttnMeta meta{b.doc.data(), idx_.data(), blk_.data()};
  const RopePos rope{b.pos.data(), nullptr, nullptr};
  AttnMeta cache_meta{};
  if (cache) {
    cache->layers.resize(cfg_.layers);
    cache->doc.insert(cache->doc.end(), b.doc.begin(), b.doc.end());
    cache->idx.insert(cache->idx.end(), idx_.begin(), idx_.end());
    cache->blk.insert(cache->blk.end(), blk_.begin(), blk_.end());
    cache_meta = AttnMeta{cache->doc.data(), cache->idx.data(), cache->blk.data()};
  }
  for (int l = 0; l < cfg_.layers; ++l)
    block_forward(ops_, dims_, p_.layers[l], acts_[l], x_.data(), T, meta, rope,
                  cache ? &cache->layers[l] : nullptr, cache_meta);

  x_final_ = x_;
  xf_.resize(T * d);
  rstd_.resize(T);
  ops_.rmsnorm_forward(xf_.data(), rstd_.data(), x_final_.data(), p_.final_norm, T, d);
}

StepStats Model::step(const Batch& b, float loss_scale, bool backward) {
  const int64_t T = b.T, d = cfg_.dim, V = cfg_.vocab_size;
  forward_hidden(b, nullptr);
  const int64_t N = vision_.n_tokens();
  const AttnMeta meta{b.doc.data(), idx_.data(), blk_.data()};
  const RopePos rope{b.pos.data(), nullptr, nullptr};

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


std::vector<int32_t> Model::generate(const Batch& prompt, int32_t eos, const SamplingOptions& opt,
                                     std::vector<float>* logits_out) {
  const int64_t d = cfg_.dim, V = cfg_.vocab_size;
  DHP_CHECK(prompt.T > 0, "generate: the prompt is empty");
  for (int32_t doc : prompt.doc) DHP_CHECK(doc == 0, "generate: the prompt must be one document");
  Rng rng(opt.seed);
  KvCache cache;
  std::vector<float> logits(V);  // (V)
  std::vector<int32_t> out;
  forward_hidden(prompt, &cache);
  int64_t last = prompt.T - 1;
  for (;;) {
    ops_.linear_forward(logits.data(), xf_.data() + last * d, p_.lm_head, nullptr, 1, d, V);
    if (logits_out) logits_out->insert(logits_out->end(), logits.begin(), logits.end());
    const int32_t tok = pick_token(logits, opt.temperature, opt.top_p, rng);
    if (tok == eos || int(out.size()) >= opt.max_new_tokens) break;
    out.push_back(tok);
    if (int(out.size()) == opt.max_new_tokens) break;
    Batch one;
    one.T = 1;
    one.tokens = {tok};
    one.targets = {-1};
    one.doc = {0};
    one.pos = {int32_t(cache.len())};
    one.image_slot = {-1};
    forward_hidden(one, &cache);
    last = 0;
  }
  return out;
}

}  // namespace dhp
