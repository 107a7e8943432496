// The model tests against the PyTorch references of tests/reference/ (hf_*_ref.py): what a
// reference run wrote read back, dhp's gradients under a folder's names, and the distance
// between the two, measured as the issues bound it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/model.h"
#include "tests/hf_fixture.h"
#include "trainer/hf_checkpoint.h"

namespace dhp::testing {

struct RefResult {
  double loss = 0;
  std::vector<float> last_logits;                   // (V) at the last position
  std::map<std::string, std::vector<float>> grads;  // by the folder's names
};

// An h x w RGB image (rows of w·3 bytes) as a batch's patch rows: patches row-major, each in
// (ky, kx, c) order, p pixels a side.
inline void append_patches(Batch& b, const uint8_t* rgb, int h, int w, int p) {
  for (int r = 0; r < h / p; ++r)
    for (int c = 0; c < w / p; ++c)
      for (int ky = 0; ky < p; ++ky)
        for (int kx = 0; kx < p; ++kx)
          for (int ch = 0; ch < 3; ++ch) b.pixels.push_back(rgb[size_t(((r * p + ky) * w + c * p + kx) * 3 + ch)]);
}

// OUT/loss.json, OUT/logits.bin (T, V) and OUT/grads.safetensors of a reference run.
inline RefResult read_reference(const std::filesystem::path& out, int64_t T, int64_t V) {
  RefResult r;
  r.loss = nlohmann::json::parse(std::ifstream(out / "loss.json"))["loss"].get<double>();
  std::vector<float> logits(size_t(T * V));
  std::ifstream(out / "logits.bin", std::ios::binary)
      .read(reinterpret_cast<char*>(logits.data()), std::streamsize(logits.size() * 4));
  r.last_logits.assign(logits.end() - V, logits.end());
  for (auto& [name, g] : folder_f32(out)) r.grads[name] = std::move(g);
  return r;
}

// Runs tests/reference/`script` on CKPT with OUT/input.json = `input` (and `flags`), and reads
// what it wrote (read_reference).
inline RefResult run_reference(const std::string& script, const std::filesystem::path& ckpt,
                               const std::filesystem::path& out, const nlohmann::json& input, int64_t T, int64_t V,
                               const std::string& flags) {
  std::ofstream(out / "input.json") << input.dump();
  const std::string cmd =
      reference_py() + script + " " + ckpt.string() + " " + (out / "input.json").string() + " " + out.string() + " " + flags;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return read_reference(out, T, V);
}

// One training step's loss and gradients of `m` on `b` (mean loss over its targets) under the
// names of `layout`, as a folder holds them (fused tensors concatenated, conv kernels in the
// file's order), and the logits of b's last position.
inline RefResult run_step(Model& m, const Batch& b, HfLayout layout) {
  const ModelConfig& cfg = m.config();
  RefResult r;
  m.zero_grads();
  const float scale = 1.0f / float(b.loss_tokens());
  r.loss = m.step(b, scale, true).loss_sum * scale;
  for (const auto& bind : hf_name_map(cfg, layout)) {
    std::vector<float> g;
    for (const std::string& name : binding_tensors(bind)) {
      const ParamSpec& s = m.table().get(name);
      // A tensor that takes no gradient (a tower layer after the feature layer) has none.
      if (s.trainable) g.insert(g.end(), m.grads() + s.grad_offset, m.grads() + s.grad_offset + s.numel());
      else g.resize(g.size() + size_t(s.numel()), 0.0f);
    }
    if (bind.transform == HfTransform::ConvPatch) {
      std::vector<float> k(g.size());
      hf_permute_patch(k.data(), g.data(), m.table().get(bind.dhp).shape[0], cfg.vision.patch,
                       cfg.vision.traits().temporal_patch, true);
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

struct RefDistance {
  double loss = 0, logits = 0, grads = 0;
  std::string worst;
  int unmatched = 0;  // tensors with a gradient on one side only, or of another size
};

// The loss relative to the reference's, the last logits relative to their largest, each
// tensor's gradient relative to its largest entry. A gradient zero in exact arithmetic (a
// tower's key bias: softmax ignores a shift shared by every key) is rounding noise on both
// sides: both must stay at noise level against the model's largest gradient.
inline RefDistance ref_distance(const RefResult& ref, const RefResult& got) {
  RefDistance d;
  d.loss = std::abs(ref.loss - got.loss) / std::abs(ref.loss);
  double lmax = 0, lerr = 0;
  for (size_t i = 0; i < ref.last_logits.size() && i < got.last_logits.size(); ++i) {
    lmax = std::max(lmax, double(std::abs(ref.last_logits[i])));
    lerr = std::max(lerr, double(std::abs(ref.last_logits[i] - got.last_logits[i])));
  }
  d.logits = ref.last_logits.size() == got.last_logits.size() ? lerr / lmax : INFINITY;
  double top = 0;
  for (const auto& [name, g] : ref.grads)
    for (float v : g) top = std::max(top, double(std::abs(v)));
  for (const auto& [name, g] : ref.grads)
    if (!got.grads.count(name)) ++d.unmatched, d.worst = name;
  for (const auto& [name, g] : got.grads) {
    double mgot = 0;
    for (float v : g) mgot = std::max(mgot, double(std::abs(v)));
    const auto it = ref.grads.find(name);
    if (it == ref.grads.end()) {
      if (mgot > 0) ++d.unmatched, d.worst = name;
      continue;
    }
    if (it->second.size() != g.size()) {
      ++d.unmatched, d.worst = name;
      continue;
    }
    double mref = 0, err = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      mref = std::max(mref, double(std::abs(it->second[i])));
      err = std::max(err, double(std::abs(it->second[i] - g[i])));
    }
    if (mref < 1e-7 * top) {
      if (mgot > 1e-6 * top) ++d.unmatched, d.worst = name;
      continue;
    }
    if (err / mref > d.grads) d.grads = err / mref, d.worst = name;
  }
  return d;
}

// The vision-language issues' bounds: loss 1e-5 relative, logits 1e-4, each gradient 1e-4 of
// its largest entry.
inline constexpr double kRefLossTol = 1e-5, kRefLogitsTol = 1e-4, kRefGradTol = 1e-4;

// A match within those bounds, printed as `what`.
inline void expect_reference_match(const RefDistance& d, const std::string& what) {
  std::printf("%s: loss %.2e, logits %.2e, gradients %.2e (worst %s)\n", what.c_str(), d.loss, d.logits, d.grads,
              d.worst.c_str());
  EXPECT_EQ(d.unmatched, 0) << what << ": " << d.worst;
  EXPECT_LT(d.loss, kRefLossTol) << what;
  EXPECT_LT(d.logits, kRefLogitsTol) << what;
  EXPECT_LT(d.grads, kRefGradTol) << what << ": " << d.worst;
}

// A negative control: it must miss by more than ten times the bounds, or the match would not
// prove the semantics it names.
inline void expect_control_misses(const RefDistance& d, const std::string& what) {
  std::printf("control, %s: loss %.2e, logits %.2e, gradients %.2e\n", what.c_str(), d.loss, d.logits, d.grads);
  EXPECT_TRUE(d.loss > 10 * kRefLossTol || d.logits > 10 * kRefLogitsTol || d.grads > 10 * kRefGradTol || d.unmatched)
      << what << " went unnoticed: loss " << d.loss << ", logits " << d.logits << ", gradients " << d.grads;
}

}  // namespace dhp::testing
