// Many steps of one strategy on the same batches: what `dhp plan` and bench_planner print.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "parallel/planner.h"

namespace dhp {

struct StrategyReport {
  Strategy strategy = Strategy::dhp;
  std::string label;               // the row's name when not the strategy's own (a bench variant)
  int static_cp = 0;               // the CP degree of a static layout
  double step_s = 0;               // mean predicted step time
  double bound_s = 0;              // mean lower bound
  double ratio = 0;                // step / bound
  double speedup_vs_static = 0;    // filled in by the caller, 0 = not known
  double idle = 0;                 // mean idle fraction of rank-time
  double groups = 0;               // mean groups per step
  double waves = 0;                // mean waves per step
  int max_waves = 0;
  std::map<int, int64_t> degrees;  // ring degree -> groups, over all steps
  std::map<std::string, int> candidates;  // winning search -> steps (dhp, pow2)
  double evaluations = 0;          // mean cost evaluations per plan
  int64_t max_evaluations = 0, budget = 0;
  double wall_median_ms = 0, wall_p99_ms = 0;
  std::string name() const;        // label, "static cp=N" or the strategy's name
  nlohmann::json to_json() const;
};

// The batch of step s (0 <= s < steps), made when it is needed: steps are planned one at a
// time, so a long simulation never holds every batch at once.
using BatchSource = std::function<std::vector<SeqShape>(int step)>;

StrategyReport simulate(const Planner& planner, Strategy strategy, const BatchSource& batches, int steps,
                        int static_cp = 0);
StrategyReport simulate(const Planner& planner, Strategy strategy,
                        const std::vector<std::vector<SeqShape>>& batches, int static_cp = 0);

// Every divisor of the world that holds the longest sample, simulated; the fastest wins.
StrategyReport best_static(const Planner& planner, const BatchSource& batches, int steps);
StrategyReport best_static(const Planner& planner, const std::vector<std::vector<SeqShape>>& batches);

// The comparison table, speedups relative to the `static` row when there is one.
std::string format_reports(const std::vector<StrategyReport>& reports);

}  // namespace dhp
