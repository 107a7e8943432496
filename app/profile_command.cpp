// `dhp profile`: the profiling pass of design.md §2.1 (trainer/profile.h) on one rank. Fits
// the cost model's coefficients to the measured step times with refit(), and prints measured
// against predicted times before and after the fit. The coefficients go to a JSON file that
// `dhp plan --coeffs` (and the online refit, as its prior) can use. Ring transfer and latency
// need more than one rank: they keep their prior.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>

#include "app/cli.h"
#include "core/check.h"
#include "core/files.h"
#include "parallel/cost_model.h"
#include "trainer/config.h"
#include "trainer/profile.h"

namespace dhp {
namespace {

struct ProfileOptions {
  std::string config, out = "cost_coeffs.json";
  int threads = 1, repeats = 3;
  bool quick = false;
  bool force = false;  // replace an --out that is not an earlier profile
};

std::string arch_name(VisionArch a) {
  for (const auto& [value, name] : kVisionArchNames)
    if (value == a) return std::string(name);
  return "?";
}

// An earlier profile's coefficients file, which a new profile may replace.
bool is_profile_json(const std::string& path) {
  const nlohmann::json j = nlohmann::json::parse(read_head(path, 16 << 20), nullptr, false);
  return j.is_object() && j.contains("coeffs") && j.contains("observations");
}

void run_profile(const ProfileOptions& o) {
  DHP_CHECK(o.threads >= 1 && o.threads <= 1024, "--threads must be between 1 and 1024, got {}", o.threads);
  DHP_CHECK(o.repeats >= 1 && o.repeats <= 100, "--repeats must be between 1 and 100, got {}", o.repeats);
  // Before the minutes of measuring, not after.
  check_output_path(o.out, "--out", is_profile_json, o.force);
  ModelConfig cfg;
  if (!o.config.empty()) cfg = load_config(o.config).model;
  StepProfiler profiler(cfg, o.threads);
  const CostModel prior(cfg, device_profile("cpu"), 1);
  std::vector<TimingObservation> obs;
  fmt::print("dhp profile: model dim {} x {} layers, vision {} {} x {} layers ({} run), {} thread(s), median of {} "
             "runs\n\n",
             cfg.dim, cfg.layers, arch_name(cfg.vision.arch), cfg.vision.dim, cfg.vision.layers,
             cfg.vision.layers_run(), o.threads, o.repeats);
  for (const ProfileShape& sh : profile_shapes(cfg, o.quick))
    obs.push_back(profiler.measure(sh, o.repeats, uint64_t(obs.size()) + 1));
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
                                 {"vision_layers", cfg.vision.layers},
                                 {"vision_arch", arch_name(cfg.vision.arch)},
                                 {"vision_layers_run", cfg.vision.layers_run()}}}};
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
