// `dhp profile`: the profiling pass of design.md §2.1 on the run's device (train.device). First
// the device's rates op by op (parallel/device_probe.h: the Linear products, attention per
// chunk size, and ring transfer where two ranks run it), which replace the datasheet profile
// as the prior; then whole steps (trainer/profile.h), to which refit() fits the cost model's
// coefficients. Prints measured against predicted times and the coefficients next to the
// built-in profile. The coefficients go to a JSON file that `dhp plan --coeffs` (and the
// online refit, as its prior) can use.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>

#include "app/cli.h"
#include "core/check.h"
#include "core/files.h"
#include "core/text.h"
#include "kernels/backend.h"
#include "parallel/cost_model.h"
#include "parallel/device_probe.h"
#include "parallel/mpi_comm.h"
#include "trainer/config.h"
#include "trainer/profile.h"

namespace dhp {
namespace {

struct ProfileOptions {
  std::string config, out = "cost_coeffs.json", prior = "h200", model_profile;
  int64_t max_chunk = 0;
  bool probe_only = false;  // the device's rates op by op, no whole steps (no model is built)
  int threads = 1, repeats = 3;
  bool quick = false;
  bool force = false;  // replace an --out that is not an earlier profile
};

// An earlier profile's coefficients file, which a new profile may replace.
bool is_profile_json(const std::string& path) {
  const nlohmann::json j = nlohmann::json::parse(read_head(path, 16 << 20), nullptr, false);
  return j.is_object() && j.contains("coeffs") && j.contains("observations");
}

void run_profile(const ProfileOptions& o, const std::vector<std::string>& overrides, const CliHooks& hooks) {
  DHP_CHECK(o.threads >= 1 && o.threads <= 1024, "--threads must be between 1 and 1024, got {}", o.threads);
  DHP_CHECK(o.repeats >= 1 && o.repeats <= 100, "--repeats must be between 1 and 100, got {}", o.repeats);
  // 0 is "not given" (the device's default); a ladder starts at 64 tokens, and 2^20 tokens of
  // one document is past any device's memory for the probe's scores.
  DHP_CHECK(o.max_chunk == 0 || (o.max_chunk >= 64 && o.max_chunk <= (int64_t(1) << 20)),
            "--max-chunk must be between 64 and {} tokens, got {}", int64_t(1) << 20, o.max_chunk);
  // Checked whatever the device: on the CPU the prior is not used, but a misspelt name must not
  // pass silently.
  DHP_CHECK(o.prior == "a100" || o.prior == "h100" || o.prior == "h200",
            "--prior '{}' is not a built-in GPU profile: use a100, h100 or h200", printable(o.prior));
  auto world = start_world(nullptr, nullptr);
  Config cfg = o.config.empty() ? parse_config("", "built-in defaults", overrides) : load_config(o.config, overrides);
  world = communicator_for(std::move(world), cfg.train.device, hooks);
  Communicator& comm = *world;
  const bool lead = comm.rank() == 0, cuda = cfg.train.device == "cuda";
  // Before the minutes of measuring, not after.
  if (lead) check_output_path(o.out, "--out", is_profile_json, o.force);
  BackendOptions bo = backend_options(cfg);
  bo.threads = o.threads;
  bo.adapt_threads = false;
  std::unique_ptr<Backend> backend = make_backend(cfg.train.device, bo);
  if (!o.model_profile.empty()) cfg.model = model_profile(o.model_profile);
  const ModelConfig& m = cfg.model;
  const std::string prior_name = cuda ? o.prior : "cpu";
  const CostModel builtin(m, device_profile(prior_name), 1);
  if (lead)
    fmt::print("dhp profile on {} ({} storage, {} rank(s)): model dim {} x {} layers, vision {} {} x {} layers ({} run), "
               "{} thread(s), median of {} runs\n\n",
               cfg.train.device, dtype_name(backend->ops().dtype()), comm.size(), m.dim, m.layers,
               std::string(m.vision.traits().name), m.vision.dim, m.vision.layers, m.vision.layers_run(), o.threads, o.repeats);

  // The device's rates op by op: the prior of the fit below instead of the datasheet's.
  ProbeOptions po;
  po.repeats = o.repeats;
  po.chunks = chunk_ladder(64, o.quick ? 256 : o.max_chunk > 0 ? o.max_chunk : cuda ? 65536 : 2048);
  po.gemm_tokens = cuda ? 8192 : o.quick ? 64 : 512;
  // Memory runs out where the options ask for more than this machine has: say which options.
  const auto sized_by_options = [&](const Error& e) {
    if (std::string_view(e.what()).find("out of ") != 0) return e;
    return Error(fmt::format("{} (while profiling {} with chunks up to {} tokens: --model-profile and --max-chunk "
                             "size this; on the CPU, --probe-only skips the whole steps)",
                             e.what(), o.model_profile.empty() ? "the config's model" : "--model-profile " + o.model_profile,
                             po.chunks.empty() ? 0 : po.chunks.back()));
  };
  const DeviceProbe probe = [&] {
    try {
      return probe_device(*backend, m, po, &comm);
    } catch (const Error& e) {
      throw sized_by_options(e);
    }
  }();
  if (!lead) return;  // the whole steps are rank 0's
  fmt::print("{}", probe.table(builtin.coeffs(), m));
  const nlohmann::json probe_json = probe.to_json();
  CostModel prior = builtin;
  prior.set_coeffs(probe.coeffs(builtin.coeffs()));

  std::vector<TimingObservation> obs;
  if (!o.probe_only) {
    try {
      StepProfiler profiler(m, std::move(backend), o.threads);
      for (const ProfileShape& sh : profile_shapes(m, o.quick))
        obs.push_back(profiler.measure(sh, o.repeats, uint64_t(obs.size()) + 1));
    } catch (const Error& e) {
      throw sized_by_options(e);
    }
  }
  const CostCoeffs fit = o.probe_only ? prior.coeffs() : refit(prior, obs, 1e-3);
  CostModel fitted = prior;
  fitted.set_coeffs(fit);
  if (!o.probe_only) fmt::print("\nwhole steps (forward, backward), one rank:\n");
  if (!o.probe_only)
    fmt::print("{:>5} {:>6} {:>7} {:>5}  {:>11} {:>11} {:>11}\n", "docs", "text", "images", "grid", "measured ms",
               "prior ms", "fitted ms");
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& ob : obs) {
    GroupCost g;
    for (const auto& s : ob.seqs) g.add(prior.prepare(s));
    const double a = prior.seconds(g, 1, false), f = fitted.seconds(g, 1, false);
    const auto& s0 = ob.seqs[0];
    const int grid = s0.images ? int(std::lround(std::sqrt(double(s0.vision_tokens / s0.images) *
                                                          m.vision.merge * m.vision.merge)))
                               : 0;
    fmt::print("{:>5} {:>6} {:>7} {:>5}  {:>11.3f} {:>11.3f} {:>11.3f}\n", ob.seqs.size(), s0.text_tokens, s0.images,
               grid, 1e3 * ob.seconds, 1e3 * a, 1e3 * f);
    rows.push_back({{"docs", ob.seqs.size()}, {"text_tokens", s0.text_tokens}, {"vision_tokens", s0.vision_tokens},
                    {"images", s0.images}, {"seconds", ob.seconds}, {"predicted_prior", a}, {"predicted_fit", f}});
  }
  const double before = obs.empty() ? 0 : mean_relative_error(prior, obs);
  const double after = obs.empty() ? 0 : mean_relative_error(fitted, obs);
  if (!o.probe_only)
    fmt::print("\nmean relative error: {:.1f}% with the probed coefficients, {:.1f}% after the fit\n", 100 * before,
               100 * after);
  const CostCoeffs& b = builtin.coeffs();
  const CostCoeffs& pr = prior.coeffs();
  fmt::print("coefficients, as rates (per second):\n  {:<20} {:>12} {:>12} {:>12}\n", "", prior_name + " (built-in)",
             "probed", "fitted");
  for (int i = 0; i < CostCoeffs::kCount; ++i) {
    const bool ring = i == 2 || i == 3 || i == 4;
    fmt::print("  {:<20} {:>12.4g} {:>12.4g} {:>12.4g}{}\n", CostCoeffs::name(i), 1 / b[i], 1 / pr[i], 1 / fit[i],
               ring && probe.transfer.empty() ? "  (built-in: needs two ranks)" : "");
  }
  nlohmann::json j = {{"coeffs", fit.to_json()},       {"observations", rows},   {"error_prior", before},
                      {"error_fit", after},            {"threads", o.threads},   {"repeats", o.repeats},
                      {"device", cfg.train.device},    {"builtin_profile", prior_name},
                      {"builtin_coeffs", b.to_json()}, {"probed_coeffs", pr.to_json()},
                      {"probe", probe_json},
                      {"model", {{"dim", m.dim}, {"layers", m.layers}, {"vision_dim", m.vision.dim},
                                 {"vision_layers", m.vision.layers},
                                 {"vision_arch", std::string(m.vision.traits().name)},
                                 {"vision_layers_run", m.vision.layers_run()}}}};
  check_output_path(o.out, "--out", is_profile_json, o.force);
  try {
    write_file_atomic(o.out, j.dump(2) + "\n");
  } catch (const Error& e) {
    throw Error(fmt::format("--out: {}", e.what()));
  }
  fmt::print("wrote {}\n", o.out);
}

}  // namespace

void add_profile_command(CLI::App& app, const CliHooks& hooks) {
  auto opts = std::make_shared<ProfileOptions>();
  auto* cmd = app.add_subcommand(
      "profile",
      "Measure the device (train.device: cpu or cuda) op by op and step by step and fit the planner's cost model; "
      "any key can be overridden as --section.key=value");
  cmd->add_option("--config", opts->config, "TOML config whose [model] is profiled (default: the built-in model)");
  cmd->add_option("--out", opts->out, "JSON file for the fitted coefficients")->capture_default_str();
  cmd->add_option("--threads", opts->threads, "Compute threads")->capture_default_str();
  cmd->add_option("--repeats", opts->repeats, "Timed runs per shape (the median counts)")->capture_default_str();
  cmd->add_flag("--quick", opts->quick, "A few shapes only (for tests)");
  cmd->add_flag("--force", opts->force, "Replace an --out file that is not an earlier profile");
  cmd->add_option("--prior", opts->prior, "Built-in cost profile a device profile is shown against (a100, h100, h200)")
      ->capture_default_str();
  cmd->add_option("--max-chunk", opts->max_chunk, "Longest attention chunk probed, in tokens (default: 65536 on "
                  "cuda, 2048 on the CPU)");
  cmd->add_option("--model-profile", opts->model_profile, "Model shape instead of the config's: tiny, 7b, 13b, 34b, 72b");
  cmd->add_flag("--probe-only", opts->probe_only, "Only the device's rates op by op: no whole steps, no model built "
                "(the coefficients written are the probed ones)");
  cmd->allow_extras();
  cmd->callback([cmd, opts, &hooks] { run_profile(*opts, cmd->remaining(), hooks); });
}

}  // namespace dhp
