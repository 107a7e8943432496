// A tiny model configuration and hand-built packed batches shared by the model tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "model/model.h"
#include "tests/grad_check.h"
#include "types/batch.h"

namespace dhp::testing {

inline ModelConfig tiny_config() {
  ModelConfig c;
  c.dim = 16;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn = 24;
  c.vocab_size = 23;
  c.rope_theta = 100.0;
  c.vision.patch = 2;
  c.vision.dim = 8;
  c.vision.layers = 1;
  c.vision.heads = 2;
  c.vision.ffn = 12;
  c.vision.merge = 2;
  return c;
}

// tiny_config() with the tower of `arch`, as its row says (types/architecture.h): learned
// positions at a 4x4 grid (image_size 8 at patch 2); a pretrained tower's three layers, of
// which feature_layer -2 runs two; the row's pixel constants.
inline ModelConfig tower_config(VisionArch arch) {
  ModelConfig c = tiny_config();
  auto& v = c.vision;
  const TowerTraits& t = tower_traits(arch);
  v.arch = arch;
  if (t.learned_positions) v.image_size = 8;
  // DeepStack: two tower layers, each feeding a set of image tokens into a decoder layer that
  // is not the last (a set added after the last reaches only its own rows' logits).
  if (t.deepstack) {
    v.layers = 2;
    v.deepstack = {0, 1};
    c.layers = 3;
  }
  // A tower that comes in a model of its own with a decoder family of its own holds that
  // family's decoder: Qwen3-VL's, q/k norms and interleaved M-RoPE over a head of 12.
  if (!t.hf_text_type.empty()) {
    c.qk_norm = true;
    c.head_dim = 12;
    c.mrope_section = {2, 2, 2};
  }
  if (t.feature_layer) {
    v.layers = 3;
    v.feature_layer = -2;
  }
  v.norm_eps = t.pool_head ? 1e-6 : 1e-5;
  v.act = t.pool_head ? VisionAct::gelu_tanh : VisionAct::quick_gelu;
  v.pixel_mean = t.pixel_mean;
  v.pixel_std = t.pixel_std;
  return c;
}

// A document: text ids with a loss flag each, and images (grid_h x grid_w patches) inserted
// where `image_at` says (before text position k).
struct Doc {
  std::vector<int32_t> ids;
  std::vector<int> loss;
  std::vector<std::pair<size_t, std::pair<int, int>>> images;
};

inline Batch make_batch(const std::vector<Doc>& docs, const ModelConfig& cfg, uint64_t pixel_seed) {
  Batch b;
  Rng rng(pixel_seed);
  const int m = cfg.vision.merge;
  int32_t slot = 0;
  for (size_t di = 0; di < docs.size(); ++di) {
    const Doc& d = docs[di];
    std::vector<int32_t> toks, slots;
    std::vector<int> loss;
    // M-RoPE positions as the data path gives them (data/sample.h): an image's tokens share
    // the count at its start and add their row and column; the count then moves past the
    // image's larger side.
    int32_t count = 0;
    size_t next_image = 0;
    for (size_t k = 0; k <= d.ids.size(); ++k) {
      while (next_image < d.images.size() && d.images[next_image].first == k) {
        auto [gh, gw] = d.images[next_image++].second;
        PackedImage im{b.n_patches(), gh, gw};
        for (int64_t k = 0; k < int64_t(gh) * gw * cfg.vision.patch_numel(); ++k)
          b.pixels.push_back(uint8_t(rng.below(256)));
        b.images.push_back(im);
        const int rows = gh / m, cols = gw / m;
        for (int t = 0; t < rows * cols; ++t) {
          toks.push_back(0);
          slots.push_back(slot++);
          loss.push_back(0);
          b.rope_pos.insert(b.rope_pos.end(), {count, count + t / cols, count + t % cols});
        }
        count += std::max(rows, cols);
      }
      if (k == d.ids.size()) break;
      toks.push_back(d.ids[k]);
      slots.push_back(-1);
      loss.push_back(d.loss[k]);
      b.rope_pos.insert(b.rope_pos.end(), 3, count++);
    }
    for (size_t t = 0; t < toks.size(); ++t) {
      b.tokens.push_back(toks[t]);
      b.image_slot.push_back(slots[t]);
      b.doc.push_back(int32_t(di));
      b.pos.push_back(int32_t(t));
      b.targets.push_back(t + 1 < toks.size() && loss[t + 1] ? toks[t + 1] : -1);
    }
    b.sample_ids.push_back(int64_t(di));
  }
  b.T = int64_t(b.tokens.size());
  return b;
}

inline std::vector<Doc> sample_docs() {
  return {
      Doc{{2, 7, 4, 5, 9, 10, 11, 3}, {0, 0, 0, 0, 1, 1, 1, 1}, {{3, {4, 4}}}},
      Doc{{2, 12, 13, 14, 3}, {0, 0, 1, 1, 1}, {}},
      Doc{{2, 4, 5, 4, 5, 15, 16, 3}, {0, 0, 0, 0, 0, 1, 1, 1}, {{2, {2, 4}}, {4, {4, 2}}}},
  };
}

inline void randomise(Model& m, uint64_t seed) {
  // Larger than the 0.02 initialisation so every parameter has a gradient well above the
  // finite-difference noise floor.
  Rng rng(seed);
  std::vector<float> host(static_cast<size_t>(m.n_params()));
  for (float& x : host) x = float((rng.uniform() * 2 - 1) * 0.5);
  m.upload_params(host);
}

// Every parameter tensor's gradient against central differences (6 probes each) after one
// step over sample_docs(); the tower's layers after feature_layer hold no gradient (nor
// moments, nor decay), and every tensor of the vision path that runs gets a nonzero one.
inline void expect_every_gradient(const ModelConfig& cfg) {
  auto backend = make_cpu_backend({1});
  Model model(cfg, *backend);
  randomise(model, 17);
  Batch b = make_batch(sample_docs(), cfg, 3);
  const float scale = 1.0f / float(b.loss_tokens());
  model.zero_grads();
  model.step(b, scale, true);
  std::vector<float> params(model.params(), model.params() + model.n_params());
  std::vector<float> grads(model.grads(), model.grads() + model.n_grads());
  const int run = cfg.vision.layers_run();
  int64_t unused_numel = 0;
  for (const auto& spec : model.table().specs()) {
    std::vector<float> x(params.begin() + spec.offset, params.begin() + spec.offset + spec.numel());
    bool unused = false;
    for (int i = run; i < cfg.vision.layers; ++i)
      unused = unused || spec.name.rfind("vision.layers." + std::to_string(i) + ".", 0) == 0;
    EXPECT_EQ(spec.trainable, !unused) << spec.name;
    if (unused) {
      unused_numel += spec.numel();
      continue;
    }
    std::vector<float> g(grads.begin() + spec.grad_offset, grads.begin() + spec.grad_offset + spec.numel());
    // With no layer run, a dropped class row reaches nothing: its embedding gets no gradient.
    const bool reaches = run > 0 || spec.name != "vision.class_embed";
    if ((spec.name.rfind("vision.", 0) == 0 || spec.name.rfind("projector.", 0) == 0) && reaches) {
      EXPECT_TRUE(std::any_of(g.begin(), g.end(), [](float v) { return v != 0.0f; })) << spec.name;
    }
    auto loss = [&] {
      std::copy(x.begin(), x.end(), model.params() + spec.offset);
      return model.step(b, 0.0f, false).loss_sum * scale;
    };
    expect_gradient(spec.name, x, g, loss, 6);
    std::copy(x.begin(), x.end(), model.params() + spec.offset);
  }
  EXPECT_EQ(unused_numel > 0, run < cfg.vision.layers);
  EXPECT_EQ(model.table().all_trainable(), run == cfg.vision.layers);
}

// A one-document prompt for generation: sample_docs()[0] cut before its answer (<bos> 7
// [image] 4 5: the image sits before position 3), then `extra`; laid out for `cfg`'s vision.
inline Batch prompt_with(const std::vector<int32_t>& extra, const ModelConfig& cfg = tiny_config()) {
  Doc d = sample_docs()[0];
  d.ids.resize(4);
  d.loss.assign(4, 0);
  for (int32_t t : extra) {
    d.ids.push_back(t);
    d.loss.push_back(0);
  }
  return make_batch({d}, cfg, 9);
}

// Greedy generation of n tokens from prompt_with({}) through the KV cache, against, for each
// token, a full pass over the prompt plus the tokens before it: the same token and the same
// logits (1e-5). Returns the cached run's logits, (n, V).
inline std::vector<float> expect_cache_matches_full_passes(Model& model, int n) {
  const ModelConfig& cfg = model.config();
  SamplingOptions greedy;
  greedy.max_new_tokens = n;
  std::vector<float> cached_logits;
  const auto cached = model.generate(prompt_with({}, cfg), -1, greedy, &cached_logits);
  EXPECT_EQ(cached.size(), size_t(n));
  const int64_t V = cfg.vocab_size;
  SamplingOptions one;
  one.max_new_tokens = 1;
  for (size_t k = 0; k < cached.size(); ++k) {
    std::vector<float> full;
    const auto next = model.generate(prompt_with({cached.begin(), cached.begin() + long(k)}, cfg), -1, one, &full);
    EXPECT_EQ(next.size(), 1u);
    if (next.size() == 1) {
      EXPECT_EQ(next[0], cached[k]) << "token " << k;
    }
    for (int64_t v = 0; v < V; ++v)
      EXPECT_NEAR(full[size_t(v)], cached_logits[size_t(int64_t(k) * V + v)], 1e-5) << "step " << k << " logit " << v;
  }
  return cached_logits;
}

// The largest relative L2 gap between two models' gradients (same table; `a` the reference),
// over the tensors that take a gradient, and in *where the tensor's name. `skip` leaves a
// tensor out, given its spec and the norm of a's gradient of it.
inline double worst_gradient_gap(
    const Model& a, const Model& b, std::string* where,
    const std::function<bool(const ParamSpec&, double ref_norm)>& skip = nullptr) {
  double worst = 0.0;
  for (const auto& spec : a.table().specs()) {
    if (!spec.trainable) continue;
    double d2 = 0.0, r2 = 0.0;
    for (int64_t i = spec.grad_offset; i < spec.grad_offset + spec.numel(); ++i) {
      const double r = a.grads()[i], d = double(b.grads()[i]) - r;
      d2 += d * d, r2 += r * r;
    }
    if (skip && skip(spec, std::sqrt(r2))) continue;
    const double gap = std::sqrt(d2) / std::max(std::sqrt(r2), 1e-12);
    if (gap > worst) {
      worst = gap;
      *where = spec.name;
    }
  }
  return worst;
}

// The same randomised model on the fp32 CPU backend (`a`) and with bf16 storage (`b`), each
// after one forward and backward pass over sample_docs(): the pair the bf16 tests compare.
struct Fp32AndBf16 {
  static BackendOptions bf16_options() {
    BackendOptions opt;
    opt.precision = Precision::bf16;
    return opt;
  }
  // `adjust` (optional) changes the randomised weights of both before the step.
  Fp32AndBf16(const ModelConfig& cfg, uint64_t seed, const std::function<void(Model&)>& adjust = nullptr)
      : f32(make_cpu_backend({1})),
        b16(make_cpu_backend(bf16_options())),
        a(cfg, *f32),
        b(cfg, *b16),
        batch(make_batch(sample_docs(), cfg, 3)) {
    randomise(a, seed);
    randomise(b, seed);
    if (adjust) adjust(a), adjust(b);
    const float scale = 1.0f / float(batch.loss_tokens());
    a.zero_grads();
    b.zero_grads();
    sa = a.step(batch, scale, true);
    sb = b.step(batch, scale, true);
  }
  std::unique_ptr<Backend> f32, b16;
  Model a, b;
  Batch batch;
  StepStats sa, sb;
};

}  // namespace dhp::testing
