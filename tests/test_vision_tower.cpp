// The pretrained vision towers (model.vision.arch = clip, siglip; docs/vision_towers.md): the
// parameter table of vt_spec's names and shapes, finite-difference gradients of the block and
// of the whole vision path, and recompute's bit-identical gradients.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "model/block.h"
#include "model/model.h"
#include "model/vision.h"
#include "parallel/cost_model.h"
#include "parallel/memory_model.h"
#include "tests/grad_check.h"
#include "tests/model_fixtures.h"

namespace dhp {
namespace {

using testing::expect_every_gradient;
using testing::expect_gradient;
using testing::make_batch;
using testing::random_vec;
using testing::worst_gradient_gap;
using testing::Fp32AndBf16;
using testing::randomise;
using testing::sample_docs;
using testing::tiny_config;
using testing::tower_config;
using testing::weighted_sum;

std::vector<int64_t> shape(const ParamTable& t, const std::string& name) {
  return t.get(name).shape;
}

TEST(VisionTowerTable, ClipNamesAndShapes) {
  ModelConfig c = tower_config(VisionArch::clip);
  const ParamTable t(c);
  const int64_t dv = 8, F = 12, pn = 2 * 2 * 3;
  EXPECT_EQ(shape(t, "vision.patch_embed.weight"), (std::vector<int64_t>{dv, pn}));
  EXPECT_FALSE(t.find("vision.patch_embed.bias"));
  EXPECT_EQ(shape(t, "vision.class_embed"), (std::vector<int64_t>{dv}));
  EXPECT_EQ(shape(t, "vision.pos_embed.weight"), (std::vector<int64_t>{4 * 4 + 1, dv}));
  EXPECT_EQ(shape(t, "vision.pre_norm.weight"), (std::vector<int64_t>{dv}));
  EXPECT_EQ(shape(t, "vision.pre_norm.bias"), (std::vector<int64_t>{dv}));
  EXPECT_FALSE(t.find("vision.norm.weight"));
  // Every layer of the checkpoint is a parameter, run or not.
  for (int i = 0; i < 3; ++i) {
    const std::string pre = "vision.layers." + std::to_string(i) + ".";
    for (const char* n : {"attn_norm.weight", "attn_norm.bias", "mlp_norm.weight", "mlp_norm.bias",
                          "attn.wq.bias", "attn.wk.bias", "attn.wv.bias", "attn.wo.bias",
                          "mlp.fc2.bias"})
      EXPECT_EQ(shape(t, pre + n), (std::vector<int64_t>{dv})) << pre + n;
    for (const char* n : {"attn.wq.weight", "attn.wk.weight", "attn.wv.weight", "attn.wo.weight"})
      EXPECT_EQ(shape(t, pre + n), (std::vector<int64_t>{dv, dv})) << pre + n;
    EXPECT_EQ(shape(t, pre + "mlp.fc1.weight"), (std::vector<int64_t>{F, dv}));
    EXPECT_EQ(shape(t, pre + "mlp.fc1.bias"), (std::vector<int64_t>{F}));
    EXPECT_EQ(shape(t, pre + "mlp.fc2.weight"), (std::vector<int64_t>{dv, F}));
    EXPECT_FALSE(t.find(pre + "mlp.w1.weight"));
    EXPECT_FALSE(t.find(pre + "mlp.w3.weight"));
  }
  EXPECT_FALSE(t.find("vision.layers.3.attn.wq.weight"));
  EXPECT_EQ(shape(t, "projector.fc1.weight"), (std::vector<int64_t>{16, 4 * dv}));
  for (const auto& p : t.specs())
    if (p.name.rfind("vision.", 0) == 0) {
      EXPECT_EQ(p.group, ParamGroup::Vision) << p.name;
    }
  // Weight decay on the matrices only.
  EXPECT_TRUE(t.get("vision.layers.0.mlp.fc1.weight").decay);
  EXPECT_FALSE(t.get("vision.layers.0.mlp.fc1.bias").decay);
  EXPECT_FALSE(t.get("vision.pos_embed.weight").decay);

  const ModelParams p = bind_params(t, c, static_cast<float*>(nullptr) + 0);
  EXPECT_EQ(p.vision_layers.size(), 3u);
  EXPECT_EQ(p.patch_embed_b, nullptr);
  EXPECT_EQ(p.vision_norm, nullptr);
  EXPECT_EQ(p.class_embed - p.patch_embed_w, t.get("vision.class_embed").offset);
  EXPECT_EQ(p.vision_layers[1].w1 - p.patch_embed_w, t.get("vision.layers.1.mlp.fc1.weight").offset);
  EXPECT_EQ(p.vision_layers[1].b2 - p.patch_embed_w, t.get("vision.layers.1.mlp.fc2.bias").offset);
  EXPECT_EQ(p.vision_layers[1].w3, nullptr);
  // The decoder's block keeps its SwiGLU and no LayerNorm biases.
  EXPECT_NE(p.layers[0].w3, nullptr);
  EXPECT_EQ(p.layers[0].attn_norm_b, nullptr);
  EXPECT_EQ(p.layers[0].b1, nullptr);
}

TEST(VisionTowerTable, SiglipNamesAndShapes) {
  ModelConfig c = tower_config(VisionArch::siglip);
  const ParamTable t(c);
  EXPECT_EQ(shape(t, "vision.patch_embed.bias"), (std::vector<int64_t>{8}));
  EXPECT_FALSE(t.find("vision.class_embed"));
  EXPECT_FALSE(t.find("vision.pre_norm.weight"));
  EXPECT_EQ(shape(t, "vision.pos_embed.weight"), (std::vector<int64_t>{16, 8}));
  EXPECT_FALSE(t.find("vision.norm.weight"));
  EXPECT_TRUE(t.find("vision.layers.2.mlp.fc2.bias"));
  // The native tower's table is what it was.
  const ParamTable native(tiny_config());
  EXPECT_TRUE(native.find("vision.norm.weight"));
  EXPECT_TRUE(native.find("vision.patch_embed.bias"));
  EXPECT_TRUE(native.find("vision.layers.0.mlp.w3.weight"));
  EXPECT_FALSE(native.find("vision.pos_embed.weight"));
}


// ---- the block ----------------------------------------------------------------------------

// One LayerNorm/GELU block with biases and no RoPE (the Hugging Face towers') on an encoder stream of two images (a class row and 2x3 patches, a class row
// and 2x2), each one bidirectional block; parameters and input in host vectors (the CPU
// backend's device memory is the host's).
struct VitBlockCase {
  static constexpr int64_t C = 8, F = 12, T = 1 + 6 + 1 + 4;
  BlockDims dims{C, 2, 2, 4, F, 10000.0, 1e-5f, NormKind::layer, MlpKind::gelu, GeluKind::Quick, false};
  std::unique_ptr<Backend> backend = make_cpu_backend({1});
  Arena arena{*backend};
  // The parameters in BlockParams order: attn_norm, wq, wk, wv, wo, mlp_norm, w1, w2, (w3),
  // bq, bk, bv, attn_norm_b, bo, mlp_norm_b, b1, b2.
  std::vector<std::vector<float>> w, g;
  std::vector<std::string> names = {"attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "fc1", "fc2",
                                    "bq", "bk", "bv", "attn_norm_b", "bo", "mlp_norm_b", "b1", "b2"};
  std::vector<float> x, r;
  std::vector<int32_t> doc, zero;

  explicit VitBlockCase(GeluKind act, uint64_t seed = 3) {
    dims.act = act;
    Rng rng(seed);
    const std::vector<int64_t> sizes = {C, C * C, C * C, C * C, C * C, C, F * C, C * F,
                                        C, C, C, C, C, C, F, C};
    for (int64_t n : sizes) w.push_back(random_vec(rng, size_t(n), 0.5f));
    for (int k : {0, 5}) for (auto& e : w[size_t(k)]) e += 1.0f;  // norm weights near 1
    x = random_vec(rng, size_t(T * C));
    r = random_vec(rng, size_t(T * C));
    for (int64_t t = 0; t < T; ++t) doc.push_back(t < 7 ? 0 : 1);
    zero.assign(size_t(T), 0);
  }
  template <class P>
  BlockParamsOf<P> bind(std::vector<std::vector<float>>& v) {
    BlockParamsOf<P> b{};
    P* order[] = {&b.attn_norm, &b.wq, &b.wk, &b.wv, &b.wo, &b.mlp_norm, &b.w1, &b.w2,
                  &b.bq, &b.bk, &b.bv, &b.attn_norm_b, &b.bo, &b.mlp_norm_b, &b.b1, &b.b2};
    for (size_t i = 0; i < v.size(); ++i) *order[i] = P(v[i].data());
    return b;
  }
  // Forward (and backward when dx is given) in `mode`; returns sum(r · out).
  double run(Recompute mode, std::vector<float>* dx = nullptr) {
    const Ops& ops = backend->ops();
    LocalAttention attn(ops);
    BlockActs acts;
    BlockScratch scratch;
    Act out;
    arena.carve([&](Carver& c) {
      const BlockActs rebuilt = carve_block_rebuilt(c, dims, T, DType::F32, mode);
      acts = carve_block_acts(c, dims, T, DType::F32, mode, rebuilt);
      // A second layer's buffers: selective and full rebuild into the shared set, which this
      // one overwrites, as a following layer would.
      carve_block_acts(c, dims, T, DType::F32, mode, rebuilt);
      scratch = carve_block_scratch(c, dims, T, DType::F32);
      out = c.take(T * C, DType::F32);
    });
    std::copy(x.begin(), x.end(), acts.x_in.f32());
    attn.prepare(AttnMeta{doc.data(), zero.data(), doc.data()}, T);
    const BlockWeights bw = bind<Act>(w);
    block_forward(ops, dims, bw, acts, out, T, RopePos{}, attn, 0);
    const std::vector<float> y(out.f32(), out.f32() + T * C);
    if (dx) {
      g.clear();
      for (const auto& v : w) g.emplace_back(v.size(), 0.0f);
      // What the rebuilt buffers hold when the next layer ran: garbage for this layer.
      if (mode != Recompute::off) {
        std::fill(acts.xn1.f32(), acts.xn1.f32() + T * C, 7.0f);
        std::fill(acts.g.f32(), acts.g.f32() + T * F, -3.0f);
      }
      std::copy(r.begin(), r.end(), out.f32());
      block_backward(ops, dims, bw, bind<float*>(g), acts, scratch, out, T, RopePos{}, attn, 0,
                     mode);
      dx->assign(out.f32(), out.f32() + T * C);
    }
    return weighted_sum(y, r);
  }
};

class VitBlock : public ::testing::TestWithParam<GeluKind> {};

TEST_P(VitBlock, GradientsByFiniteDifferences) {
  VitBlockCase k(GetParam());
  std::vector<float> dx;
  k.run(Recompute::off, &dx);
  auto loss = [&] { return k.run(Recompute::off); };
  expect_gradient("d(x_in)", k.x, dx, loss, 40);
  const auto grads = k.g;
  for (size_t i = 0; i < k.w.size(); ++i) expect_gradient(k.names[i], k.w[i], grads[i], loss, 24);
}

// Selective and full recompute rebuild with the same ops on the same inputs: bit-identical
// gradients, though the rebuilt buffers held another layer's values.
TEST_P(VitBlock, RecomputeGivesBitIdenticalGradients) {
  VitBlockCase k(GetParam());
  std::vector<float> dx_off;
  k.run(Recompute::off, &dx_off);
  const auto g_off = k.g;
  for (Recompute mode : {Recompute::selective, Recompute::full}) {
    std::vector<float> dx;
    k.run(mode, &dx);
    EXPECT_EQ(dx, dx_off) << recompute_name(mode);
    for (size_t i = 0; i < g_off.size(); ++i) EXPECT_EQ(k.g[i], g_off[i]) << recompute_name(mode) << " " << k.names[i];
  }
}

INSTANTIATE_TEST_SUITE_P(Acts, VitBlock,
                         ::testing::Values(GeluKind::Quick, GeluKind::Tanh, GeluKind::Erf));

// ---- the whole model --------------------------------------------------------------------

// expect_every_gradient: images of 4x4, 2x4 and 4x2 patches against a 4x4 position grid (and,
// at merge 1, against a 3x3 one: every grid resized), decoder included; the layers after
// feature_layer get no gradient.
TEST(VisionTowerGradients, ClipEveryParameterTensor) {
  expect_every_gradient(tower_config(VisionArch::clip));
}

TEST(VisionTowerGradients, SiglipEveryParameterTensor) {
  expect_every_gradient(tower_config(VisionArch::siglip));
}

// LLaVA-1.5's shape: merge 1 (a token per patch), the projector's erf GELU, features from the
// last layer, positions resized from a 3x3 grid.
TEST(VisionTowerGradients, ClipMergeOneLastLayer) {
  ModelConfig c = tower_config(VisionArch::clip);
  c.vision.merge = 1;
  c.vision.image_size = 6;
  c.vision.layers = 2;
  c.vision.feature_layer = -1;
  expect_every_gradient(c);
}

// feature_layer 0: the embeddings after pre_layrnorm, no layer runs.
TEST(VisionTowerGradients, ClipFeaturesFromTheEmbeddings) {
  ModelConfig c = tower_config(VisionArch::clip);
  c.vision.layers = 1;
  c.vision.feature_layer = 0;
  expect_every_gradient(c);
}

// The model in every recompute mode: bit-identical loss and gradients (clip tower, whose
// stream holds class rows, and siglip).
TEST(VisionTowerRecompute, BitIdenticalGradients) {
  for (VisionArch arch : {VisionArch::clip, VisionArch::siglip}) {
    ModelConfig cfg = tower_config(arch);
    auto backend = make_cpu_backend({2});
    Model model(cfg, *backend);
    randomise(model, 31);
    Batch b = make_batch(sample_docs(), cfg, 8);
    model.zero_grads();
    const double off = model.step(b, 0.1f, true).loss_sum;
    const std::vector<float> g_off(model.grads(), model.grads() + model.n_grads());
    const size_t held_off = model.activation_bytes();
    for (Recompute mode : {Recompute::selective, Recompute::full}) {
      model.set_recompute(mode);
      model.zero_grads();
      EXPECT_EQ(model.step(b, 0.1f, true).loss_sum, off) << recompute_name(mode);
      EXPECT_TRUE(std::equal(g_off.begin(), g_off.end(), model.grads())) << recompute_name(mode);
      EXPECT_LT(model.activation_bytes(), held_off) << recompute_name(mode);
    }
  }
}

// What changes the tower's output: the position grid is resized (a different pretrained grid
// changes the loss), the class row is dropped from the features (changing class_embed still
// changes the loss, through attention), and the pixel constants are the config's.
TEST(VisionTowerForward, DependsOnWhatTheSemanticsSay) {
  auto loss_of = [](const ModelConfig& cfg, const std::function<void(Model&)>& edit = {}) {
    auto backend = make_cpu_backend({1});
    Model model(cfg, *backend);
    randomise(model, 5);
    if (edit) edit(model);
    Batch b = make_batch(sample_docs(), cfg, 2);
    return model.step(b, 0.0f, false).loss_sum;
  };
  const ModelConfig clip = tower_config(VisionArch::clip);
  const double base = loss_of(clip);
  ModelConfig other_mean = clip;
  other_mean.vision.pixel_mean[1] += 0.01;
  EXPECT_NE(loss_of(other_mean), base);
  // Layers after feature_layer do not run: their weights change nothing.
  const ParamTable t(clip);
  const ParamSpec& last = t.get("vision.layers.2.mlp.fc1.weight");
  EXPECT_EQ(loss_of(clip, [&](Model& m) { m.params()[last.offset] += 1.0f; }), base);
  const ParamSpec& cls = t.get("vision.class_embed");
  EXPECT_NE(loss_of(clip, [&](Model& m) { m.params()[cls.offset] += 1.0f; }), base);
  // A frozen tower: the projector still trains, nothing below it is computed.
  ParamGroups frozen;
  frozen[ParamGroup::Vision].trainable = false;
  auto backend = make_cpu_backend({1});
  Model model(clip, *backend, frozen);
  randomise(model, 5);
  Batch b = make_batch(sample_docs(), clip, 2);
  model.zero_grads();
  EXPECT_EQ(model.step(b, 0.1f, true).loss_sum, base);
  EXPECT_LT(model.n_grads(), model.n_params());
}

// Generation with a clip tower: the prompt's image runs through the tower once, then the KV
// cache serves every new token; each step's logits equal a full pass over the longer prompt.
TEST(VisionTowerGenerate, KvCacheMatchesFullRecomputation) {
  const ModelConfig cfg = tower_config(VisionArch::clip);
  auto backend = make_cpu_backend({1});
  Model model(cfg, *backend);
  randomise(model, 37);
  testing::expect_cache_matches_full_passes(model, 4);
}

// bf16 storage (the CPU's staging through fp32 kernels): a tower's loss and every gradient
// tensor within bf16's rounding of fp32's, and not equal to them.
TEST(VisionTowerBf16, TracksFp32) {
  for (VisionArch arch : {VisionArch::clip, VisionArch::siglip}) {
    const Fp32AndBf16 pair(tower_config(arch), 17);
    const Model &a = pair.a, &b = pair.b;
    const StepStats &sa = pair.sa, &sb = pair.sb;
    EXPECT_NEAR(sb.loss_sum, sa.loss_sum, 2e-3 * std::abs(sa.loss_sum));
    EXPECT_NE(sb.loss_sum, sa.loss_sum);
    // Tensors without a gradient: the key bias (the softmax ignores it: its gradient is
    // rounding alone), and any whose gradient is zero.
    std::string where;
    const double worst = worst_gradient_gap(a, b, &where, [](const ParamSpec& s, double ref) {
      return ref < 1e-10 || s.name.find("attn.wk.bias") != std::string::npos;
    });
    EXPECT_LT(worst, 5e-2) << where;
    EXPECT_GT(worst, 1e-4) << "bf16 gradients equal fp32's: nothing was rounded";
  }
}

// ---- the planner's models ----------------------------------------------------------------

TEST(VisionTowerPricing, MemoryModelCountsTheTableAndTheClassRow) {
  for (VisionArch arch : {VisionArch::clip, VisionArch::siglip}) {
    ModelConfig cfg = tower_config(arch);
    const ParamTable t(cfg);
    const MemoryModel mem(cfg, device_profile("cpu"), 1, 1.0, false);
    EXPECT_EQ(mem.group_parameters(ParamGroup::Vision), t.group_numel(ParamGroup::Vision));
    EXPECT_EQ(mem.parameters(), t.group_numel(ParamGroup::Vision) + t.group_numel(ParamGroup::Projector) +
                                    t.group_numel(ParamGroup::Language) + t.group_numel(ParamGroup::Embeddings));
    // Two images of 16 patches (4 merged tokens each): a clip tower's stream holds 34 rows.
    const SeqShape s{0, 10, 8, 2};
    const int64_t rows = arch == VisionArch::clip ? 34 : 32;
    EXPECT_EQ(mem.one_rank_bytes(s), s.tokens() * mem.bytes_per_token() + rows * mem.bytes_per_patch());
    EXPECT_EQ(mem.max_rank_patches(std::vector<const SeqShape*>{&s}, 2), rows / 2);
    // Attention within each image, its class row included.
    const CostModel cost(cfg, device_profile("cpu"), 1);
    EXPECT_EQ(cost.vision_pairs(s), 2.0 * (rows / 2) * (rows / 2));
  }
  // Layers after feature_layer cost nothing: a deeper checkpoint prices the same.
  ModelConfig a = tower_config(VisionArch::clip), b = a;
  b.vision.layers = 7;
  b.vision.feature_layer = -6;  // runs 2 layers, as a's -2 of 3
  const CostModel ca(a, device_profile("cpu"), 1), cb(b, device_profile("cpu"), 1);
  const SeqShape s{0, 10, 8, 2};
  GroupCost ga, gb;
  ga.add(ca.prepare(s));
  gb.add(cb.prepare(s));
  EXPECT_EQ(ca.seconds(ga, 1, false), cb.seconds(gb, 1, false));
  const MemoryModel ma(a, device_profile("cpu"), 1, 1.0, false), mb(b, device_profile("cpu"), 1, 1.0, false);
  EXPECT_EQ(ma.bytes_per_patch(), mb.bytes_per_patch());
  EXPECT_GT(mb.parameters(), ma.parameters());
}

TEST(VisionTowerConfig, NativePixelConstantsAreTheSpecs) {
  const PixelNorm n = pixel_norm(VisionConfig{});
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(n.mean[c], float(kClipPixelMean[size_t(c)]));
    EXPECT_EQ(n.std[c], float(kClipPixelStd[size_t(c)]));
  }
}

}  // namespace
}  // namespace dhp
