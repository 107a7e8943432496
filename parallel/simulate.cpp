#include "parallel/simulate.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <nlohmann/json.hpp>

#include "core/check.h"

namespace dhp {

std::string StrategyReport::name() const {
  if (!label.empty()) return label;
  if (strategy == Strategy::static_layout) return fmt::format("static cp={}", static_cp);
  return std::string(strategy_name(strategy));
}

nlohmann::json StrategyReport::to_json() const {
  nlohmann::json hist = nlohmann::json::object();
  for (auto [d, n] : degrees) hist[std::to_string(d)] = n;
  nlohmann::json cand = nlohmann::json::object();
  for (const auto& [c, n] : candidates) cand[c] = n;
  nlohmann::json j = {{"strategy", label.empty() ? std::string(strategy_name(strategy)) : label},   {"step_s", step_s},       {"bound_s", bound_s},
                      {"ratio", ratio},         {"idle", idle},           {"groups", groups},
                      {"waves", waves},         {"max_waves", max_waves}, {"degrees", hist},
                      {"candidates", cand},     {"evaluations", evaluations},
                      {"max_evaluations", max_evaluations}, {"budget", budget},
                      {"wall_median_ms", wall_median_ms}, {"wall_p99_ms", wall_p99_ms}};
  if (strategy == Strategy::static_layout) j["static_cp"] = static_cp;
  if (speedup_vs_static > 0) j["speedup_vs_static"] = speedup_vs_static;
  return j;
}

StrategyReport simulate(const Planner& planner, Strategy strategy,
                        const std::vector<std::vector<SeqShape>>& batches, int static_cp) {
  return simulate(planner, strategy, [&](int s) { return batches[size_t(s)]; }, int(batches.size()), static_cp);
}

StrategyReport simulate(const Planner& planner, Strategy strategy, const BatchSource& batches, int steps,
                        int static_cp) {
  StrategyReport r;
  r.strategy = strategy;
  r.static_cp = static_cp;
  std::vector<double> wall;
  for (int step = 0; step < steps; ++step) {
    const std::vector<SeqShape> batch = batches(step);
    PlanStats st;
    const auto t0 = std::chrono::steady_clock::now();
    Plan plan = planner.plan_as_run(strategy, batch, static_cp, &st);
    wall.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    r.evaluations += double(st.evaluations);
    r.max_evaluations = std::max(r.max_evaluations, st.evaluations);
    r.budget = st.budget;
    if (!plan.candidate().empty()) ++r.candidates[plan.candidate()];
    const auto& s = plan.summary();
    r.step_s += s.makespan_ns * 1e-9;
    r.bound_s += s.lower_bound_ns * 1e-9;
    r.idle += s.idle_fraction;
    r.groups += s.groups;
    r.waves += s.waves;
    r.max_waves = std::max(r.max_waves, s.waves);
    for (const auto& g : plan.groups()) ++r.degrees[g.ring_degree];
    if (traits(strategy).degrees == RingDegrees::fixed && !plan.groups().empty()) r.static_cp = plan.groups()[0].ring_degree;
  }
  const double n = std::max(1, steps);
  r.step_s /= n, r.bound_s /= n, r.idle /= n, r.groups /= n, r.waves /= n, r.evaluations /= n;
  r.ratio = r.bound_s > 0 ? r.step_s / r.bound_s : 0;
  if (!wall.empty()) {
    std::sort(wall.begin(), wall.end());
    r.wall_median_ms = wall[wall.size() / 2];
    r.wall_p99_ms = wall[std::min(wall.size() - 1, size_t(double(wall.size()) * 0.99))];
  }
  return r;
}

StrategyReport best_static(const Planner& planner, const std::vector<std::vector<SeqShape>>& batches) {
  return best_static(planner, [&](int s) { return batches[size_t(s)]; }, int(batches.size()));
}

StrategyReport best_static(const Planner& planner, const BatchSource& batches, int steps) {
  int need = 1;
  for (int s = 0; s < steps; ++s) need = std::max(need, planner.static_min_cp(batches(s)));
  const int n = planner.world();
  std::optional<StrategyReport> best;
  for (int c = need; c <= n; ++c) {
    if (n % c) continue;
    StrategyReport r = simulate(planner, Strategy::static_layout, batches, steps, c);
    if (!best || r.step_s < best->step_s) best = r;
  }
  DHP_ASSERT(best);
  return *best;
}

std::string format_reports(const std::vector<StrategyReport>& reports) {
  double base = 0;
  for (const auto& r : reports)
    if (r.strategy == Strategy::static_layout && r.label.empty()) base = r.step_s;
  std::string out = fmt::format("{:<14} {:>10} {:>10} {:>7} {:>8} {:>6} {:>8} {:>6}  {:>9} {:>9} {:>8}  {}\n", "strategy",
                                "step (s)", "bound (s)", "ratio", "speedup", "idle", "groups", "waves",
                                "plan p50", "plan p99", "evals", "degrees (degree:groups)");
  for (const auto& r : reports) {
    const std::string name = r.name();
    std::string hist;
    for (auto [d, c] : r.degrees) hist += fmt::format("{}{}:{}", hist.empty() ? "" : " ", d, c);
    out += fmt::format("{:<14} {:>10.4f} {:>10.4f} {:>7.3f} {:>8} {:>5.1f}% {:>8.1f} {:>6.2f}  {:>7.3f}ms {:>7.3f}ms {:>8.0f}  {}\n",
                       name, r.step_s, r.bound_s, r.ratio,
                       base > 0 ? fmt::format("{:.2f}x", base / r.step_s) : std::string("-"), 100 * r.idle,
                       r.groups, r.waves, r.wall_median_ms, r.wall_p99_ms, r.evaluations, hist);
  }
  for (const auto& r : reports) {
    if (r.strategy != Strategy::dhp || !r.label.empty() || r.candidates.empty()) continue;
    std::string won;
    for (const auto& [c, n] : r.candidates) won += fmt::format("{}{} {}", won.empty() ? "" : ", ", c, n);
    out += fmt::format("{} plans won by: {}\n", r.name(), won);
  }
  return out;
}

}  // namespace dhp
