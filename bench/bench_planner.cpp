// Planner benchmarks (one core): wall time of the dhp planner per step, the exact solver
// against the plain DP, and the simulated step time of dhp / pow2 / best static on the
// length presets with a 7B-class model on 64 ranks. Prints tables; asserts nothing.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "data/presets.h"
#include "kernels/check.h"
#include "parallel/planner.h"
#include "parallel/simulate.h"
#include "parallel/solver.h"

namespace {

using namespace dhp;
using Clock = std::chrono::steady_clock;

std::vector<std::vector<SeqShape>> batches(const std::string& preset, int size, int steps, uint64_t seed) {
  const PresetParams p = preset_params(preset);
  std::vector<std::vector<SeqShape>> out;
  for (int s = 0; s < steps; ++s) {
    std::vector<SeqShape> b;
    for (const auto& x : preset_samples(p, int64_t(s) * size, size, seed, 28))
      b.push_back({x.id, x.text_tokens, x.vision_tokens, int32_t(x.images.size())});
    out.push_back(std::move(b));
  }
  return out;
}

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

void wall_time_table() {
  fmt::print("## dhp planner wall time per step (video-longtail, 7b on h200 141 GiB, recompute, "
             "8 ranks/node, budget 5 ms of work)\n\n");
  fmt::print("| sequences | ranks | steps | median ms | p99 ms | evaluations | groups | waves | step/bound |\n");
  fmt::print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  ParallelConfig par;
  par.device = "h200", par.memory_gb = 141, par.recompute = true, par.ranks_per_node = 8;
  double evals = 0, spent = 0;
  for (int size : {128, 512, 4096}) {
    for (int n : {8, 64, 512, 1024}) {
      Planner planner(model_profile("7b"), par, n);
      const int steps = size >= 4096 ? 15 : 40;
      auto bs = batches("video-longtail", size, steps, 1);
      std::vector<double> wall;
      double ev = 0, groups = 0, waves = 0, ratio = 0;
      for (const auto& b : bs) {
        PlanStats st;
        const auto t0 = Clock::now();
        Plan plan = planner.plan_dhp(b, &st);
        wall.push_back(ms_since(t0));
        ev += double(st.evaluations), groups += plan.summary().groups, waves += plan.summary().waves;
        ratio += double(plan.makespan_ns()) / double(plan.summary().lower_bound_ns);
      }
      std::sort(wall.begin(), wall.end());
      double total = 0;
      for (double w : wall) total += w;
      evals += ev, spent += total;
      fmt::print("| {} | {} | {} | {:.3f} | {:.3f} | {:.0f} | {:.0f} | {:.1f} | {:.3f} |\n", size, n, steps,
                 wall[wall.size() / 2], wall[std::min(wall.size() - 1, size_t(wall.size() * 0.99))], ev / steps,
                 groups / steps, waves / steps, ratio / steps);
    }
  }
  fmt::print("\nthroughput: {:.0f} cost evaluations per ms of planning (kEvaluationsPerMs = {})\n\n",
             evals / spent, kEvaluationsPerMs);
}

void solver_table() {
  fmt::print("## degree solver alone: parametric search vs the plain O(K·N²) DP (random monotone-ish times)\n\n");
  fmt::print("| groups K | ranks N | parametric ms | plain DP ms | same makespan |\n|---:|---:|---:|---:|:---:|\n");
  uint64_t x = 12345;
  auto next = [&] { return x = x * 6364136223846793005ULL + 1442695040888963407ULL, x >> 33; };
  for (auto [K, n] : {std::pair{16, 64}, {64, 64}, {256, 512}, {1024, 1024}}) {
    std::vector<std::vector<int64_t>> t(K, std::vector<int64_t>(n));
    for (int k = 0; k < K; ++k) {
      const int64_t work = 1000 + int64_t(next() % 1000000), ring = int64_t(next() % 50);
      for (int d = 1; d <= n; ++d) t[k][d - 1] = work / d + ring * (d - 1) + 1;
    }
    TableTimes table(std::move(t));
    auto t0 = Clock::now();
    auto fast = solve_degrees(table, n);
    const double fast_ms = ms_since(t0);
    t0 = Clock::now();
    auto dp = solve_degrees_dp(table, n);
    const double dp_ms = ms_since(t0);
    fmt::print("| {} | {} | {:.3f} | {:.1f} | {} |\n", K, n, fast_ms, dp_ms, fast.makespan == dp.makespan ? "yes" : "NO");
  }
  fmt::print("\n");
}

void strategy_tables(bool recompute) {
  ParallelConfig par;
  par.device = "h100", par.memory_gb = 80, par.ranks_per_node = 8, par.recompute = recompute;
  const int n = 64, batch = 512, steps = 20;
  Planner planner(model_profile("7b"), par, n);
  for (const char* preset : {"video-longtail", "mixed", "captions"}) {
    auto bs = batches(preset, batch, steps, 7);
    fmt::print("## {}: 7b on {} x h100 80 GiB (8 per node, {}), global batch {}, {} steps\n\n```\n",
               preset, n, recompute ? "full recompute" : "no recompute", batch, steps);
    std::vector<StrategyReport> rows;
    rows.push_back(simulate(planner, "dhp", bs));
    rows.push_back(simulate(planner, "dhp-waves", bs));
    try {
      rows.push_back(simulate(planner, "pow2", bs));
    } catch (const Error& e) {
      fmt::print("pow2: {}\n", e.what());
    }
    rows.push_back(best_static(planner, bs));
    fmt::print("{}```\n\n", format_reports(rows));
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Optional section filter ("solver", "wall", "strategies") for quick reruns.
  const std::string only = argc > 1 ? argv[1] : "";
  if (only.empty() || only == "solver") solver_table();
  if (only.empty() || only == "wall") wall_time_table();
  if (only.empty() || only == "strategies") {
    strategy_tables(true);
    strategy_tables(false);
  }
  std::fflush(stdout);
  return 0;
}
