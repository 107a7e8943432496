// Internal to the planner's .cpp files: per-batch precomputation shared by the strategies.
#pragma once

#include <cstdint>
#include <vector>

#include "parallel/planner.h"

namespace dhp::detail {

class BatchCosts {
 public:
  BatchCosts(const Planner& p, const std::vector<SeqShape>& batch);

  int size() const { return int(seqs_.size()); }
  const SeqShape& seq(int s) const { return seqs_[s]; }
  const std::vector<SeqShape>& seqs() const { return seqs_; }
  int min_degree(int s) const { return dmin_[s]; }  // memory alone, <= world
  int64_t work(int s) const { return t1_[s]; }      // time on one rank, ignoring memory
  int64_t total_work() const { return total_; }

  // Time of sequence s on a ring of d ranks, counted as one evaluation.
  int64_t time(int s, int d) const {
    ++evaluations_;
    return cost_.ticks(costs_[s], d);
  }
  int64_t group_time(const std::vector<int32_t>& g, int d) const {
    int64_t t = 0;
    for (int32_t s : g) t += time(s, d);
    return t;
  }
  int64_t group_bytes(const std::vector<int32_t>& g, int c) const;
  int group_min_degree(const std::vector<int32_t>& g) const;
  int64_t evaluations() const { return evaluations_; }
  // Scheduling work that is not a cost evaluation, charged to the same budget in units of
  // about one evaluation, so the budget still bounds wall time (and stays deterministic).
  void charge(int64_t units) const { evaluations_ += units; }

 private:
  const CostModel& cost_;
  const MemoryModel& memory_;
  int world_;
  std::vector<SeqShape> seqs_;
  std::vector<SeqCost> costs_;
  std::vector<int> dmin_;
  std::vector<int64_t> t1_;
  int64_t total_ = 0;
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
  // the work done, in rank visits.
  Slot best_block(int d, int64_t* cost) const;
  void occupy(int first, int d, int64_t end);
  int64_t free_at(int r) const { return free_[r]; }
  int64_t makespan() const;

 private:
  int n_, node_, size_;
  std::vector<int64_t> free_;
  std::vector<std::pair<int64_t, int>> tree_;  // (free_at, rank): minimum over a segment
};

// One unit for the list scheduler: sequences run together, in this order, on a ring.
struct Job {
  std::vector<int32_t> seqs;
  int degree = 1;   // ranks the group owns
  int cp = 1;       // ranks its ring uses (<= degree)
  int64_t time = 0;
};

// Places the jobs in the given order, each on the block that frees first; returns the
// groups (wave, peak_bytes left for finish_groups) and the makespan.
std::vector<PlanGroup> list_schedule(const BatchCosts& b, const std::vector<Job>& jobs, int world,
                                     int ranks_per_node, int64_t* makespan);

// Merges a group into the one before it on the same ranks when it starts exactly as that
// one ends and their sequences fit in memory together: times and starts are unchanged and
// a rank runs fewer, larger micro-steps (the memory model's limit is what keeps them apart).
std::vector<PlanGroup> merge_runs(const BatchCosts& b, const MemoryModel& mem, std::vector<PlanGroup> groups,
                                  int world);

// Sorts the groups by (start, first rank), numbers their waves (1 + the largest wave of
// a group that ran before on any of its ranks) and fills in their peak bytes.
std::vector<PlanGroup> finish_groups(const BatchCosts& b, std::vector<PlanGroup> groups, int world);

// Planner::lower_bound() on an already prepared batch.
int64_t lower_bound(const BatchCosts& b, int world);

}  // namespace dhp::detail
