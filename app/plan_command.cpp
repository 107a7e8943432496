// `dhp plan`: simulates many steps of the planner strategies on the same batches and prints
// the comparison (design.md §2.4). Lengths come from a file or a synthetic preset.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <sstream>
#include <stdexcept>

#include "app/cli.h"
#include "core/check.h"
#include "core/input.h"
#include "core/json_input.h"
#include "core/text.h"
#include "data/presets.h"
#include "parallel/planner.h"
#include "parallel/simulate.h"
#include "trainer/config.h"
#include "trainer/hf_checkpoint.h"

namespace dhp {
namespace {

// Limits of `dhp plan` beyond the planner's own (world size, tokens per sample, memory).
constexpr int kMaxBatch = 1 << 20;   // samples per global batch
constexpr int kMaxSteps = 100000;    // steps simulated

struct PlanOptions {
  std::string data, preset = "video-longtail", config, model_profile, device, strategies = "dhp,static,pow2";
  int world = 64, batch = 512, steps = 20, ranks_per_node = 0;
  std::string recompute;  // "", or a mode of types/recompute.h (on = full): overrides parallel.recompute
  double memory_gb = 0, budget_ms = 0;
  int zero = -1;  // overrides parallel.zero when set
  bool memory_set = false, ranks_set = false, budget_set = false;
  std::string coeffs;     // JSON file of cost coefficients (dhp profile)
  uint64_t seed = 1;
  bool json = false, show_plan = false;
};

// One sample per line: "vision_tokens text_tokens [images]" or a JSON object with those keys.
std::vector<SeqShape> read_lengths(const std::string& path) {
  // A regular file only (a FIFO would block), read line by line with a cap.
  LineReader in("--data", path);
  std::vector<SeqShape> out;
  std::set<int64_t> ids;
  std::string line;
  while (in.next(line)) {
    const int64_t no = in.line_no();
    if (line.find_first_not_of(" \t\r") == std::string::npos || line[0] == '#') continue;
    DHP_CHECK(int64_t(out.size()) < int64_t(kMaxBatch) * 64, "{}: more than {} samples", path,
              int64_t(kMaxBatch) * 64);
    SeqShape s;
    s.id = int64_t(out.size());
    int64_t images = -1;
    // A data manifest or a binary file given by mistake is named as what it is not, without
    // the JSON library's own text (which quotes the bytes it read).
    const auto not_lengths = [&] {
      return Error(fmt::format("--data: {}:{} is not a lengths record (expected 'vision_tokens text_tokens "
                               "[images]' or JSON with those fields), got '{}'",
                               path, no, printable(line, 80)));
    };
    if (line.find('{') != std::string::npos) {
      const nlohmann::json j = parse_json_input(line, fmt::format("--data: {}:{}", path, no));
      const auto integer = [&](const char* key) { return j.contains(key) && j[key].is_number_integer(); };
      if (!j.is_object() || !integer("text_tokens") || (j.contains("vision_tokens") && !integer("vision_tokens")) ||
          (j.contains("images") && !integer("images")) || (j.contains("id") && !integer("id")))
        throw not_lengths();
      s.vision_tokens = j.value("vision_tokens", int64_t(0));
      s.text_tokens = j.value("text_tokens", int64_t(0));
      images = j.value("images", int64_t(-1));
      s.id = j.value("id", s.id);
    } else {
      std::istringstream ls(line);
      if (!(ls >> s.vision_tokens >> s.text_tokens)) throw not_lengths();
      if (!(ls >> images)) images = -1;
      std::string rest;
      DHP_CHECK(!(ls >> rest), "--data: {}:{}: unexpected '{}' after the counts", path, no, printable(rest, 80));
    }
    if (images < 0) images = s.vision_tokens > 0 ? 1 : 0;
    DHP_CHECK(images <= INT32_MAX, "{}:{}: {} images is too many", path, no, images);
    s.images = int32_t(images);
    try {
      validate_shape(s);
    } catch (const Error& e) {
      throw Error(fmt::format("{}:{}: {}", path, no, e.what()));
    }
    DHP_CHECK(ids.insert(s.id).second, "{}:{}: sample id {} appears twice", path, no, s.id);
    out.push_back(s);
  }
  DHP_CHECK(!out.empty(), "--data: '{}' holds no samples", path);
  return out;
}

// The same batches for every strategy, made one step at a time: consecutive samples of a
// seeded permutation (file) or of the preset's deterministic stream.
BatchSource make_batches(const PlanOptions& o, int factor) {
  if (!o.data.empty()) {
    auto all = std::make_shared<std::vector<SeqShape>>(read_lengths(o.data));
    DHP_CHECK(int64_t(all->size()) >= o.batch,
              "--data: '{}' holds {} samples, fewer than --batch {}: a batch would hold a sample twice", o.data,
              all->size(), o.batch);
    auto perm = std::make_shared<std::vector<size_t>>(all->size());
    std::iota(perm->begin(), perm->end(), 0);
    uint64_t x = o.seed * 0x9e3779b97f4a7c15ULL + 1;
    for (size_t i = perm->size(); i > 1; --i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      std::swap((*perm)[i - 1], (*perm)[x % i]);
    }
    const int batch = o.batch;
    return [all, perm, batch](int s) {
      std::vector<SeqShape> b;
      b.reserve(size_t(batch));
      for (int i = 0; i < batch; ++i) b.push_back((*all)[(*perm)[(size_t(s) * size_t(batch) + size_t(i)) % perm->size()]]);
      return b;
    };
  }
  PresetParams p;
  try {
    p = preset_params(o.preset);
  } catch (const std::invalid_argument& e) {
    throw Error(e.what());
  }
  const int batch = o.batch;
  const uint64_t seed = o.seed;
  return [p, batch, seed, factor](int s) {
    std::vector<SeqShape> b;
    b.reserve(size_t(batch));
    for (const auto& x : preset_samples(p, int64_t(s) * batch, batch, seed, factor))
      b.push_back({x.id, x.text_tokens, x.vision_tokens, int32_t(x.images.size()), x.tower_images()});
    return b;
  };
}

std::vector<Strategy> parse_strategies(const std::string& list) {
  const std::string all = strategy_names(false);
  std::vector<Strategy> out;
  std::stringstream ss(list);
  for (std::string s; std::getline(ss, s, ',');) {
    DHP_CHECK(!s.empty(), "--strategies: empty name in '{}' (comma-separated: {})", list, all);
    const std::optional<Strategy> st = find_strategy(s);
    DHP_CHECK(st, "--strategies: unknown '{}' ({})", s, all);
    DHP_CHECK(std::find(out.begin(), out.end(), *st) == out.end(), "--strategies: '{}' given twice", s);
    out.push_back(*st);
  }
  DHP_CHECK(!out.empty(), "--strategies: name at least one of {}", all);
  return out;
}

void run_plan(const PlanOptions& o) {
  DHP_CHECK(o.world >= 1 && o.world <= kMaxWorld, "--world must be between 1 and {} ranks, got {}", kMaxWorld,
            o.world);
  DHP_CHECK(o.batch >= 1 && o.batch <= kMaxBatch, "--batch must be between 1 and {} samples, got {}", kMaxBatch,
            o.batch);
  DHP_CHECK(o.steps >= 1 && o.steps <= kMaxSteps, "--steps must be between 1 and {}, got {}", kMaxSteps, o.steps);
  DHP_CHECK(!o.memory_set || (std::isfinite(o.memory_gb) && o.memory_gb > 0 && o.memory_gb <= kMaxMemoryGb),
            "--memory-gb must be a positive number of GiB, at most {}, got {}", kMaxMemoryGb, o.memory_gb);
  DHP_CHECK(!o.ranks_set || o.ranks_per_node >= 1, "--ranks-per-node must be at least 1, got {}", o.ranks_per_node);
  DHP_CHECK(!o.budget_set || (std::isfinite(o.budget_ms) && o.budget_ms >= 0 && o.budget_ms <= 1e6),
            "--budget-ms must be between 0 and 1e6, got {}", o.budget_ms);
  DHP_CHECK(o.zero >= -1 && o.zero <= kMaxZero, "--zero: the ZeRO stage is 0 to {}, got {}", kMaxZero, o.zero);
  DHP_CHECK(o.recompute.empty() || o.recompute == "on" || find_recompute(o.recompute),
            "--recompute: off, selective or full (on = full), got '{}'", o.recompute);
  const std::vector<Strategy> strategies = parse_strategies(o.strategies);
  ModelConfig model;
  ParallelConfig par;
  ParamGroups groups;
  if (!o.config.empty()) {
    Config cfg = load_config(o.config);
    apply_hf_init_if_here(cfg);  // the folders' shapes, as the run will have them
    model = cfg.model, par = cfg.parallel, groups = cfg.optim.groups;
  }
  if (!o.model_profile.empty()) model = model_profile(o.model_profile);
  if (!o.device.empty()) par.cost_profile = o.device;
  if (o.memory_set) par.memory_gb = o.memory_gb;
  if (o.ranks_set) par.ranks_per_node = o.ranks_per_node;
  // A plan made here is for a cluster this process is not on: auto (0) means 8, a GPU node.
  if (par.ranks_per_node == 0) par.ranks_per_node = 8;
  if (o.budget_set) par.planner_budget_ms = o.budget_ms;
  if (o.zero >= 0) par.zero = o.zero;
  if (!o.recompute.empty())
    par.recompute = o.recompute == "on" ? Recompute::full : *find_recompute(o.recompute);
  CostModel cost(model, device_profile(par.cost_profile), par.ranks_per_node, par.recompute);
  if (!o.coeffs.empty()) {
    const std::string text = InputFile("--coeffs", o.coeffs).read_all(int64_t(64) << 20, "--coeffs");
    size_t at = 0;
    const nlohmann::json j = parse_json_input(text, "--coeffs '" + o.coeffs + "'", &at);
    DHP_CHECK(!j.is_discarded(), "--coeffs: '{}' is not JSON (at byte {}); pass the file dhp profile --out wrote",
              o.coeffs, at);
    cost.set_coeffs(CostCoeffs::from_json(j.contains("coeffs") ? j["coeffs"] : j));
  }
  Planner planner(cost, par, o.world, groups);
  const BatchSource batches = make_batches(o, model.vision.factor());

  std::vector<StrategyReport> rows;
  nlohmann::json failures = nlohmann::json::object();
  for (const Strategy s : strategies) {
    const StrategyTraits& t = traits(s);
    try {
      if (t.degrees == RingDegrees::fixed && par.static_cp == 0) rows.push_back(best_static(planner, batches, o.steps));
      else rows.push_back(simulate(planner, s, batches, o.steps, par.static_cp));
    } catch (const Error& e) {
      // A baseline that cannot hold the data (pow2 on a world whose largest power of two is
      // too small, static with a fixed CP) is reported, not fatal; a strategy of any degree
      // holds whatever fits the world, so its failure is the run's.
      if (t.degrees == RingDegrees::any) throw;
      failures[std::string(t.name)] = e.what();
    }
  }
  double base = 0;
  for (const auto& r : rows)
    if (r.strategy == Strategy::static_layout) base = r.step_s;
  for (auto& r : rows) r.speedup_vs_static = base > 0 ? base / r.step_s : 0;

  if (o.json) {
    nlohmann::json j = {{"world", o.world}, {"batch", o.batch}, {"steps", o.steps}, {"seed", o.seed},
                        {"source", o.data.empty() ? "preset:" + o.preset : o.data},
                        {"device", par.cost_profile}, {"memory_gb", par.memory_gb}, {"recompute", recompute_name(par.recompute)},
                        {"ranks_per_node", par.ranks_per_node}, {"budget_ms", par.planner_budget_ms},
                        {"coeffs", planner.cost().coeffs().to_json()}};
    const MemoryModel& mem = planner.memory();
    j["memory"] = {{"parameters", mem.parameters()},
                   {"trainable_parameters", mem.trainable_parameters()},
                   {"static_bytes", mem.static_bytes()},
                   {"gradient_bytes", mem.gradient_bytes()},
                   {"optimizer_bytes", mem.optimizer_bytes()}};
    for (const auto& r : rows) j["strategies"].push_back(r.to_json());
    if (!failures.empty()) j["failed"] = failures;
    if (o.show_plan) j["first_plan"] = planner.plan_dhp(batches(0)).to_json();
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("dhp plan: {} ranks ({} per node), device {} with {} GiB, {} steps of {} samples from {}\n",
             o.world, par.ranks_per_node, par.cost_profile, par.memory_gb, o.steps, o.batch,
             o.data.empty() ? "preset " + o.preset : o.data);
  const MemoryModel& mem = planner.memory();
  const double mib = double(1 << 20);
  fmt::print("model: dim {} x {} layers, vision {} x {} layers; {} parameters ({} trainable); recompute {}\n",
             model.dim, model.layers, model.vision.dim, model.vision.layers, mem.parameters(),
             mem.trainable_parameters(), recompute_name(par.recompute));
  const StateBytes& st = mem.state();
  const bool windowed = par.shards_gradients(o.world);
  const double window = 4.0 * double(mem.gradient_window()) / mib;
  fmt::print("per rank: weights, gradients and optimizer state {:.2f} MiB (fp32 master {:.2f}, working copy {:.2f}, "
             "gradients {:.2f}{}, moments {:.2f}{})\n",
             double(mem.static_bytes()) / mib, double(st.master) / mib, double(st.working) / mib,
             double(st.gradients) / mib,
             windowed ? fmt::format(" = a window of {:.2f} (two decoder layers and the parameters outside them) and a "
                                    "summed block of {:.2f}", window, double(st.gradients) / mib - window)
                      : "",
             double(st.moments) / mib, par.zero > 0 && o.world > 1 ? fmt::format(", ZeRO-{}", par.zero) : "");
  if (mem.layer_gather_bytes() > 0)
    fmt::print("ZeRO-3: the working copy is a window of the weights outside the decoder layers and two layers; "
               "each pass gathers {} layers of {:.2f} MiB\n", 2 * model.layers - 2, double(mem.layer_gather_bytes()) / mib);
  else if (par.shards_weights(o.world))
    fmt::print("ZeRO-3: the decoder layers do not train or are fewer than three, so every rank holds their working "
               "copy whole, as under ZeRO-2\n");
  // The longest text-only sample one rank holds in each recompute mode.
  std::vector<std::string> longest;
  for (const auto& [mode, name] : kRecomputeNames) {
    const MemoryModel m(model, device_profile(par.cost_profile), o.world, par.memory_gb, par.zero, mode, groups);
    longest.push_back(fmt::format("{} {}", name, m.longest_text_tokens()));
  }
  fmt::print("longest text sample on one rank, tokens by parallel.recompute: {}\n\n", fmt::join(longest, ", "));
  fmt::print("{}", format_reports(rows));
  for (auto& [k, v] : failures.items()) fmt::print("{}: not possible: {}\n", k, v.get<std::string>());
  if (o.show_plan) fmt::print("\nfirst step's dhp plan:\n{}", planner.plan_dhp(batches(0)).to_string());
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto opts = std::make_shared<PlanOptions>();
  auto* cmd = app.add_subcommand("plan", "Simulate the planner strategies on batches of sample lengths");
  cmd->add_option("--data", opts->data, "File of lengths: 'vision_tokens text_tokens [images]' per line, or JSON lines");
  cmd->add_option("--preset", opts->preset, "Synthetic lengths: captions, mixed, video-longtail, internvl-tiles")->capture_default_str();
  cmd->add_option("--config", opts->config, "TOML config whose [model] and [parallel] are used");
  cmd->add_option("--model-profile", opts->model_profile, "Model shape instead of the config's: tiny, 7b, 13b, 34b, 72b, internvl3-8b");
  cmd->add_option("--device", opts->device, "Cost profile: cpu, a100, h100, h200 (default: parallel.cost_profile)");
  cmd->add_option("--coeffs", opts->coeffs, "JSON cost coefficients (e.g. written by dhp profile) instead of the "
                                            "device profile's");
  cmd->add_option("--world", opts->world, "Number of ranks")->capture_default_str();
  cmd->add_option("--batch", opts->batch, "Samples per global batch")->capture_default_str();
  cmd->add_option("--memory-gb", opts->memory_gb, "Usable memory per device (default: parallel.memory_gb)")
      ->each([opts](const std::string&) { opts->memory_set = true; });
  cmd->add_option("--steps", opts->steps, "Steps to simulate")->capture_default_str();
  cmd->add_option("--strategies", opts->strategies,
                  "Comma-separated: dhp,static,pow2 and dhp-waves (dhp's waves as global barriers, for reference)")
      ->capture_default_str();
  cmd->add_option("--recompute", opts->recompute, "Planner models with activation recompute: off, selective or full (on = full) "
                                                  "(default: parallel.recompute)");
  cmd->add_option("--zero", opts->zero, "ZeRO stage 0, 1, 2 or 3 (default: parallel.zero)");
  cmd->add_option("--ranks-per-node", opts->ranks_per_node, "Ranks per node (default: parallel.ranks_per_node; 8 when that is 0, auto)")
      ->each([opts](const std::string&) { opts->ranks_set = true; });
  cmd->add_option("--budget-ms", opts->budget_ms, "Planner budget, ms of cost evaluations (default: "
                                                  "parallel.planner_budget_ms)")
      ->each([opts](const std::string&) { opts->budget_set = true; });
  cmd->add_option("--seed", opts->seed, "Seed of the preset / the sample order")->capture_default_str();
  cmd->add_flag("--json", opts->json, "Print JSON for scripts");
  cmd->add_flag("--show-plan", opts->show_plan, "Also print the first step's dhp plan");
  cmd->callback([opts] { run_plan(*opts); });
}

}  // namespace dhp
