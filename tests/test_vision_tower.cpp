// The pretrained vision towers (model.vision.arch = clip, siglip; docs/vision_towers.md): the
// parameter table of vt_spec's names and shapes, finite-difference gradients of the block and
// of the whole vision path, and recompute's bit-identical gradients.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "model/model.h"
#include "tests/grad_check.h"
#include "tests/model_fixtures.h"

namespace dhp {
namespace {

using testing::tiny_config;

ModelConfig tower_config(VisionArch arch) {
  ModelConfig c = tiny_config();
  auto& v = c.vision;
  v.arch = arch;
  v.image_size = 8;  // a 4 x 4 position grid at patch 2
  v.layers = 3;
  v.feature_layer = -2;
  v.norm_eps = arch == VisionArch::siglip ? 1e-6 : 1e-5;
  v.act = arch == VisionArch::siglip ? VisionAct::gelu_tanh : VisionAct::quick_gelu;
  const auto [mean, std] = default_pixel_norm(arch);
  v.pixel_mean = mean;
  v.pixel_std = std;
  return c;
}

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
    if (p.name.rfind("vision.", 0) == 0) EXPECT_EQ(p.group, ParamGroup::Vision) << p.name;
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

}  // namespace
}  // namespace dhp
