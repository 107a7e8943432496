// The whole model: finite-difference gradients of every parameter tensor on a tiny config,
// and the property DHP rests on: the loss and the gradients do not depend on how the global
// batch is split into packs.
#include <gtest/gtest.h>

#include <cmath>

#include "model/model.h"
#include "tests/grad_check.h"
#include "tests/model_fixtures.h"

namespace dhp {
namespace {

using testing::expect_every_gradient;
using testing::expect_gradient;
using testing::make_batch;
using testing::randomise;
using testing::random_vec;
using testing::sample_docs;
using testing::tiny_config;
using testing::worst_gradient_gap;
using testing::Fp32AndBf16;
using testing::Doc;

TEST(Model, InitialLossIsNearUniform) {
  auto backend = make_cpu_backend({1});
  ModelConfig cfg = tiny_config();
  Model model(cfg, *backend);
  model.initialise(5);
  Batch b = make_batch(sample_docs(), cfg, 1);
  StepStats st = model.step(b, 0.0f, false);
  EXPECT_EQ(st.targets, b.loss_tokens());
  EXPECT_NEAR(st.loss_sum / st.targets, std::log(double(cfg.vocab_size)), 0.05);
}

TEST(Model, SameSeedSameWeightsAndSpecNames) {
  auto backend = make_cpu_backend({1});
  ModelConfig cfg = tiny_config();
  Model a(cfg, *backend), b(cfg, *backend);
  a.initialise(9);
  b.initialise(9);
  EXPECT_TRUE(std::equal(a.params(), a.params() + a.n_params(), b.params()));
  const auto& t = a.table();
  EXPECT_NE(t.find("vision.layers.0.attn.wq.weight"), nullptr);
  EXPECT_NE(t.find("projector.fc1.bias"), nullptr);
  EXPECT_NE(t.find("layers.1.mlp.w3.weight"), nullptr);
  EXPECT_NE(t.find("lm_head.weight"), nullptr);
  EXPECT_EQ(t.get("projector.fc1.weight").shape, (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(t.get("layers.0.attn.wk.weight").shape, (std::vector<int64_t>{8, 16}));
  // Norm weights start at one, biases at zero.
  EXPECT_EQ(a.params()[t.get("final_norm.weight").offset], 1.0f);
  EXPECT_EQ(a.params()[t.get("projector.fc2.bias").offset], 0.0f);
}

class ModelGradients : public ::testing::TestWithParam<bool> {};

TEST_P(ModelGradients, EveryParameterTensor) {
  ModelConfig cfg = tiny_config();
  cfg.tie_embeddings = GetParam();
  expect_every_gradient(cfg);
}

// The decoder's q/k/v biases (Hugging Face Qwen2 checkpoints) and a non-default RMSNorm eps:
// the biases' gradients by finite differences like every other tensor.
TEST(ModelGradientsOfAdditions, QkvBiasesAndNormEps) {
  ModelConfig cfg = tiny_config();
  cfg.attention_bias = true;
  cfg.rms_norm_eps = 1e-2;
  auto backend = make_cpu_backend({1});
  Model probe(cfg, *backend);
  ASSERT_TRUE(probe.table().find("layers.0.attn.wk.bias"));
  ASSERT_FALSE(probe.table().find("vision.layers.0.attn.wk.bias"));
  EXPECT_FALSE(probe.table().get("layers.1.attn.wq.bias").decay);
  expect_every_gradient(cfg);
}

// Qwen3's decoder (per-head q/k RMSNorm before RoPE, head_dim apart from dim/heads, biases on
// q, k, v and o) with Llama-3.x's RoPE scaling: head_dim 8 and base 100 give wavelengths of
// 6.3, 19.9, 62.8 and 199 positions, which an original context of 32 (bounds 8 and 32) puts
// in every band of the llama3 rule (kept, blended, divided twice).
ModelConfig qwen3_llama3_config() {
  ModelConfig cfg = tiny_config();
  cfg.head_dim = 8;
  cfg.qk_norm = true;
  cfg.attention_bias = true;
  cfg.attention_out_bias = true;
  cfg.rms_norm_eps = 1e-2;
  cfg.rope_scaling = RopeScaling::llama3;
  cfg.rope_factor = 4.0;
  cfg.rope_original_max_pos = 32;
  return cfg;
}

TEST(ModelGradientsOfAdditions, QkNormOutputBiasHeadDimAndLlama3Rope) {
  const ModelConfig cfg = qwen3_llama3_config();
  auto backend = make_cpu_backend({1});
  Model probe(cfg, *backend);
  for (const char* name : {"layers.1.attn.q_norm.weight", "layers.1.attn.k_norm.weight"}) {
    ASSERT_TRUE(probe.table().find(name)) << name;
    EXPECT_EQ(probe.table().get(name).shape, std::vector<int64_t>{8}) << name;
    EXPECT_FALSE(probe.table().get(name).decay) << name;
  }
  EXPECT_EQ(probe.table().get("layers.0.attn.wo.bias").shape, std::vector<int64_t>{16});
  EXPECT_EQ(probe.table().get("layers.0.attn.wq.weight").shape, (std::vector<int64_t>{32, 16}));
  ASSERT_FALSE(probe.table().find("vision.layers.0.attn.q_norm.weight"));
  expect_every_gradient(cfg);
}

// The scaling changes the loss (so the gradient check above is not passing over a no-op):
// the same pass is bit-reproducible, so any change beyond fp32 rounding of the sum is the
// frequencies'; an original context past every wavelength keeps them all.
TEST(ModelGradientsOfAdditions, Llama3RopeChangesTheLoss) {
  const ModelConfig cfg = qwen3_llama3_config();
  auto loss_of = [](const ModelConfig& c) {
    auto backend = make_cpu_backend({1});
    Model m(c, *backend);
    randomise(m, 5);
    const Batch b = make_batch(sample_docs(), c, 3);
    return m.step(b, 1.0f, false).loss_sum;
  };
  const double base = loss_of(cfg);
  ModelConfig plain_rope = cfg;
  plain_rope.rope_scaling = RopeScaling::none;
  EXPECT_GT(std::abs(loss_of(plain_rope) - base), 1e-5 * std::abs(base));
  ModelConfig far = cfg;  // an original context past every wavelength: the rule keeps every f
  far.rope_original_max_pos = 1 << 20;
  EXPECT_EQ(loss_of(far), loss_of(plain_rope));
}

// Recompute rebuilds q and k before their norms, and the norms, from the same inputs: the
// gradients are bit-identical in every mode.
TEST(ModelGradientsOfAdditions, QkNormRecomputeIsBitIdentical) {
  const ModelConfig cfg = qwen3_llama3_config();
  auto backend = make_cpu_backend({1});
  Model m(cfg, *backend);
  randomise(m, 13);
  const Batch b = make_batch(sample_docs(), cfg, 3);
  std::vector<float> off;
  for (Recompute mode : {Recompute::off, Recompute::selective, Recompute::full}) {
    m.set_recompute(mode);
    m.zero_grads();
    m.step(b, 0.1f, true);
    if (mode == Recompute::off) off.assign(m.grads(), m.grads() + m.n_grads());
    else EXPECT_TRUE(std::equal(off.begin(), off.end(), m.grads())) << int(mode);
  }
}

INSTANTIATE_TEST_SUITE_P(Tied, ModelGradients, ::testing::Values(false, true));

TEST(Model, LossAndGradientsIndependentOfPacking) {
  auto backend = make_cpu_backend({1});
  ModelConfig cfg = tiny_config();
  Model model(cfg, *backend);
  randomise(model, 23);
  const auto docs = sample_docs();
  Batch all = make_batch(docs, cfg, 4);
  const float scale = 1.0f / float(all.loss_tokens());

  model.zero_grads();
  double packed = model.step(all, scale, true).loss_sum;
  std::vector<float> g_packed(model.grads(), model.grads() + model.n_params());

  // The same documents as three separate micro-batches with gradient accumulation. Pixels
  // must match: re-derive each document's patches from the packed batch.
  model.zero_grads();
  double split = 0.0;
  int64_t patch_row = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    Batch one = make_batch({docs[i]}, cfg, 0);
    const int64_t pn = cfg.vision.patch_numel();
    std::copy(all.pixels.begin() + patch_row * pn,
              all.pixels.begin() + (patch_row + one.n_patches()) * pn, one.pixels.begin());
    patch_row += one.n_patches();
    split += model.step(one, scale, true).loss_sum;
  }
  EXPECT_NEAR(packed, split, 1e-4 * std::abs(packed));
  for (int64_t i = 0; i < model.n_params(); ++i)
    ASSERT_NEAR(model.grads()[i], g_packed[i], 1e-5 + 1e-3 * std::abs(g_packed[i])) << i;
}

TEST(Model, StepIsDeterministic) {
  auto backend = make_cpu_backend({2});
  ModelConfig cfg = tiny_config();
  Model model(cfg, *backend);
  randomise(model, 29);
  Batch b = make_batch(sample_docs(), cfg, 5);
  model.zero_grads();
  double l1 = model.step(b, 0.1f, true).loss_sum;
  std::vector<float> g1(model.grads(), model.grads() + model.n_params());
  model.zero_grads();
  double l2 = model.step(b, 0.1f, true).loss_sum;
  EXPECT_EQ(l1, l2);
  EXPECT_TRUE(std::equal(g1.begin(), g1.end(), model.grads()));
}

}  // namespace
}  // namespace dhp

namespace dhp {
namespace {

using testing::prompt_with;

// Each generated token again from a full forward pass over the prompt plus the tokens before it.
TEST(Generate, KvCacheMatchesFullRecomputation) {
  auto backend = make_cpu_backend({1});
  Model model(testing::tiny_config(), *backend);
  testing::randomise(model, 31);
  testing::expect_cache_matches_full_passes(model, 8);
}

// The same with Qwen3's q/k norms and Llama-3.x's scaled RoPE: positions come from the cache.
TEST(Generate, KvCacheMatchesFullRecomputationWithQkNormAndLlama3Rope) {
  auto backend = make_cpu_backend({1});
  Model model(qwen3_llama3_config(), *backend);
  testing::randomise(model, 37);
  testing::expect_cache_matches_full_passes(model, 6);
}

// M-RoPE: the prompt's image takes its rows and columns, and each new token goes on from one
// past the prompt's largest position, as a full pass over the longer prompt places it. The
// same model with 1-D RoPE generates other logits from the same prompt.
TEST(Generate, KvCacheMatchesFullRecomputationWithMRope) {
  for (bool interleaved : {true, false}) {
    ModelConfig cfg = testing::tiny_config();
    cfg.head_dim = 12;
    cfg.mrope_section = {2, 2, 2};
    cfg.mrope_interleaved = interleaved;
    auto backend = make_cpu_backend({1});
    Model model(cfg, *backend);
    testing::randomise(model, 37);
    const std::vector<float> cached_logits = testing::expect_cache_matches_full_passes(model, 5);
    ModelConfig plain_cfg = cfg;
    plain_cfg.mrope_section = {0, 0, 0};
    Model plain(plain_cfg, *backend);
    testing::randomise(plain, 37);
    SamplingOptions greedy;
    greedy.max_new_tokens = 5;
    std::vector<float> plain_logits;
    plain.generate(prompt_with({}), -1, greedy, &plain_logits);
    double diff = 0.0;
    for (size_t i = 0; i < std::min(plain_logits.size(), cached_logits.size()); ++i)
      diff = std::max(diff, double(std::abs(plain_logits[i] - cached_logits[i])));
    EXPECT_GT(diff, 1e-3) << "M-RoPE changed no logit";
  }
}

TEST(Generate, StopsAtEosAndSamplingIsSeeded) {
  auto backend = make_cpu_backend({1});
  Model model(testing::tiny_config(), *backend);
  testing::randomise(model, 37);
  SamplingOptions greedy;
  greedy.max_new_tokens = 6;
  const auto g = model.generate(prompt_with({}), -1, greedy);
  // With the first greedy token as <eos>, generation stops before emitting anything.
  EXPECT_TRUE(model.generate(prompt_with({}), g[0], greedy).empty());
  SamplingOptions hot;
  hot.max_new_tokens = 6;
  hot.temperature = 1.5;
  hot.top_p = 0.9;
  hot.seed = 4;
  const auto a = model.generate(prompt_with({}), -1, hot), b = model.generate(prompt_with({}), -1, hot);
  EXPECT_EQ(a, b);
  // A nucleus too small to hold more than the top token is greedy.
  hot.top_p = 1e-9;
  EXPECT_EQ(model.generate(prompt_with({}), -1, hot), g);
}

}  // namespace
}  // namespace dhp

namespace dhp {
namespace {

static_assert(!std::is_copy_constructible_v<Model> && !std::is_copy_assignable_v<Model>,
              "a copy of a Model would alias its device buffers");

// Reorders the tokens of a batch; every per-token array moves together.
Batch permute_tokens(const Batch& b, const std::vector<int64_t>& order) {
  Batch p = b;
  for (size_t i = 0; i < order.size(); ++i) {
    const size_t j = size_t(order[i]);
    p.tokens[i] = b.tokens[j];
    p.targets[i] = b.targets[j];
    p.doc[i] = b.doc[j];
    p.pos[i] = b.pos[j];
    p.image_slot[i] = b.image_slot[j];
  }
  return p;
}

TEST(Model, TokenOrderComesFromPositionsNotFromThePack) {
  // A rank holding zigzag pieces sees a sequence's chunks out of order and interleaved with
  // other documents: the causal order and RoPE must follow the positions, so the loss and
  // every gradient are those of the ordered pack.
  auto backend = make_cpu_backend({1});
  ModelConfig cfg = tiny_config();
  Model model(cfg, *backend);
  randomise(model, 41);
  const Batch b = make_batch(sample_docs(), cfg, 6);
  const float scale = 1.0f / float(b.loss_tokens());
  model.zero_grads();
  const double ordered = model.step(b, scale, true).loss_sum;
  const std::vector<float> g(model.grads(), model.grads() + model.n_params());

  // Last chunk of every document first, then the rest backwards, documents interleaved.
  std::vector<int64_t> order;
  for (int64_t t = b.T - 1; t >= 0; t -= 2) order.push_back(t);
  for (int64_t t = b.T - 2; t >= 0; t -= 2) order.push_back(t);
  ASSERT_EQ(int64_t(order.size()), b.T);
  model.zero_grads();
  const double shuffled = model.step(permute_tokens(b, order), scale, true).loss_sum;
  EXPECT_NEAR(shuffled, ordered, 1e-5 * std::abs(ordered));
  for (int64_t i = 0; i < model.n_params(); ++i)
    ASSERT_NEAR(model.grads()[i], g[i], 1e-6 + 1e-4 * std::abs(g[i])) << i;
}

// Local attention that counts how the model calls it.
class CountingAttention final : public Attention {
 public:
  explicit CountingAttention(const Ops& ops) : inner_(ops) {}
  void prepare(AttnMeta meta, int64_t T) override {
    ++prepared;
    inner_.prepare(meta, T);
  }
  void forward(int layer, Act out, float* lse, CAct q, CAct k, CAct v,
               const AttnDims& d) override {
    forward_layers.push_back(layer);
    inner_.forward(layer, out, lse, q, k, v, d);
  }
  void backward(int layer, Act dq, Act dk, Act dv, CAct dout, CAct out, const float* lse, CAct q,
                CAct k, CAct v, const AttnDims& d) override {
    backward_layers.push_back(layer);
    inner_.backward(layer, dq, dk, dv, dout, out, lse, q, k, v, d);
  }
  int prepared = 0;
  std::vector<int> forward_layers, backward_layers;

 private:
  LocalAttention inner_;
};

TEST(Model, DecoderAttentionIsTheObjectHandedIn) {
  auto backend = make_cpu_backend({1});
  ModelConfig cfg = tiny_config();
  cfg.layers = 3;
  Model model(cfg, *backend);
  randomise(model, 43);
  const Batch b = make_batch(sample_docs(), cfg, 7);
  const float scale = 1.0f / float(b.loss_tokens());
  model.zero_grads();
  const double plain = model.step(b, scale, true).loss_sum;
  const std::vector<float> g(model.grads(), model.grads() + model.n_params());

  CountingAttention counting(backend->ops());
  model.zero_grads();
  model.run(model.upload(b), scale, true, &counting);
  const StepStats st = model.take_stats();
  EXPECT_EQ(counting.prepared, 1);
  EXPECT_EQ(counting.forward_layers, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(counting.backward_layers, (std::vector<int>{2, 1, 0}));
  EXPECT_EQ(st.loss_sum, plain);
  EXPECT_TRUE(std::equal(g.begin(), g.end(), model.grads()));
}

TEST(Model, SteadyStateStepsAllocateNothing) {
  auto backend = make_cpu_backend({2});
  ModelConfig cfg = tiny_config();
  Model model(cfg, *backend);
  randomise(model, 47);
  const auto docs = sample_docs();
  const Batch big = make_batch(docs, cfg, 8);
  model.step(big, 0.1f, true);  // the largest shape: the arenas grow to it once
  const int64_t after_warmup = backend->allocations();
  for (int it = 0; it < 3; ++it)
    for (const auto& batch : {big, make_batch({docs[1]}, cfg, 9), make_batch({docs[0], docs[2]}, cfg, 10)}) {
      model.step(batch, 0.1f, true);
      model.step(batch, 0.0f, false);
    }
  EXPECT_EQ(backend->allocations(), after_warmup);
}

}  // namespace
}  // namespace dhp

namespace dhp {
namespace {

// bf16 storage of activations and working weights (on the CPU, fp32 kernels between bf16
// roundings): the loss and every gradient tensor stay within bf16's rounding of fp32's, the
// result is not fp32's (the storage really rounds), and the working weights follow changes
// of the master weights.
TEST(Model, Bf16StorageTracksFp32) {
  Fp32AndBf16 pair(tiny_config(), 17);
  ASSERT_EQ(pair.b16->ops().dtype(), DType::BF16);
  Model &a = pair.a, &b = pair.b;
  const Batch& batch = pair.batch;
  const StepStats &sa = pair.sa, &sb = pair.sb;
  EXPECT_EQ(sb.targets, sa.targets);
  // Activations carry 8 significant bits (2^-9 relative rounding) through 2 + 2 layers: the
  // loss moved by 1.4e-4 relative and the worst tensor's gradient by 1.9e-2 when measured.
  EXPECT_NEAR(sb.loss_sum, sa.loss_sum, 2e-3 * std::abs(sa.loss_sum));
  EXPECT_NE(sb.loss_sum, sa.loss_sum);
  std::string where;
  const double gap = worst_gradient_gap(a, b, &where);
  EXPECT_LT(gap, 5e-2) << where;
  EXPECT_GT(gap, 1e-4) << "bf16 gradients equal fp32's: nothing was rounded";

  // The optimizer writes the master weights through params(); the next pass must see them.
  for (Model* m : {&a, &b}) {
    float* p = m->params();
    for (int64_t i = 0; i < m->n_params(); ++i) p[i] *= 0.5f;
  }
  const StepStats ha = a.step(batch, 0.0f, false), hb = b.step(batch, 0.0f, false);
  // Halving every weight moves the loss by 4% here; stale working weights would keep bf16's
  // loss where it was, 20 times the rounding's 2e-3 from fp32's (1.4e-4 measured).
  EXPECT_GT(std::abs(ha.loss_sum - sa.loss_sum), 0.02 * std::abs(sa.loss_sum));
  EXPECT_NEAR(hb.loss_sum, ha.loss_sum, 2e-3 * std::abs(ha.loss_sum));
}

// The same bf16 staging with the decoder's q/k/v biases and a non-default eps: the bias is in
// the storage dtype like the weights, its gradient fp32.
TEST(Model, Bf16StorageTracksFp32WithQkvBiases) {
  ModelConfig cfg = tiny_config();
  cfg.attention_bias = true;
  cfg.rms_norm_eps = 1e-2;
  const Fp32AndBf16 pair(cfg, 19);
  const Model &a = pair.a, &b = pair.b;
  const StepStats &sa = pair.sa, &sb = pair.sb;
  // The tolerances of Bf16StorageTracksFp32: bf16's rounding through the same depth.
  EXPECT_NEAR(sb.loss_sum, sa.loss_sum, 2e-3 * std::abs(sa.loss_sum));
  std::string where;
  EXPECT_LT(worst_gradient_gap(a, b, &where), 5e-2) << where;
  const ParamSpec& bias = b.table().get("layers.0.attn.wv.bias");
  EXPECT_TRUE(std::any_of(b.grads() + bias.offset, b.grads() + bias.offset + bias.numel(),
                          [](float g) { return g != 0.0f; }));
}

// bf16 staging through the q/k norms, the output bias and the scaled RoPE.
TEST(Model, Bf16StorageTracksFp32WithQkNormAndLlama3Rope) {
  const Fp32AndBf16 pair(qwen3_llama3_config(), 23);
  EXPECT_NEAR(pair.sb.loss_sum, pair.sa.loss_sum, 2e-3 * std::abs(pair.sa.loss_sum));
  std::string where;
  EXPECT_LT(worst_gradient_gap(pair.a, pair.b, &where), 5e-2) << where;
  const ParamSpec& qn = pair.b.table().get("layers.0.attn.q_norm.weight");
  EXPECT_TRUE(std::any_of(pair.b.grads() + qn.offset, pair.b.grads() + qn.offset + qn.numel(),
                          [](float g) { return g != 0.0f; }));
}

}  // namespace
}  // namespace dhp
