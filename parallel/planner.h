// The per-step planner (design.md §2): from the lengths of one global batch to a Plan.
//
//   dhp     a portfolio of searches, the best schedule wins (ties: the simpler one):
//           1. the pow2 planner below, exactly (so dhp is never slower than pow2);
//           2. the static layout at the other CP degrees that divide the world and hold the
//              batch (so dhp is never slower than static at its best degree while the budget
//              lets it try them: a fifth of what is left), each skipped when a lower bound
//              shows it cannot win;
//           3. the same search with any integer degree: packed waves (stage 1 memory-aware
//              best-fit-decreasing packing into atomic groups, waves when groups outnumber
//              ranks, stage 2 exact degree assignment per wave (solver.h), improved by
//              moving short sequences out of the slowest groups) run without barriers, and
//              moldable list schedules: for a target M each long sequence gets the fewest
//              ranks that bring it under M, short ones are packed into one-rank
//              micro-batches, and everything is list-scheduled longest first on rank
//              timelines with node-aware contiguous placement; M is searched from the lower
//              bound up.
//           Back-to-back groups on the same ranks merge into one micro-batch where memory
//           allows (it is then priced as one micro-batch). Everything inside a budget of
//           cost evaluations (never wall time, so every rank stops at the same point), with
//           early stops when a search stops improving.
//   static  fixed DP x CP mesh; sequences spread over the DP replicas longest-first to the
//           least loaded, each replica running memory-sized micro-batches one after another.
//           A replica that cannot sit inside one node is priced at inter-node bandwidth.
//   pow2    per-step CP degrees restricted to powers of two (Megatron-Core dynamic CP),
//           planned with dhp's own search, scheduler, placement, merging and memory model,
//           plus the static layouts at power-of-two CP degrees (they are power-of-two plans
//           too): only the degree set differs.
//
// Every strategy's plan is an as-soon-as-possible schedule: each rank runs its groups one
// after another (gradient accumulation) and a group starts exactly when the last of its
// ranks is free; only the final gradient reduction synchronises all ranks (check()).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/config.h"
#include "parallel/cost_model.h"
#include "parallel/memory_model.h"
#include "parallel/plan.h"
#include "types/model_config.h"

namespace dhp {

// Cost evaluations (and scheduling work charged in the same unit) a plan may spend per
// millisecond of planner_budget_ms: the slower phases' rate measured on one core of the
// development machine (bench_planner prints the current rate). A plan spends at most the
// budget, except that preparing the batch (every sequence's cost, memory minimum and the
// lower bound) and the first schedule of each search it runs are always made: about 10
// units per sequence, which only exceeds the default 5 ms above ~4000 sequences.
inline constexpr int64_t kEvaluationsPerMs = 12000;

// The largest world the planner accepts (a million ranks).
inline constexpr int kMaxWorld = 1 << 20;

struct PlanStats {
  int64_t evaluations = 0;  // cost evaluations (and scheduling work in the same unit) spent
  int64_t budget = 0;       // what the strategy was allowed
  int64_t floor = 0;        // of the evaluations, those made whatever the budget: preparing
                            // the batch and the first schedule of each search
  int packings = 0;         // packings and schedules tried
  int moves = 0;            // sequence moves accepted (wave improvement)
  std::string candidate;    // the search whose schedule won (dhp): e.g. "any/moldable"
  std::string rule;         // what decided between dhp's candidates (choose_robustly)
};

// What would make a model whose state alone exceeds parallel.memory_gb on `world` ranks fit:
// ZeRO-1 on these ranks, ZeRO-1 on the fewest ranks that fit it (a power-of-two multiple of
// `world`), or, where no number of ranks does, what every rank holds regardless.
std::string what_would_fit(const ModelConfig& model, const DeviceProfile& device, int world,
                           const ParallelConfig& par, const ParamGroups& groups, const EngineLayout& engine);

class Planner {
 public:
  // Cost and memory models from the model config and parallel.cost_profile / memory_gb / zero;
  // `groups` says which parameters train (the memory model counts their gradients and moments).
  // `engine`: what the run's engine holds (memory_model.h): its storage dtype decides what its
  // activations and working weights take whatever the profile assumes.
  Planner(const ModelConfig& model, const ParallelConfig& par, int world,
          const ParamGroups& groups = {}, const EngineLayout& engine = {});
  // With an explicit cost model, e.g. one whose coefficients were refitted (its device already
  // in the engine's storage dtype).
  Planner(const CostModel& cost, const ParallelConfig& par, int world,
          const ParamGroups& groups = {}, const EngineLayout& engine = {});

  // The strategy of parallel.strategy (static uses parallel.static_cp), as plan_as_run says.
  Plan plan(const std::vector<SeqShape>& batch, PlanStats* stats = nullptr) const;
  // A plan of strategy s as a run executes it: under ZeRO-2 over several ranks every wave ends
  // on all ranks together (trainer/grad_reducer.h), so plans are timed so (Plan::with_barriers)
  // and s takes the fastest of its own and those of StrategyTraits::under_barriers.
  Plan plan_as_run(Strategy s, const std::vector<SeqShape>& batch, int static_cp, PlanStats* stats = nullptr) const;
  Plan plan_dhp(const std::vector<SeqShape>& batch, PlanStats* stats = nullptr) const;
  // dhp's packed wave solution with every wave a global barrier (strategy "dhp-waves"):
  // the reference that plan_dhp's barrier-free schedule never does worse than.
  Plan plan_dhp_waves(const std::vector<SeqShape>& batch, PlanStats* stats = nullptr) const;
  // cp = 0: the smallest divisor of the world that holds every sequence of `batch`.
  Plan plan_static(const std::vector<SeqShape>& batch, int cp, PlanStats* stats = nullptr) const;
  Plan plan_pow2(const std::vector<SeqShape>& batch, PlanStats* stats = nullptr) const;
  // The share of the budget pow2 gets (inside dhp and alone: the same plan, so dhp is never
  // slower). docs/planner.md also reports pow2 given the whole budget.
  static constexpr double kPow2Share = 0.45;

  // A bound no plan can beat: the larger of (a) the rank-time every sequence needs at its
  // cheapest allowed degree (memory minimum and up), with the ring steps' max(compute,
  // transfer) bounded below by lambda·compute + (1-lambda)·transfer, over N; and (b) the
  // slowest sequence on its best ring alone.
  int64_t lower_bound(const std::vector<SeqShape>& batch) const;
  // The smallest divisor of the world on which every sequence fits (error if none).
  int static_min_cp(const std::vector<SeqShape>& seqs) const;
  // The smallest ring degree that holds the sequence alone (error naming it if > world).
  int min_degree(const SeqShape& s) const;

  // Everything a plan must satisfy; returns the violations (empty when valid): every sample
  // once, zigzag ranges tiling each sequence, memory, the as-soon-as-possible schedule, each
  // group's time equal to the cost model's price of its micro-batch at its placement (a ring
  // spanning nodes at inter-node bandwidth), and, for dhp and pow2, no ring of at most one
  // node's ranks spanning two nodes.
  std::vector<std::string> check(const Plan& plan) const;

  const CostModel& cost() const { return cost_; }
  const MemoryModel& memory() const { return memory_; }
  const ParallelConfig& config() const { return par_; }
  const ParamGroups& groups() const { return groups_; }
  int world() const { return world_; }

 private:
  int64_t budget() const;  // evaluations one plan may spend

  CostModel cost_;
  MemoryModel memory_;
  ParallelConfig par_;
  int world_;
  ParamGroups groups_;
  EngineLayout engine_;
};

namespace detail {
struct Candidate;
}

// dhp's robust choice between the best baseline (pow2's plan or the best static layout) and
// the best plan with any integer degrees. The model's error per ring degree
// (CostModel::relative_error, measured by the online refit) gives each plan an expected error:
// its groups' errors weighted by their rank-time. The any-degree plan wins when it is predicted
// faster by more than the larger of the two errors. When it leads by less (a near tie the model
// cannot resolve) the plan with fewer and smaller rings wins: fewer ring steps (the sum of
// degree - 1 over its groups), then the narrower widest ring; the faster when those tie. A plan
// predicted slower than the best baseline is never chosen.
struct RobustChoice {
  bool any = false;  // the any-degree plan, else the baseline
  std::string rule;  // which rule decided, for the step log
};
RobustChoice choose_robustly(const CostModel& cost, const detail::Candidate& base, const detail::Candidate& any);
// A plan's expected relative error: its groups' errors at their degrees, weighted by rank-time.
double predicted_error(const CostModel& cost, const std::vector<PlanGroup>& groups);
struct RingLoad {
  int64_t ring_steps = 0;  // sum over the groups of ring degree - 1
  int widest = 1;
};
RingLoad ring_load(const std::vector<PlanGroup>& groups);

// Contiguous, node-aware placement of one wave: first rank of each group, given degrees
// that sum to at most `world`. Groups of at least a node start on a node boundary; smaller
// ones go best-fit into the free segments of nodes so that they do not straddle two.
std::vector<int> place_wave(const std::vector<int>& degrees, int world, int ranks_per_node);

}  // namespace dhp
