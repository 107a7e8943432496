#include "parallel/solver.h"

#include <algorithm>
#include <functional>
#include <queue>

#include "core/check.h"

namespace dhp {
namespace {

// Prefix minima T^_k(d) of every group, extended only as far as a search asks.
class Prefix {
 public:
  Prefix(const GroupTimes& t, int n) : t_(t), n_(n), hat_(size_t(t.groups())), arg_(size_t(t.groups())) {}

  int64_t evaluations = 0;

  int known(int k) const { return int(hat_[k].size()); }
  int64_t hat(int k, int d) {
    extend(k, d);
    return hat_[k][d - 1];
  }
  int arg(int k, int d) {
    extend(k, d);
    return arg_[k][d - 1];
  }
  // The smallest d <= cap with T^_k(d) <= m, or cap + 1.
  int lowest(int k, int64_t m, int cap) {
    auto& h = hat_[k];
    if (!h.empty() && h.back() <= m) {
      // h is non-increasing: find the first entry <= m.
      auto it = std::partition_point(h.begin(), h.end(), [m](int64_t v) { return v > m; });
      return int(it - h.begin()) + 1;
    }
    while (known(k) < cap) {
      extend(k, known(k) + 1);
      if (h.back() <= m) return known(k);
    }
    return cap + 1;
  }

 private:
  void extend(int k, int d) {
    DHP_ASSERT(d >= 1 && d <= n_);
    auto& h = hat_[k];
    auto& a = arg_[k];
    while (int(h.size()) < d) {
      const int dd = int(h.size()) + 1;
      int64_t v = kNever;
      if (dd >= t_.min_degree(k)) {
        ++evaluations;
        v = std::min(t_.time(k, dd), kNever);
      }
      if (h.empty() || v < h.back()) h.push_back(v), a.push_back(dd);
      else h.push_back(h.back()), a.push_back(a.back());
    }
  }

  const GroupTimes& t_;
  int n_;
  std::vector<std::vector<int64_t>> hat_;
  std::vector<std::vector<int>> arg_;
};

void finish(DegreeSolution& s, Prefix& p) {
  const int K = int(s.degree.size());
  s.cp.resize(K);
  s.time.resize(K);
  for (int k = 0; k < K; ++k) {
    s.cp[k] = p.arg(k, s.degree[k]);
    s.time[k] = p.hat(k, s.degree[k]);
  }
  s.evaluations = p.evaluations;
}

}  // namespace

DegreeSolution solve_degrees(const GroupTimes& t, int n) {
  DegreeSolution s;
  const int K = t.groups();
  DHP_ASSERT(n >= 1);
  if (K == 0 || K > n) return s;
  Prefix p(t, n);
  std::vector<int64_t> dmin(K);
  int64_t dmin_sum = 0;
  for (int k = 0; k < K; ++k) dmin_sum += dmin[k] = std::clamp<int64_t>(t.min_degree(k), 1, int64_t(n) + 1);
  if (dmin_sum > n) return s;
  // The most ranks group k can own while every other group keeps its minimum.
  auto cap = [&](int k) { return int(n - (dmin_sum - dmin[k])); };
  std::vector<int> lo(K);
  auto feasible = [&](int64_t m) {
    int64_t used = 0;
    for (int k = 0; k < K; ++k) {
      lo[k] = p.lowest(k, m, cap(k));
      used += lo[k];
      if (lo[k] > cap(k) || used > n) return false;
    }
    return true;
  };
  // Every group at its minimum degree is an assignment, so its makespan bounds the optimum
  // from above unless the hint was loose; then the search starts from "anything finite".
  int64_t hi = 0;
  for (int k = 0; k < K; ++k) hi = std::max(hi, p.hat(k, int(dmin[k])));
  if (hi >= kNever) hi = kNever - 1;
  if (!feasible(hi)) return s;
  int64_t lo_m = -1;  // infeasible: times are positive integers
  while (hi - lo_m > 1) {
    const int64_t mid = lo_m + (hi - lo_m) / 2;
    if (feasible(mid)) hi = mid;
    else lo_m = mid;
  }
  feasible(hi);
  s.feasible = true;
  s.makespan = hi;
  s.degree = lo;
  int left = n;
  for (int d : s.degree) left -= d;
  // Spare ranks: to the slowest group that gets faster with one more (ties: lowest index).
  using Item = std::pair<int64_t, int>;  // (time, -k): the max is the slowest, lowest index
  std::priority_queue<Item> heap;
  for (int k = 0; k < K; ++k) heap.push({p.hat(k, s.degree[k]), -k});
  while (left > 0 && !heap.empty()) {
    auto [tk, nk] = heap.top();
    heap.pop();
    const int k = -nk;
    const int64_t next = p.hat(k, s.degree[k] + 1);
    if (next < tk) {
      ++s.degree[k], --left;
      heap.push({next, nk});
    }
  }
  if (left > 0) {
    // Nobody gets faster: the spare ranks idle inside the slowest group.
    int slow = 0;
    for (int k = 1; k < K; ++k)
      if (p.hat(k, s.degree[k]) > p.hat(slow, s.degree[slow])) slow = k;
    s.degree[slow] += left;
  }
  finish(s, p);
  return s;
}

DegreeSolution solve_degrees_dp(const GroupTimes& t, int n) {
  DegreeSolution s;
  const int K = t.groups();
  if (K == 0 || K > n) return s;
  Prefix p(t, n);
  // f[k][m]: least makespan of the first k groups on exactly m ranks; via[k][m]: the degree.
  std::vector<std::vector<int64_t>> f(K + 1, std::vector<int64_t>(n + 1, kNever));
  std::vector<std::vector<int>> via(K + 1, std::vector<int>(n + 1, 0));
  f[0][0] = 0;
  for (int k = 1; k <= K; ++k)
    for (int m = k; m <= n; ++m)
      for (int d = 1; d <= m - (k - 1); ++d) {
        const int64_t v = std::max(f[k - 1][m - d], p.hat(k - 1, d));
        if (v < f[k][m]) f[k][m] = v, via[k][m] = d;
      }
  if (f[K][n] >= kNever) return s;
  s.feasible = true;
  s.makespan = f[K][n];
  s.degree.assign(K, 0);
  for (int k = K, m = n; k >= 1; --k) {
    s.degree[k - 1] = via[k][m];
    m -= via[k][m];
  }
  finish(s, p);
  return s;
}

DegreeSolution solve_degrees_exhaustive(const GroupTimes& t, int n) {
  DegreeSolution s;
  const int K = t.groups();
  if (K == 0 || K > n) return s;
  Prefix p(t, n);
  std::vector<int> cur(K);
  std::function<void(int, int, int64_t)> go = [&](int k, int left, int64_t worst) {
    if (k == K - 1) {
      const int64_t v = std::max(worst, p.hat(k, left));
      if (v < s.makespan) s.makespan = v, s.degree = cur, s.degree[k] = left;
      return;
    }
    for (int d = 1; d <= left - (K - 1 - k); ++d) {
      cur[k] = d;
      go(k + 1, left - d, std::max(worst, p.hat(k, d)));
    }
  };
  go(0, n, 0);
  if (s.makespan >= kNever) return DegreeSolution{};
  s.feasible = true;
  finish(s, p);
  return s;
}

}  // namespace dhp
