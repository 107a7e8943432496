#include "trainer/online_planner.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/log.h"
#include "model/layer_window.h"
#include "model/params.h"

namespace dhp {
namespace {

// The plan's schedule replayed with measured group times: each rank runs its groups in start
// order (the plan's order) and a group starts when the last of its ranks is free.
double rebuilt_makespan(const Plan& plan, const std::vector<double>& seconds) {
  std::vector<PlanGroup> groups = plan.groups();
  for (size_t g = 0; g < groups.size(); ++g) groups[g].time_ns = int64_t(seconds[g] * 1e9 + 0.5);
  std::stable_sort(groups.begin(), groups.end(),
                   [](const PlanGroup& x, const PlanGroup& y) { return x.start_ns < y.start_ns; });
  return double(retime_asap(groups, plan.world())) * 1e-9;
}

}  // namespace

EngineLayout engine_layout(const Config& cfg) {
  const ParamTable table(cfg.model, cfg.optim.groups);
  const Device device = cfg.train.device == "cuda" ? Device::CUDA : Device::CPU;
  const int storage_bytes = resolve_precision(cfg.train.precision, device) == Precision::bf16 ? 2 : 4;
  return {storage_bytes, table.total(), table.trainable_total(), LayerWindow::of_grads(table, cfg.model.layers).elements(),
          LayerWindow::of_weights(table, cfg.model.layers).elements()};
}

OnlinePlanner::OnlinePlanner(const Config& cfg, Communicator& comm)
    : cfg_(cfg.parallel),
      groups_(cfg.optim.groups),
      engine_(engine_layout(cfg)),
      comm_(comm),
      rank0_(comm.rank() == 0),
      planner_(std::make_shared<const Planner>(cfg.model, cfg.parallel, comm.size(), groups_, engine_)) {}

std::shared_ptr<const Planner> OnlinePlanner::current() const {
  std::lock_guard lk(mu_);
  return planner_;
}

void OnlinePlanner::replace(const CostModel& cost) {
  auto next = std::make_shared<const Planner>(cost, cfg_, comm_.size(), groups_, engine_);
  std::lock_guard lk(mu_);
  planner_ = std::move(next);
}

CostCheck OnlinePlanner::learn(const StepWork& work, const std::vector<GroupTiming>& timings) {
  // Every group's time is its slowest member's busy time.
  const auto& groups = work.plan.groups();
  std::vector<double> measured(groups.size(), 0.0);
  for (const GroupTiming& t : timings) measured[size_t(t.group)] = t.busy_seconds;
  comm_.all_reduce_max(measured.data(), int64_t(measured.size()));
  double err = 0.0;
  int counted = 0;
  // The first step a process runs grows its arenas and touches their pages for the first
  // time: its groups take longer than the same groups later, so the refit leaves them out.
  const bool warming = steps_seen_++ == 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (measured[g] <= 0.0) continue;
    err += std::abs(double(groups[g].time_ns) * 1e-9 - measured[g]) / measured[g];
    ++counted;
    if (warming) continue;
    TimingObservation o;
    for (int32_t s : groups[g].seqs) o.seqs.push_back(work.plan.seqs()[size_t(s)]);
    o.degree = groups[g].ring_degree;
    // Priced at inter-node bandwidth when its ring spans nodes, as the plan priced it.
    const int rpn = current()->config().ranks_per_node;
    o.inter = groups[g].ring_degree > rpn || groups[g].first_rank / rpn != (groups[g].first_rank + groups[g].ring_degree - 1) / rpn;
    o.seconds = measured[g];
    observed_.push_back(std::move(o));
  }
  const CostCheck check{counted ? err / counted : 0.0, rebuilt_makespan(work.plan, measured), measured};
  while (int(observed_.size()) > cfg_.refit_window) observed_.pop_front();
  if (!cfg_.refit || observed_.empty()) return check;
  CostModel cost = current()->cost();
  const std::vector<TimingObservation> window(observed_.begin(), observed_.end());
  cost.set_coeffs(refit(cost, window));
  // The error the planner's robust choice allows for: the refitted model's own error on the
  // window, per ring degree.
  cost.set_error_by_degree(measured_error(cost, window));
  replace(cost);
  return check;
}

std::string OnlinePlanner::saved() const {
  if (!cfg_.refit) return "";
  return CostState{cfg_.cost_profile, current()->cost().coeffs(), {observed_.begin(), observed_.end()}}
      .to_json()
      .dump();
}

void OnlinePlanner::restore(const std::string& saved) {
  if (!cfg_.refit) return;
  if (saved.empty()) {
    if (rank0_) spdlog::info("cost model: the checkpoint carries no refit; starting from the '{}' profile",
                             cfg_.cost_profile);
    return;
  }
  const nlohmann::json j = nlohmann::json::parse(saved, nullptr, false);
  DHP_CHECK(!j.is_discarded(), "the checkpoint's /cost_model is not JSON (damaged checkpoint)");
  CostState st = CostState::from_json(j);
  if (st.device != cfg_.cost_profile) {
    if (rank0_) spdlog::info("cost model: the checkpoint's refit is for parallel.cost_profile = '{}', this run "
                             "uses '{}'; starting from its profile", st.device, cfg_.cost_profile);
    return;
  }
  CostModel cost = current()->cost();
  cost.set_coeffs(st.coeffs);
  while (int(st.window.size()) > cfg_.refit_window) st.window.erase(st.window.begin());
  observed_.assign(st.window.begin(), st.window.end());
  cost.set_error_by_degree(measured_error(cost, st.window));
  replace(cost);
  if (rank0_) spdlog::info("cost model: refitted coefficients and {} observed groups restored",
                           observed_.size());
}

}  // namespace dhp
