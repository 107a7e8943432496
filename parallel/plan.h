// The plan of one step: an immutable value that every rank computes identically from the
// batch's lengths. It says which sequences run together (groups), on which contiguous ranks,
// when (start times; every rank runs its groups in start order, a group starting as soon as
// all its ranks are free), each rank's token ranges, and the predicted times.
//
// Token ranges (design.md §4, zigzag): a sequence of L tokens on a ring of c ranks is cut
// into 2c chunks, chunk j holding floor(L/2c) tokens plus one when j < L mod 2c; ring rank i
// holds chunks i and 2c-1-i. Every rank then holds floor or ceil of L/c tokens, with no
// padding, and the causal work of the early and late chunks balances.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "parallel/cost_model.h"
#include "parallel/strategy.h"

namespace dhp {

// [begin, end) token positions of one sequence; seq indexes Plan::seqs().
struct TokenRange {
  int32_t seq = 0;
  int64_t begin = 0;
  int64_t end = 0;
  bool operator==(const TokenRange&) const = default;
};

struct PlanGroup {
  int wave = 0;              // micro-step depth: 1 + the largest wave before it on any of its
                             // ranks (0 if none); strictly increasing along every rank
  int first_rank = 0;        // the group owns ranks [first_rank, first_rank + ranks)
  int ranks = 1;             // ranks the group owns (a placement may leave some idle)
  int ring_degree = 1;       // the ring's degree: the first ring_degree ranks hold tokens
  std::vector<int32_t> seqs; // indices into Plan::seqs(), in processing order
  int64_t start_ns = 0;      // predicted start, from the beginning of the step
  int64_t time_ns = 0;       // predicted duration
  int64_t peak_bytes = 0;    // memory model: the fullest rank of the group
  bool operator==(const PlanGroup&) const = default;
};

// Re-times groups as soon as possible in their order: each starts when the last of its ranks
// [first_rank, first_rank + degree) is free and lasts time_ns. Returns the makespan.
int64_t retime_asap(std::vector<PlanGroup>& groups, int world);

// The zigzag ranges of ring rank i of c for a sequence of L tokens (empty chunks omitted).
std::vector<std::pair<int64_t, int64_t>> zigzag_ranges(int64_t length, int c, int i);

struct PlanSummary {
  int64_t makespan_ns = 0;
  int64_t lower_bound_ns = 0;
  int waves = 0;             // micro-steps: the largest wave + 1
  int groups = 0;
  double idle_fraction = 0;  // rank-time not spent running a ring, over world x makespan
};

class Plan {
 public:
  Plan() = default;
  // placement: the strategy whose placement laid out the groups (dhp may adopt a static
  // layout); the plan's own strategy when not given.
  Plan(Strategy strategy, int world, std::vector<SeqShape> seqs, std::vector<PlanGroup> groups,
       int64_t lower_bound_ns, std::string candidate = "", std::optional<Strategy> placement = {},
       std::string rule = "");

  Strategy strategy() const { return strategy_; }
  // Whether its waves are global barriers: its strategy's (dhp-waves), or with_barriers().
  bool barriers() const { return barriers_; }
  // The same groups on the same ranks with every wave a global barrier: wave w starts when the
  // last group of wave w - 1 ends, as a run under ZeRO-2 executes any plan (trainer/grad_reducer.h).
  Plan with_barriers() const;
  Strategy placement() const { return placement_; }
  // Which of the strategy's searches produced the plan (dhp's portfolio), or empty.
  const std::string& candidate() const { return candidate_; }
  // What decided between dhp's candidates (the robust choice, planner.h), or empty.
  const std::string& rule() const { return rule_; }
  int world() const { return world_; }
  const std::vector<SeqShape>& seqs() const { return seqs_; }
  const std::vector<PlanGroup>& groups() const { return groups_; }
  int64_t makespan_ns() const { return summary_.makespan_ns; }
  const PlanSummary& summary() const { return summary_; }

  // Token ranges of global rank r in group g (empty when r is one of its idle ranks).
  std::vector<TokenRange> ranges(int g, int rank) const;
  // Every group a rank takes part in, in start order.
  std::vector<int> groups_of(int rank) const;

  nlohmann::json to_json() const;
  std::string to_string() const;  // one line per group, then the summary
  bool operator==(const Plan& o) const {
    return strategy_ == o.strategy_ && world_ == o.world_ && groups_ == o.groups_ &&
           summary_.makespan_ns == o.summary_.makespan_ns;
  }

 private:
  Strategy strategy_ = Strategy::dhp, placement_ = Strategy::dhp;
  bool barriers_ = false;
  std::string candidate_, rule_;
  int world_ = 0;
  std::vector<SeqShape> seqs_;
  std::vector<PlanGroup> groups_;
  PlanSummary summary_;
};

}  // namespace dhp
