// InternVL3 checkpoints on tiny random folders in both of its published layouts
// (tests/reference/make_hf_internvl_fixture.py): transformers' InternVLForConditionalGeneration
// and OpenGVLab's remote-code InternVLChatModel. The config's keys and refusals, the import
// (the fused qkv, the layer scales, the projector's LayerNorm), the export round trip in each
// layout, and the model against an independent PyTorch implementation of InternVL
// (tests/reference/hf_internvl_ref.py) on a one-tile image, a six-tile image with its
// thumbnail and a two-tile one, with negative controls that must fail.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "model/model.h"
#include "tests/error_of.h"
#include "tests/file_text.h"
#include "tests/hf_fixture.h"
#include "tests/hf_reference.h"
#include "trainer/hf_checkpoint.h"

namespace dhp {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::error_of;
using testing::RefDistance;
using testing::RefResult;

const fs::path& root() { return testing::hf_fixture_root(); }
fs::path fixture(const std::string& name, const std::string& args) {
  return testing::hf_fixture("make_hf_internvl_fixture.py", name, args);
}
// Three InternViT layers (dv 32, 4 heads), 16 px tiles of 4 px patches: a 4 x 4 grid, 2 x 2
// tokens a tile after the pixel shuffle; a Qwen2 decoder of two layers (48 wide, GQA 4/2).
// The same seed in both layouts: the same values under two sets of names.
fs::path internvl() { return fixture("internvl", ""); }
fs::path internvl_original() { return fixture("internvl_original", "--layout original"); }
// InternViT-6B's blocks (InternVL3-38B and 78B): RMSNorm, no q/k/v biases, q/k RMSNorm over the
// whole width.
const char* const k6b = "--vnorm rms_norm --qk-norm --no-attention-bias";
fs::path internvl_6b() { return fixture("internvl_6b", k6b); }
fs::path internvl_6b_original() { return fixture("internvl_6b_original", std::string(k6b) + " --layout original"); }

Config applied(const std::vector<std::string>& overrides) {
  Config c = parse_config("", "test.toml", overrides);
  apply_hf_init(c);
  return c;
}
ModelConfig config_of(const fs::path& dir) { return applied({"--model.init=" + dir.string()}).model; }

// ---------------------------------------------------------------------------------------------
// config.json

TEST(HfInternVlConfig, BothLayoutsSetTheSameModel) {
  for (const fs::path& dir : {internvl(), internvl_original()}) {
    const ModelConfig m = config_of(dir);
    EXPECT_EQ(m.vision.arch, VisionArch::intern_vit) << dir;
    EXPECT_EQ(m.vision.dim, 32);
    EXPECT_EQ(m.vision.layers, 3);
    EXPECT_EQ(m.vision.heads, 4);
    EXPECT_EQ(m.vision.ffn, 64);
    EXPECT_EQ(m.vision.patch, 4);
    EXPECT_EQ(m.vision.image_size, 16);
    EXPECT_EQ(m.vision.merge, 2);  // downsample_ratio 0.5
    EXPECT_EQ(m.vision.feature_layer, -1);
    EXPECT_EQ(m.vision.norm_eps, 1e-6);
    EXPECT_EQ(m.vision.act, VisionAct::gelu);
    EXPECT_EQ(m.vision.resize, ImageFit::siglip);  // each tile a square of image_size
    EXPECT_EQ(m.vision.pixel_mean, kImagenetPixelMean);
    EXPECT_EQ(m.vision.pixel_std, kImagenetPixelStd);
    // InternVL's tiling: max_patches / max_dynamic_patch 12, a thumbnail.
    EXPECT_EQ(data_geometry(m.vision).max_tiles, 12);
    EXPECT_EQ(m.vision.min_tiles, 1);
    EXPECT_TRUE(m.vision.thumbnail);
    EXPECT_EQ(m.dim, 48);
    EXPECT_EQ(m.layers, 2);
    EXPECT_EQ(m.kv_heads, 2);
    EXPECT_TRUE(m.attention_bias);  // Qwen2: q/k/v biases
    EXPECT_FALSE(m.attention_out_bias);
    EXPECT_FALSE(m.tie_embeddings);
    EXPECT_EQ(m.vocab_size, 512);
  }
}

// The blocks' keys choose InternViT-300M's or InternViT-6B's row; both layouts agree.
TEST(HfInternVlConfig, TheBlocksChooseTheRow) {
  for (const fs::path& dir : {internvl_6b(), internvl_6b_original()}) {
    const ModelConfig m = config_of(dir);
    EXPECT_EQ(m.vision.arch, VisionArch::intern_vit_6b) << dir;
    EXPECT_EQ(m.vision.dim, 32);
    EXPECT_EQ(m.vision.norm_eps, 1e-6);
  }
  EXPECT_EQ(config_of(internvl()).vision.arch, VisionArch::intern_vit);
}

// Blocks of neither InternViT, a final LayerNorm and the remote code's v1 shuffle order are
// refused by name, not run as something else.
TEST(HfInternVlConfig, RefusesWhatItCannotRun) {
  const std::string rms = error_of([&] { config_of(fixture("internvl_rms", "--vnorm rms_norm")); });
  EXPECT_NE(rms.find("\"norm_type\" rms_norm with \"use_qk_norm\" false and \"attention_bias\" true is no "
                     "InternViT dhp runs"), std::string::npos) << rms;
  const std::string qk = error_of([&] { config_of(fixture("internvl_qk", "--layout original --qk-norm")); });
  EXPECT_NE(qk.find("\"qk_normalization\" true"), std::string::npos) << qk;
  const std::string pool = error_of([&] { config_of(fixture("internvl_pool", "--no-mean-pooling")); });
  EXPECT_NE(pool.find("\"use_mean_pooling\" is false"), std::string::npos) << pool;
  const fs::path v1 = root() / "internvl_v1";
  fs::create_directories(v1);
  for (const auto& e : fs::directory_iterator(internvl_original())) fs::copy(e.path(), v1 / e.path().filename());
  json c = json::parse(std::ifstream(v1 / "config.json"));
  c["ps_version"] = "v1";
  std::ofstream(v1 / "config.json") << c.dump(2);
  const std::string order = error_of([&] { config_of(v1); });
  EXPECT_NE(order.find("\"ps_version\" is v1"), std::string::npos) << order;
  c["ps_version"] = "v2";
  c["pad2square"] = true;
  std::ofstream(v1 / "config.json") << c.dump(2);
  const std::string pad = error_of([&] { config_of(v1); });
  EXPECT_NE(pad.find("\"pad2square\" is true"), std::string::npos) << pad;
  const fs::path seq = root() / "internvl_seq";
  fs::create_directories(seq);
  for (const auto& e : fs::directory_iterator(internvl())) fs::copy(e.path(), seq / e.path().filename());
  json h = json::parse(std::ifstream(seq / "config.json"));
  h["image_seq_length"] = 256;  // InternVL3's, for 448 px tiles; this fixture's tiles give 4
  std::ofstream(seq / "config.json") << h.dump(2);
  const std::string tokens = error_of([&] { config_of(seq); });
  EXPECT_NE(tokens.find("\"image_seq_length\" is 256"), std::string::npos) << tokens;
}

// InternVL3's remote-code folders keep Qwen2.5's rope_scaling "dynamic" (factor 2): plain RoPE
// within max_position_embeddings (4096 here), refused for longer sequences, written back.
TEST(HfInternVlConfig, DynamicRopeIsPlainWithinItsPositions) {
  const fs::path dir = root() / "internvl_dynamic";
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(internvl_original())) fs::copy(e.path(), dir / e.path().filename());
  json c = json::parse(std::ifstream(dir / "config.json"));
  c["llm_config"]["rope_scaling"] = {{"factor", 2.0}, {"rope_type", "dynamic"}, {"type", "dynamic"}};
  std::ofstream(dir / "config.json") << c.dump(2);
  const ModelConfig m = config_of(dir);
  EXPECT_EQ(m.rope_scaling, RopeScaling::dynamic);
  EXPECT_EQ(m.rope_factor, 2.0);
  const std::string longer = error_of([&] { applied({"--model.init=" + dir.string(), "--data.max_tokens=8192"}); });
  EXPECT_NE(longer.find("\"rope_scaling\" has rope_type dynamic, which rescales RoPE beyond max_position_embeddings (4096)"),
            std::string::npos) << longer;
  auto backend = make_cpu_backend({1});
  Model model(m, *backend);
  model.initialise(3);
  import_hf_checkpoint(dir.string(), model, false);
  HfExportOptions e;
  e.dir = (root() / "internvl_dynamic_export").string();
  e.image_token_index = m.vocab_size - 1;
  e.remote_code = true;
  export_hf_checkpoint(model, e);
  const json out = json::parse(std::ifstream(fs::path(e.dir) / "config.json"));
  EXPECT_EQ(out["llm_config"]["rope_scaling"]["rope_type"], "dynamic");
  EXPECT_EQ(out["llm_config"]["rope_scaling"]["factor"], 2.0);
  EXPECT_EQ(config_of(e.dir).rope_scaling, RopeScaling::dynamic);
}

// ---------------------------------------------------------------------------------------------
// import and export

std::vector<float> imported(const fs::path& dir) {
  const ModelConfig cfg = config_of(dir);
  auto backend = make_cpu_backend({1});
  Model m(cfg, *backend);
  m.initialise(3);
  const HfImport r = import_hf_checkpoint(dir.string(), m, false);
  EXPECT_TRUE(r.initialised.empty()) << r.initialised.front();
  return std::vector<float>(m.params(), m.params() + m.n_params());
}

// The remote code's fused qkv, ls1/ls2 and mlp1.{0,1,3} hold what transformers' q/k/v_proj,
// lambda_1/2 and layer_norm/linear_1/linear_2 hold: both folders give bit-identical weights.
TEST(HfInternVlImport, BothLayoutsGiveTheSameWeights) {
  const std::vector<float> a = imported(internvl()), b = imported(internvl_original());
  ASSERT_EQ(a.size(), b.size());
  EXPECT_TRUE(a == b);
  EXPECT_TRUE(imported(internvl_6b()) == imported(internvl_6b_original()));
  // And they are the file's: the layer scale and the class row, checked by name.
  const ModelConfig cfg = config_of(internvl());
  const ParamTable table(cfg);
  const auto file = testing::folder_f32(internvl());
  const std::vector<float>& ls = file.at("model.vision_tower.encoder.layer.2.lambda_2");
  EXPECT_TRUE(std::equal(ls.begin(), ls.end(), a.begin() + table.get("vision.layers.2.mlp.ls.weight").offset));
  const std::vector<float>& cls = file.at("model.vision_tower.embeddings.cls_token");
  EXPECT_TRUE(std::equal(cls.begin(), cls.end(), a.begin() + table.get("vision.class_embed").offset));
}

// Each layout exported from its own import is the folder byte for byte; an export in the other
// layout is the other folder's tensors (the fixtures share their values).
TEST(HfInternVlExport, RoundTripsAreByteIdenticalInBothLayouts) {
  for (const bool remote : {false, true})
    for (const bool six : {false, true}) {
      const fs::path hf = six ? internvl_6b() : internvl(), original = six ? internvl_6b_original() : internvl_original();
      const fs::path src = remote ? original : hf;
      const ModelConfig cfg = config_of(src);
      auto backend = make_cpu_backend({1});
      Model m(cfg, *backend);
      m.initialise(3);
      import_hf_checkpoint(src.string(), m, false);
      for (const bool out_remote : {false, true}) {
        HfExportOptions e;
        e.dir = (root() / fmt::format("export_{}_{}_{}", six, remote, out_remote)).string();
        e.image_token_index = cfg.vocab_size - 1;
        e.remote_code = out_remote;
        export_hf_checkpoint(m, e);
        EXPECT_EQ(testing::tensor_bytes(out_remote ? original : hf), testing::tensor_bytes(e.dir))
            << six << ": " << remote << " -> " << out_remote;
        const ModelConfig again = config_of(e.dir);
        EXPECT_EQ(ParamTable(again).total(), ParamTable(cfg).total());
        EXPECT_EQ(again.vision.feature_layer, cfg.vision.feature_layer);
        EXPECT_EQ(again.vision.pixel_mean, cfg.vision.pixel_mean);
        Model second(again, *backend);
        second.initialise(9);
        import_hf_checkpoint(e.dir, second, false);
        HfExportOptions e2 = e;
        e2.dir += "_again";
        export_hf_checkpoint(second, e2);
        EXPECT_EQ(testing::tensor_bytes(e.dir), testing::tensor_bytes(e2.dir));
        for (const char* f : {"config.json", "preprocessor_config.json"}) {
          if (fs::exists(fs::path(e.dir) / f)) {
            EXPECT_EQ(testing::read_text(fs::path(e.dir) / f), testing::read_text(fs::path(e2.dir) / f)) << f;
          }
        }
        const json c = json::parse(std::ifstream(fs::path(e.dir) / "config.json"));
        EXPECT_EQ(c["architectures"][0], out_remote ? "InternVLChatModel" : "InternVLForConditionalGeneration");
      }
    }
}

// ---------------------------------------------------------------------------------------------
// the model against the PyTorch reference

// Images as InternVL's tiling gives them: one tile; six tiles (a 2 x 3 grid) and the
// thumbnail; two tiles (1 x 2) and the thumbnail. Each tile its own encoder image.
const std::vector<int> kTiles = {1, 7, 3};

// Text, then <img> the image's tiles' <IMG_CONTEXT> positions </img>, for each image; text at
// the end. Targets on text. The tiles' pixels (S x S x 3, row-major) go to `rgb`.
Batch internvl_batch(const ModelConfig& cfg, std::vector<std::vector<uint8_t>>* rgb) {
  Batch b;
  Rng rng(31);
  const int p = cfg.vision.patch, S = cfg.vision.image_size, g = S / p, per_tile = (g / 2) * (g / 2);
  const int32_t V = cfg.vocab_size, begin = V - 3, end = V - 2, context = V - 1;
  const std::vector<std::vector<int32_t>> text = {{1, 5, 9}, {33, 200, 17}, {3, 99, 250, 7}, {64, 12, 301, 45, 2}};
  int32_t slot = 0;
  auto add = [&](int32_t tok, int32_t s) {
    b.tokens.push_back(tok);
    b.image_slot.push_back(s);
    b.doc.push_back(0);
    b.pos.push_back(int32_t(b.pos.size()));
  };
  for (size_t k = 0; k < text.size(); ++k) {
    for (int32_t t : text[k]) add(t, -1);
    if (k == kTiles.size()) break;
    add(begin, -1);
    for (int tile = 0; tile < kTiles[k]; ++tile) {
      std::vector<uint8_t> pix(size_t(S) * S * 3);
      for (auto& v : pix) v = uint8_t(rng.below(256));
      b.images.push_back(PackedImage{b.n_patches(), g, g});
      testing::append_patches(b, pix.data(), S, S, p);
      for (int t = 0; t < per_tile; ++t) add(context, slot++);
      rgb->push_back(std::move(pix));
    }
    add(end, -1);
  }
  b.T = int64_t(b.tokens.size());
  for (int64_t t = 0; t < b.T; ++t)
    b.targets.push_back(b.image_slot[size_t(t)] < 0 && t + 1 < b.T && b.image_slot[size_t(t + 1)] < 0
                            ? b.tokens[size_t(t + 1)] : -1);
  b.sample_ids.push_back(0);
  return b;
}

RefResult reference(const fs::path& ckpt, const std::string& flags = "") {
  static int n = 0;
  const fs::path out = root() / ("internvl_ref" + std::to_string(n++));
  fs::create_directories(out);
  const ModelConfig cfg = config_of(ckpt);
  std::vector<std::vector<uint8_t>> rgb;
  const Batch b = internvl_batch(cfg, &rgb);
  json tiles = json::array();
  for (size_t i = 0; i < rgb.size(); ++i) {
    const std::string name = "tile" + std::to_string(i) + ".rgb";
    std::ofstream(out / name, std::ios::binary).write(reinterpret_cast<const char*>(rgb[i].data()),
                                                      std::streamsize(rgb[i].size()));
    tiles.push_back({{"pixels", name}});
  }
  return testing::run_reference("hf_internvl_ref.py", ckpt, out,
                                 json{{"tokens", b.tokens}, {"targets", b.targets}, {"tiles", tiles}}, b.T,
                                 cfg.vocab_size, flags);
}

RefResult run_dhp(const fs::path& ckpt) {
  const ModelConfig cfg = config_of(ckpt);
  auto backend = make_cpu_backend({1});
  Model m(cfg, *backend);
  m.initialise(3);
  import_hf_checkpoint(ckpt.string(), m, false);
  std::vector<std::vector<uint8_t>> rgb;
  const Batch b = internvl_batch(cfg, &rgb);
  return testing::run_step(m, b, hf_export_layout(cfg, read_hf_config(ckpt.string(), cfg, 0, 0).remote_code));
}

TEST(HfInternVlReference, MatchesInBothLayouts) {
  for (const fs::path& dir : {internvl(), internvl_original(), internvl_6b(), internvl_6b_original()})
    testing::expect_reference_match(testing::ref_distance(reference(dir), run_dhp(dir)), dir.filename().string());
}

// Each must miss by more than ten times the bounds, or the match above would not prove the
// semantics it names.
TEST(HfInternVlNegative, EachControlFails) {
  const RefResult got = run_dhp(internvl());
  for (const auto& [flag, what] : std::vector<std::pair<std::string, std::string>>{
           {"--shuffle-order", "the pixel shuffle's 2x2 neighbours in column-major order"},
           {"--no-layer-scale", "LayerScale off"},
           {"--keep-cls", "the class row kept as a feature"},
           {"--no-projector-norm", "the projector's LayerNorm left out"}}) {
    testing::expect_control_misses(testing::ref_distance(reference(internvl(), flag), got), what);
  }
  // InternViT-6B's q/k norms span the whole width, not each head.
  testing::expect_control_misses(
      testing::ref_distance(reference(internvl_6b(), "--qk-norm-per-head"), run_dhp(internvl_6b())),
      "q/k norms per head");
}

}  // namespace
}  // namespace dhp
