// Qwen3-VL (Qwen3VLForConditionalGeneration) checkpoints on tiny random folders in Hugging
// Face's exact layout (tests/reference/make_hf_qwen3_vl_fixture.py): the config's keys and
// refusals, the import (fused qkv, the Conv3d patch embedding over two frames, the mergers),
// the export round trip, and the model against an independent PyTorch implementation of
// transformers' Qwen3-VL (tests/reference/hf_qwen3_vl_ref.py) on images of several sizes and
// a short video (frame pairs), the M-RoPE positions included, with negative controls that must
// fail.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
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

const fs::path& root() { return testing::hf_fixture_root(); }
fs::path fixture(const std::string& name, const std::string& args) {
  return testing::hf_fixture("make_hf_qwen3_vl_fixture.py", name, args);
}
// Three tower layers, DeepStack after layers 0 and 1, a decoder of three layers with head 16
// and M-RoPE sections [4, 2, 2]; a 4x4 position grid at patch 4 (image_size 16), merge 2.
fs::path qwen3_vl() { return fixture("qwen3_vl", ""); }

Config applied(const std::vector<std::string>& overrides) {
  Config c = parse_config("", "test.toml", overrides);
  apply_hf_init(c);
  return c;
}
ModelConfig config_of(const fs::path& dir) { return applied({"--model.init=" + dir.string()}).model; }

// ---------------------------------------------------------------------------------------------
// config.json

TEST(HfQwen3VlConfig, SetsTheTowerDecoderAndProcessor) {
  const ModelConfig m = config_of(qwen3_vl());
  EXPECT_EQ(m.vision.arch, VisionArch::qwen3_vl);
  EXPECT_EQ(m.vision.dim, 32);
  EXPECT_EQ(m.vision.layers, 3);
  EXPECT_EQ(m.vision.heads, 4);
  EXPECT_EQ(m.vision.ffn, 64);
  EXPECT_EQ(m.vision.patch, 4);
  EXPECT_EQ(m.vision.merge, 2);
  EXPECT_EQ(m.vision.image_size, 16);  // num_position_embeddings 16: a 4x4 grid of 4 px patches
  EXPECT_EQ(m.vision.deepstack, (std::vector<int>{0, 1}));
  EXPECT_EQ(m.vision.act, VisionAct::gelu_tanh);
  EXPECT_EQ(m.vision.resize, ImageFit::qwen);
  EXPECT_EQ(m.vision.pixel_mean, kSiglipPixelMean);
  EXPECT_EQ(m.dim, 48);
  EXPECT_EQ(m.layers, 3);
  EXPECT_EQ(m.hd(), 16);
  EXPECT_TRUE(m.qk_norm);
  EXPECT_EQ(m.mrope_section, (std::array<int, 3>{4, 2, 2}));
  EXPECT_TRUE(m.mrope_interleaved);
  EXPECT_EQ(m.rope_theta, 5000000.0);
  EXPECT_FALSE(m.tie_embeddings);
  EXPECT_EQ(m.vocab_size, 512);
  // transformers 5's rope_parameters say the same.
  const ModelConfig v5 = config_of(fixture("qwen3_vl_v5", "--rope-key rope_parameters"));
  EXPECT_EQ(v5.mrope_section, m.mrope_section);
  EXPECT_EQ(v5.rope_theta, m.rope_theta);
}

// Qwen3-VL always interleaves (transformers never reads mrope_interleaved): a config that says
// otherwise is not guessed at.
TEST(HfQwen3VlConfig, RefusesWhatItCannotRun) {
  const std::string blocked = error_of([&] { config_of(fixture("qwen3_vl_blocked", "--blocked-config")); });
  EXPECT_NE(blocked.find("\"mrope_interleaved\" is false"), std::string::npos) << blocked;
  const std::string frames = error_of([&] { config_of(fixture("qwen3_vl_t1", "--temporal 1")); });
  EXPECT_NE(frames.find("\"temporal_patch_size\" is 1"), std::string::npos) << frames;
  const std::string both = error_of([&] {
    applied({"--model.init=" + qwen3_vl().string(), "--model.vision.init=" + qwen3_vl().string()});
  });
  EXPECT_NE(both.find("with its own vision tower"), std::string::npos) << both;
}

// Only a family whose row reads M-RoPE sets it: a text folder of another family keeps the
// configuration's model.mrope_section (M-RoPE over a Qwen2 decoder), as a resume re-reads it.
TEST(HfQwen3VlConfig, AnotherFamilyKeepsTheConfigurationsMRope) {
  const fs::path qwen2 = testing::hf_fixture("make_hf_fixture.py", "qwen2_text", "--arch qwen2 --hidden 128 --kv 2");
  const ModelConfig m = applied({"--model.init=" + qwen2.string(), "--model.mrope_section=[6, 5, 5]"}).model;
  EXPECT_EQ(m.mrope_section, (std::array<int, 3>{6, 5, 5}));
}

// ---------------------------------------------------------------------------------------------
// import and export

TEST(HfQwen3VlImport, SplitsTheFusedQkvAndThePatchEmbeddingsFrames) {
  const ModelConfig cfg = config_of(qwen3_vl());
  auto backend = make_cpu_backend({1});
  Model m(cfg, *backend);
  m.initialise(3);
  const HfImport r = import_hf_checkpoint(qwen3_vl().string(), m, false);
  EXPECT_TRUE(r.initialised.empty()) << r.initialised.front();
  const auto file = testing::folder_f32(qwen3_vl());
  const int64_t dv = cfg.vision.dim;
  const std::vector<float>& qkv = file.at("model.visual.blocks.1.attn.qkv.weight");
  const char* const parts[] = {"wq", "wk", "wv"};
  for (int k = 0; k < 3; ++k) {
    const ParamSpec& s = m.table().get(std::string("vision.layers.1.attn.") + parts[k] + ".weight");
    EXPECT_TRUE(std::equal(qkv.begin() + k * dv * dv, qkv.begin() + (k + 1) * dv * dv, m.params() + s.offset)) << k;
  }
  // (dv, 3, t, p, p) in the file; frame t's (ky, kx, c) values at t·p·p·3 in dhp's row.
  const std::vector<float>& conv = file.at("model.visual.patch_embed.proj.weight");
  const ParamSpec& pe = m.table().get("vision.patch_embed.weight");
  const int64_t p = 4, row = 2 * p * p * 3;
  for (int64_t o : {int64_t(0), dv - 1})
    for (int64_t t = 0; t < 2; ++t)
      for (int64_t c = 0; c < 3; ++c)
        EXPECT_EQ(m.params()[pe.offset + o * row + t * p * p * 3 + (1 * p + 2) * 3 + c],
                  conv[size_t(o * row + (c * 2 + t) * p * p + 1 * p + 2)]);
}

TEST(HfQwen3VlExport, RoundTripIsByteIdentical) {
  const ModelConfig cfg = config_of(qwen3_vl());
  auto backend = make_cpu_backend({1});
  Model m(cfg, *backend);
  m.initialise(3);
  import_hf_checkpoint(qwen3_vl().string(), m, false);
  HfExportOptions e;
  e.dir = (root() / "qwen3_vl_export").string();
  e.image_token_index = cfg.vocab_size - 2;
  export_hf_checkpoint(m, e);
  EXPECT_EQ(testing::tensor_bytes(qwen3_vl()), testing::tensor_bytes(e.dir));
  // Read back, the same model.
  const ModelConfig again = config_of(e.dir);
  EXPECT_EQ(again.vision.deepstack, cfg.vision.deepstack);
  EXPECT_EQ(again.mrope_section, cfg.mrope_section);
  EXPECT_EQ(again.vision.min_pixels, cfg.vision.min_pixels);
  EXPECT_EQ(again.vision.max_pixels, cfg.vision.max_pixels);
  const json c = json::parse(std::ifstream(fs::path(e.dir) / "config.json"));
  EXPECT_EQ(c["architectures"][0], "Qwen3VLForConditionalGeneration");
  EXPECT_EQ(c["image_token_id"], cfg.vocab_size - 2);
  EXPECT_EQ(c["text_config"]["rope_scaling"]["mrope_interleaved"], true);
  Model second(again, *backend);
  second.initialise(9);
  import_hf_checkpoint(e.dir, second, false);
  HfExportOptions e2 = e;
  e2.dir = (root() / "qwen3_vl_export2").string();
  export_hf_checkpoint(second, e2);
  EXPECT_EQ(testing::tensor_bytes(e.dir), testing::tensor_bytes(e2.dir));
  for (const char* f : {"config.json", "preprocessor_config.json"})
    EXPECT_EQ(testing::read_text(fs::path(e.dir) / f), testing::read_text(fs::path(e2.dir) / f)) << f;
}

// ---------------------------------------------------------------------------------------------
// the model against the PyTorch reference

struct Image {
  int h, w;
  int frames = 1;  // a video: frames in pairs, each pair after its timestamp's text
};
// Grids of 4x6, 6x4 and 8x4 patches against the pretrained 4x4: each resized differently;
// then a video of four 16x24 frames (two frame pairs).
const std::vector<Image> kImages = {{16, 24}, {24, 16}, {32, 16}, {16, 24, 4}};

// A reference run's results and the M-RoPE positions it worked out (dhp's: the batch's).
struct Result {
  testing::RefResult r;
  std::vector<int32_t> rope_pos;  // (T, 3)
};

// Text, then <|vision_start|> the image's pads <|vision_end|>, for each image; a video's frame
// pairs each so, with <|video_pad|>, after two tokens of its timestamp; text at the end.
// Targets on text (a pad neither predicts nor is predicted). M-RoPE positions as dhp's data path
// gives them (data/layout.cpp): text counts on, an image's tokens take the count at its start
// plus their merged row and column, and the count then moves past its larger side.
Batch qwen_batch(const ModelConfig& cfg, std::vector<std::vector<uint8_t>>* rgb) {
  Batch b;
  Rng rng(29);
  const int p = cfg.vision.patch, m = cfg.vision.merge;
  const int32_t V = cfg.vocab_size, start = V - 4, end = V - 3, image_pad = V - 2, video_pad = V - 1;
  const std::vector<std::vector<int32_t>> text = {{1, 5, 9}, {33, 200, 17}, {3, 99, 250, 7}, {64, 12}, {301, 45, 2}};
  int32_t slot = 0, count = 0;
  auto add = [&](int32_t tok, int32_t s, std::array<int32_t, 3> rope) {
    b.tokens.push_back(tok);
    b.image_slot.push_back(s);
    b.doc.push_back(0);
    b.pos.push_back(int32_t(b.pos.size()));
    b.rope_pos.insert(b.rope_pos.end(), rope.begin(), rope.end());
  };
  auto text_token = [&](int32_t tok) {
    add(tok, -1, {count, count, count});
    ++count;
  };
  for (size_t k = 0; k < text.size(); ++k) {
    for (int32_t t : text[k]) text_token(t);
    if (k == kImages.size()) break;
    const Image im = kImages[k];
    const size_t frame = size_t(im.h) * im.w * 3;
    std::vector<uint8_t> pix(frame * size_t(im.frames));
    for (auto& v : pix) v = uint8_t(rng.below(256));
    const int gh = im.h / p, gw = im.w / p, rows = gh / m, cols = gw / m;
    const int per = im.frames == 1 ? 1 : 2;  // frames an encoder image holds
    for (int g = 0; g < im.frames / per; ++g) {
      PackedImage packed{b.n_patches(), gh, gw};
      packed.frames = per;
      b.images.push_back(packed);
      for (int f = g * per; f < (g + 1) * per; ++f) testing::append_patches(b, pix.data() + size_t(f) * frame, im.h, im.w, p);
      if (im.frames > 1) {
        text_token(400 + g);  // "<0.5 seconds>" and the like, as text
        text_token(410);
      }
      text_token(start);
      for (int t = 0; t < rows * cols; ++t)
        add(im.frames > 1 ? video_pad : image_pad, slot++, {count, count + t / cols, count + t % cols});
      count += std::max(rows, cols);
      text_token(end);
    }
    rgb->push_back(std::move(pix));
  }
  b.T = int64_t(b.tokens.size());
  for (int64_t t = 0; t < b.T; ++t)
    b.targets.push_back(b.image_slot[size_t(t)] < 0 && t + 1 < b.T && b.image_slot[size_t(t + 1)] < 0
                            ? b.tokens[size_t(t + 1)] : -1);
  b.sample_ids.push_back(0);
  return b;
}

Result reference(const fs::path& ckpt, const std::string& flags = "") {
  static int n = 0;
  const fs::path out = root() / ("qwen_ref" + std::to_string(n++));
  fs::create_directories(out);
  std::vector<std::vector<uint8_t>> rgb;
  const Batch b = qwen_batch(config_of(ckpt), &rgb);
  json items = json::array();
  for (size_t i = 0; i < rgb.size(); ++i) {
    const std::string name = "image" + std::to_string(i) + ".rgb";
    std::ofstream(out / name, std::ios::binary).write(reinterpret_cast<const char*>(rgb[i].data()),
                                                      std::streamsize(rgb[i].size()));
    items.push_back({{"kind", kImages[i].frames > 1 ? "video" : "image"}, {"height", kImages[i].h},
                     {"width", kImages[i].w}, {"frames", kImages[i].frames}, {"pixels", name}});
  }
  Result r{testing::run_reference("hf_qwen3_vl_ref.py", ckpt, out,
                                  json{{"tokens", b.tokens}, {"targets", b.targets}, {"items", items}}, b.T,
                                  config_of(ckpt).vocab_size, flags),
           {}};
  const json pos = json::parse(std::ifstream(out / "positions.json"))["position_ids"];
  for (int64_t t = 0; t < b.T; ++t)
    for (int a = 0; a < 3; ++a) r.rope_pos.push_back(pos[size_t(a)][size_t(t)].get<int32_t>());
  return r;
}

Result run_dhp(const fs::path& ckpt) {
  const ModelConfig cfg = config_of(ckpt);
  auto backend = make_cpu_backend({1});
  Model m(cfg, *backend);
  m.initialise(3);
  import_hf_checkpoint(ckpt.string(), m, false);
  std::vector<std::vector<uint8_t>> rgb;
  const Batch b = qwen_batch(cfg, &rgb);
  return Result{testing::run_step(m, b, HfLayout::Qwen3Vl), b.rope_pos};
}

TEST(HfQwen3VlReference, MatchesOnImagesOfSeveralSizesAndAVideo) {
  const Result ref = reference(qwen3_vl()), got = run_dhp(qwen3_vl());
  // The positions the reference worked out from the tokens (get_rope_index) are dhp's.
  EXPECT_EQ(ref.rope_pos, got.rope_pos);
  testing::expect_reference_match(testing::ref_distance(ref.r, got.r), "qwen3_vl");
}

// Each must miss by more than ten times the bounds, or the match above would not prove the
// semantics it names.
TEST(HfQwen3VlNegative, EachControlFails) {
  const Result got = run_dhp(qwen3_vl());
  for (const auto& [flag, what] : std::vector<std::pair<std::string, std::string>>{
           {"--rope-1d", "1-D RoPE instead of M-RoPE"},
           {"--blocked", "M-RoPE's blocked layout instead of the interleaved one"},
           {"--no-deepstack", "DeepStack off"},
           {"--bicubic", "bicubic position resizing instead of bilinear over the grid's corners"},
           {"--no-vision-rope", "the tower's attention without 2-D RoPE"}}) {
    testing::expect_control_misses(testing::ref_distance(reference(qwen3_vl(), flag).r, got.r), what);
  }
}

}  // namespace
}  // namespace dhp
