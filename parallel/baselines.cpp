// The static baseline of design.md §2.4, planned from the same cost and memory models as dhp
// (pow2 is dhp's own search with power-of-two degrees: dhp.cpp).
#include <algorithm>
#include <queue>

#include "core/check.h"
#include "parallel/planner.h"
#include "parallel/planner_detail.h"

namespace dhp {
namespace detail {

Candidate static_layout(const BatchCosts& b, int c) {
  const int n = b.world();
  DHP_ASSERT(c >= 1 && n % c == 0);
  const MemoryModel& mem = b.memory();
  std::vector<int64_t> t(size_t(b.size()));
  std::vector<int32_t> order(size_t(b.size()));
  for (int s = 0; s < b.size(); ++s) {
    t[s] = c == 1 ? b.work(s) : b.time(s, c);
    order[s] = s;
  }
  // Longest first onto the least loaded replica (ties: lowest replica).
  std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return t[x] > t[y]; });
  const int replicas = n / c;
  std::vector<std::vector<int32_t>> assigned(static_cast<size_t>(replicas));
  using Load = std::pair<int64_t, int>;
  std::priority_queue<Load, std::vector<Load>, std::greater<Load>> heap;
  for (int r = 0; r < replicas; ++r) heap.push({0, r});
  for (int32_t s : order) {
    auto [load, r] = heap.top();
    heap.pop();
    assigned[size_t(r)].push_back(s);
    heap.push({load + t[s], r});
  }
  b.charge(int64_t(b.size()) / 4 + 1);
  // Each replica runs memory-sized micro-batches back to back; a replica that does not sit
  // inside one node runs its ring across nodes and is priced so.
  Candidate out;
  out.name = "static cp=" + std::to_string(c);
  out.placement = Strategy::static_layout;
  out.makespan = 0;
  for (int r = 0; r < replicas; ++r) {
    const bool inter = b.cost().inter(c) || b.spans_nodes(r * c, c);
    const std::vector<int32_t>& list = assigned[size_t(r)];
    const int m = int(list.size());
    // Per sequence: decoder tokens a rank holds, its patches, its largest image.
    std::vector<int64_t> tok(list.size()), pat(list.size()), big(list.size());
    for (int i = 0; i < m; ++i) {
      const SeqShape& q = b.seq(list[i]);
      tok[i] = (q.tokens() + c - 1) / c;
      pat[i] = q.vision_tokens * mem.merge2();
      ImageClass im[2];
      image_classes(q, mem.merge2(), im, mem.extra_rows());
      big[i] = im[0].patches;
    }
    // Does [i, e) fit as one micro-batch? Exactly: its images balanced over the c ranks.
    auto exact = [&](int i, int e) {
      thread_local std::vector<ImageClass> cls;
      cls.clear();
      int64_t t = 0;
      for (int x = i; x < e; ++x) {
        t += tok[x];
        ImageClass im[2];
        const int k = image_classes(b.seq(list[x]), mem.merge2(), im, mem.extra_rows());
        for (int y = 0; y < k; ++y) cls.push_back(im[y]);
      }
      std::sort(cls.begin(), cls.end(), [](const ImageClass& a, const ImageClass& z) { return a.patches > z.patches; });
      size_t w = 0;
      for (size_t y = 1; y < cls.size(); ++y) {
        if (cls[y].patches == cls[w].patches) cls[w].count += cls[y].count;
        else cls[++w] = cls[y];
      }
      if (!cls.empty()) cls.resize(w + 1);
      b.charge(1 + int64_t(e - i) / 4);
      return mem.bytes_for(t, MemoryModel::max_rank_patches(cls, c)) <= mem.capacity();
    };
    // Micro-batches: the longest run of the replica's sequences, in order, that fits. A
    // bound on the busiest rank (within one image of the average) extends it cheaply; the
    // exact balance then gallops and bisects (fitting only grows harder as it grows).
    int64_t clock = 0;
    for (int i = 0; i < m;) {
      int e = i + 1;
      int64_t t = tok[i], p = pat[i], bg = big[i];
      while (e < m) {
        const int64_t t2 = t + tok[e], p2 = p + pat[e], bg2 = std::max(bg, big[e]);
        const int64_t vis = c == 1 ? p2 : (p2 + c - 1) / c + bg2;
        if (mem.bytes_for(t2, vis) > mem.capacity()) break;
        t = t2, p = p2, bg = bg2, ++e;
      }
      if (c > 1 && e < m) {
        int ok = e, step = 1, fail = m + 1;
        while (ok + step <= m) {
          if (exact(i, ok + step)) ok += step, step *= 2;
          else {
            fail = ok + step;
            break;
          }
        }
        while (fail - ok > 1 && ok < m) {
          const int mid = ok + (std::min(fail, m + 1) - ok) / 2;
          if (mid > m) break;
          if (exact(i, mid)) ok = mid;
          else fail = mid;
        }
        e = ok;
      }
      PlanGroup g;
      g.seqs.assign(list.begin() + i, list.begin() + e);
      g.first_rank = r * c, g.ranks = c, g.ring_degree = c, g.start_ns = clock;
      g.time_ns = b.group_time(g.seqs, c, inter);
      clock += g.time_ns;
      out.groups.push_back(std::move(g));
      i = e;
    }
    out.makespan = std::max(out.makespan, clock);
  }
  return out;
}

}  // namespace detail

Plan Planner::plan_static(const std::vector<SeqShape>& batch, int cp, PlanStats* stats) const {
  const int n = world_;
  const int c = cp > 0 ? cp : static_min_cp(batch);
  DHP_CHECK(c <= n && n % c == 0, "static layout: CP degree {} must divide the world size {}", c, n);
  if (batch.empty()) return Plan(Strategy::static_layout, n, {}, {}, 0);
  detail::BatchCosts b(*this, batch);
  for (int s = 0; s < b.size(); ++s)
    DHP_CHECK(b.min_degree(s) <= c,
              "static layout with CP degree {}: sample {} ({} tokens) needs at least {} ranks; use a "
              "larger parallel.static_cp or 0 to size it for the longest sample",
              c, b.seq(s).id, b.seq(s).tokens(), b.min_degree(s));
  detail::Candidate cand = detail::static_layout(b, c);
  auto groups = detail::finish_groups(b, std::move(cand.groups), n);
  if (stats) *stats = PlanStats{b.evaluations(), 0, b.evaluations(), 1, 0, cand.name, ""};
  return Plan(Strategy::static_layout, n, batch, std::move(groups), b.lower_bound(), cand.name, cand.placement);
}

}  // namespace dhp
