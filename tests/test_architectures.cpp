// Every row of the architecture table (types/architecture.h) through one test: a tiny model of
// each vision tower and of each decoder family, through forward and backward with every
// parameter tensor's gradient checked by finite differences, recompute's bit-identical
// gradients, bf16 storage tracking fp32, the memory model's count of the parameter table and
// of the vision path's activations, and export -> import -> export byte-identical. A row added
// to the table is a case here without another line.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/check.h"
#include "model/model.h"
#include "parallel/memory_model.h"
#include "tests/file_text.h"
#include "tests/hf_fixture.h"
#include "tests/model_fixtures.h"
#include "data/layout.h"
#include "data/pack.h"
#include "trainer/config.h"
#include "trainer/evaluate.h"
#include "trainer/hf_checkpoint.h"

namespace dhp {
namespace {

namespace fs = std::filesystem;
using testing::Doc;
using testing::Fp32AndBf16;
using testing::make_batch;
using testing::randomise;
using testing::sample_docs;
using testing::tensor_bytes;
using testing::tiny_config;
using testing::tower_config;
using testing::worst_gradient_gap;

struct Row {
  std::string name;
  ModelConfig cfg;
};
void PrintTo(const Row& r, std::ostream* os) { *os << r.name; }

// A decoder family's traits on tiny_config(): the biases its checkpoints can carry (both
// where they are optional) and its q/k norms.
ModelConfig decoder_config(const DecoderTraits& d) {
  ModelConfig c = tiny_config();
  c.attention_bias = d.bias != DecoderBias::none;
  c.attention_out_bias = d.bias == DecoderBias::qkvo_optional;
  c.qk_norm = d.qk_norm;
  if (d.mrope) {
    c.head_dim = 12;
    c.mrope_section = {2, 2, 2};
  }
  return c;
}

std::vector<Row> rows() {
  std::vector<Row> out;
  for (const TowerTraits& t : kTowerTraits) {
    ModelConfig c = tower_config(t.arch);
    if (t.has_hf() && t.hf_model_class.empty()) c.vision.merge = 1;  // LLaVA's: a token per patch
    out.push_back({"tower_" + std::string(t.name), c});
  }
  for (const DecoderTraits& d : kDecoderTraits) out.push_back({"decoder_" + std::string(d.model_type), decoder_config(d)});
  return out;
}

class Architecture : public ::testing::TestWithParam<Row> {};

TEST_P(Architecture, EveryGradientByFiniteDifferences) { testing::expect_every_gradient(GetParam().cfg); }

// Each recompute mode rebuilds with the same ops on the same inputs: the same loss and
// bit-identical gradients, holding fewer activation bytes.
TEST_P(Architecture, RecomputeIsBitIdenticalAndHoldsLess) {
  const ModelConfig& cfg = GetParam().cfg;
  auto backend = make_cpu_backend({2});
  Model model(cfg, *backend);
  randomise(model, 31);
  const Batch b = make_batch(sample_docs(), cfg, 8);
  model.zero_grads();
  const double off = model.step(b, 0.1f, true).loss_sum;
  const std::vector<float> g_off(model.grads(), model.grads() + model.n_grads());
  size_t held = model.activation_bytes();
  for (Recompute mode : {Recompute::selective, Recompute::full}) {
    model.set_recompute(mode);
    model.zero_grads();
    EXPECT_EQ(model.step(b, 0.1f, true).loss_sum, off) << recompute_name(mode);
    EXPECT_TRUE(std::equal(g_off.begin(), g_off.end(), model.grads())) << recompute_name(mode);
    EXPECT_LT(model.activation_bytes(), held) << recompute_name(mode);
    held = model.activation_bytes();
  }
}

// The same function without LayerScale: each block's scales folded into the rows (and bias) of
// the Linear before them, the scales set to one.
void fold_layer_scale(Model& m) {
  const ParamTable& t = m.table();
  float* p = m.params();
  for (int l = 0; l < m.config().vision.layers; ++l) {
    const std::string pre = "vision.layers." + std::to_string(l) + ".";
    for (const auto& [ls, w, bias] : {std::array<const char*, 3>{"attn.ls.weight", "attn.wo.weight", "attn.wo.bias"},
                                      std::array<const char*, 3>{"mlp.ls.weight", "mlp.fc2.weight", "mlp.fc2.bias"}}) {
      const ParamSpec &scale = t.get(pre + ls), &weight = t.get(pre + w);
      const ParamSpec* b = t.find(pre + bias);
      const int64_t rows = scale.numel(), cols = weight.numel() / rows;
      for (int64_t r = 0; r < rows; ++r) {
        float& s = p[scale.offset + r];
        for (int64_t c = 0; c < cols; ++c) p[weight.offset + r * cols + c] *= s;
        if (b) p[b->offset + r] *= s;
        s = 1.0f;
      }
    }
  }
}

// bf16 storage: the loss and every gradient tensor within bf16's rounding of fp32's, and not
// equal to them (something was rounded).
TEST_P(Architecture, Bf16TracksFp32) {
  const ModelConfig& cfg = GetParam().cfg;
  const Fp32AndBf16 pair(cfg, 17);
  EXPECT_NEAR(pair.sb.loss_sum, pair.sa.loss_sum, 2e-3 * std::abs(pair.sa.loss_sum));
  EXPECT_NE(pair.sb.loss_sum, pair.sa.loss_sum);
  // The key bias takes no gradient (the softmax ignores it: its gradient is rounding alone).
  std::string where;
  const double worst = worst_gradient_gap(pair.a, pair.b, &where, [](const ParamSpec& s, double ref) {
    return ref < 1e-10 || s.name.find("attn.wk.bias") != std::string::npos;
  });
  std::printf("%s: worst bf16 gradient gap %.3g (%s)\n", GetParam().name.c_str(), worst, where.c_str());
  double bound = 5e-2;
  if (cfg.vision.traits().layer_scale) {
    // LayerScale shrinks each branch against its residual stream, and the gradients of what
    // feeds the branch with it, so bf16's relative gap on them is the function's, not the op's:
    // the bound is the gap of the same function with the scales folded into the Linears (no
    // LayerScale op, one rounding fewer), on the tensors both have, plus a quarter. Measured
    // on the intern_vit row: 0.050 with the op, 0.063 folded; with every scale 0.25 (exact in
    // bf16, no rounding added) 0.044.
    const Fp32AndBf16 folded(cfg, 17, fold_layer_scale);
    std::string folded_where;
    const double base = worst_gradient_gap(folded.a, folded.b, &folded_where, [](const ParamSpec& s, double ref) {
      return ref < 1e-10 || s.name.find("attn.wk.bias") != std::string::npos ||
             s.name.find(".ls.") != std::string::npos || s.name.find("attn.wo.") != std::string::npos ||
             s.name.find("mlp.fc2.") != std::string::npos;
    });
    std::printf("  folded into the Linears: %.3g (%s)\n", base, folded_where.c_str());
    bound = std::max(bound, 1.25 * base);
  }
  EXPECT_LT(worst, bound) << where;
  EXPECT_GT(worst, 1e-4) << "bf16 gradients equal fp32's: nothing was rounded";
}

// The memory model reads the same row: its parameter count is the table's, group by group, and
// what it prices for the model's arena per encoder row is what the vision path carves
// (measured as the model with images less the model on as many text tokens), with the arena's
// eighth of headroom above it and the batch's pixels and columns (the uploader's arena) beside
// it: within 3% above, never below. A tower four times as wide with four times the patches
// keeps the arena's alignment below 1% of it.
TEST_P(Architecture, MemoryModelPricesWhatTheEngineHolds) {
  ModelConfig cfg = GetParam().cfg;
  const DeviceProfile dev = device_profile("cpu");
  const ParamTable table(cfg);
  for (size_t g = 0; g < kParamGroups; ++g)
    EXPECT_EQ(MemoryModel(cfg, dev, 1, 80, false).group_parameters(ParamGroup(g)), table.group_numel(ParamGroup(g)))
        << kParamGroupNames[g];
  // Trainable: all but what a checkpoint's tower holds and never runs.
  int64_t trainable = 0;
  for (const ParamSpec& s : table.specs()) trainable += s.trainable ? s.numel() : 0;
  EXPECT_EQ(MemoryModel(cfg, dev, 1, 80, false).trainable_parameters(), trainable);
  cfg.vision.dim *= 4;
  cfg.vision.ffn *= 4;
  std::vector<Doc> with_images = sample_docs();
  for (Doc& d : with_images)
    for (auto& im : d.images) im.second = {im.second.first * 2, im.second.second * 2};
  std::vector<Doc> text = with_images;
  const int m2 = cfg.vision.merge * cfg.vision.merge;
  int64_t rows = 0;
  for (Doc& d : text) {
    for (auto it = d.images.rbegin(); it != d.images.rend(); ++it) {
      const int64_t p = int64_t(it->second.first) * it->second.second;
      rows += p + extra_image_rows(cfg);
      d.ids.insert(d.ids.begin() + long(it->first), size_t(p / m2), 4);
      d.loss.insert(d.loss.begin() + long(it->first), size_t(p / m2), 0);
    }
    d.images.clear();
  }
  const Batch a = make_batch(with_images, cfg, 1), b = make_batch(text, cfg, 1);
  ASSERT_EQ(a.T, b.T);
  for (Recompute mode : {Recompute::off, Recompute::selective, Recompute::full}) {
    auto carved = [&](const Batch& batch) {
      auto backend = make_cpu_backend({1});
      Model m(cfg, *backend);
      m.set_recompute(mode);
      m.initialise(1);
      m.step(batch, 0.1f, true);
      return int64_t(m.activation_bytes());
    };
    const double measured = double(carved(a) - carved(b)) * 9 / 8;
    const MemoryModel mem(cfg, dev, 1, 80, false, mode);
    const double predicted = double(mem.arenas_for(a.T, rows, 1, a.T).model - mem.arenas_for(a.T, 0, 1, a.T).model);
    EXPECT_GE(predicted, measured) << recompute_name(mode);
    EXPECT_LE(predicted, measured * 1.03) << recompute_name(mode);
  }
}

// Export, import the export into a model of the configuration its folder gives, export again:
// the same tensors' bytes and the same config.json. A tower without a Hugging Face form is not
// written (only the decoder is); a family an export does not name is written as the one it
// computes the same as.
TEST_P(Architecture, ExportImportExportIsByteIdentical) {
  const Row& row = GetParam();
  auto backend = make_cpu_backend({1});
  Model first(row.cfg, *backend);
  randomise(first, 23);
  const fs::path root = testing::hf_fixture_root() / row.name;
  HfExportOptions e;
  e.dir = (root / "one").string();
  e.image_token_index = row.cfg.vocab_size - 1;
  // An M-RoPE decoder is written only inside its vision-language model (the tower_qwen3_vl
  // row): alone it is refused, before any file is written.
  if (row.cfg.mrope() && row.cfg.vision.traits().hf_text_type.empty()) {
    EXPECT_THROW(export_hf_checkpoint(first, e), Error);
    EXPECT_FALSE(fs::exists(fs::path(e.dir) / "config.json"));
    return;
  }
  export_hf_checkpoint(first, e);
  Config again = parse_config("", "test.toml", {"--model.init=" + e.dir});
  if (!row.cfg.vision.traits().has_hf()) again.model.vision = row.cfg.vision;  // the decoder alone came
  apply_hf_init(again);
  Model second(again.model, *backend);
  second.initialise(5);
  import_hf_checkpoint(e.dir, second);
  HfExportOptions e2 = e;
  e2.dir = (root / "two").string();
  export_hf_checkpoint(second, e2);
  const auto one = tensor_bytes(e.dir), two = tensor_bytes(e2.dir);
  const auto written = hf_name_map(row.cfg, hf_export_layout(row.cfg));
  EXPECT_EQ(one.size(), written.size());
  EXPECT_EQ(one, two);
  for (const char* f : {"config.json", "generation_config.json"})
    EXPECT_EQ(testing::read_text(fs::path(e.dir) / f), testing::read_text(fs::path(e2.dir) / f)) << f;
  // The tensors written came across as the first model's.
  for (const HfBinding& w : written)
    for (const std::string& name : binding_tensors(w)) {
      const ParamSpec& a = first.table().get(name);
      const ParamSpec* b = second.table().find(name);
      ASSERT_TRUE(b) << name;
      EXPECT_TRUE(std::equal(first.params() + a.offset, first.params() + a.offset + a.numel(), second.params() + b->offset))
          << name;
    }
}

INSTANTIATE_TEST_SUITE_P(Rows, Architecture, ::testing::ValuesIn(rows()),
                         [](const ::testing::TestParamInfo<Row>& i) { return i.param.name; });

// A decoder with M-RoPE has no class an export writes: refused before any file is written,
// saying why.
TEST(ArchitectureExport, RefusesMRope) {
  ModelConfig cfg = tiny_config();
  cfg.head_dim = 12;
  cfg.mrope_section = {2, 2, 2};
  auto backend = make_cpu_backend({1});
  Model m(cfg, *backend);
  m.initialise(1);
  HfExportOptions e;
  e.dir = (testing::hf_fixture_root() / "mrope_export").string();
  std::string msg;
  try {
    export_hf_checkpoint(m, e);
  } catch (const Error& err) {
    msg = err.what();
  }
  EXPECT_NE(msg.find("M-RoPE (model.mrope_section = [2, 2, 2])"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(fs::path(e.dir) / "config.json"));
  EXPECT_FALSE(fs::exists(fs::path(e.dir) / "model.safetensors"));
}

// Exact-match evaluation generates from the sample's tokens before its answer: with their
// M-RoPE positions (an image's grid), not 1-D ones, which an M-RoPE model never trained on.
TEST(ArchitectureEval, AnswerPromptKeepsMRopePositions) {
  const std::vector<int32_t> layout = {7, 8, -1, 9, 10, 11};
  const std::vector<uint8_t> loss = {0, 0, 0, 0, 1, 1};
  const StoredLayout st{layout.data(), loss.data(), int64_t(layout.size()), {{2, 3}}, SpecialIds{}};
  const Sample s = expand_layout(st, 0, full_length(st), nullptr, 2, ImageLoad::Skip);
  const size_t a = size_t(std::find(s.loss_mask.begin(), s.loss_mask.end(), 1) - s.loss_mask.begin());
  const Sample prompt = answer_prompt(s, a);
  ASSERT_EQ(prompt.tokens.size(), a);
  EXPECT_EQ(prompt.rope_pos, std::vector<int32_t>(s.rope_pos.begin(), s.rope_pos.begin() + long(3 * a)));
  // After the 2 x 3 image the count is 3 behind the token index: 1-D positions would differ.
  EXPECT_NE(prompt.rope_pos[3 * (a - 1)], int32_t(a - 1));
}

// The table itself: names unique, the Hugging Face names of each row unique (rows of one
// checkpoint family, InternViT-300M's and -6B's, share theirs and their tensor names, and the
// block keys the config reader chooses between them by differ), LLaVA's feature strategy the
// one that drops exactly the row's class row.
TEST(ArchitectureTable, RowsAreConsistent) {
  std::set<std::string> names, hf;
  std::map<std::string, const TowerTraits*> first;  // a Hugging Face name's first row
  for (const TowerTraits& t : kTowerTraits) {
    EXPECT_TRUE(names.insert(std::string(t.name)).second) << t.name;
    EXPECT_EQ(t.has_hf(), t.hf_names != HfTowerNames::none) << t.name << ": a Hugging Face tower has its tensor names";
    if (!t.has_hf()) continue;
    for (std::string_view n : {t.hf_model_type, t.hf_tower_class, t.hf_dual_class, t.hf_model_class, t.hf_remote_class}) {
      if (n.empty()) continue;
      const auto [it, fresh] = first.emplace(std::string(n), &t);
      if (fresh) continue;
      const TowerTraits& a = *it->second;
      EXPECT_EQ(a.hf_names, t.hf_names) << n << ": rows sharing it share their tensor names";
      EXPECT_TRUE(a.norm != t.norm || a.qk_norm != t.qk_norm || a.qkv_bias != t.qkv_bias)
          << n << ": " << a.name << " and " << t.name << " differ in no block key the config reader reads";
    }
    // A remote-code class comes beside transformers' class of the same model; a model's own
    // decoder family is one of the decoder rows.
    EXPECT_TRUE(t.hf_remote_class.empty() || !t.hf_model_class.empty()) << t.name;
    if (!t.hf_text_type.empty()) {
      EXPECT_FALSE(t.hf_model_class.empty()) << t.name;
      EXPECT_TRUE(std::any_of(std::begin(kDecoderTraits), std::end(kDecoderTraits),
                              [&](const DecoderTraits& d) { return d.model_type == t.hf_text_type; }))
          << t.hf_text_type;
    }
    // A tower LLaVA composes: its feature strategy drops exactly its class row, and it is read
    // up to LLaVA's feature layer.
    if (!t.hf_model_class.empty()) continue;
    EXPECT_EQ(t.hf_feature_select, t.class_row ? "default" : "full") << t.name;
    EXPECT_TRUE(t.feature_layer) << t.name << ": a checkpoint's tower is read up to LLaVA's feature layer";
  }
  for (const auto& [n, row] : first) hf.insert(n);
  for (const DecoderTraits& d : kDecoderTraits) {
    EXPECT_TRUE(hf.insert(std::string(d.model_type)).second) << d.model_type;
    EXPECT_TRUE(hf.insert(std::string(d.hf_class)).second) << d.hf_class;
  }
  EXPECT_EQ(kVisionArchNames.size(), std::size(kTowerTraits));
}

}  // namespace
}  // namespace dhp
