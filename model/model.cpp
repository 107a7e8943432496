#include "model/model.h"

#include <algorithm>
#include <cmath>

#include "core/bf16.h"
#include "core/check.h"
#include "core/rng.h"

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

// The decoder's RoPE frequencies: model.rope_theta, and model.rope_scaling's parameters.
RopeSpec decoder_rope(const ModelConfig& c) {
  RopeSpec r(c.rope_theta);
  if (c.rope_scaling == RopeScaling::llama3)
    r = RopeSpec::llama3(c.rope_theta, c.rope_factor, c.rope_low_freq_factor, c.rope_high_freq_factor,
                         double(c.rope_original_max_pos));
  for (int a = 0; a < 3; ++a) r.mrope_section[a] = c.mrope_section[size_t(a)];
  r.mrope_interleaved = c.mrope_interleaved;
  return r;
}
}  // namespace

Model::Model(const ModelConfig& cfg, Backend& backend, const ParamGroups& groups, OptimizerShard master,
             bool window_grads, bool window_weights)
    : cfg_(cfg),
      backend_(backend),
      ops_(backend.ops()),
      table_(cfg_, groups),
      dtype_(ops_.dtype()),
      master_shard_{master, table_.trainable_total()},
      weights_window_(window_weights && master.world > 1 ? LayerWindow::of_weights(table_, cfg_.layers)
                                                         : LayerWindow::whole(table_.total())),
      // In fp32 the master is sharded only where ZeRO-3 gathers the layers (a working copy of
      // them whole would be the master itself).
      sheds_(master.world > 1 && (dtype_ != DType::F32 || weights_window_.windowed())),
      params_(backend, sheds_ ? 0 : sizeof(float) * size_t(table_.total())),
      master_(backend, sheds_ ? sizeof(float) * size_t(master_shard_.held_size()) : 0),
      window_(window_grads ? LayerWindow::of_grads(table_, cfg_.layers) : LayerWindow::whole(table_.trainable_total())),
      grads_(backend, sizeof(float) * size_t(window_.elements())),
      work_(backend, sheds_ || dtype_ != DType::F32 ? dtype_size(dtype_) * size_t(weights_window_.elements()) : 0),
      stats_(backend, sizeof(CrossEntropyStats)),
      w_(bind_weights(table_, cfg_, work_.bytes() > 0 ? Act(work_.data(), dtype_) : Act(params_.as<float>()),
                      weights_window_)),
      g_(bind_grads(table_, cfg_, grads_.as<float>(), window_)),
      dims_{cfg_.dim, cfg_.heads, cfg_.kv_heads, cfg_.hd(), cfg_.ffn, decoder_rope(cfg_),
            float(cfg_.rms_norm_eps)},
      vision_(cfg_, ops_),
      local_attn_(ops_),
      uploader_(backend, cfg_),
      arena_(backend) {
  dims_.qk_norm = cfg_.qk_norm;
  acts_.resize(cfg_.layers);
  if (const ParamSpec* h = table_.find("lm_head.weight")) lm_head_at_ = h->grad_offset;
  final_norm_at_ = table_.get("final_norm.weight").grad_offset;
  tok_embed_at_ = table_.get("tok_embed.weight").grad_offset;
  for (int l = 0; l < cfg_.layers; ++l)
    layer_at_.push_back(table_.get("layers." + std::to_string(l) + ".attn_norm.weight").grad_offset);
  if (weights_window_.windowed()) {
    // A layer's gathered weights come from its gradient-layout master: the two layouts must
    // hold the layers alike (all trainable, one size).
    DHP_ASSERT(window_.windowed() && window_.slot == weights_window_.slot);
  }
  backend_.zero(params_.data(), params_.bytes());
  backend_.zero(master_.data(), master_.bytes());
  backend_.zero(work_.data(), work_.bytes());
  backend_.zero(grads_.data(), grads_.bytes());
  backend_.zero(stats_.data(), stats_.bytes());
}

void Model::refresh_weights() {
  if (!weights_stale_ || sheds_) return;
  if (dtype_ != DType::F32)
    ops_.cast(Act(work_.data(), dtype_), params_.as<float>(), table_.total());
  weights_stale_ = false;
}

void Model::initialise(uint64_t seed) {
  std::vector<float> host(size_t(table_.total()));
  table_.initialise(host.data(), seed);
  upload_params(host);
}

std::vector<float> Model::download_params() const {
  std::vector<float> host(size_t(table_.total()));
  read_params(0, table_.total(), host.data());
  return host;
}

void Model::upload_params(const std::vector<float>& host) {
  DHP_ASSERT(int64_t(host.size()) == table_.total());
  write_params(0, host.data(), table_.total());
}

void Model::write_params(int64_t offset, const float* host, int64_t count) {
  DHP_ASSERT(offset >= 0 && count >= 0 && offset + count <= table_.total());
  if (!sheds_) {
    weights_stale_ = true;
    backend_.upload(params_.as<float>() + offset, host, sizeof(float) * size_t(count));
    return;
  }
  ++weights_version_;
  // The working copy rounded from the values, through fp32 staging a chunk at a time (under
  // ZeRO-3 outside the decoder layers: those are gathered from the master when a pass needs them).
  constexpr int64_t kChunk = int64_t(1) << 22;
  DeviceBuffer staged(backend_, sizeof(float) * size_t(std::min(count, kChunk)));
  for (int64_t i = 0; i < count; i += kChunk) {
    const int64_t c = std::min(kChunk, count - i);
    backend_.upload(staged.data(), host + i, sizeof(float) * size_t(c));
    weights_window_.for_each_in_rest(offset + i, offset + i + c, [&](int64_t o, int64_t at, int64_t n) {
      ops_.cast(working() + at, staged.as<float>() + (o - offset - i), n);
    });
  }
  // The master of the trainable elements this rank holds, exactly.
  for_each_master_piece(offset, count, [&](int64_t at, int64_t local, int64_t n) {
    backend_.upload(master() + local, host + (at - offset), sizeof(float) * size_t(n));
  });
}

template <class F>
void Model::for_each_master_piece(int64_t offset, int64_t count, F&& f) const {
  for (const ParamSpec& p : table_.specs()) {
    const int64_t a = std::max(offset, p.offset), b = std::min(offset + count, p.offset + p.numel());
    if (!p.trainable || a >= b) continue;
    const int64_t to_grad = p.grad_offset - p.offset;
    master_shard_.for_each_held(a + to_grad, b + to_grad, [&](const CompactShard::Range& h, int64_t x, int64_t y) {
      f(x - to_grad, h.local + (x - h.begin), y - x);
    });
  }
}

bool Model::keeps_any(int64_t offset, int64_t count) const {
  bool any = false;
  weights_window_.for_each_in_rest(offset, offset + count, [&](int64_t, int64_t, int64_t) { any = true; });
  if (!any) for_each_master_piece(offset, count, [&](int64_t, int64_t, int64_t) { any = true; });
  return any;
}

void Model::read_working(int64_t offset, int64_t count, float* host) const {
  DHP_ASSERT(offset >= 0 && count >= 0 && offset + count <= table_.total());
  if (dtype_ == DType::F32 && !sheds_) {
    backend_.download(host, params_.as<float>() + offset, sizeof(float) * size_t(count));
    return;
  }
  DHP_ASSERT(dtype_ == DType::BF16 || dtype_ == DType::F32);
  if (weights_stale_ && !sheds_) {  // what the next pass rounds the master to
    backend_.download(host, params_.as<float>() + offset, sizeof(float) * size_t(count));
    for (int64_t i = 0; i < count; ++i) host[i] = bf16_round(host[i]);
    return;
  }
  if (weights_window_.windowed()) std::fill_n(host, count, 0.0f);
  std::vector<uint16_t> raw;
  weights_window_.for_each_in_rest(offset, offset + count, [&](int64_t o, int64_t at, int64_t n) {
    float* out = host + (o - offset);
    if (dtype_ == DType::F32) {
      backend_.download(out, work_.as<float>() + at, sizeof(float) * size_t(n));
      return;
    }
    raw.resize(size_t(n));
    backend_.download(raw.data(), static_cast<const uint16_t*>(work_.data()) + at, sizeof(uint16_t) * size_t(n));
    widen_bf16(out, raw.data(), n);
  });
}

void Model::read_params(int64_t offset, int64_t count, float* host) const {
  DHP_ASSERT(offset >= 0 && count >= 0 && offset + count <= table_.total());
  if (!sheds_) {
    backend_.download(host, params_.as<float>() + offset, sizeof(float) * size_t(count));
    return;
  }
  read_working(offset, count, host);
  for_each_master_piece(offset, count, [&](int64_t at, int64_t local, int64_t n) {
    backend_.download(host + (at - offset), master() + local, sizeof(float) * size_t(n));
  });
}

void Model::zero_grads() { backend_.zero(grads_.data(), grads_.bytes()); }

void Model::carve(int64_t T, int64_t P, int64_t S, int64_t N, int64_t R, bool backward) {
  const int64_t d = cfg_.dim, V = cfg_.vocab_size, rows = std::min(T, kLogitRows);
  const DType t = dtype_;
  arena_.carve([&](Carver& c) {
    vision_.carve(c, P, S, N, backward, g_.patch_embed_w != nullptr, recompute_);
    rebuilt_ = carve_block_rebuilt(c, dims_, T, t, recompute_);
    for (auto& a : acts_) a = carve_block_acts(c, dims_, T, t, recompute_, rebuilt_);
    if (cfg_.vision.image_sets() > 1) deep_rows_ = c.take(T * d, t);
    x_final_ = c.take(T * d, t);
    xf_ = c.take(T * d, t);
    rstd_ = c.take<float>(T);
    logits_ = c.take(rows * V, t);
    lse_ = c.take<float>(rows);
    if (!backward) return;
    scratch_ = carve_block_scratch(c, dims_, T, t);
    dxf_ = c.take(T * d, t);
    dx_ = c.take(T * d, t);
    drows_ = c.take(R * cfg_.vision.image_sets() * d, t);
  });
}

void Model::forward_hidden(const DeviceBatch& b, Attention& attn, ImageRoute* route) {
  const int64_t T = b.T, d = cfg_.dim, sets = cfg_.vision.image_sets();
  refresh_weights();
  vision_.forward(w_, b);
  // Decoder input: token embeddings, with the image tokens dropped into their positions. Each
  // image row carries every token set (DeviceBatch::image_slots), and travels as one.
  ops_.embedding_forward(stream(0), b.ids, w_.tok_embed, T, d);
  const CAct image_rows = route ? route->forward(vision_.tokens(), sets * d) : vision_.tokens();
  if (b.R > 0) ops_.scatter_rows(stream(0), image_rows, b.image_slots, T, d);
  // Causal within each document by position; doc keeps packed documents apart.
  attn.prepare(b.decoder_meta(), T);
  const RopePos rope{b.rope, nullptr, nullptr};
  for (int l = 0; l < cfg_.layers; ++l) {
    if (feed_) feed_->need(l, false);
    block_forward(ops_, dims_, w_.layers[l], acts_[l], stream(l + 1), T, rope, attn, l);
    // DeepStack: set l + 1 joins the stream at the image rows after layer l.
    if (l + 1 < sets && b.R > 0) {
      ops_.fill(deep_rows_, 0.0f, T * d);
      ops_.scatter_rows(deep_rows_, image_rows, b.image_slots + (l + 1) * T, T, d);
      ops_.add_inplace(stream(l + 1), deep_rows_, T * d);
    }
  }
  ops_.rmsnorm_forward(xf_, rstd_, x_final_, w_.final_norm, T, d, dims_.eps);
}

void Model::run(const DeviceBatch& b, float loss_scale, bool backward, Attention* attn_in,
                ImageRoute* route, const GradsFinal& final) {
  const int64_t T = b.T, d = cfg_.dim, V = cfg_.vocab_size;
  Attention& attn = attn_in ? *attn_in : local_attn_;
  DHP_ASSERT(route ? route->rows() == b.R : b.R == b.N);
  carve(T, b.P, b.S, b.N, route ? b.R : 0, backward);
  forward_hidden(b, attn, route);

  // Logits, loss and (when training) their gradient chunk by chunk, so the full (T, V)
  // matrix is never held.
  auto* stats = stats_.as<CrossEntropyStats>();
  for (int64_t t0 = 0; t0 < T; t0 += kLogitRows) {
    const int64_t n = std::min(kLogitRows, T - t0);
    const CAct xf = xf_ + t0 * d;
    ops_.linear_forward(logits_, xf, w_.lm_head, nullptr, n, d, V);
    ops_.cross_entropy_forward(lse_, stats, logits_, b.targets + t0, n, V);
    if (!backward) continue;
    ops_.cross_entropy_backward(logits_, logits_, lse_, b.targets + t0, n, V, loss_scale);
    ops_.linear_backward(dxf_ + t0 * d, g_.lm_head, nullptr, logits_, xf, w_.lm_head, n, d, V,
                         false);
  }
  if (!backward) return;
  auto done_from = [&](int64_t offset) {
    if (final) final(offset);
  };
  if (lm_head_at_ >= 0) done_from(lm_head_at_);

  ops_.rmsnorm_backward(dx_, g_.final_norm, dxf_, x_final_, w_.final_norm, rstd_, T, d);
  done_from(final_norm_at_);
  const RopePos rope{b.rope, nullptr, nullptr};
  const int64_t sets = cfg_.vision.image_sets();
  // The image rows' gradient, every set of it (one row of sets·d per held image token).
  const Act drows = route ? drows_ : vision_.dtokens();
  const bool image_grads = g_.fc1_w || g_.patch_embed_w;
  if (image_grads && !route && b.N > 0) {
    // A piece of a sequence may hold only some of an image's tokens: the others get no
    // gradient.
    ops_.fill(drows, 0.0f, b.N * sets * d);
  }
  for (int l = cfg_.layers - 1; l >= 0; --l) {
    // A DeepStack set added after layer l takes d(layer l's output) at its rows.
    if (image_grads && l + 1 < sets && b.R > 0) ops_.gather_rows(drows, dx_, b.image_slots + (l + 1) * T, T, d);
    if (feed_) feed_->need(l, true);
    block_backward(ops_, dims_, w_.layers[l], g_.layers[l], acts_[l], scratch_, dx_, T, rope,
                   attn, l, recompute_);
    done_from(layer_at_[size_t(l)]);
  }
  if (g_.tok_embed) ops_.embedding_backward(g_.tok_embed, dx_, b.ids, T, d);
  done_from(tok_embed_at_);
  // Below the token embedding only the image path is left: nothing to do when it is frozen
  // (every rank of a ring has the same groups, so the routed exchange is skipped by all).
  if (!image_grads) {
    done_from(0);
    return;
  }
  // Every routed row is held by exactly one position of this pack.
  if (b.R > 0) ops_.gather_rows(drows, dx_, b.image_slots, T, d);
  if (route) route->backward(vision_.dtokens(), drows_, sets * d);
  if (b.N > 0) vision_.backward(w_, g_, b);
  done_from(0);
}

StepStats Model::take_stats() {
  CrossEntropyStats st;
  backend_.download(&st, stats_.data(), sizeof(st));
  backend_.zero(stats_.data(), stats_.bytes());
  return StepStats{st.loss_sum, int64_t(st.count), int64_t(st.correct)};
}

StepStats Model::step(const Batch& b, float loss_scale, bool backward) {
  run(upload(b), loss_scale, backward);
  return take_stats();
}

void Model::skip_pass(bool backward, const GradsFinal& final) {
  if (feed_)
    for (int l = 0; l < cfg_.layers; ++l) feed_->need(l, false);
  if (!backward) return;
  for (int l = cfg_.layers - 1; l >= 0; --l) {
    if (feed_) feed_->need(l, true);
    if (final) final(layer_at_[size_t(l)]);
  }
  if (final) final(0);
}

std::vector<int32_t> Model::generate(const Batch& prompt, int32_t eos, const SamplingOptions& opt,
                                     std::vector<float>* logits_out) {
  const int64_t d = cfg_.dim, V = cfg_.vocab_size;
  DHP_CHECK(prompt.T > 0, "generate: the prompt is empty");
  // Each rank generates alone; a gathered layer would need every rank at the same token.
  DHP_CHECK(!weights_window_.windowed(), "generate: not under parallel.zero = 3 over several ranks (the "
            "decoder layers are gathered from every rank)");
  for (int32_t doc : prompt.doc) DHP_CHECK(doc == 0, "generate: the prompt must be one document");
  Rng rng(opt.seed);
  KvCacheAttention cache(backend_, cfg_.layers, dims_.attn(),
                         prompt.T + std::max(0, opt.max_new_tokens));
  DeviceBuffer logits_dev(backend_, dtype_size(dtype_) * size_t(V));  // (V)
  std::vector<float> logits(V);                                         // (V) on the host
  std::vector<uint16_t> logits_bf16(dtype_ == DType::BF16 ? V : 0);
  std::vector<int32_t> out;
  // Each new token's RoPE position: one past the prompt's largest (under M-RoPE an image's
  // tokens end the count before their last text position; each of the three is that one).
  int32_t next_rope = 0;
  for (int32_t p : prompt.rope_pos.empty() ? prompt.pos : prompt.rope_pos) next_rope = std::max(next_rope, p + 1);
  const DeviceBatch& first = upload(prompt);
  carve(first.T, first.P, first.S, first.N, 0, false);
  forward_hidden(first, cache, nullptr);
  int64_t last = prompt.T - 1;
  for (;;) {
    ops_.linear_forward(Act(logits_dev.data(), dtype_), xf_ + last * d, w_.lm_head, nullptr, 1, d,
                        V);
    if (dtype_ == DType::BF16) {
      backend_.download(logits_bf16.data(), logits_dev.data(), logits_dev.bytes());
      widen_bf16(logits.data(), logits_bf16.data(), V);
    } else {
      backend_.download(logits.data(), logits_dev.data(), logits_dev.bytes());
    }
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
    one.rope_pos = {next_rope, next_rope, next_rope};
    ++next_rope;
    const DeviceBatch& next = upload(one);
    carve(1, 0, 0, 0, 0, false);
    forward_hidden(next, cache, nullptr);
    last = 0;
  }
  return out;
}

}  // namespace dhp
