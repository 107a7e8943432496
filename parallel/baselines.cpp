// The baselines of design.md §2.4, planned from the same cost and memory models as dhp.
#include <algorithm>
#include <queue>

#include "kernels/check.h"
#include "parallel/planner.h"
#include "parallel/planner_detail.h"

namespace dhp {

Plan Planner::plan_static(const std::vector<SeqShape>& batch, int cp, PlanStats* stats) const {
  const int n = world_;
  const int c = cp > 0 ? cp : static_min_cp(batch);
  DHP_CHECK(c <= n && n % c == 0, "static layout: CP degree {} must divide the world size {}", c, n);
  if (batch.empty()) return Plan("static", n, {}, {}, 0);
  detail::BatchCosts b(*this, batch);
  std::vector<int64_t> t(b.size());
  std::vector<int32_t> order(b.size());
  for (int s = 0; s < b.size(); ++s) {
    DHP_CHECK(b.min_degree(s) <= c,
              "static layout with CP degree {}: sample {} ({} tokens) needs at least {} ranks; use a "
              "larger parallel.static_cp or 0 to size it for the longest sample",
              c, b.seq(s).id, b.seq(s).tokens(), b.min_degree(s));
    t[s] = b.time(s, c);
    order[s] = s;
  }
  // Longest first onto the least loaded replica (ties: lowest replica).
  std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return t[x] > t[y]; });
  const int replicas = n / c;
  std::vector<std::vector<int32_t>> assigned(replicas);
  using Load = std::pair<int64_t, int>;
  std::priority_queue<Load, std::vector<Load>, std::greater<Load>> heap;
  for (int r = 0; r < replicas; ++r) heap.push({0, r});
  for (int32_t s : order) {
    auto [load, r] = heap.top();
    heap.pop();
    assigned[r].push_back(s);
    heap.push({load + t[s], r});
  }
  // Each replica runs memory-sized micro-batches back to back; micro-batch i is wave i.
  std::vector<PlanGroup> out;
  for (int r = 0; r < replicas; ++r) {
    int64_t clock = 0;
    int wave = 0;
    PlanGroup cur;
    auto flush = [&] {
      if (cur.seqs.empty()) return;
      cur.wave = wave++, cur.first_rank = r * c, cur.degree = c, cur.cp = c, cur.start_ns = clock;
      cur.peak_bytes = b.group_bytes(cur.seqs, c);
      clock += cur.time_ns;
      out.push_back(std::move(cur));
      cur = PlanGroup{};
    };
    for (int32_t s : assigned[r]) {
      std::vector<int32_t> grown = cur.seqs;
      grown.push_back(s);
      if (!cur.seqs.empty() && b.group_bytes(grown, c) > memory_.capacity()) flush();
      cur.seqs.push_back(s);
      cur.time_ns += t[s];
    }
    flush();
  }
  if (stats) *stats = PlanStats{b.evaluations(), 1, 0};
  return Plan("static", n, batch, std::move(out), detail::lower_bound(b, n));
}

Plan Planner::plan_pow2(const std::vector<SeqShape>& batch, PlanStats* stats) const {
  const int n = world_;
  if (batch.empty()) return Plan("pow2", n, {}, {}, 0);
  detail::BatchCosts b(*this, batch);
  int top = 1;
  while (top * 2 <= n) top *= 2;
  const int64_t fair = (b.total_work() + n - 1) / n;
  std::vector<int> deg(b.size());
  std::vector<int64_t> t(b.size());
  std::vector<int32_t> order(b.size());
  for (int s = 0; s < b.size(); ++s) {
    int p = 1;
    while (p < b.min_degree(s)) p *= 2;
    DHP_CHECK(p <= top,
              "pow2 strategy: sample {} ({} tokens) needs {} ranks, more than the largest power of two "
              "({}) in a world of {}",
              b.seq(s).id, b.seq(s).tokens(), b.min_degree(s), top, n);
    int64_t ts = b.time(s, p);
    // Greedy balancing: double while the sequence alone exceeds a rank's fair share and
    // doubling still helps.
    while (ts > fair && 2 * p <= top) {
      const int64_t t2 = b.time(s, 2 * p);
      if (t2 >= ts) break;
      p *= 2, ts = t2;
    }
    deg[s] = p, t[s] = ts, order[s] = s;
  }
  // Longest first (ties: wider ring, then index), each sequence on the contiguous block
  // that frees first — the same barrier-free list scheduler and placement dhp uses, so the
  // two differ only in the degrees they choose. Back-to-back sequences on the same ranks
  // then become one micro-batch where memory allows (Megatron packs sub-samples per CP
  // group up to its per-rank token budget).
  std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) {
    return t[x] != t[y] ? t[x] > t[y] : deg[x] > deg[y];
  });
  std::vector<detail::Job> jobs;
  jobs.reserve(order.size());
  for (int32_t s : order) jobs.push_back({{s}, deg[s], deg[s], t[s]});
  int64_t makespan = 0;
  auto groups = detail::list_schedule(b, jobs, n, par_.ranks_per_node, &makespan);
  std::vector<PlanGroup> out = detail::finish_groups(b, detail::merge_runs(b, memory_, std::move(groups), n), n);
  if (stats) *stats = PlanStats{b.evaluations(), 1, 0};
  return Plan("pow2", n, batch, std::move(out), detail::lower_bound(b, n));
}

}  // namespace dhp
