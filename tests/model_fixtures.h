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
    size_t next_image = 0;
    for (size_t k = 0; k <= d.ids.size(); ++k) {
      while (next_image < d.images.size() && d.images[next_image].first == k) {
        auto [gh, gw] = d.images[next_image++].second;
        PackedImage im{b.n_patches(), gh, gw};
        for (int64_t k = 0; k < int64_t(gh) * gw * cfg.vision.patch_numel(); ++k)
          b.pixels.push_back(uint8_t(rng.below(256)));
        b.images.push_back(im);
        for (int t = 0; t < gh * gw / (m * m); ++t) {
          toks.push_back(0);
          slots.push_back(slot++);
          loss.push_back(0);
        }
      }
      if (k == d.ids.size()) break;
      toks.push_back(d.ids[k]);
      slots.push_back(-1);
      loss.push_back(d.loss[k]);
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
  for (int64_t i = 0; i < m.n_params(); ++i) m.params()[i] = float((rng.uniform() * 2 - 1) * 0.5);
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
  Fp32AndBf16(const ModelConfig& cfg, uint64_t seed)
      : f32(make_cpu_backend({1})),
        b16(make_cpu_backend(bf16_options())),
        a(cfg, *f32),
        b(cfg, *b16),
        batch(make_batch(sample_docs(), cfg, 3)) {
    randomise(a, seed);
    randomise(b, seed);
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
