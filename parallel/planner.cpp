#include "parallel/planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <map>
#include <numeric>
#include <set>

#include "kernels/check.h"
#include "parallel/planner_detail.h"
#include "parallel/solver.h"

namespace dhp {
namespace detail {

BatchCosts::BatchCosts(const Planner& p, const std::vector<SeqShape>& batch)
    : cost_(p.cost()), memory_(p.memory()), world_(p.world()), seqs_(batch) {
  costs_.reserve(seqs_.size());
  for (const auto& s : seqs_) {
    DHP_CHECK(s.text_tokens >= 0 && s.vision_tokens >= 0 && s.tokens() > 0,
              "sample {} has {} text and {} vision tokens: a sequence needs at least one token", s.id,
              s.text_tokens, s.vision_tokens);
    costs_.push_back(cost_.prepare(s));
    dmin_.push_back(p.min_degree(s));
    t1_.push_back(time(int(t1_.size()), 1));
    total_ += t1_.back();
  }
}

int64_t BatchCosts::group_bytes(const std::vector<int32_t>& g, int c) const {
  std::vector<const SeqShape*> ptrs;
  ptrs.reserve(g.size());
  for (int32_t s : g) ptrs.push_back(&seqs_[s]);
  return memory_.group_bytes(ptrs, c);
}

int BatchCosts::group_min_degree(const std::vector<int32_t>& g) const {
  std::vector<const SeqShape*> ptrs;
  ptrs.reserve(g.size());
  for (int32_t s : g) ptrs.push_back(&seqs_[s]);
  return memory_.min_degree(ptrs, world_);
}

Timelines::Timelines(int world, int ranks_per_node)
    : n_(world), node_(std::clamp(ranks_per_node, 1, world)), size_(int(std::bit_ceil(unsigned(world)))),
      free_(size_t(world), 0), tree_(size_t(2 * size_), {kNever, INT_MAX}) {
  for (int r = 0; r < n_; ++r) tree_[size_t(size_ + r)] = {0, r};
  for (int i = size_ - 1; i >= 1; --i) tree_[i] = std::min(tree_[2 * i], tree_[2 * i + 1]);
}

Timelines::Slot Timelines::best_block(int d, int64_t* cost) const {
  DHP_ASSERT(d >= 1 && d <= n_);
  if (d == 1) {  // the rank that frees first (lowest index on ties): the segment tree's root
    *cost += std::bit_width(unsigned(size_));
    return {tree_[1].second, tree_[1].first};
  }
  Slot best{-1, 0};
  int64_t best_waste = 0;
  auto consider = [&](int f) {
    int64_t start = 0, sum = 0;
    for (int r = f; r < f + d; ++r) start = std::max(start, free_[r]), sum += free_[r];
    *cost += d;
    const int64_t waste = start * d - sum;
    if (best.first < 0 || start < best.start || (start == best.start && waste < best_waste))
      best = {f, start}, best_waste = waste;
  };
  if (d <= node_) {
    // Inside one node: the ring runs at intra-node bandwidth, as the cost model assumes.
    for (int ns = 0; ns < n_; ns += node_)
      for (int f = ns, ne = std::min(n_, ns + node_); f + d <= ne; ++f) consider(f);
  } else {
    for (int f = 0; f + d <= n_; f += node_) consider(f);  // node-aligned; f = 0 always fits
  }
  DHP_ASSERT(best.first >= 0);
  return best;
}

void Timelines::occupy(int first, int d, int64_t end) {
  for (int r = first; r < first + d; ++r) {
    free_[r] = end;
    int i = size_ + r;
    tree_[i] = {end, r};
    for (i /= 2; i >= 1; i /= 2) tree_[i] = std::min(tree_[2 * i], tree_[2 * i + 1]);
  }
}

int64_t Timelines::makespan() const { return free_.empty() ? 0 : *std::max_element(free_.begin(), free_.end()); }

std::vector<PlanGroup> list_schedule(const BatchCosts& b, const std::vector<Job>& jobs, int world,
                                     int ranks_per_node, int64_t* makespan) {
  Timelines tl(world, ranks_per_node);
  std::vector<PlanGroup> out;
  out.reserve(jobs.size());
  for (const Job& job : jobs) {
    int64_t cost = 0;
    const auto slot = tl.best_block(job.degree, &cost);
    b.charge(1 + cost / 16);
    tl.occupy(slot.first, job.degree, slot.start + job.time);
    PlanGroup g;
    g.first_rank = slot.first, g.degree = job.degree, g.cp = job.cp, g.seqs = job.seqs;
    g.start_ns = slot.start, g.time_ns = job.time;
    out.push_back(std::move(g));
  }
  *makespan = tl.makespan();
  return out;
}

namespace {
// Start order, then rank: a total order on the groups of a valid schedule.
void sort_by_start(std::vector<PlanGroup>& groups) {
  std::stable_sort(groups.begin(), groups.end(), [](const PlanGroup& x, const PlanGroup& y) {
    return std::pair(x.start_ns, x.first_rank) < std::pair(y.start_ns, y.first_rank);
  });
}
}  // namespace

std::vector<PlanGroup> merge_runs(const BatchCosts& b, const MemoryModel& mem, std::vector<PlanGroup> groups,
                                  int world) {
  sort_by_start(groups);
  const int G = int(groups.size());
  // The next group on each group's first rank. Two groups on the same ranks with one
  // starting as the other ends have nothing between them on any of those ranks (every
  // group takes time), so this one pointer is enough to find mergeable neighbours.
  std::vector<int> next(size_t(G), -1), last(size_t(world), -1);
  for (int g = 0; g < G; ++g) {
    const int r = groups[g].first_rank;
    if (last[r] >= 0) next[last[r]] = g;
    last[r] = g;
  }
  std::vector<char> dead(size_t(G), 0);
  for (int g = 0; g < G; ++g) {
    if (dead[g]) continue;
    PlanGroup& a = groups[g];
    int64_t act = 0, tokens = 0;
    auto add = [&](const std::vector<int32_t>& seqs, int64_t& act2, int64_t& tok2) {
      for (int32_t s : seqs) {
        const int64_t t = (b.seq(s).tokens() + a.cp - 1) / a.cp;
        act2 += mem.activation_bytes(b.seq(s), t), tok2 += t;
      }
    };
    add(a.seqs, act, tokens);
    for (int h = next[g]; h >= 0; h = next[h]) {
      const PlanGroup& c = groups[h];
      if (c.first_rank != a.first_rank || c.degree != a.degree || c.cp != a.cp || a.time_ns <= 0 ||
          c.time_ns <= 0 || c.start_ns != a.start_ns + a.time_ns)
        break;
      int64_t act2 = act, tok2 = tokens;
      add(c.seqs, act2, tok2);
      if (mem.rank_bytes(act2, tok2) > mem.capacity()) break;
      act = act2, tokens = tok2;
      a.seqs.insert(a.seqs.end(), c.seqs.begin(), c.seqs.end());
      a.time_ns += c.time_ns;
      dead[h] = 1;
    }
  }
  std::vector<PlanGroup> out;
  out.reserve(size_t(G));
  for (int g = 0; g < G; ++g)
    if (!dead[g]) out.push_back(std::move(groups[g]));
  return out;
}

std::vector<PlanGroup> finish_groups(const BatchCosts& b, std::vector<PlanGroup> groups, int world) {
  sort_by_start(groups);
  std::vector<int> depth(size_t(world), 0);
  for (PlanGroup& g : groups) {
    g.wave = 0;
    for (int r = g.first_rank; r < g.first_rank + g.degree; ++r) g.wave = std::max(g.wave, depth[r]);
    for (int r = g.first_rank; r < g.first_rank + g.degree; ++r) depth[r] = g.wave + 1;
    std::sort(g.seqs.begin(), g.seqs.end());
    g.peak_bytes = b.group_bytes(g.seqs, g.cp);
  }
  return groups;
}

}  // namespace detail

Planner::Planner(const ModelConfig& model, const ParallelConfig& par, int world)
    : Planner(CostModel(model, device_profile(par.device), par.ranks_per_node, par.recompute), par, world) {}

Planner::Planner(const CostModel& cost, const ParallelConfig& par, int world)
    : cost_(cost), memory_(cost.model(), cost.device(), world, par.memory_gb, par.zero1, par.recompute),
      par_(par), world_(world) {
  DHP_CHECK(world >= 1, "the world size must be at least 1, got {}", world);
  DHP_CHECK(memory_.rank_bytes(0, 0) < memory_.capacity(),
            "the model alone needs {:.2f} GiB per rank ({} parameters), more than parallel.memory_gb = {}: "
            "raise memory_gb, enable parallel.zero1 or use more ranks",
            memory_.rank_bytes(0, 0) / double(int64_t(1) << 30), memory_.parameters(), par.memory_gb);
}

Plan Planner::plan(const std::vector<SeqShape>& batch, PlanStats* stats) const {
  if (par_.strategy == "static") return plan_static(batch, par_.static_cp, stats);
  if (par_.strategy == "pow2") return plan_pow2(batch, stats);
  DHP_CHECK(par_.strategy == "dhp", "parallel.strategy = '{}': use dhp, static or pow2", par_.strategy);
  return plan_dhp(batch, stats);
}

int Planner::min_degree(const SeqShape& s) const {
  const int d = memory_.min_degree({&s}, world_);
  DHP_CHECK(d <= world_,
            "sample {} ({} tokens: {} text + {} vision) does not fit in {} GiB per rank even split over all "
            "{} ranks (it needs {:.2f} GiB on each): raise parallel.memory_gb, use more ranks, or drop "
            "samples this long (data.max_tokens)",
            s.id, s.tokens(), s.text_tokens, s.vision_tokens, par_.memory_gb, world_,
            memory_.group_bytes({&s}, world_) / double(int64_t(1) << 30));
  return d;
}

int64_t detail::lower_bound(const BatchCosts& b, int world) {
  if (b.size() == 0) return 0;
  int big = 0;
  for (int s = 1; s < b.size(); ++s)
    if (b.work(s) > b.work(big)) big = s;
  int64_t best = kNever;
  for (int d = b.min_degree(big); d <= world; ++d) best = std::min(best, b.time(big, d));
  return std::max((b.total_work() + world - 1) / world, best);
}

int64_t Planner::lower_bound(const std::vector<SeqShape>& batch) const {
  return detail::lower_bound(detail::BatchCosts(*this, batch), world_);
}

int Planner::static_min_cp(const std::vector<SeqShape>& seqs) const {
  int need = 1;
  for (const auto& s : seqs) need = std::max(need, min_degree(s));
  for (int c = need; c <= world_; ++c)
    if (world_ % c == 0) return c;
  return world_;
}

std::vector<int> place_wave(const std::vector<int>& degrees, int world, int ranks_per_node) {
  const int K = int(degrees.size()), R = std::max(1, ranks_per_node);
  std::vector<int> order(K), first(K, -1);
  for (int k = 0; k < K; ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return degrees[a] > degrees[b]; });
  // Free segments (start, length), kept ordered by (length, start) for best fit.
  std::set<std::pair<int, int>> free_by_len;
  int pos = 0;
  bool ok = true;
  for (int k : order) {
    if (degrees[k] < R) break;
    if (pos + degrees[k] > world) {
      ok = false;
      break;
    }
    first[k] = pos;
    const int end = pos + degrees[k];
    const int next = std::min(world, (end + R - 1) / R * R);
    if (next > end) free_by_len.insert({next - end, end});
    pos = next;
  }
  for (int n = pos; ok && n < world; n += R) free_by_len.insert({std::min(R, world - n), n});
  for (int k : order) {
    if (!ok) break;
    if (first[k] >= 0) continue;
    auto it = free_by_len.lower_bound({degrees[k], -1});
    if (it == free_by_len.end()) {
      ok = false;
      break;
    }
    auto [len, start] = *it;
    free_by_len.erase(it);
    first[k] = start;
    if (len > degrees[k]) free_by_len.insert({len - degrees[k], start + degrees[k]});
  }
  if (!ok) {
    // The segments fragmented: fall back to plain contiguous placement, largest first.
    pos = 0;
    for (int k : order) first[k] = pos, pos += degrees[k];
  }
  return first;
}

std::vector<std::string> Planner::check(const Plan& plan) const {
  std::vector<std::string> bad;
  const auto& seqs = plan.seqs();
  const auto& groups = plan.groups();
  std::vector<int> seen(seqs.size(), 0);
  std::map<int, std::vector<int>> wave_groups;
  for (int g = 0; g < int(groups.size()); ++g) {
    const PlanGroup& grp = groups[g];
    wave_groups[grp.wave].push_back(g);
    if (grp.first_rank < 0 || grp.first_rank + grp.degree > world_ || grp.cp < 1 || grp.cp > grp.degree)
      bad.push_back(fmt::format("group {}: ranks {}+{} (cp {}) outside the world of {}", g, grp.first_rank,
                                grp.degree, grp.cp, world_));
    for (int32_t s : grp.seqs) ++seen[size_t(s)];
    // Token ranges: the union over the ring's ranks covers each sequence exactly once.
    std::map<int32_t, std::vector<std::pair<int64_t, int64_t>>> cover;
    for (int i = 0; i < grp.cp; ++i) {
      int64_t act = 0, tokens = 0;
      std::map<int32_t, int64_t> held;
      for (const auto& r : plan.ranges(g, grp.first_rank + i)) {
        cover[r.seq].push_back({r.begin, r.end});
        held[r.seq] += r.end - r.begin;
        tokens += r.end - r.begin;
      }
      for (auto [s, t] : held) act += memory_.activation_bytes(seqs[s], t);
      const int64_t bytes = memory_.rank_bytes(act, tokens);
      if (bytes > memory_.capacity())
        bad.push_back(fmt::format("group {} rank {}: {} bytes exceed the capacity {}", g, grp.first_rank + i,
                                  bytes, memory_.capacity()));
      if (bytes > grp.peak_bytes)
        bad.push_back(fmt::format("group {} rank {}: {} bytes above its reported peak {}", g,
                                  grp.first_rank + i, bytes, grp.peak_bytes));
    }
    for (int32_t s : grp.seqs) {
      auto r = cover[s];
      std::sort(r.begin(), r.end());
      int64_t at = 0;
      for (auto [b, e] : r) {
        if (b != at || e <= b) bad.push_back(fmt::format("group {}: sample {} ranges do not tile", g, seqs[s].id));
        at = e;
      }
      if (at != seqs[s].tokens())
        bad.push_back(fmt::format("group {}: sample {} covered up to {} of {}", g, seqs[s].id, at, seqs[s].tokens()));
    }
  }
  for (size_t s = 0; s < seqs.size(); ++s)
    if (seen[s] != 1) bad.push_back(fmt::format("sample {} appears {} times", seqs[s].id, seen[s]));
  // No rank runs two groups at once, and the schedule is what the ranks will actually do:
  // each rank runs its groups in start order, and a group starts exactly when the last of
  // its ranks finishes its previous group (0 if none) — the as-soon-as-possible, barrier-
  // free semantics of gradient accumulation. Its wave is its micro-step depth: 1 + the
  // largest wave before it on any of its ranks. The one exception is `dhp-waves`, the
  // barrier reference: its waves are global barriers, so each wave's degrees sum to N and
  // all its groups start together when the slowest group of the previous wave ends.
  const bool barrier = plan.strategy() == "dhp-waves";
  std::vector<int64_t> free_at(size_t(world_), 0);
  std::vector<int> depth(size_t(world_), 0);
  std::vector<int> order(groups.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return std::pair(groups[a].start_ns, groups[a].first_rank) < std::pair(groups[b].start_ns, groups[b].first_rank);
  });
  for (int g : order) {
    const PlanGroup& grp = groups[g];
    if (grp.first_rank < 0 || grp.first_rank + grp.degree > world_) continue;
    int64_t ready = 0;
    int wave = 0;
    for (int r = grp.first_rank; r < grp.first_rank + grp.degree; ++r) {
      if (grp.start_ns < free_at[r])
        bad.push_back(fmt::format("rank {}: group {} starts at {} before the previous one ends at {}", r, g,
                                  grp.start_ns, free_at[r]));
      ready = std::max(ready, free_at[r]);
      wave = std::max(wave, depth[r]);
    }
    if (grp.time_ns < 0) bad.push_back(fmt::format("group {}: negative time {}", g, grp.time_ns));
    if (!barrier && grp.start_ns != ready)
      bad.push_back(fmt::format("group {}: starts at {}, but its ranks are all free at {}", g, grp.start_ns, ready));
    if (grp.wave != wave)
      bad.push_back(fmt::format("group {}: wave {}, but its micro-step depth is {}", g, grp.wave, wave));
    for (int r = grp.first_rank; r < grp.first_rank + grp.degree; ++r)
      free_at[r] = grp.start_ns + grp.time_ns, depth[r] = grp.wave + 1;
  }
  if (barrier) {
    int64_t wave_start = 0;
    for (const auto& [w, gs] : wave_groups) {
      int sum = 0;
      int64_t end = wave_start;
      for (int g : gs) {
        sum += groups[g].degree;
        end = std::max(end, groups[g].start_ns + groups[g].time_ns);
        if (groups[g].start_ns != wave_start)
          bad.push_back(fmt::format("wave {} group {}: starts at {}, not at the barrier {}", w, g,
                                    groups[g].start_ns, wave_start));
      }
      if (sum != world_) bad.push_back(fmt::format("wave {}: degrees sum to {}, not {}", w, sum, world_));
      wave_start = end;
    }
  }
  return bad;
}

}  // namespace dhp
