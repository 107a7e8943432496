// CLIP / SigLIP towers and LLaVA-1.5 checkpoints (trainer/hf_checkpoint.h) on tiny random
// folders in Hugging Face's and the original LLaVA code's exact layouts
// (tests/reference/make_hf_llava_fixture.py): config reading in each naming generation, the
// import's tensors and refusals, compose, export round trips, and the model against an
// independent PyTorch implementation of HF CLIP / SigLIP / LLaVA (tests/reference/
// hf_llava_ref.py) on non-square images whose grids differ from the pretrained one, with
// negative controls that must fail.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "core/input.h"
#include "model/model.h"
#include "tests/error_of.h"
#include "tests/hf_fixture.h"
#include "tests/hf_reference.h"
#include "tests/model_fixtures.h"
#include "tests/file_text.h"
#include "trainer/hf_checkpoint.h"
#include "trainer/safetensors.h"

namespace dhp {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::error_of;
using testing::tensor_bytes;
const auto read_all = testing::folder_f32;

const fs::path& root() { return testing::hf_fixture_root(); }
std::string py() { return testing::reference_py(); }
fs::path fixture(const std::string& name, const std::string& args) {
  return testing::hf_fixture("make_hf_llava_fixture.py", name, args);
}

fs::path clip_llava() { return fixture("llava_hf_clip", "llava_hf --tower clip"); }
fs::path siglip_llava() { return fixture("llava_new_siglip", "llava_new --tower siglip --feature-layer -1 --vlayers 2"); }

// A run's configuration with model.init / model.vision.init applied, as `dhp train` does.
Config applied(const std::vector<std::string>& overrides) {
  Config c = parse_config("", "test.toml", overrides);
  apply_hf_init(c);
  return c;
}

ModelConfig config_of(const fs::path& llava) { return applied({"--model.init=" + llava.string()}).model; }

// The model's weights after an import, by dhp name.
struct Imported {
  ModelConfig cfg;
  HfImport result;
  std::vector<float> arena;
  const float* at(const std::string& dhp_name) const {
    return arena.data() + ParamTable(cfg).get(dhp_name).offset;
  }
};

Imported import_into_table(const std::string& dir, const ModelConfig& cfg, uint64_t seed = 5) {
  Imported r;
  r.cfg = cfg;
  const ParamTable table(cfg);
  r.arena.assign(size_t(table.total()), 0.0f);
  table.initialise(r.arena.data(), seed);
  r.result = import_hf_weights(dir, cfg, table, host_arena_writer(r.arena.data()));
  return r;
}

int count_ignored(const HfImport& r, const std::string& part) {
  int n = 0;
  for (const auto& [why, k] : r.ignored)
    if (why.find(part) != std::string::npos) n += k;
  return n;
}

// ---------------------------------------------------------------------------------------------
// config.json of each generation

TEST(HfLlavaConfig, EachGenerationSetsTheTowerAndLlavaKeys) {
  const ModelConfig hf = config_of(clip_llava());
  EXPECT_EQ(hf.dim, 32);
  EXPECT_EQ(hf.layers, 2);
  EXPECT_EQ(hf.vision.arch, VisionArch::clip);
  EXPECT_EQ(hf.vision.dim, 32);
  EXPECT_EQ(hf.vision.layers, 3);
  EXPECT_EQ(hf.vision.heads, 4);
  EXPECT_EQ(hf.vision.ffn, 64);
  EXPECT_EQ(hf.vision.patch, 4);
  EXPECT_EQ(hf.vision.image_size, 16);
  EXPECT_EQ(hf.vision.merge, 1);
  EXPECT_EQ(hf.vision.feature_layer, -2);
  EXPECT_EQ(hf.vision.act, VisionAct::quick_gelu);
  EXPECT_EQ(hf.vision.projector_act, ProjectorAct::gelu);
  EXPECT_DOUBLE_EQ(hf.vision.norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(hf.vision.pixel_mean[0], 0.48145466);
  EXPECT_DOUBLE_EQ(hf.vision.pixel_std[2], 0.27577711);

  const ModelConfig sig = config_of(siglip_llava());
  EXPECT_EQ(sig.vision.arch, VisionArch::siglip);
  EXPECT_EQ(sig.vision.act, VisionAct::gelu_tanh);
  EXPECT_DOUBLE_EQ(sig.vision.norm_eps, 1e-6);
  EXPECT_EQ(sig.vision.feature_layer, -1);
  EXPECT_DOUBLE_EQ(sig.vision.pixel_mean[1], 0.5);

  // The original layout: the tower's shape from model.vision.init, LLaVA's keys from its own
  // config (mm_vision_select_layer, mlp2x_gelu, image_aspect_ratio "pad").
  const fs::path orig = fixture("orig_no_tower", "llava_orig --no-tower --feature-layer -3 --tokenizer");
  const fs::path tower = fixture("clip_full", "clip --image-mean 0.25,0.5,0.75");
  const Config c = applied({"--model.init=" + orig.string(), "--model.vision.init=" + tower.string(),
                            "--model.vision.arch=clip", "--model.vision.patch=4", "--model.vision.image_size=16"});
  EXPECT_EQ(c.model.vision.arch, VisionArch::clip);
  EXPECT_EQ(c.model.vision.feature_layer, -3);
  EXPECT_EQ(c.model.vision.resize, ImageFit::pad_square);
  EXPECT_EQ(c.model.vision.projector_act, ProjectorAct::gelu);
  EXPECT_DOUBLE_EQ(c.model.vision.pixel_mean[0], 0.25);  // the tower's preprocessor_config.json
  EXPECT_DOUBLE_EQ(c.model.vision.pixel_mean[2], 0.75);
  // Applying it twice changes nothing.
  Config twice = c;
  apply_hf_init(twice);
  EXPECT_EQ(format_config(twice), format_config(c));
}

// llava-hf saves only what differs from transformers' defaults: a sparse text_config is
// Llama-2-7B's shape, a sparse vision_config CLIP's.
// A resize the configuration names (file or command line) wins over a LLaVA folder's
// processor, which chooses only when nothing is named.
TEST(HfLlavaConfig, AStatedResizeWinsOverTheFoldersProcessor) {
  const fs::path dir = clip_llava();
  EXPECT_EQ(applied({"--model.init=" + dir.string()}).model.vision.resize, ImageFit::clip);
  EXPECT_EQ(applied({"--model.init=" + dir.string(), "--model.vision.resize=pad_square"}).model.vision.resize,
            ImageFit::pad_square);
  Config c = parse_config("[model.vision]\nresize = \"pad_square\"\n", "stated.toml", {"--model.init=" + dir.string()});
  apply_hf_init(c);
  EXPECT_EQ(c.model.vision.resize, ImageFit::pad_square);
  apply_hf_init(c);  // twice: the same
  EXPECT_EQ(c.model.vision.resize, ImageFit::pad_square);
}

TEST(HfLlavaConfig, NestedConfigsTakeTheClassDefaults) {
  const fs::path dir = root() / "sparse_config";
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << json{
      {"architectures", {"LlavaForConditionalGeneration"}}, {"model_type", "llava"},
      {"text_config", {{"model_type", "llama"}, {"vocab_size", 32064}, {"rms_norm_eps", 1e-5}}},
      {"vision_config", {{"model_type", "clip_vision_model"}, {"hidden_size", 1024}, {"intermediate_size", 4096},
                         {"num_hidden_layers", 24}, {"num_attention_heads", 16}, {"patch_size", 14},
                         {"image_size", 336}, {"projection_dim", 768}}}}.dump();
  const HfConfig h = read_hf_config(dir.string(), ModelConfig{}, 4096);
  EXPECT_EQ(h.kind, HfKind::Llava);
  EXPECT_EQ(h.model.dim, 4096);
  EXPECT_EQ(h.model.layers, 32);
  EXPECT_EQ(h.model.ffn, 11008);
  EXPECT_EQ(h.model.vocab_size, 32064);
  EXPECT_EQ(h.model.vision.act, VisionAct::quick_gelu);
  EXPECT_DOUBLE_EQ(h.model.vision.norm_eps, 1e-5);
  EXPECT_EQ(h.model.vision.pos_grid(), 24);
  EXPECT_EQ(h.model.vision.layers_run(), 23);  // vision_feature_layer -2 by default
}

TEST(HfLlavaConfig, RefusesWhatDhpDoesNotImplement) {
  // The error reading `base` with `patch` merged into it, in a folder of its own.
  auto patched = [&](const json& base, const std::string& name, const json& patch) {
    const fs::path dir = root() / name;
    fs::create_directories(dir);
    json c = base;
    c.merge_patch(patch);
    std::ofstream(dir / "config.json") << c.dump();
    return error_of([&] { read_hf_config(dir.string(), ModelConfig{}, 0); });
  };
  const json base = json::parse(std::ifstream(clip_llava() / "config.json"));
  auto with = [&](const std::string& name, const json& patch) {
    return patched(base, "cfg_" + name, patch);
  };
  EXPECT_EQ(with("same", json::object()), "");
  for (const auto& [key, patch] : std::vector<std::pair<std::string, json>>{
           {"vision_feature_select_strategy", {{"vision_feature_select_strategy", "full"}}},
           {"projector_hidden_act", {{"projector_hidden_act", "relu"}}},
           {"vision_feature_layer", {{"vision_feature_layer", {-2, -5}}}},
           {"multimodal_projector_bias", {{"multimodal_projector_bias", false}}},
           {"hidden_act", {{"vision_config", {{"hidden_act", "relu"}}}}},
           {"model_type", {{"vision_config", {{"model_type", "vit"}}}}},
           {"image_size", {{"vision_config", {{"image_size", 18}}}}},
           {"rope_scaling", {{"text_config", {{"rope_scaling", {{"type", "linear"}}}}}}}}) {
    const std::string msg = with(key, patch);
    EXPECT_NE(msg.find("\"" + key + "\""), std::string::npos) << key << ": " << msg;
    EXPECT_NE(msg.find("config.json"), std::string::npos) << key << ": " << msg;
  }
  const json orig = json::parse(std::ifstream(fixture("orig_no_tower", "llava_orig --no-tower --feature-layer -3 --tokenizer") / "config.json"));
  auto with_orig = [&](const std::string& name, const json& patch) {
    return patched(orig, "orig_" + name, patch);
  };
  for (const auto& [key, value] : std::vector<std::pair<std::string, json>>{
           {"mm_projector_type", "linear"}, {"mm_vision_select_feature", "cls_patch"},
           {"mm_patch_merge_type", "spatial_unpad"}, {"mm_use_im_start_end", true},
           {"image_aspect_ratio", "anyres"}}) {
    const std::string msg = with_orig(key, {{key, value}});
    EXPECT_NE(msg.find("\"" + key + "\""), std::string::npos) << key << ": " << msg;
  }
}

TEST(HfLlavaConfig, ComposeRules) {
  const fs::path orig = fixture("orig_no_tower", "llava_orig --no-tower --feature-layer -3 --tokenizer");
  const fs::path tower = fixture("clip_full", "clip --image-mean 0.25,0.5,0.75");
  // The original layout names its tower without describing it.
  std::string msg = error_of([&] { applied({"--model.init=" + orig.string()}); });
  EXPECT_NE(msg.find("model.vision.init"), std::string::npos) << msg;
  // A tower is no language model.
  msg = error_of([&] { applied({"--model.init=" + tower.string()}); });
  EXPECT_NE(msg.find("model.vision.init"), std::string::npos) << msg;
  // A llava-hf folder brings its own tower.
  msg = error_of([&] {
    applied({"--model.init=" + clip_llava().string(), "--model.vision.init=" + tower.string(),
             "--model.vision.arch=clip", "--model.vision.patch=4", "--model.vision.image_size=16"});
  });
  EXPECT_NE(msg.find("would replace"), std::string::npos) << msg;
  // A feature layer the tower does not have.
  msg = error_of([&] {
    applied({"--model.init=" + orig.string(), "--model.vision.init=" +
             fixture("clip_one_layer", "clip_vision --vlayers 1").string(), "--model.vision.arch=clip",
             "--model.vision.patch=4", "--model.vision.image_size=16"});
  });
  EXPECT_NE(msg.find("feature layer -3"), std::string::npos) << msg;
}

// ---------------------------------------------------------------------------------------------
// tensors

// The conv kernel (dv, 3, p, p) lands in dhp's (ky, kx, c) patch rows; every other tensor is a
// copy; what the model does not use is ignored with its reason.
void expect_imported_as_in_file(const fs::path& dir, HfLayout layout, const Imported& m) {
  const auto file = read_all(dir);
  const int64_t p = m.cfg.vision.patch;
  for (const auto& b : hf_name_map(m.cfg, layout)) {
    const std::vector<float>& w = file.at(b.hf);
    const float* got = m.at(b.dhp);
    if (b.transform == HfTransform::ConvPatch) {
      const int64_t rows = int64_t(w.size()) / (3 * p * p);
      for (int64_t o = 0; o < rows; ++o)
        for (int64_t c = 0; c < 3; ++c)
          for (int64_t ky = 0; ky < p; ++ky)
            for (int64_t kx = 0; kx < p; ++kx)
              ASSERT_EQ(got[o * 3 * p * p + (ky * p + kx) * 3 + c], w[size_t(((o * 3 + c) * p + ky) * p + kx)])
                  << b.hf << " at " << o << "," << c << "," << ky << "," << kx;
      continue;
    }
    EXPECT_EQ(0, std::memcmp(got, w.data(), w.size() * 4)) << b.hf << " -> " << b.dhp;
  }
}

TEST(HfLlavaImport, EveryGenerationImportsItsTensors) {
  for (const auto& [kind, layout] : {std::pair{"llava_hf", HfLayout::LlavaHf}, std::pair{"llava_new", HfLayout::LlavaNew},
                                     std::pair{"llava_orig", HfLayout::LlavaOriginal}}) {
    const fs::path dir = fixture(std::string("gen_") + kind, std::string(kind) + " --position-ids");
    std::vector<std::string> o = {"--model.init=" + dir.string()};
    if (layout == HfLayout::LlavaOriginal)  // its config does not describe the tower; its copy is read
      o.insert(o.end(), {"--model.vision.init=" + fixture("clip_vision", "clip_vision").string(),
                         "--model.vision.arch=clip", "--model.vision.patch=4", "--model.vision.image_size=16",
                         "--model.vision.embedded_tower=true"});
    const Config c = applied(o);
    const Imported m = import_into_table(dir.string(), c.model);
    EXPECT_TRUE(m.result.initialised.empty()) << kind << ": " << m.result.initialised.size() << " seeded";
    EXPECT_EQ(m.result.imported.size(), hf_name_map(c.model, layout).size()) << kind;
    expect_imported_as_in_file(dir, layout, m);
    // post_layernorm is held (never run) so that an export writes it back.
    EXPECT_TRUE(c.model.vision.post_norm) << kind;
    EXPECT_EQ(count_ignored(m.result, "post_layernorm"), 0) << kind;
    EXPECT_EQ(count_ignored(m.result, "position_ids"), 1) << kind;
    ASSERT_EQ(m.result.sources.size(), 1u);
    EXPECT_NE(m.result.sources[0].find(hf_layout_name(layout)), std::string::npos) << m.result.sources[0];
  }
}

// The tower of an original LLaVA checkpoint that holds a copy of it: model.vision.init's
// (mm_vision_tower's download) unless the copy is asked for, by LLaVA's own
// unfreeze_mm_vision_tower or by model.vision.embedded_tower; the import's notes say which.
TEST(HfLlavaImport, AnOriginalLlavaRunsTheTowerLlavaLoads) {
  const fs::path tower = fixture("clip_vision_seed8", "clip_vision --seed 8");
  const fs::path plain = fixture("orig_copy", "llava_orig");
  const fs::path unfrozen = fixture("orig_unfrozen", "llava_orig --config unfreeze_mm_vision_tower=true");
  for (const auto& [dir, key, copy] : {std::tuple{plain, "", false}, std::tuple{plain, "--model.vision.embedded_tower=true", true},
                                       std::tuple{unfrozen, "", true}}) {
    std::vector<std::string> o = {"--model.init=" + dir.string(), "--model.vision.init=" + tower.string(),
                                  "--model.vision.arch=clip", "--model.vision.patch=4", "--model.vision.image_size=16"};
    if (*key) o.push_back(key);
    const Config c = applied(o);
    const Imported m = import_into_table(dir.string(), c.model);
    SCOPED_TRACE(dir.filename().string() + " " + key);
    EXPECT_TRUE(m.result.initialised.empty());
    if (copy) {
      expect_imported_as_in_file(dir, HfLayout::LlavaOriginal, m);
    } else {
      expect_imported_as_in_file(tower, HfLayout::Tower, m);
      EXPECT_GT(count_ignored(m.result, "copy of the tower"), 10);
    }
    std::string notes;
    for (const auto& n : m.result.notes) notes += n + "\n";
    EXPECT_NE(notes.find(copy ? "the copy saved in" : "the tower LLaVA loads from mm_vision_tower"), std::string::npos) << notes;
    if (copy && !*key) {
      EXPECT_NE(notes.find("unfreeze_mm_vision_tower"), std::string::npos) << notes;
    }
  }
  // The two towers differ: the test can tell which was read.
  EXPECT_NE(tensor_bytes(tower).at("vision_model.encoder.layers.0.mlp.fc1.weight"),
            tensor_bytes(plain).at("model.vision_tower.vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight"));
}

// Compose: a Llama decoder and a CLIP (dual encoder) or SigLIP folder; the projector keeps its
// seeded values; the text side, projections and SigLIP's head are ignored by name.
TEST(HfLlavaImport, ComposesADecoderAndATower) {
  const fs::path decoder = root() / "decoder";
  if (!fs::exists(decoder / "config.json")) {
    const std::string cmd = testing::fixture_command("make_hf_fixture.py", decoder, "--kv 2");
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  for (const auto& [kind, arch] : {std::pair{"clip", "clip"}, std::pair{"siglip", "siglip"}}) {
    const fs::path tower = fixture(std::string("dual_") + kind, kind);
    // The folder brings the tower's arch and shape; restating them (clip) or not (siglip) is
    // the same run.
    std::vector<std::string> o = {"--model.init=" + decoder.string(), "--model.vision.init=" + tower.string(),
                                  "--model.vision.merge=2"};
    if (std::string(kind) == "clip")
      o.insert(o.end(), {std::string("--model.vision.arch=") + arch, "--model.vision.patch=4",
                         "--model.vision.image_size=16"});
    const Config c = applied(o);
    EXPECT_EQ(c.model.vision.arch, std::string(kind) == "clip" ? VisionArch::clip : VisionArch::siglip);
    EXPECT_EQ(c.model.vision.patch, 4);
    EXPECT_EQ(c.model.vision.image_size, 16);
    EXPECT_EQ(c.model.vision.merge, 2);  // the TOML's: the projector is new
    const Imported m = import_into_table(decoder.string(), c.model, 11);
    expect_imported_as_in_file(decoder, HfLayout::Decoder, m);
    expect_imported_as_in_file(tower, HfLayout::Tower, m);
    EXPECT_EQ(m.result.sources.size(), 2u);
    const std::set<std::string> seeded(m.result.initialised.begin(), m.result.initialised.end());
    EXPECT_EQ(seeded, (std::set<std::string>{"projector.fc1.weight", "projector.fc1.bias", "projector.fc2.weight",
                                              "projector.fc2.bias"}));
    const ParamTable table(c.model);
    std::vector<float> fresh(size_t(table.total()));
    table.initialise(fresh.data(), 11);
    const ParamSpec& fc1 = table.get("projector.fc1.weight");
    EXPECT_EQ(0, std::memcmp(m.at("projector.fc1.weight"), fresh.data() + fc1.offset, size_t(fc1.numel()) * 4));
    EXPECT_GT(count_ignored(m.result, "text tower"), 10) << kind;
    EXPECT_GE(count_ignored(m.result, "logit scale"), 1) << kind;
    // SigLIP's pooling head is held (never run), as post_layernorm is.
    EXPECT_EQ(c.model.vision.pool_head, std::string(kind) == "siglip");
    EXPECT_TRUE(c.model.vision.post_norm);
    EXPECT_EQ(count_ignored(m.result, "attention-pooling head"), 0);
  }
}

// A refused folder names the tensor and the file and leaves the model unchanged.
TEST(HfLlavaImport, RefusesWhatDoesNotFit) {
  const fs::path good = clip_llava();
  const ModelConfig cfg = config_of(good);
  auto refused = [&](const fs::path& dir, const ModelConfig& c) {
    const ParamTable table(c);
    std::vector<float> arena(size_t(table.total()));
    table.initialise(arena.data(), 3);
    const std::vector<float> before = arena;
    const std::string msg = error_of([&] { import_hf_weights(dir.string(), c, table, host_arena_writer(arena.data())); });
    EXPECT_EQ(before, arena) << "the model changed: " << msg;
    return msg;
  };
  const std::string fc2 = "vision_tower.vision_model.encoder.layers.1.mlp.fc2.weight";
  std::string msg = refused(fixture("missing_fc2", "llava_hf --drop " + fc2), cfg);
  EXPECT_NE(msg.find("has no tensor '" + fc2 + "'"), std::string::npos) << msg;
  msg = refused(fixture("extra_tensor", "llava_hf --extra vision_tower.vision_model.encoder.extra.weight"), cfg);
  EXPECT_NE(msg.find("'vision_tower.vision_model.encoder.extra.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
  // A conv kernel of another patch size (the config says 4; the tensor is 2x2).
  ModelConfig other = cfg;
  other.vision.patch = 2;
  other.vision.image_size = 8;
  msg = refused(good, other);
  EXPECT_NE(msg.find("model.vision.patch is 2 here, 4 in the checkpoint"), std::string::npos) << msg;
  // The original layout without its tower and without model.vision.init.
  const fs::path orig = fixture("orig_no_tower", "llava_orig --no-tower --feature-layer -3 --tokenizer");
  ModelConfig o = cfg;
  o.vision.feature_layer = -3;
  msg = refused(orig, o);
  EXPECT_NE(msg.find("model.vision.init"), std::string::npos) << msg;
}

// ---------------------------------------------------------------------------------------------
// export

Model& model_from(const fs::path& dir, const Config& c, std::unique_ptr<Backend>& backend,
                  std::unique_ptr<Model>& model) {
  backend = make_cpu_backend({1});
  model = std::make_unique<Model>(c.model, *backend);
  model->initialise(1);
  import_hf_checkpoint(dir.string(), *model);
  return *model;
}

// Every generation exports as llava-hf; the export's tensors are the source's under the
// llava-hf names; importing the export and exporting again gives the same bytes, config and
// preprocessor config.
TEST(HfLlavaExport, RoundTripIsByteIdentical) {
  for (const auto& [kind, extra] : {std::pair{"llava_hf", ""}, std::pair{"llava_hf", " --tower siglip"},
                                    std::pair{"llava_new", " --tower siglip --dtype bf16"}, std::pair{"llava_orig", ""}}) {
    const std::string tag = std::string(kind) + (std::string(extra).empty() ? "" : "_siglip");
    const fs::path dir = fixture("rt_" + tag, std::string(kind) + extra);
    std::vector<std::string> o = {"--model.init=" + dir.string()};
    if (std::string(kind) == "llava_orig")
      o.insert(o.end(), {"--model.vision.init=" + fixture("clip_vision", "clip_vision").string(),
                         "--model.vision.arch=clip", "--model.vision.patch=4", "--model.vision.image_size=16",
                         "--model.vision.embedded_tower=true"});
    const Config c = applied(o);
    std::unique_ptr<Backend> b1, b2;
    std::unique_ptr<Model> m1, m2;
    Model& first = model_from(dir, c, b1, m1);
    HfExportOptions e;
    e.dir = (root() / ("rt1_" + tag)).string();
    e.dtype = hf_checkpoint_dtype(dir.string());
    e.image_token_index = 300;
    export_hf_checkpoint(first, e);
    // The source's tensors under llava-hf's names.
    const auto src = tensor_bytes(dir), out = tensor_bytes(e.dir);
    const auto src_names = hf_name_map(c.model, std::string(kind) == "llava_hf" ? HfLayout::LlavaHf
                                                : std::string(kind) == "llava_new" ? HfLayout::LlavaNew
                                                                                   : HfLayout::LlavaOriginal);
    const auto out_names = hf_name_map(c.model, HfLayout::LlavaHf);
    ASSERT_EQ(src_names.size(), out_names.size());
    ASSERT_EQ(out.size(), out_names.size()) << kind;
    for (size_t i = 0; i < src_names.size(); ++i)
      EXPECT_EQ(src.at(src_names[i].hf), out.at(out_names[i].hf)) << kind << ": " << out_names[i].hf;
    // Strict: every tensor of a llava-hf source is in the export under its own name, with its
    // bytes (post_layernorm and SigLIP's head included), but the position_ids buffers, which
    // transformers no longer saves.
    if (std::string(kind) == "llava_hf")
      for (const auto& [name, bytes] : src)
        if (name.find("position_ids") == std::string::npos) {
          ASSERT_TRUE(out.count(name)) << name << " is not in the export";
          EXPECT_EQ(bytes, out.at(name)) << name;
        }
    const json cfg = json::parse(std::ifstream(fs::path(e.dir) / "config.json"));
    EXPECT_EQ(cfg["architectures"][0], "LlavaForConditionalGeneration");
    EXPECT_EQ(cfg["vision_feature_layer"], c.model.vision.feature_layer);
    // And back: the export is a llava-hf folder that imports to the same model.
    const Config again = applied({"--model.init=" + e.dir});
    EXPECT_EQ(format_config(again), format_config(applied({"--model.init=" + e.dir})));
    Model& second = model_from(e.dir, again, b2, m2);
    EXPECT_EQ(first.download_params(), second.download_params()) << kind;
    HfExportOptions e2 = e;
    e2.dir = (root() / ("rt2_" + tag)).string();
    export_hf_checkpoint(second, e2);
    EXPECT_EQ(tensor_bytes(e.dir), tensor_bytes(e2.dir)) << kind;
    for (const char* f : {"config.json", "preprocessor_config.json", "generation_config.json"})
      EXPECT_EQ(testing::read_text(fs::path(e.dir) / f), testing::read_text(fs::path(e2.dir) / f)) << kind << ": " << f;
  }
}

// An original LLaVA's tokenizer has no <image> (LLaVA splices an image in by position): read
// with data.added_tokens "none" the model keeps the file's vocabulary, and its export adds
// <image> and <pad> after the tokenizer's ids and grows the rows to a multiple of 64 at the
// mean row, as llava-hf's conversion does. The files say so (added_tokens.json,
// image_token_index, pad_token_id at the top level, tokenizer_config.json's legacy and
// chat_template, processor_config.json), the rows the model had are its bytes, and the export
// imports back with the grown vocabulary.
TEST(HfLlavaExport, AnOriginalLlavaWithoutAnImageTokenIsExported) {
  // As many rows as the tokenizer has pieces (Vicuna's 32000 rows and pieces).
  const fs::path dir = fixture("orig_tok", "llava_orig --tokenizer --vocab 300");
  const std::vector<std::string> o = {"--model.init=" + dir.string(),
                                      "--model.vision.init=" + fixture("clip_vision", "clip_vision").string(),
                                      "--model.vision.arch=clip", "--model.vision.patch=4", "--model.vision.image_size=16",
                                      "--data.tokenizer=" + dir.string(), "--data.added_tokens=none",
                                      "--data.template=llava_v1"};
  const Config c = applied(o);
  const Tokenizer t(dir.string(), "none");
  const int file_vocab = json::parse(std::ifstream(dir / "config.json"))["vocab_size"].get<int>();
  ASSERT_EQ(c.model.vocab_size, file_vocab);  // nothing added: the file's softmax
  ASSERT_EQ(t.vocab_size(), file_vocab);
  std::unique_ptr<Backend> b;
  std::unique_ptr<Model> m;
  Model& model = model_from(dir, c, b, m);
  const HfTokenizerFiles tok = hf_tokenizer_files(t.files(), 2048, ChatTemplate::LlavaV1);
  HfExportOptions e;
  e.dir = (root() / "orig_tok_export").string();
  e.tokenizer = &tok;
  export_hf_checkpoint(model, e);
  const int image = t.vocab_size(), grown = (t.vocab_size() + 2 + 63) / 64 * 64;
  const json cfg = json::parse(std::ifstream(fs::path(e.dir) / "config.json"));
  EXPECT_EQ(cfg["image_token_index"], image);
  EXPECT_EQ(cfg["pad_token_id"], image + 1);
  EXPECT_FALSE(cfg["text_config"].contains("pad_token_id"));
  EXPECT_EQ(cfg["vocab_size"], grown);
  EXPECT_EQ(cfg["text_config"]["max_position_embeddings"], 2048);  // the source's
  const json added = json::parse(std::ifstream(fs::path(e.dir) / "added_tokens.json"));
  EXPECT_EQ(added, (json{{"<image>", image}, {"<pad>", image + 1}}));
  const json tc = json::parse(std::ifstream(fs::path(e.dir) / "tokenizer_config.json"));
  EXPECT_EQ(tc["chat_template"], jinja_chat_template(ChatTemplate::LlavaV1, true));
  EXPECT_EQ(tc["legacy"], true);
  const json pc = json::parse(std::ifstream(fs::path(e.dir) / "processor_config.json"));
  EXPECT_EQ(pc["image_token"], "<image>");
  EXPECT_EQ(pc["num_additional_image_tokens"], 1);
  const auto src = read_all(dir), out = read_all(e.dir);
  for (const auto& [from, to] : {std::pair{"model.embed_tokens.weight", "language_model.model.embed_tokens.weight"},
                                 std::pair{"lm_head.weight", "language_model.lm_head.weight"}}) {
    const std::vector<float>& a = src.at(from);
    const std::vector<float>& x = out.at(to);
    const size_t d = a.size() / size_t(file_vocab);
    ASSERT_EQ(x.size(), size_t(cfg["vocab_size"].get<int>()) * d) << to;
    EXPECT_TRUE(std::equal(a.begin(), a.end(), x.begin())) << to << ": the file's rows changed";
    for (size_t col = 0; col < d; ++col) {  // a grown row is the mean of the model's rows
      double mean = 0;
      for (size_t r = 0; r < size_t(file_vocab); ++r) mean += a[r * d + col];
      EXPECT_NEAR(x[(x.size() / d - 1) * d + col], mean / file_vocab, 1e-6) << to;
    }
  }
  // And back: the grown folder is a llava-hf checkpoint.
  const Config again = applied({"--model.init=" + e.dir});
  EXPECT_EQ(again.model.vocab_size, cfg["vocab_size"].get<int>());
}

TEST(HfLlavaExport, RefusesAMergedTowerAndNoImageToken) {
  const fs::path decoder = root() / "decoder";
  if (!fs::exists(decoder / "config.json")) {
    const std::string cmd = testing::fixture_command("make_hf_fixture.py", decoder, "--kv 2");
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  const fs::path tower = fixture("clip_vision", "clip_vision");
  for (int merge : {2, 1}) {
    const Config c = applied({"--model.init=" + decoder.string(), "--model.vision.init=" + tower.string(),
                              "--model.vision.arch=clip", "--model.vision.patch=4", "--model.vision.image_size=16",
                              "--model.vision.merge=" + std::to_string(merge)});
    std::unique_ptr<Backend> b;
    std::unique_ptr<Model> m;
    Model& model = model_from(decoder, c, b, m);
    HfExportOptions e;
    e.dir = (root() / ("merged" + std::to_string(merge))).string();
    const std::string msg = error_of([&] { export_hf_checkpoint(model, e); });
    EXPECT_NE(msg.find(merge == 2 ? "model.vision.merge = 2" : "image_token_index"), std::string::npos) << msg;
    EXPECT_FALSE(fs::exists(fs::path(e.dir) / "model.safetensors"));
  }
}

// ---------------------------------------------------------------------------------------------
// the model against the PyTorch reference

// Images whose grids differ from the pretrained 4x4 (patch 4, image_size 16) in both
// directions, non-square, plus one at the pretrained size (the identity resize).
struct Image {
  int h, w;
};
const std::vector<Image> kImages = {{12, 20}, {24, 16}, {16, 16}};

struct Result {
  double loss = 0;
  std::vector<float> last_logits;
  std::map<std::string, std::vector<float>> grads;  // by the folder's Hugging Face names
};

// The batch: text, image 0, text, image 1, text, image 2, text; image rows carry no loss.
Batch llava_batch(const ModelConfig& cfg, std::vector<std::vector<uint8_t>>* rgb) {
  Batch b;
  Rng rng(17);
  const int p = cfg.vision.patch;
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
    if (k == kImages.size()) break;
    const Image im = kImages[k];
    std::vector<uint8_t> pix(size_t(im.h) * im.w * 3);
    for (auto& v : pix) v = uint8_t(rng.below(256));
    const int gh = im.h / p, gw = im.w / p;
    b.images.push_back(PackedImage{b.n_patches(), gh, gw});
    testing::append_patches(b, pix.data(), im.h, im.w, p);
    for (int t = 0; t < gh * gw; ++t) add(0, slot++);
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
  const fs::path out = root() / ("ref" + std::to_string(n++));
  fs::create_directories(out);
  std::vector<std::vector<uint8_t>> rgb;
  const Batch b = llava_batch(config_of(ckpt), &rgb);
  json images = json::array();
  for (size_t i = 0; i < rgb.size(); ++i) {
    const std::string name = "image" + std::to_string(i) + ".rgb";
    std::ofstream(out / name, std::ios::binary).write(reinterpret_cast<const char*>(rgb[i].data()),
                                                      std::streamsize(rgb[i].size()));
    images.push_back({{"height", kImages[i].h}, {"width", kImages[i].w}, {"pixels", name}});
  }
  std::ofstream(out / "input.json")
      << json{{"tokens", b.tokens}, {"targets", b.targets}, {"image_slot", b.image_slot}, {"images", images}}.dump();
  const std::string cmd = py() + "hf_llava_ref.py " + ckpt.string() + " " + (out / "input.json").string() + " " +
                          out.string() + " " + flags;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  Result r;
  r.loss = json::parse(std::ifstream(out / "loss.json"))["loss"].get<double>();
  const int64_t V = config_of(ckpt).vocab_size;
  std::vector<float> logits(size_t(b.T * V));
  std::ifstream(out / "logits.bin", std::ios::binary).read(reinterpret_cast<char*>(logits.data()),
                                                           std::streamsize(logits.size() * 4));
  r.last_logits.assign(logits.end() - V, logits.end());
  for (auto& [name, g] : read_all(out)) r.grads[name] = std::move(g);
  return r;
}

Result run_dhp(const fs::path& ckpt, HfLayout layout) {
  const ModelConfig cfg = config_of(ckpt);
  auto backend = make_cpu_backend({1});
  Model m(cfg, *backend);
  m.initialise(3);
  import_hf_checkpoint(ckpt.string(), m);
  std::vector<std::vector<uint8_t>> rgb;
  const Batch b = llava_batch(cfg, &rgb);
  Result r;
  m.zero_grads();
  const float scale = 1.0f / float(b.loss_tokens());
  r.loss = m.step(b, scale, true).loss_sum * scale;
  for (const auto& bind : hf_name_map(cfg, layout)) {
    const ParamSpec& s = m.table().get(bind.dhp);
    // A parameter that takes no gradient (a tower layer after the feature layer) has none.
    std::vector<float> g = s.trainable ? std::vector<float>(m.grads() + s.grad_offset,
                                                            m.grads() + s.grad_offset + s.numel())
                                       : std::vector<float>(size_t(s.numel()), 0.0f);
    if (bind.transform == HfTransform::ConvPatch) {
      std::vector<float> k(g.size());
      hf_permute_patch(k.data(), g.data(), s.shape[0], cfg.vision.patch, 1, true);
      g.swap(k);
    }
    r.grads[bind.hf] = std::move(g);
  }
  Batch prompt = b;
  prompt.targets.assign(size_t(b.T), -1);
  SamplingOptions opt;
  opt.max_new_tokens = 0;  // the logits of the last prompt position only
  m.generate(prompt, -1, opt, &r.last_logits);
  return r;
}

struct Distance {
  double loss = 0, logits = 0, grads = 0;
  std::string worst;
};

// A tensor the reference gives no gradient (a tower layer after the feature layer) must get
// none in dhp either; each other tensor's gradient is compared relative to its largest entry.
Distance distance(const Result& ref, const Result& got) {
  Distance d;
  d.loss = std::abs(ref.loss - got.loss) / std::abs(ref.loss);
  double lmax = 0, lerr = 0;
  for (size_t i = 0; i < ref.last_logits.size() && i < got.last_logits.size(); ++i) {
    lmax = std::max(lmax, double(std::abs(ref.last_logits[i])));
    lerr = std::max(lerr, double(std::abs(ref.last_logits[i] - got.last_logits[i])));
  }
  d.logits = ref.last_logits.size() == got.last_logits.size() ? lerr / lmax : INFINITY;
  double top = 0;
  for (const auto& [name, g] : ref.grads) {
    EXPECT_TRUE(got.grads.count(name)) << name << " has a reference gradient but no dhp tensor";
    for (float v : g) top = std::max(top, double(std::abs(v)));
  }
  for (const auto& [name, g] : got.grads) {
    const auto it = ref.grads.find(name);
    if (it == ref.grads.end()) {
      double top = 0;
      for (float v : g) top = std::max(top, double(std::abs(v)));
      EXPECT_EQ(top, 0.0) << name << " is not used by the reference, yet dhp gives it a gradient";
      continue;
    }
    if (it->second.size() != g.size()) {
      ADD_FAILURE() << name << " has a reference gradient of another size";
      continue;
    }
    double mref = 0, err = 0, mgot = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      mref = std::max(mref, double(std::abs(it->second[i])));
      mgot = std::max(mgot, double(std::abs(g[i])));
      err = std::max(err, double(std::abs(it->second[i] - g[i])));
    }
    // A gradient that is zero in exact arithmetic (the key bias: softmax ignores a shift shared
    // by every key) is rounding noise on both sides (~1e-11 here): both must stay at noise
    // level, measured against the largest gradient of the model.
    if (mref < 1e-7 * top) {
      EXPECT_LT(mgot, 1e-6 * top) << name << ": zero in the reference, " << mgot << " in dhp";
      continue;
    }
    if (err / mref > d.grads) d.grads = err / mref, d.worst = name;
  }
  return d;
}

// fp32 on both sides with different summation orders (test_hf.cpp's tolerances): the loss to
// ~1e-6 relative, each tensor's gradient to 1e-4 of its largest entry.
constexpr double kLossTol = 2e-5, kLogitsTol = 1e-4, kGradTol = 1e-4;

void expect_matches(const Distance& d, const std::string& what) {
  std::printf("%s: loss %.2e, logits %.2e, gradients %.2e (worst %s)\n", what.c_str(), d.loss, d.logits, d.grads,
              d.worst.c_str());
  EXPECT_LT(d.loss, kLossTol) << what;
  EXPECT_LT(d.logits, kLogitsTol) << what;
  EXPECT_LT(d.grads, kGradTol) << what << ": worst " << d.worst;
}

void expect_differs(const Distance& d, const std::string& what) {
  std::printf("control, %s: loss %.2e, gradients %.2e (worst %s)\n", what.c_str(), d.loss, d.grads, d.worst.c_str());
  EXPECT_TRUE(d.loss > 10 * kLossTol || d.grads > 10 * kGradTol)
      << what << " went unnoticed: loss " << d.loss << ", gradients " << d.grads;
}

TEST(HfLlavaReference, ClipTowerMatches) {
  expect_matches(distance(reference(clip_llava()), run_dhp(clip_llava(), HfLayout::LlavaHf)), "clip");
}

TEST(HfLlavaReference, SiglipTowerMatches) {
  expect_matches(distance(reference(siglip_llava()), run_dhp(siglip_llava(), HfLayout::LlavaNew)), "siglip");
}

// Each must fail the comparison, or the match above would not prove the semantics.
TEST(HfLlavaNegative, EachControlFails) {
  const Result got = run_dhp(clip_llava(), HfLayout::LlavaHf);
  for (const auto& [flag, what] : std::vector<std::pair<std::string, std::string>>{
           {"--bilinear", "bilinear instead of bicubic position resizing"},
           {"--gelu", "erf GELU instead of quick_gelu in the tower"},
           {"--last-layer", "the last layer's output instead of hidden_states[-2]"},
           {"--keep-cls", "the class row kept (the last patch dropped)"},
           {"--mean-shift 0.05", "a normalisation mean off by 0.05"}}) {
    const Distance d = distance(reference(clip_llava(), flag), got);
    expect_differs(d, what);
  }
}

}  // namespace
}  // namespace dhp
