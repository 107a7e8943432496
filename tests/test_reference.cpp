// dhp's model against an independent PyTorch implementation of model-spec.md
// (tests/reference/model_ref.py): same weights, same packed batch, same loss and gradients
// to fp32 rounding. This pins the spec's details (RoPE convention, 2-D RoPE halves, merge
// order, GELU form, masks, loss normalisation) that a self-consistent gradient check cannot.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

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
  write_floats(dir / "patches.bin", b.patches.data(), b.patches.size());
}

class Reference : public ::testing::TestWithParam<bool> {};

TEST_P(Reference, LossAndGradientsMatchPyTorch) {
  auto backend = make_cpu_backend({1});
  ModelConfig cfg = testing::tiny_config();
  cfg.tie_embeddings = GetParam();
  cfg.rope_theta = 37.0;  // a small base makes every rotation frequency matter
  Model model(cfg, *backend);
  testing::randomise(model, 41);
  Batch b = testing::make_batch(testing::sample_docs(), cfg, 7);

  const fs::path dir = fs::temp_directory_path() /
                       ("dhp_reference_" + std::to_string(::getpid()) + (GetParam() ? "_tied" : ""));
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

INSTANTIATE_TEST_SUITE_P(Tied, Reference, ::testing::Values(false, true));

}  // namespace
}  // namespace dhp
