// Internal to the planner's .cpp files: per-batch precomputation shared by the strategies.
#pragma once

#include <bit>
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/planner.h"
#include "parallel/solver.h"

namespace dhp::detail {

// The ring degrees a search may use: any integer (dhp) or powers of two only (pow2).
enum class Degrees { Any, Pow2 };
inline bool allowed(Degrees ds, int d) { return ds == Degrees::Any || std::has_single_bit(unsigned(d)); }
// The smallest allowed degree >= d (may exceed the world).
inline int64_t round_up(Degrees ds, int d) {
  return ds == Degrees::Any ? d : int64_t(std::bit_ceil(uint64_t(std::max(1, d))));
}

class BatchCosts {
 public:
  BatchCosts(const Planner& p, const std::vector<SeqShape>& batch);

  int size() const { return int(seqs_.size()); }
  const SeqShape& seq(int s) const { return seqs_[s]; }
  const std::vector<SeqShape>& seqs() const { return seqs_; }
  const SeqCost& cost_of(int s) const { return costs_[s]; }
  int min_degree(int s) const { return dmin_[s]; }  // memory alone, <= world
  int64_t work(int s) const { return t1_[s]; }      // time alone on one rank, ignoring memory
  int64_t total_work() const { return total_; }
  int64_t one_rank_bytes(int s) const { return bytes1_[s]; }
  int world() const { return world_; }
  int ranks_per_node() const { return rpn_; }
  const CostModel& cost() const { return cost_; }
  const MemoryModel& memory() const { return memory_; }
  // Planner::lower_bound of the batch, computed once.
  int64_t lower_bound() const { return lower_bound_; }

  // Time of sequence s alone on a ring of d ranks placed as the planners place it (inside a
  // node when d <= ranks per node), counted as one evaluation.
  int64_t time(int s, int d) const {
    ++evaluations_;
    return cost_.ticks(costs_[s], d);
  }
  // Time of a micro-batch: one evaluation per sequence plus the image balancing's steps.
  int64_t group_time(const std::vector<int32_t>& g, int d, bool inter) const;
  int64_t group_time(const std::vector<int32_t>& g, int d) const { return group_time(g, d, cost_.inter(d)); }
  int64_t group_bytes(const std::vector<int32_t>& g, int c) const;
  int group_min_degree(const std::vector<int32_t>& g) const;
  // Does a ring of cp ranks starting at `first` span more than one node?
  bool spans_nodes(int first, int cp) const { return first / rpn_ != (first + cp - 1) / rpn_; }

  int64_t evaluations() const { return evaluations_; }
  // Scheduling work that is not a cost evaluation, charged to the same budget in units of
  // about one evaluation, so the budget still bounds wall time (and stays deterministic).
  void charge(int64_t units) const { evaluations_ += units; }

 private:
  int64_t compute_lower_bound();

  const CostModel& cost_;
  const MemoryModel& memory_;
  int world_, rpn_;
  std::vector<SeqShape> seqs_;
  std::vector<SeqCost> costs_;
  std::vector<int> dmin_;
  std::vector<int64_t> t1_, bytes1_;
  int64_t total_ = 0, lower_bound_ = 0;
  mutable int64_t evaluations_ = 0;
};

// Rank timelines of an as-soon-as-possible schedule (no barriers): every rank runs its
// groups one after another, and a group starts the moment the last of its ranks is free —
// exactly what gradient accumulation with per-group ring collectives does at run time.
// Placement is contiguous and node-aware, as the cost model assumes: a ring of d <= R ranks
// (R ranks per node) stays inside one node, a larger one starts on a node boundary.
class Timelines {
 public:
  Timelines(int world, int ranks_per_node);
  struct Slot {
    int first = 0;
    int64_t start = 0;
  };
  // The block of d ranks that can start earliest; ties: the least idle time it creates
  // (sum of start - free_at over the block), then the lowest first rank. `cost` receives
  // the work done, in rank visits. Per-node order statistics in segment trees find the
  // candidate nodes without visiting every rank.
  Slot best_block(int d, int64_t* cost) const;
  void occupy(int first, int d, int64_t end);
  int64_t free_at(int r) const { return free_[r]; }
  int64_t makespan() const;

 private:
  void refresh_node(int node);
  // The leftmost node >= pos whose value in tree t is <= x, or -1.
  int leftmost(const std::vector<int64_t>& t, int pos, int64_t x) const;

  int n_, node_, nodes_, size_, nsize_;
  std::vector<int64_t> free_;
  std::vector<std::pair<int64_t, int>> tree_;  // (free_at, rank): minimum over a segment
  std::vector<std::vector<int64_t>> kth_;      // kth_[k][.]: min-tree over nodes of their (k+1)-th smallest free_at
  std::vector<int64_t> node_max_, node_sum_;   // per node
  std::vector<int64_t> pmax_, psum_;           // per rank: max / sum of free_at from its node's first rank
};

// One unit for the list scheduler: sequences run together, in this order, on a ring.
struct Job {
  std::vector<int32_t> seqs;
  int ranks = 1;        // ranks the group owns
  int ring_degree = 1;  // ranks its ring uses (<= ranks)
  int64_t time = 0;
};

// Places the jobs in the given order, each on the block that frees first; returns the
// groups (wave, peak_bytes left for finish_groups) and the makespan.
std::vector<PlanGroup> list_schedule(const BatchCosts& b, const std::vector<Job>& jobs, int world,
                                     int ranks_per_node, int64_t* makespan);

// Merges a group into the one before it on the same ranks when it starts exactly as that
// one ends and their sequences fit in memory together; the merged micro-batch is priced
// again (it pays the weight streaming and each ring step's latency once, so it is faster
// than the two apart) and the schedule is re-timed as soon as possible, which only moves
// starts earlier.
std::vector<PlanGroup> merge_runs(const BatchCosts& b, std::vector<PlanGroup> groups, int world,
                                  int64_t* makespan);

// Sorts the groups by (start, first rank), numbers their waves (1 + the largest wave of
// a group that ran before on any of its ranks) and fills in their peak bytes.
std::vector<PlanGroup> finish_groups(const BatchCosts& b, std::vector<PlanGroup> groups, int world);

// A finished schedule and the name of the search that produced it.
struct Candidate {
  std::vector<PlanGroup> groups;
  int64_t makespan = kNever;
  std::string name;
  // Whose placement laid out the groups: dhp adopting a static layout inherits its freedom to
  // lay a ring across nodes (StrategyTraits::rings_may_span_nodes).
  Strategy placement = Strategy::dhp;
};

// Static data parallelism with CP degree c (baselines.cpp): sequences longest-first to the
// least loaded of the N/c replicas, each replica running memory-sized micro-batches.
Candidate static_layout(const BatchCosts& b, int c);

// dhp's search (dhp.cpp) over the given degree set, spending evaluations until stop_at:
// packed waves with exact degrees, run without barriers, and moldable list schedules. Its
// first schedule (one moldable list schedule) is made whatever the budget; nothing after it
// starts unless its estimated cost fits before stop_at. An empty candidate (makespan kNever)
// when the degree set cannot hold some sequence.
// wave_units >= 0: the wave solution gets exactly that many evaluations (when they fit), as
// plan_dhp_waves gives it, so that dhp's barrier-free form of it is the same solution.
Candidate search(const BatchCosts& b, const ParallelConfig& par, Degrees ds, int64_t stop_at, PlanStats& st,
                 int64_t wave_units = -1);

}  // namespace dhp::detail
