// The per-step planner (design.md §2): from the lengths of one global batch to a Plan.
//
//   dhp     Stage 1 memory-aware best-fit-decreasing packing of short sequences into atomic
//           groups of about one rank's share of the work; long ones alone. Waves when the
//           groups (or their minimum degrees) outnumber the ranks. Stage 2 exact degree
//           assignment per wave (solver.h), improved by moving short sequences out of the
//           slowest groups and re-packing at other targets. That wave solution is then run
//           without barriers (a group starts when its ranks are free), and competes with
//           moldable list schedules: for a target M every sequence gets the fewest ranks
//           (any integer) that bring it under M, and the rings are list-scheduled longest
//           first on rank timelines with node-aware contiguous placement; M is searched
//           from the lower bound up. The best schedule wins; back-to-back groups on the same
//           ranks merge into one micro-step where memory allows. Everything inside a budget
//           counted in cost evaluations (never wall time, so every rank stops at the same
//           point), with early stops when a search stops improving.
//   static  fixed DP x CP mesh; CP large enough for the longest sequence; sequences spread
//           over the DP replicas longest-first to the least loaded (greedy), each replica
//           running memory-sized micro-batches one after another.
//   pow2    per-step CP degrees restricted to powers of two (Megatron-Core dynamic CP):
//           each sequence gets the smallest power of two that holds it, doubled while it is
//           still longer than a rank's fair share, then list-scheduled longest first with
//           the same barrier-free scheduler and placement as dhp.
//
// Every strategy's plan is an as-soon-as-possible schedule: each rank runs its groups one
// after another (gradient accumulation) and a group starts exactly when the last of its
// ranks is free; only the final gradient reduction synchronises all ranks (check()).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "parallel/config.h"
#include "parallel/cost_model.h"
#include "parallel/memory_model.h"
#include "parallel/plan.h"

namespace dhp {

// Cost evaluations the improvement phase may spend per millisecond of planner_budget_ms;
// measured on one core of the development machine (bench_planner prints the current rate).
inline constexpr int64_t kEvaluationsPerMs = 13000;

struct PlanStats {
  int64_t evaluations = 0;  // sequence-cost evaluations spent
  int packings = 0;         // packings tried (dhp)
  int moves = 0;            // sequence moves accepted (dhp)
};

class Planner {
 public:
  // Cost and memory models from the model config and parallel.device / memory_gb / zero1.
  Planner(const ModelConfig& model, const ParallelConfig& par, int world);
  // With an explicit cost model, e.g. one whose coefficients were refitted.
  Planner(const CostModel& cost, const ParallelConfig& par, int world);

  // The strategy of parallel.strategy (static uses parallel.static_cp).
  Plan plan(const std::vector<SeqShape>& batch, PlanStats* stats = nullptr) const;
  Plan plan_dhp(const std::vector<SeqShape>& batch, PlanStats* stats = nullptr) const;
  // dhp's packed wave solution with every wave a global barrier (strategy "dhp-waves"):
  // the reference that plan_dhp's barrier-free schedule never does worse than.
  Plan plan_dhp_waves(const std::vector<SeqShape>& batch, PlanStats* stats = nullptr) const;
  // cp = 0: the smallest divisor of the world that holds every sequence of `batch`.
  Plan plan_static(const std::vector<SeqShape>& batch, int cp, PlanStats* stats = nullptr) const;
  Plan plan_pow2(const std::vector<SeqShape>& batch, PlanStats* stats = nullptr) const;

  // max(total work on one rank each / N, the largest sequence on up to N ranks).
  int64_t lower_bound(const std::vector<SeqShape>& batch) const;
  // The smallest divisor of the world on which every sequence fits (error if none).
  int static_min_cp(const std::vector<SeqShape>& seqs) const;
  // The smallest ring degree that holds the sequence alone (error naming it if > world).
  int min_degree(const SeqShape& s) const;

  // Everything a plan must satisfy; returns the violations (empty when valid).
  std::vector<std::string> check(const Plan& plan) const;

  const CostModel& cost() const { return cost_; }
  const MemoryModel& memory() const { return memory_; }
  const ParallelConfig& config() const { return par_; }
  int world() const { return world_; }

 private:
  int64_t wave_budget() const;  // evaluations the wave solver may spend

  CostModel cost_;
  MemoryModel memory_;
  ParallelConfig par_;
  int world_;
};

// Contiguous, node-aware placement of one wave: first rank of each group, given degrees
// that sum to at most `world`. Groups of at least a node start on a node boundary; smaller
// ones go best-fit into the free segments of nodes so that they do not straddle two.
std::vector<int> place_wave(const std::vector<int>& degrees, int world, int ranks_per_node);

}  // namespace dhp
