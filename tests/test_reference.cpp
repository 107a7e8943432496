// dhp's model against an independent PyTorch implementation of model-spec.md
// (tests/reference/model_ref.py): same weights, same packed batch, same loss and gradients
// to fp32 rounding. This pins the spec's details (RoPE convention, 2-D RoPE halves, merge
// order, GELU form, masks, loss normalisation) that a self-consistent gradient check cannot.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/cpu/pixels.h"
#include "model/model.h"
#include "tests/model_fixtures.h"

namespace dhp {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

void write_floats(const fs::path& p, const float* x, size_t n) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(x), std::streamsize(n * sizeof(float)));
}

std::vector<float> read_floats(const fs::path& p, size_t n) {
  std::vector<float> x(n);
  std::ifstream in(p, std::ios::binary);
  in.read(reinterpret_cast<char*>(x.data()), std::streamsize(n * sizeof(float)));
  EXPECT_TRUE(in.good()) << p;
  return x;
}

void dump(const fs::path& dir, const Model& m, const Batch& b) {
  const ModelConfig& c = m.config();
  json cfg = {{"dim", c.dim}, {"layers", c.layers}, {"heads", c.heads}, {"kv_heads", c.kv_heads},
              {"head_dim", c.head_dim}, {"ffn", c.ffn}, {"vocab_size", c.vocab_size},
              {"rope_theta", c.rope_theta}, {"tie_embeddings", c.tie_embeddings},
              {"rms_norm_eps", c.rms_norm_eps},
              {"vision", {{"patch", c.vision.patch}, {"dim", c.vision.dim},
                          {"layers", c.vision.layers}, {"heads", c.vision.heads},
                          {"ffn", c.vision.ffn}, {"merge", c.vision.merge}}}};
  std::ofstream(dir / "config.json") << cfg.dump();
  json table = json::array();
  for (const auto& s : m.table().specs())
    table.push_back({{"name", s.name}, {"shape", s.shape}, {"offset", s.offset}});
  std::ofstream(dir / "params.json") << table.dump();
  write_floats(dir / "params.bin", m.params(), size_t(m.n_params()));
  json images = json::array();
  for (const auto& im : b.images)
    images.push_back({{"patch_offset", im.patch_offset}, {"grid_h", im.grid_h}, {"grid_w", im.grid_w}});
  json batch = {{"tokens", b.tokens}, {"targets", b.targets}, {"doc", b.doc}, {"pos", b.pos},
                {"image_slot", b.image_slot}, {"images", images}};
  std::ofstream(dir / "batch.json") << batch.dump();
  // The encoder's input as the model computes it from the batch's pixels.
  std::vector<float> patches(b.pixels.size());
  cpu::normalize_pixels(patches.data(), b.pixels.data(), int64_t(patches.size()), pixel_norm(c.vision));
  write_floats(dir / "patches.bin", patches.data(), patches.size());
}

// Runs the reference on a dump of (cfg, randomised weights, a pack of docs) and compares the
// loss and every parameter's gradient.
void expect_matches_pytorch(const ModelConfig& cfg, const std::vector<testing::Doc>& docs,
                            const std::string& tag) {
  auto backend = make_cpu_backend({1});
  Model model(cfg, *backend);
  testing::randomise(model, 41);
  Batch b = testing::make_batch(docs, cfg, 7);

  const fs::path dir = fs::temp_directory_path() /
                       ("dhp_reference_" + std::to_string(::getpid()) + "_" + tag);
  fs::create_directories(dir);
  dump(dir, model, b);
  const std::string cmd = "/usr/bin/python3 " + std::string(DHP_SOURCE_DIR) +
                          "/tests/reference/model_ref.py " + dir.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0)
      << cmd << " failed: the reference needs Debian's python3-torch (scripts/setup.sh installs it)";

  const float scale = 1.0f / float(b.loss_tokens());
  model.zero_grads();
  const double loss = model.step(b, scale, true).loss_sum * scale;
  json ref = json::parse(std::ifstream(dir / "loss.json"));
  // fp32 throughout on both sides, summation orders differ: agreement to ~1e-6 relative.
  EXPECT_NEAR(loss, ref["loss"].get<double>(), 2e-5 * std::abs(loss));

  const auto grads = read_floats(dir / "grads.bin", size_t(model.n_params()));
  for (const auto& s : model.table().specs()) {
    double max_ref = 0.0, max_err = 0.0;
    for (int64_t i = s.offset; i < s.offset + s.numel(); ++i) {
      max_ref = std::max(max_ref, double(std::abs(grads[i])));
      max_err = std::max(max_err, double(std::abs(grads[i] - model.grads()[i])));
    }
    // Relative to the tensor's largest gradient: fp32 rounding of sums over ~100 terms.
    EXPECT_LE(max_err, 1e-4 * max_ref + 1e-7) << s.name << ": largest gradient " << max_ref;
    EXPECT_GT(max_ref, 0.0) << s.name << " got no gradient in the reference";
  }
  fs::remove_all(dir);
}

class Reference : public ::testing::TestWithParam<bool> {};

TEST_P(Reference, LossAndGradientsMatchPyTorch) {
  ModelConfig cfg = testing::tiny_config();
  cfg.tie_embeddings = GetParam();
  cfg.rope_theta = 37.0;  // a small base makes every rotation frequency matter
  expect_matches_pytorch(cfg, testing::sample_docs(), GetParam() ? "tied" : "untied");
}

INSTANTIATE_TEST_SUITE_P(Tied, Reference, ::testing::Values(false, true));

// dhp's additions for Hugging Face decoders: q/k/v biases (randomised, so their gradients and
// their place before RoPE matter) and an rms_norm_eps large enough to move every norm.
TEST(ReferenceHf, AttentionBiasesAndNormEpsMatchPyTorch) {
  ModelConfig cfg = testing::tiny_config();
  cfg.attention_bias = true;
  cfg.rms_norm_eps = 1e-2;
  cfg.rope_theta = 37.0;
  expect_matches_pytorch(cfg, testing::sample_docs(), "bias_eps");
}

// The tiny configuration's vision head dim is 4: each half of the 2-D RoPE has one frequency,
// so a wrong exponent there is invisible, and one vision layer over small grids barely moves
// the loss when rows and columns are swapped. This one has vision head dim 16 (four
// frequencies per half), three vision layers, grids with up to 10 rows or columns and every
// shape non-square, several documents in the pack (one text-only, one with two images), and
// multi-query attention in the decoder; every parameter gradient is compared.
TEST(ReferenceVision, DeepVisionNonSquareGridsAndMqaMatchPyTorch) {
  ModelConfig cfg = testing::tiny_config();
  cfg.dim = 32;
  cfg.heads = 4;
  cfg.kv_heads = 1;
  cfg.ffn = 40;
  cfg.rope_theta = 37.0;
  cfg.vision.dim = 32;
  cfg.vision.heads = 2;  // head dim 16
  cfg.vision.layers = 3;
  cfg.vision.ffn = 24;
  const std::vector<testing::Doc> docs = {
      {{2, 7, 4, 5, 9, 10, 11, 3}, {0, 0, 0, 0, 1, 1, 1, 1}, {{1, {6, 4}}}},
      {{2, 12, 13, 14, 3}, {0, 0, 1, 1, 1}, {}},
      {{2, 4, 5, 4, 5, 15, 16, 3}, {0, 0, 0, 0, 0, 1, 1, 1}, {{2, {2, 8}}, {4, {8, 2}}}},
      {{2, 6, 8, 17, 18, 19, 3}, {0, 0, 0, 1, 1, 1, 1}, {{3, {4, 10}}}},
  };
  expect_matches_pytorch(cfg, docs, "vision");
}

}  // namespace
}  // namespace dhp
