#include "parallel/planner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <map>
#include <numeric>
#include <set>

#include "core/check.h"
#include "parallel/planner_detail.h"
#include "parallel/solver.h"
#include "types/state_bytes.h"

namespace dhp {
namespace detail {

BatchCosts::BatchCosts(const Planner& p, const std::vector<SeqShape>& batch)
    : cost_(p.cost()), memory_(p.memory()), world_(p.world()),
      rpn_(std::clamp(p.config().ranks_per_node, 1, p.world())), seqs_(batch) {
  costs_.reserve(seqs_.size());
  for (const auto& s : seqs_) {
    validate_shape(s);
    costs_.push_back(cost_.prepare(s));
    dmin_.push_back(p.min_degree(s));
    bytes1_.push_back(memory_.one_rank_bytes(s));
    t1_.push_back(time(int(t1_.size()), 1));
    total_ += t1_.back();
  }
  lower_bound_ = compute_lower_bound();
}

int64_t BatchCosts::group_time(const std::vector<int32_t>& g, int d, bool inter) const {
  thread_local GroupCost acc;
  acc.clear();
  for (int32_t s : g) acc.add(costs_[s]);
  evaluations_ += int64_t(g.size());
  return cost_.ticks(acc, d, inter, &evaluations_);
}

int64_t BatchCosts::group_bytes(const std::vector<int32_t>& g, int c) const {
  thread_local std::vector<const SeqShape*> ptrs;
  ptrs.clear();
  charge(1 + int64_t(g.size()) / 4);
  for (int32_t s : g) ptrs.push_back(&seqs_[s]);
  return memory_.group_bytes(ptrs, c);
}

int BatchCosts::group_min_degree(const std::vector<int32_t>& g) const {
  thread_local std::vector<const SeqShape*> ptrs;
  ptrs.clear();
  charge(4 + int64_t(g.size()));
  for (int32_t s : g) ptrs.push_back(&seqs_[s]);
  return memory_.min_degree(ptrs, world_);
}

int64_t BatchCosts::compute_lower_bound() {
  if (seqs_.empty()) return 0;
  const int n = world_;
  // (a) Rank-time: sum over the sequences of the least d x time they add to any micro-batch
  // at an allowed degree, for a few lambdas; every group's ranks are busy that long.
  double area = 0;
  for (double lambda : {1.0, 0.0}) {
    double sum = 0;
    for (int s = 0; s < size(); ++s) sum += cost_.min_area_lower_bound(costs_[s], dmin_[s], n, lambda);
    charge(size() / 2);
    area = std::max(area, sum / n);
  }
  // (b) The slowest sequence alone on its best ring. Only sequences whose time at their
  // minimum degree exceeds the bound so far can raise it; the scan over d stops when the
  // fixed costs and the ring latency alone (which grow with d) pass the best time found.
  double bound = area;
  std::vector<std::pair<double, int>> order;
  for (int s = 0; s < size(); ++s) order.push_back({cost_.time_lower_bound(costs_[s], dmin_[s]), s});
  charge(size() / 4);
  std::sort(order.begin(), order.end(), std::greater<>());
  const double fixed = cost_.fixed_seconds(), latency = cost_.step_latency();
  for (auto [at_min, s] : order) {
    if (at_min <= bound) break;
    double best = at_min;
    for (int d = dmin_[s] + 1; d <= n && best > bound && fixed + latency * (d - 1) < best; ++d) {
      best = std::min(best, cost_.time_lower_bound(costs_[s], d));
      charge(1);
    }
    bound = std::max(bound, best);
  }
  return int64_t(std::floor(bound * 1e9));
}

Timelines::Timelines(int world, int ranks_per_node)
    : n_(world), node_(std::clamp(ranks_per_node, 1, world)), nodes_((world + node_ - 1) / node_),
      size_(int(std::bit_ceil(unsigned(world)))), nsize_(int(std::bit_ceil(unsigned(nodes_)))),
      free_(size_t(world), 0), tree_(size_t(2 * size_), {kNever, INT_MAX}),
      kth_(size_t(node_), std::vector<int64_t>(size_t(2 * nsize_), kNever)), node_max_(size_t(nodes_), 0),
      node_sum_(size_t(nodes_), 0), pmax_(size_t(world), 0), psum_(size_t(world), 0) {
  for (int r = 0; r < n_; ++r) tree_[size_t(size_ + r)] = {0, r};
  for (int i = size_ - 1; i >= 1; --i) tree_[i] = std::min(tree_[2 * i], tree_[2 * i + 1]);
  for (int v = 0; v < nodes_; ++v) refresh_node(v);
}

void Timelines::refresh_node(int v) {
  const int a = v * node_, e = std::min(n_, a + node_);
  thread_local std::vector<int64_t> sorted;
  sorted.assign(free_.begin() + a, free_.begin() + e);
  std::sort(sorted.begin(), sorted.end());
  int64_t mx = 0, sum = 0;
  for (int r = a; r < e; ++r) mx = std::max(mx, free_[r]), sum += free_[r], pmax_[r] = mx, psum_[r] = sum;
  node_max_[v] = mx, node_sum_[v] = sum;
  for (int k = 0; k < node_; ++k) {
    auto& t = kth_[size_t(k)];
    int i = nsize_ + v;
    t[i] = k < int(sorted.size()) ? sorted[size_t(k)] : kNever;
    for (i /= 2; i >= 1; i /= 2) t[i] = std::min(t[2 * i], t[2 * i + 1]);
  }
}

int Timelines::leftmost(const std::vector<int64_t>& t, int pos, int64_t x) const {
  // Walk up from pos collecting the right siblings, then down into the first that holds
  // a value <= x.
  if (pos >= nodes_) return -1;
  int i = nsize_ + pos;
  if (t[i] <= x) return pos;
  while (i > 1) {
    if ((i & 1) == 0 && t[i + 1] <= x) {
      i = i + 1;
      while (i < nsize_) i = t[2 * i] <= x ? 2 * i : 2 * i + 1;
      const int v = i - nsize_;
      return v < nodes_ ? v : -1;
    }
    i /= 2;
  }
  return -1;
}

Timelines::Slot Timelines::best_block(int d, int64_t* cost) const {
  DHP_ASSERT(d >= 1 && d <= n_);
  if (d == 1) {  // the rank that frees first (lowest index on ties): the segment tree's root
    *cost += std::bit_width(unsigned(size_));
    return {tree_[1].second, tree_[1].first};
  }
  Slot best{-1, 0};
  int64_t best_waste = 0;
  auto consider = [&](int f, int64_t start, int64_t sum) {
    const int64_t waste = start * d - sum;
    if (best.first < 0 || start < best.start || (start == best.start && waste < best_waste))
      best = {f, start}, best_waste = waste;
  };
  if (d <= node_) {
    // Inside one node: the ring runs at intra-node bandwidth, as the cost model assumes. No
    // window of a node starts before the node's d-th smallest free time, so only nodes whose
    // d-th smallest is at most the best start so far are looked at, in rank order (and at
    // most 8 that can only tie on the start).
    const auto& t = kth_[size_t(d - 1)];
    int ties = 0;
    for (int pos = 0;;) {
      const int64_t x = best.first < 0 ? kNever - 1 : best_waste == 0 ? best.start - 1 : best.start;
      const int v = leftmost(t, pos, x);
      *cost += std::bit_width(unsigned(nsize_));
      if (v < 0) break;
      if (best.first >= 0 && t[size_t(nsize_ + v)] == best.start && ++ties > 8) break;
      const int a = v * node_, e = std::min(n_, a + node_);
      for (int f = a; f + d <= e; ++f) {
        int64_t start = 0, sum = 0;
        for (int r = f; r < f + d; ++r) start = std::max(start, free_[r]), sum += free_[r];
        consider(f, start, sum);
      }
      *cost += int64_t(e - a) * d;
      pos = v + 1;
    }
  } else {
    // Node-aligned blocks: q whole nodes and the first `rem` ranks of the next. The largest
    // free time over the whole nodes slides along with a monotone deque.
    const int q = d / node_, rem = d % node_;
    thread_local std::vector<int> dq;
    dq.assign(size_t(nodes_) + 1, 0);
    int head = 0, tail = 0;
    int64_t window_sum = 0;
    for (int v = 0; v < nodes_; ++v) {
      while (tail > head && node_max_[dq[tail - 1]] <= node_max_[v]) --tail;
      dq[tail++] = v;
      window_sum += node_sum_[v];
      const int k = v - q + 1;  // first node of the window
      if (k < 0) continue;
      if (dq[head] < k) ++head;
      if (k > 0) window_sum -= node_sum_[k - 1];
      const int f = k * node_;
      if (f + d > n_) break;
      int64_t start = node_max_[dq[head]], sum = window_sum;
      if (rem > 0) {
        const int last = f + q * node_ + rem - 1;
        start = std::max(start, pmax_[last]), sum += psum_[last];
      }
      consider(f, start, sum);
    }
    *cost += nodes_;
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
  for (int v = first / node_; v <= (first + d - 1) / node_; ++v) refresh_node(v);
}

int64_t Timelines::makespan() const { return free_.empty() ? 0 : *std::max_element(free_.begin(), free_.end()); }

std::vector<PlanGroup> list_schedule(const BatchCosts& b, const std::vector<Job>& jobs, int world,
                                     int ranks_per_node, int64_t* makespan) {
  Timelines tl(world, ranks_per_node);
  std::vector<PlanGroup> out;
  out.reserve(jobs.size());
  for (const Job& job : jobs) {
    int64_t cost = 0;
    const auto slot = tl.best_block(job.ranks, &cost);
    b.charge(1 + cost / 64);
    tl.occupy(slot.first, job.ranks, slot.start + job.time);
    PlanGroup g;
    g.first_rank = slot.first, g.ranks = job.ranks, g.ring_degree = job.ring_degree, g.seqs = job.seqs;
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

std::vector<PlanGroup> merge_runs(const BatchCosts& b, std::vector<PlanGroup> groups, int world,
                                  int64_t* makespan) {
  sort_by_start(groups);
  const int G = int(groups.size());
  const MemoryModel& mem = b.memory();
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
  b.charge(G);
  for (int g = 0; g < G; ++g) {
    if (dead[g]) continue;
    PlanGroup& a = groups[g];
    // One rank holds everything: bytes add up exactly. Wider rings: the exact group bytes.
    int64_t act = 0, tokens = 0;
    if (a.ring_degree == 1)
      for (int32_t s : a.seqs) act += b.one_rank_bytes(s), tokens += b.seq(s).tokens();
    bool merged = false;
    int64_t end = a.start_ns + a.time_ns;
    for (int h = next[g]; h >= 0; h = next[h]) {
      const PlanGroup& c = groups[h];
      if (c.first_rank != a.first_rank || c.ranks != a.ranks || c.ring_degree != a.ring_degree || c.start_ns != end) break;
      if (a.ring_degree == 1) {
        int64_t act2 = act, tok2 = tokens;
        for (int32_t s : c.seqs) act2 += b.one_rank_bytes(s), tok2 += b.seq(s).tokens();
        if (mem.rank_bytes(act2, tok2) > mem.capacity()) break;
        act = act2, tokens = tok2;
        a.seqs.insert(a.seqs.end(), c.seqs.begin(), c.seqs.end());
      } else {
        std::vector<int32_t> both = a.seqs;
        both.insert(both.end(), c.seqs.begin(), c.seqs.end());
        if (b.group_bytes(both, a.ring_degree) > mem.capacity()) break;
        a.seqs = std::move(both);
      }
      end = c.start_ns + c.time_ns;
      dead[h] = 1;
      merged = true;
    }
    if (merged) a.time_ns = b.group_time(a.seqs, a.ring_degree, b.spans_nodes(a.first_rank, a.ring_degree) || b.cost().inter(a.ring_degree));
  }
  std::vector<PlanGroup> out;
  out.reserve(size_t(G));
  for (int g = 0; g < G; ++g)
    if (!dead[g]) out.push_back(std::move(groups[g]));
  // Re-time as soon as possible in the same order per rank: times only went down, so by
  // induction no start moves later.
  *makespan = retime_asap(out, world);
  sort_by_start(out);
  return out;
}

std::vector<PlanGroup> finish_groups(const BatchCosts& b, std::vector<PlanGroup> groups, int world) {
  sort_by_start(groups);
  std::vector<int> depth(size_t(world), 0);
  for (PlanGroup& g : groups) {
    g.wave = 0;
    for (int r = g.first_rank; r < g.first_rank + g.ranks; ++r) g.wave = std::max(g.wave, depth[r]);
    for (int r = g.first_rank; r < g.first_rank + g.ranks; ++r) depth[r] = g.wave + 1;
    std::sort(g.seqs.begin(), g.seqs.end());
    g.peak_bytes = b.group_bytes(g.seqs, g.ring_degree);
  }
  return groups;
}

}  // namespace detail

namespace {

// ranks_per_node 0 (auto, not resolved by a run's placement) is one node of the whole world.
ParallelConfig with_nodes(ParallelConfig par, int world) {
  if (par.ranks_per_node == 0) par.ranks_per_node = std::max(1, world);
  return par;
}

// A profile stored in another dtype than it assumes (a CPU run in bf16, a GPU run in fp32).
DeviceProfile stored_in(DeviceProfile p, int storage_bytes) {
  if (storage_bytes > 0) p.act_bytes = p.weight_bytes = storage_bytes;
  return p;
}

}  // namespace

Planner::Planner(const ModelConfig& model, const ParallelConfig& par, int world,
                 const ParamGroups& groups, const EngineLayout& engine)
    : Planner(CostModel(model, stored_in(device_profile(par.cost_profile), engine.storage_bytes),
                        with_nodes(par, world).ranks_per_node, par.recompute),
              par, world, groups, engine) {}

Planner::Planner(const CostModel& cost, const ParallelConfig& given, int world, const ParamGroups& groups,
                 const EngineLayout& engine)
    : cost_(cost),
      memory_(cost.model(), cost.device(), world, given.memory_gb, given.zero, given.recompute, groups, engine),
      par_(with_nodes(given, world)), world_(world), groups_(groups), engine_(engine) {
  const ParallelConfig& par = par_;
  cost_.price_layer_gathers(memory_.layer_gather_bytes(), world);
  DHP_CHECK(world >= 1 && world <= kMaxWorld, "the world size must be between 1 and {} ranks, got {}", kMaxWorld,
            world);
  DHP_CHECK(par.ranks_per_node >= 1, "parallel.ranks_per_node must be at least 1, got {}", par.ranks_per_node);
  DHP_CHECK(std::isfinite(par.planner_budget_ms) && par.planner_budget_ms >= 0 && par.planner_budget_ms <= 1e6,
            "parallel.planner_budget_ms must be between 0 and 1e6, got {}", par.planner_budget_ms);
  DHP_CHECK(memory_.rank_bytes(0, 0) < memory_.capacity(),
            "the model alone needs {:.2f} GiB per rank ({} parameters), more than parallel.memory_gb = {}: {}",
            memory_.rank_bytes(0, 0) / double(int64_t(1) << 30), memory_.parameters(), par.memory_gb,
            what_would_fit(cost.model(), cost.device(), world, par, groups, engine));
}

std::string what_would_fit(const ModelConfig& model, const DeviceProfile& device, int world,
                           const ParallelConfig& par, const ParamGroups& groups, const EngineLayout& engine) {
  const double gib = double(int64_t(1) << 30);
  auto holds = [&](int n, int zero) {
    return MemoryModel(model, device, n, par.memory_gb, zero, par.recompute, groups, engine);
  };
  auto fits = [](const MemoryModel& m) { return m.rank_bytes(0, 0) < m.capacity(); };
  // What a stage shards: the moments, from 2 the gradients, beside a working copy the master.
  auto sharded = [&](int zero) {
    std::vector<std::string> parts = {"the moments"};
    if (zero >= 2) parts.push_back("the gradients");
    if (zero >= 3) parts.push_back("the decoder layers' working weights");
    if (device.act_bytes < 4 || zero >= 3) parts.push_back("the fp32 master weights");
    const std::string last = parts.back();
    parts.pop_back();
    return parts.empty() ? last : fmt::format("{} and {}", fmt::join(parts, ", "), last);
  };
  for (int zero = par.zero + 1; zero <= kMaxZero; ++zero)
    if (const MemoryModel m = holds(world, zero); fits(m))
      return fmt::format("set parallel.zero = {} (then {:.2f} GiB per rank: {} sharded over the {} ranks)", zero,
                         m.rank_bytes(0, 0) / gib, sharded(zero), world);
  // Sharded, only the moments, gradients and (beside a working copy) the master shrink with the ranks.
  for (int64_t n = int64_t(world) * 2; n <= kMaxWorld; n *= 2)
    for (int zero = std::max(par.zero, 1); zero <= kMaxZero; ++zero)
      if (const MemoryModel m = holds(int(n), zero); fits(m))
        return fmt::format("with parallel.zero = {} it fits from {} ranks ({:.2f} GiB per rank), or raise memory_gb",
                           zero, n, m.rank_bytes(0, 0) / gib);
  const MemoryModel most = holds(world, kMaxZero);
  const StateBytes every = state_bytes(most.parameters(), most.trainable_parameters(), device.act_bytes, kMaxWorld,
                                       most.gradient_window(), most.layer_gather_bytes() > 0 ? most.weight_window() : 0);
  return fmt::format("no number of ranks makes it fit: what every rank holds however many there are (fp32 master "
                     "weights {:.2f} GiB, the working copy {:.2f} GiB, fp32 gradients {:.2f} GiB with parallel.zero = "
                     "{}) is beyond it; raise memory_gb, freeze parameter groups (optim.groups) or train a smaller model",
                     every.master / gib, every.working / gib, every.gradients / gib, kMaxZero);
}

Plan Planner::plan(const std::vector<SeqShape>& batch, PlanStats* stats) const {
  return plan_as_run(par_.strategy, batch, par_.static_cp, stats);
}

Plan Planner::plan_as_run(Strategy s, const std::vector<SeqShape>& batch, int static_cp, PlanStats* stats) const {
  Plan best = traits(s).plan(*this, batch, static_cp, stats);
  if (!par_.shards_gradients(world_)) return best;
  // The strategy's own plan with barriers, or another's it may run where that is faster.
  best = best.with_barriers();
  auto consider = [&](Strategy other, int cp) {
    PlanStats more;
    Plan p = traits(other).plan(*this, batch, cp, &more).with_barriers();
    if (stats) stats->evaluations += more.evaluations;
    if (p.makespan_ns() < best.makespan_ns()) best = std::move(p);
  };
  for (const Strategy other : traits(s).under_barriers) {
    if (traits(other).degrees != RingDegrees::fixed) {
      consider(other, 0);
      continue;
    }
    // A layout of one degree: each that divides the world and holds the batch (dhp re-forms
    // every step, so the degree may change from step to step).
    for (int cp = static_min_cp(batch); cp <= world_; ++cp)
      if (world_ % cp == 0) consider(other, cp);
  }
  return best;
}

int Planner::min_degree(const SeqShape& s) const {
  validate_shape(s);
  const int d = memory_.min_degree(s, world_);
  if (d <= world_) return d;
  // Would another recompute mode fit it? The first that does (least recompute first) is named.
  std::string other = "no recompute mode fits it either";
  for (const auto& [mode, name] : kRecomputeNames) {
    if (mode == par_.recompute) continue;
    const MemoryModel m(cost_.model(), cost_.device(), world_, par_.memory_gb, par_.zero, mode, groups_, engine_);
    const int dm = m.min_degree(s, world_);
    if (dm <= world_) {
      other = fmt::format("parallel.recompute = \"{}\" fits it on {} rank{} ({:.2f} GiB each)", name, dm,
                          dm == 1 ? "" : "s", m.group_bytes(s, dm) / double(int64_t(1) << 30));
      break;
    }
  }
  DHP_CHECK(false,
            "sample {} ({} tokens: {} text + {} vision) does not fit in {} GiB per rank even split over all "
            "{} ranks (it needs {:.2f} GiB on each with parallel.recompute = \"{}\"; {}): raise "
            "parallel.memory_gb, use more ranks, change parallel.recompute, or drop samples this long "
            "(data.max_tokens)",
            s.id, s.tokens(), s.text_tokens, s.vision_tokens, par_.memory_gb, world_,
            memory_.group_bytes(s, world_) / double(int64_t(1) << 30), recompute_name(par_.recompute), other);
  return d;
}

int64_t Planner::lower_bound(const std::vector<SeqShape>& batch) const {
  return detail::BatchCosts(*this, batch).lower_bound();
}

int64_t Planner::budget() const { return int64_t(par_.planner_budget_ms * double(kEvaluationsPerMs)); }

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
    if (grp.first_rank < 0 || grp.first_rank + grp.ranks > world_ || grp.ring_degree < 1 || grp.ring_degree > grp.ranks)
      bad.push_back(fmt::format("group {}: ranks {}+{} (cp {}) outside the world of {}", g, grp.first_rank,
                                grp.ranks, grp.ring_degree, world_));
    for (int32_t s : grp.seqs)
      if (s >= 0 && s < int32_t(seqs.size())) ++seen[size_t(s)];
    if (grp.ring_degree < 1 || grp.ring_degree > grp.ranks || grp.first_rank < 0 || grp.first_rank + grp.ring_degree > world_) continue;
    bool seqs_ok = true;
    for (int32_t s : grp.seqs) seqs_ok &= s >= 0 && s < int32_t(seqs.size());
    if (!seqs_ok) {
      bad.push_back(fmt::format("group {}: a sequence index outside the batch", g));
      continue;
    }
    std::vector<const SeqShape*> members;
    for (int32_t s : grp.seqs) members.push_back(&seqs[size_t(s)]);
    // Time: the cost model's price of this micro-batch on this ring where it is placed.
    const int rpn = std::clamp(par_.ranks_per_node, 1, world_);
    const bool spans = grp.first_rank / rpn != (grp.first_rank + grp.ring_degree - 1) / rpn;
    // dhp's and pow2's own placement keeps rings of at most a node's ranks inside a node; a
    // static layout (the static strategy, or dhp adopting it) and the barrier reference may
    // lay one across two nodes, priced at inter-node bandwidth (checked below).
    const bool may_span = traits(plan.strategy()).rings_may_span_nodes || traits(plan.placement()).rings_may_span_nodes;
    if (spans && grp.ring_degree <= rpn && !may_span)
      bad.push_back(fmt::format("group {}: its ring of {} ranks from rank {} spans two nodes of {} ranks", g, grp.ring_degree,
                                grp.first_rank, rpn));
    {
      GroupCost acc;
      for (const SeqShape* s : members) acc.add(cost_.prepare(*s));
      const int64_t want = cost_.ticks(acc, grp.ring_degree, spans || cost_.inter(grp.ring_degree));
      if (!grp.seqs.empty() && grp.time_ns != want)
        bad.push_back(fmt::format("group {}: time {} ns, but the cost model prices its {} sequences on {} ranks{} "
                                  "at {} ns", g, grp.time_ns, grp.seqs.size(), grp.ring_degree,
                                  spans ? " across nodes" : "", want));
    }
    // Token ranges: the union over the ring's ranks covers each sequence exactly once.
    // Memory: each rank's decoder tokens from its ranges, plus the most patches any rank of
    // the ring encodes (images are whole on a rank).
    const int64_t patch_bytes = memory_.max_rank_patches(members, grp.ring_degree) * memory_.bytes_per_patch();
    std::map<int32_t, std::vector<std::pair<int64_t, int64_t>>> cover;
    for (int i = 0; i < grp.ring_degree; ++i) {
      int64_t tokens = 0;
      for (const auto& r : plan.ranges(g, grp.first_rank + i)) {
        cover[r.seq].push_back({r.begin, r.end});
        tokens += r.end - r.begin;
      }
      const int64_t bytes = memory_.rank_bytes(tokens * memory_.bytes_per_token() + patch_bytes, tokens);
      if (bytes > memory_.capacity())
        bad.push_back(fmt::format("group {} rank {}: {} bytes exceed the capacity {}", g, grp.first_rank + i, bytes,
                                  memory_.capacity()));
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
  // all its groups start together when the slowest group of the previous wave ends; a plan
  // retimed with barriers (Plan::with_barriers, ZeRO-2) starts its waves so too.
  const bool barrier = plan.barriers();
  std::vector<int64_t> free_at(size_t(world_), 0);
  std::vector<int> depth(size_t(world_), 0);
  std::vector<int> order(groups.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return std::pair(groups[a].start_ns, groups[a].first_rank) < std::pair(groups[b].start_ns, groups[b].first_rank);
  });
  for (int g : order) {
    const PlanGroup& grp = groups[g];
    if (grp.first_rank < 0 || grp.first_rank + grp.ranks > world_) continue;
    int64_t ready = 0;
    int wave = 0;
    for (int r = grp.first_rank; r < grp.first_rank + grp.ranks; ++r) {
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
    for (int r = grp.first_rank; r < grp.first_rank + grp.ranks; ++r)
      free_at[r] = grp.start_ns + grp.time_ns, depth[r] = grp.wave + 1;
  }
  if (barrier) {
    int64_t wave_start = 0;
    for (const auto& [w, gs] : wave_groups) {
      int sum = 0;
      int64_t end = wave_start;
      for (int g : gs) {
        sum += groups[g].ranks;
        end = std::max(end, groups[g].start_ns + groups[g].time_ns);
        if (groups[g].start_ns != wave_start)
          bad.push_back(fmt::format("wave {} group {}: starts at {}, not at the barrier {}", w, g,
                                    groups[g].start_ns, wave_start));
      }
      if (traits(plan.strategy()).barriers && sum != world_)
        bad.push_back(fmt::format("wave {}: degrees sum to {}, not {}", w, sum, world_));
      wave_start = end;
    }
  }
  return bad;
}

}  // namespace dhp
