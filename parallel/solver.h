// Stage 2 of the planner: choose a degree d_k >= 1 for each of K groups, summing to N, that
// minimises the makespan max_k T^_k(d_k).
//
// T^_k(d) = min over d' <= d of T_k(d') is the time of group k when it owns d ranks: a group
// given more ranks than it can use runs its ring on the best d' of them (its `cp`) and the
// rest idle. T^ is non-increasing, so
//   makespan <= M is achievable  <=>  sum_k lo_k(M) <= N,  lo_k(M) = min{d : T_k(d) <= M},
// and the optimum is the least integer M passing that test: a binary search over integer
// times with lazily built prefix minima, O(K log N) per probe, instead of the O(K·N²) DP.
// solve_degrees_dp() (the plain DP) and solve_degrees_exhaustive() exist to prove that.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

namespace dhp {

inline constexpr int64_t kNever = std::numeric_limits<int64_t>::max() / 4;

// The time of group k on exactly d ranks (1 <= d <= N); kNever where it does not fit.
class GroupTimes {
 public:
  virtual ~GroupTimes() = default;
  virtual int groups() const = 0;
  virtual int64_t time(int k, int d) const = 0;
  // A degree below which the group never fits (a hint; 1 is always correct).
  virtual int min_degree(int) const { return 1; }
};

struct DegreeSolution {
  bool feasible = false;
  int64_t makespan = kNever;
  std::vector<int> degree;      // ranks each group owns; sums to N when feasible
  std::vector<int> cp;          // ranks its ring uses: the smallest d' <= degree reaching T^
  std::vector<int64_t> time;    // T^_k(degree_k)
  int64_t evaluations = 0;      // calls of GroupTimes::time, the planner's unit of work
};

// Exact and fast; leftover ranks go, one at a time, to the slowest group they speed up
// (ties: lowest index), so the non-critical groups also finish as early as they can.
DegreeSolution solve_degrees(const GroupTimes& t, int n);
// The plain O(K·N²) dynamic program over (groups x ranks); same makespan.
DegreeSolution solve_degrees_dp(const GroupTimes& t, int n);
// Every composition of N into K parts; for tests on small instances.
DegreeSolution solve_degrees_exhaustive(const GroupTimes& t, int n);

// A GroupTimes backed by a dense table, times[k][d - 1]; for tests and small problems.
class TableTimes : public GroupTimes {
 public:
  explicit TableTimes(std::vector<std::vector<int64_t>> times) : t_(std::move(times)) {}
  int groups() const override { return int(t_.size()); }
  int64_t time(int k, int d) const override { return t_[k][d - 1]; }

 private:
  std::vector<std::vector<int64_t>> t_;
};

}  // namespace dhp
