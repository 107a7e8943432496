// `dhp profile`: the profiling pass of design.md §2.1. Times forward + backward of the CPU
// model on micro-batches of many shapes (text lengths, packed documents, images of several
// sizes and counts) on one rank, fits the cost model's coefficients to the measurements with
// refit(), and prints measured against predicted times before and after the fit. The
// coefficients go to a JSON file that `dhp plan --coeffs` (and the online refit, as its
// prior) can use. Ring transfer and latency need more than one rank: they keep their prior.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>

#include "app/cli.h"
#include "core/check.h"
#include "core/files.h"
#include "core/clock.h"
#include "kernels/backend.h"
#include "model/model.h"
#include "parallel/cost_model.h"
#include "trainer/config.h"

namespace dhp {
namespace {

struct ProfileOptions {
  std::string config, out = "cost_coeffs.json";
  int threads = 1, repeats = 3;
  bool quick = false;
  bool force = false;  // replace an --out that is not an earlier profile
};

// An earlier profile's coefficients file, which a new profile may replace.
bool is_profile_json(const std::string& path) {
  const nlohmann::json j = nlohmann::json::parse(read_head(path, 16 << 20), nullptr, false);
  return j.is_object() && j.contains("coeffs") && j.contains("observations");
}

// One shape: documents of `text` tokens each, with `images` images of grid x grid patches.
struct Shape {
  int docs = 1;
  int64_t text = 0;
  int images = 0;  // per document
  int grid = 0;    // patches per side (a multiple of the merge factor)
};

Batch make_batch(const ModelConfig& cfg, const Shape& sh, uint64_t seed) {
  Batch b;
  const int m = cfg.vision.merge;
  const int64_t pn = cfg.vision.patch_numel();
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 7;
  auto next = [&] { return x ^= x << 13, x ^= x >> 7, x ^= x << 17, x; };
  int32_t slot = 0;
  for (int di = 0; di < sh.docs; ++di) {
    int32_t pos = 0;
    for (int i = 0; i < sh.images; ++i) {
      PackedImage im{b.n_patches(), sh.grid, sh.grid};
      for (int64_t k = 0; k < int64_t(sh.grid) * sh.grid * pn; ++k)
        b.pixels.push_back(uint8_t(next() % 256));
      b.images.push_back(im);
      for (int t = 0; t < sh.grid * sh.grid / (m * m); ++t) {
        b.tokens.push_back(0), b.image_slot.push_back(slot++), b.doc.push_back(di), b.pos.push_back(pos++);
        b.targets.push_back(-1);
      }
    }
    for (int64_t t = 0; t < sh.text; ++t) {
      b.tokens.push_back(int32_t(1 + next() % uint64_t(cfg.vocab_size - 1)));
      b.image_slot.push_back(-1), b.doc.push_back(di), b.pos.push_back(pos++);
      b.targets.push_back(t + 1 < sh.text ? int32_t(1 + next() % uint64_t(cfg.vocab_size - 1)) : -1);
    }
    b.sample_ids.push_back(di);
  }
  b.T = int64_t(b.tokens.size());
  return b;
}


std::vector<Shape> shapes(const ModelConfig& cfg, bool quick) {
  const int m = cfg.vision.merge;
  std::vector<Shape> out;
  const std::vector<int64_t> lengths = quick ? std::vector<int64_t>{128, 1024} : std::vector<int64_t>{64, 128, 256, 512, 1024, 2048, 4096};
  for (int64_t L : lengths) out.push_back({1, L, 0, 0});
  for (int docs : {4, 16})
    for (int64_t L : quick ? std::vector<int64_t>{64} : std::vector<int64_t>{32, 128, 256}) out.push_back({docs, L, 0, 0});
  const std::vector<int> grids = quick ? std::vector<int>{4 * m} : std::vector<int>{4 * m, 8 * m, 16 * m};
  for (int grid : grids)
    for (int images : quick ? std::vector<int>{1} : std::vector<int>{1, 2, 4, 8}) out.push_back({1, 48, images, grid});
  if (!quick) out.push_back({4, 64, 2, 8 * m}), out.push_back({2, 512, 1, 16 * m});
  return out;
}

void run_profile(const ProfileOptions& o) {
  DHP_CHECK(o.threads >= 1 && o.threads <= 1024, "--threads must be between 1 and 1024, got {}", o.threads);
  DHP_CHECK(o.repeats >= 1 && o.repeats <= 100, "--repeats must be between 1 and 100, got {}", o.repeats);
  // Before the minutes of measuring, not after.
  check_output_path(o.out, "--out", is_profile_json, o.force);
  ModelConfig cfg;
  if (!o.config.empty()) cfg = load_config(o.config).model;
  BackendOptions bo;
  bo.threads = o.threads;
  auto backend = make_cpu_backend(bo);
  Model model(cfg, *backend);
  model.initialise(1);
  const CostModel prior(cfg, device_profile("cpu"), 1, false);
  std::vector<TimingObservation> obs;
  fmt::print("dhp profile: model dim {} x {} layers, vision {} x {} layers, {} thread(s), median of {} runs\n\n",
             cfg.dim, cfg.layers, cfg.vision.dim, cfg.vision.layers, o.threads, o.repeats);
  for (const Shape& sh : shapes(cfg, o.quick)) {
    const Batch b = make_batch(cfg, sh, uint64_t(obs.size()) + 1);
    model.zero_grads();
    model.step(b, 1.0f / float(std::max<int64_t>(1, b.loss_tokens())), true);  // warm-up
    std::vector<double> t;
    for (int r = 0; r < o.repeats; ++r) {
      const auto w0 = std::chrono::steady_clock::now();
      const double c0 = thread_cpu_seconds();
      model.step(b, 1.0f / float(std::max<int64_t>(1, b.loss_tokens())), true);
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
      // One thread: the thread's own CPU time, immune to other processes on the machine.
      t.push_back(o.threads == 1 ? thread_cpu_seconds() - c0 : wall);
    }
    std::sort(t.begin(), t.end());
    TimingObservation ob;
    ob.degree = 1;
    ob.seconds = t[t.size() / 2];
    const int64_t vision_per_doc = int64_t(sh.images) * sh.grid * sh.grid / (cfg.vision.merge * cfg.vision.merge);
    for (int d = 0; d < sh.docs; ++d)
      ob.seqs.push_back({d, sh.text, vision_per_doc, int32_t(vision_per_doc > 0 ? sh.images : 0)});
    obs.push_back(ob);
  }
  const CostCoeffs fit = refit(prior, obs, 1e-3);
  CostModel fitted = prior;
  fitted.set_coeffs(fit);
  fmt::print("{:>5} {:>6} {:>7} {:>5}  {:>11} {:>11} {:>11}\n", "docs", "text", "images", "grid", "measured ms",
             "prior ms", "fitted ms");
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& ob : obs) {
    GroupCost g;
    for (const auto& s : ob.seqs) g.add(prior.prepare(s));
    const double a = prior.seconds(g, 1, false), f = fitted.seconds(g, 1, false);
    const auto& s0 = ob.seqs[0];
    const int grid = s0.images ? int(std::lround(std::sqrt(double(s0.vision_tokens / s0.images) *
                                                          cfg.vision.merge * cfg.vision.merge)))
                               : 0;
    fmt::print("{:>5} {:>6} {:>7} {:>5}  {:>11.3f} {:>11.3f} {:>11.3f}\n", ob.seqs.size(), s0.text_tokens, s0.images,
               grid, 1e3 * ob.seconds, 1e3 * a, 1e3 * f);
    rows.push_back({{"docs", ob.seqs.size()}, {"text_tokens", s0.text_tokens}, {"vision_tokens", s0.vision_tokens},
                    {"images", s0.images}, {"seconds", ob.seconds}, {"predicted_prior", a}, {"predicted_fit", f}});
  }
  const double before = mean_relative_error(prior, obs), after = mean_relative_error(fitted, obs);
  fmt::print("\nmean relative error: {:.1f}% with the prior coefficients, {:.1f}% after the fit\n", 100 * before,
             100 * after);
  fmt::print("fitted coefficients (rates):\n");
  for (int i = 0; i < CostCoeffs::kCount; ++i)
    fmt::print("  {:<20} {:.4g}  ({:.4g} per second){}\n", CostCoeffs::name(i), fit[i], 1 / fit[i],
               i == 2 || i == 3 || i == 4 ? "  (prior: not measured on one rank)" : "");
  nlohmann::json j = {{"coeffs", fit.to_json()},       {"observations", rows},   {"error_prior", before},
                      {"error_fit", after},            {"threads", o.threads},   {"repeats", o.repeats},
                      {"model", {{"dim", cfg.dim}, {"layers", cfg.layers}, {"vision_dim", cfg.vision.dim},
                                 {"vision_layers", cfg.vision.layers}}}};
  check_output_path(o.out, "--out", is_profile_json, o.force);
  try {
    write_file_atomic(o.out, j.dump(2) + "\n");
  } catch (const Error& e) {
    throw Error(fmt::format("--out: {}", e.what()));
  }
  fmt::print("wrote {}\n", o.out);
}

}  // namespace

void add_profile_command(CLI::App& app) {
  auto opts = std::make_shared<ProfileOptions>();
  auto* cmd = app.add_subcommand("profile", "Measure the CPU model's step times and fit the planner's cost model");
  cmd->add_option("--config", opts->config, "TOML config whose [model] is profiled (default: the built-in model)");
  cmd->add_option("--out", opts->out, "JSON file for the fitted coefficients")->capture_default_str();
  cmd->add_option("--threads", opts->threads, "Compute threads")->capture_default_str();
  cmd->add_option("--repeats", opts->repeats, "Timed runs per shape (the median counts)")->capture_default_str();
  cmd->add_flag("--quick", opts->quick, "A few shapes only (for tests)");
  cmd->add_flag("--force", opts->force, "Replace an --out file that is not an earlier profile");
  cmd->callback([opts] { run_profile(*opts); });
}

}  // namespace dhp
