// `dhp plan`: simulates many steps of the planner strategies on the same batches and prints
// the comparison (design.md §2.4). Lengths come from a file or a synthetic preset.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include "data/presets.h"
#include "kernels/check.h"
#include "parallel/planner.h"
#include "parallel/simulate.h"
#include "trainer/cli.h"
#include "trainer/config.h"

namespace dhp {
namespace {

struct PlanOptions {
  std::string data, preset = "video-longtail", config, model_profile, device, strategies = "dhp,static,pow2";
  int world = 64, batch = 512, steps = 20, ranks_per_node = 0;
  std::string recompute;  // "", "on" or "off": overrides parallel.recompute
  double memory_gb = 0;
  uint64_t seed = 1;
  bool json = false, show_plan = false;
};

// One sample per line: "vision_tokens text_tokens [images]" or a JSON object with those keys.
std::vector<SeqShape> read_lengths(const std::string& path) {
  std::ifstream in(path);
  DHP_CHECK(in.good(), "--data: cannot read '{}'", path);
  std::vector<SeqShape> out;
  std::string line;
  for (int64_t no = 1; std::getline(in, line); ++no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos || line[0] == '#') continue;
    SeqShape s;
    s.id = int64_t(out.size());
    if (line.find('{') != std::string::npos) {
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
        s.vision_tokens = j.value("vision_tokens", int64_t(0));
        s.text_tokens = j.value("text_tokens", int64_t(0));
        s.images = j.value("images", s.vision_tokens > 0 ? 1 : 0);
        s.id = j.value("id", s.id);
      } catch (const nlohmann::json::exception& e) {
        throw Error(fmt::format("{}:{}: {}", path, no, e.what()));
      }
    } else {
      std::istringstream ls(line);
      int64_t images = -1;
      DHP_CHECK(bool(ls >> s.vision_tokens >> s.text_tokens), "{}:{}: expected 'vision_tokens text_tokens', got '{}'",
                path, no, line);
      if (ls >> images) s.images = int32_t(images);
      else s.images = s.vision_tokens > 0 ? 1 : 0;
    }
    DHP_CHECK(s.vision_tokens >= 0 && s.text_tokens >= 0 && s.tokens() > 0, "{}:{}: a sample needs tokens", path, no);
    out.push_back(s);
  }
  DHP_CHECK(!out.empty(), "--data: '{}' holds no samples", path);
  return out;
}

// The same batches for every strategy: consecutive samples of a seeded permutation (file)
// or of the preset's deterministic stream.
std::vector<std::vector<SeqShape>> make_batches(const PlanOptions& o, int factor) {
  std::vector<std::vector<SeqShape>> out;
  if (!o.data.empty()) {
    auto all = read_lengths(o.data);
    std::vector<size_t> perm(all.size());
    std::iota(perm.begin(), perm.end(), 0);
    uint64_t x = o.seed * 0x9e3779b97f4a7c15ULL + 1;
    for (size_t i = perm.size(); i > 1; --i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      std::swap(perm[i - 1], perm[x % i]);
    }
    for (int s = 0; s < o.steps; ++s) {
      std::vector<SeqShape> b;
      for (int i = 0; i < o.batch; ++i) b.push_back(all[perm[(size_t(s) * o.batch + i) % perm.size()]]);
      out.push_back(std::move(b));
    }
    return out;
  }
  PresetParams p;
  try {
    p = preset_params(o.preset);
  } catch (const std::invalid_argument& e) {
    throw Error(e.what());
  }
  for (int s = 0; s < o.steps; ++s) {
    std::vector<SeqShape> b;
    for (const auto& x : preset_samples(p, int64_t(s) * o.batch, o.batch, o.seed, factor))
      b.push_back({x.id, x.text_tokens, x.vision_tokens, int32_t(x.images.size())});
    out.push_back(std::move(b));
  }
  return out;
}

void run_plan(const PlanOptions& o) {
  DHP_CHECK(o.world >= 1 && o.batch >= 1 && o.steps >= 1, "--world, --batch and --steps must be positive");
  ModelConfig model;
  ParallelConfig par;
  if (!o.config.empty()) {
    Config cfg = load_config(o.config);
    model = cfg.model, par = cfg.parallel;
  }
  if (!o.model_profile.empty()) model = model_profile(o.model_profile);
  if (!o.device.empty()) par.device = o.device;
  if (o.memory_gb > 0) par.memory_gb = o.memory_gb;
  if (o.ranks_per_node > 0) par.ranks_per_node = o.ranks_per_node;
  DHP_CHECK(o.recompute.empty() || o.recompute == "on" || o.recompute == "off", "--recompute: on or off, got '{}'",
            o.recompute);
  if (!o.recompute.empty()) par.recompute = o.recompute == "on";
  Planner planner(model, par, o.world);
  auto batches = make_batches(o, model.vision.factor());

  std::vector<std::string> names;
  std::stringstream ss(o.strategies);
  for (std::string s; std::getline(ss, s, ',');)
    if (!s.empty()) names.push_back(s);
  std::vector<StrategyReport> rows;
  nlohmann::json failures = nlohmann::json::object();
  for (const auto& name : names) {
    DHP_CHECK(name == "dhp" || name == "dhp-waves" || name == "static" || name == "pow2",
              "--strategies: unknown '{}' (dhp, dhp-waves, static, pow2)", name);
    try {
      if (name == "static" && par.static_cp == 0) rows.push_back(best_static(planner, batches));
      else rows.push_back(simulate(planner, name, batches, par.static_cp));
    } catch (const Error& e) {
      // A baseline that cannot hold the data (pow2 on a world whose largest power of two is
      // too small, static with a fixed CP) is reported, not fatal.
      if (name == "dhp") throw;
      failures[name] = e.what();
    }
  }
  double base = 0;
  for (const auto& r : rows)
    if (r.strategy == "static") base = r.step_s;
  for (auto& r : rows) r.speedup_vs_static = base > 0 ? base / r.step_s : 0;

  if (o.json) {
    nlohmann::json j = {{"world", o.world}, {"batch", o.batch}, {"steps", o.steps}, {"seed", o.seed},
                        {"source", o.data.empty() ? "preset:" + o.preset : o.data},
                        {"device", par.device}, {"memory_gb", par.memory_gb}, {"recompute", par.recompute}};
    for (const auto& r : rows) j["strategies"].push_back(r.to_json());
    if (!failures.empty()) j["failed"] = failures;
    if (o.show_plan) j["first_plan"] = planner.plan_dhp(batches[0]).to_json();
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("dhp plan: {} ranks ({} per node), device {} with {} GiB, {} steps of {} samples from {}\n",
             o.world, par.ranks_per_node, par.device, par.memory_gb, o.steps, o.batch,
             o.data.empty() ? "preset " + o.preset : o.data);
  fmt::print("model: dim {} x {} layers, vision {} x {} layers; {} parameters; recompute {}\n\n", model.dim,
             model.layers, model.vision.dim, model.vision.layers, planner.memory().parameters(),
             par.recompute ? "on" : "off");
  fmt::print("{}", format_reports(rows));
  for (auto& [k, v] : failures.items()) fmt::print("{}: not possible: {}\n", k, v.get<std::string>());
  if (o.show_plan) fmt::print("\nfirst step's dhp plan:\n{}", planner.plan_dhp(batches[0]).to_string());
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto opts = std::make_shared<PlanOptions>();
  auto* cmd = app.add_subcommand("plan", "Simulate the planner strategies on batches of sample lengths");
  cmd->add_option("--data", opts->data, "File of lengths: 'vision_tokens text_tokens' per line, or JSON lines");
  cmd->add_option("--preset", opts->preset, "Synthetic lengths: captions, mixed, video-longtail")->capture_default_str();
  cmd->add_option("--config", opts->config, "TOML config whose [model] and [parallel] are used");
  cmd->add_option("--model-profile", opts->model_profile, "Model shape instead of the config's: tiny, 7b");
  cmd->add_option("--device", opts->device, "Cost profile: cpu, a100, h100, h200 (default: parallel.device)");
  cmd->add_option("--world", opts->world, "Number of ranks")->capture_default_str();
  cmd->add_option("--batch", opts->batch, "Samples per global batch")->capture_default_str();
  cmd->add_option("--memory-gb", opts->memory_gb, "Usable memory per device (default: parallel.memory_gb)");
  cmd->add_option("--steps", opts->steps, "Steps to simulate")->capture_default_str();
  cmd->add_option("--strategies", opts->strategies,
                  "Comma-separated: dhp,static,pow2 and dhp-waves (dhp's waves as global barriers, for reference)")
      ->capture_default_str();
  cmd->add_option("--recompute", opts->recompute, "Planner models with activation recompute: on or off "
                                                  "(default: parallel.recompute)");
  cmd->add_option("--ranks-per-node", opts->ranks_per_node, "Ranks per node (default: parallel.ranks_per_node)");
  cmd->add_option("--seed", opts->seed, "Seed of the preset / the sample order")->capture_default_str();
  cmd->add_flag("--json", opts->json, "Print JSON for scripts");
  cmd->add_flag("--show-plan", opts->show_plan, "Also print the first step's dhp plan");
  cmd->callback([opts] { run_plan(*opts); });
}

}  // namespace dhp
