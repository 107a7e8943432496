// The dhp strategy: packing, waves, exact degrees, improvement, placement (planner.h).
#include <algorithm>
#include <cmath>
#include <set>

#include "kernels/check.h"
#include "parallel/planner.h"
#include "parallel/planner_detail.h"
#include "parallel/solver.h"

namespace dhp {
namespace {

using detail::BatchCosts;

struct Group {
  std::vector<int32_t> seqs;
  int dmin = 1;       // memory alone
  int64_t work = 0;   // time on one rank
};

// The degree problem of one wave.
class WaveTimes : public GroupTimes {
 public:
  WaveTimes(const BatchCosts& b, const std::vector<Group>& g, const std::vector<int>& members)
      : b_(b), g_(g), m_(members) {}
  int groups() const override { return int(m_.size()); }
  int64_t time(int k, int d) const override {
    const Group& g = g_[m_[k]];
    return d < g.dmin ? kNever : b_.group_time(g.seqs, d);
  }
  int min_degree(int k) const override { return g_[m_[k]].dmin; }

 private:
  const BatchCosts& b_;
  const std::vector<Group>& g_;
  const std::vector<int>& m_;
};

struct Solution {
  std::vector<Group> groups;
  std::vector<std::vector<int>> waves;   // group indices of each wave
  std::vector<DegreeSolution> degrees;   // per wave, aligned with waves[w]
  int64_t makespan = kNever;             // sum over waves
  int moves = 0;
};

// Stage 1: sequences that need several ranks (memory) or more than `target` alone stay
// alone; the rest go best-fit-decreasing into bins of at most `target` time that fit one
// rank's memory.
std::vector<Group> pack(const BatchCosts& b, const MemoryModel& mem, int n, const std::vector<int32_t>& seqs,
                        int64_t target) {
  std::vector<Group> groups;
  std::vector<int32_t> small;
  int64_t large_ranks = 0;
  for (int32_t s : seqs) {
    if (b.min_degree(s) > 1 || b.work(s) > target) {
      groups.push_back({{s}, b.min_degree(s), b.work(s)});
      large_ranks += b.min_degree(s);
    } else {
      small.push_back(s);
    }
  }
  // More bins than the ranks left would force a second wave for a few overflowing bins;
  // past that count, bins grow beyond the target instead (least loaded first).
  const int64_t max_bins = std::max<int64_t>(1, n - large_ranks);
  std::stable_sort(small.begin(), small.end(), [&](int32_t x, int32_t y) { return b.work(x) > b.work(y); });
  struct Bin {
    Group g;
    int64_t act = 0, tokens = 0;
  };
  std::vector<Bin> bins;
  std::set<std::pair<int64_t, int>> by_room;  // (target - load, bin): best fit = least room
  for (int32_t s : small) {
    const int64_t L = b.seq(s).tokens(), a = mem.activation_bytes(b.seq(s), L), w = b.work(s);
    int chosen = -1, tries = 0;
    // Memory rarely binds before time does; a few roomier bins are tried before a new one.
    for (auto it = by_room.lower_bound({w, -1}); it != by_room.end() && tries < 8; ++it, ++tries) {
      const Bin& bin = bins[it->second];
      if (mem.rank_bytes(bin.act + a, bin.tokens + L) <= mem.capacity()) {
        chosen = it->second;
        by_room.erase(it);
        break;
      }
    }
    if (chosen < 0 && int64_t(bins.size()) >= max_bins) {
      tries = 0;
      for (auto it = by_room.rbegin(); it != by_room.rend() && tries < 8; ++it, ++tries) {
        const Bin& bin = bins[it->second];
        if (mem.rank_bytes(bin.act + a, bin.tokens + L) <= mem.capacity()) {
          chosen = it->second;
          by_room.erase(std::next(it).base());
          break;
        }
      }
    }
    if (chosen < 0) {
      chosen = int(bins.size());
      bins.emplace_back();
    }
    Bin& bin = bins[chosen];
    bin.g.seqs.push_back(s);
    bin.g.work += w;
    bin.act += a;
    bin.tokens += L;
    by_room.insert({target - bin.g.work, chosen});
  }
  for (auto& bin : bins) groups.push_back(std::move(bin.g));
  return groups;
}

// Waves: as few as the ranks allow, balanced by work longest-first.
std::vector<std::vector<int>> split_waves(const std::vector<Group>& groups, int n) {
  const int K = int(groups.size());
  int64_t dsum = 0;
  for (const auto& g : groups) dsum += g.dmin;
  std::vector<int> all(K);
  for (int k = 0; k < K; ++k) all[k] = k;
  if (K <= n && dsum <= n) return {all};
  std::vector<int> order = all;
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return groups[x].work > groups[y].work; });
  for (int W = int((std::max<int64_t>(K, dsum) + n - 1) / n);; ++W) {
    std::vector<std::vector<int>> waves(W);
    std::vector<int64_t> load(W, 0), used(W, 0);
    bool ok = true;
    for (int k : order) {
      int best = -1;
      for (int w = 0; w < W; ++w)
        if (int(waves[w].size()) < n && used[w] + groups[k].dmin <= n && (best < 0 || load[w] < load[best]))
          best = w;
      if (best < 0) {
        ok = false;
        break;
      }
      waves[best].push_back(k);
      load[best] += groups[k].work, used[best] += groups[k].dmin;
    }
    if (!ok) continue;
    for (auto& w : waves) std::sort(w.begin(), w.end());
    return waves;
  }
}

void solve_waves(const BatchCosts& b, Solution& sol, int n) {
  sol.waves = split_waves(sol.groups, n);
  sol.degrees.clear();
  sol.makespan = 0;
  for (const auto& members : sol.waves) {
    WaveTimes t(b, sol.groups, members);
    sol.degrees.push_back(solve_degrees(t, n));
    DHP_ASSERT(sol.degrees.back().feasible);
    sol.makespan += sol.degrees.back().makespan;
  }
}

// Moves short sequences out of the slowest group of a wave into groups that finish early,
// degrees fixed, while the wave's makespan drops and the budget lasts.
int improve_wave(const BatchCosts& b, const MemoryModel& mem, Solution& sol, int w, int64_t stop_at) {
  const auto& members = sol.waves[w];
  DegreeSolution& deg = sol.degrees[w];
  std::set<std::pair<int64_t, int>> order;  // (time, k)
  // Activation bytes and tokens of each group's fullest rank at its ring degree, kept up to
  // date so that a move's memory check costs O(1).
  std::vector<int64_t> act(members.size(), 0), tokens(members.size(), 0);
  auto share = [&](int32_t s, int c, int64_t& a, int64_t& t) {
    t = (b.seq(s).tokens() + c - 1) / c;
    a = mem.activation_bytes(b.seq(s), t);
  };
  for (int k = 0; k < int(members.size()); ++k) {
    order.insert({deg.time[k], k});
    for (int32_t s : sol.groups[members[k]].seqs) {
      int64_t a, t;
      share(s, deg.cp[k], a, t);
      act[k] += a, tokens[k] += t;
    }
  }
  int moves = 0;
  // A move lowers the time of the slowest group but the wave's makespan only when no other
  // group ties with it; when a whole round of moves (one per group) has not lowered it,
  // the search has stalled and stops early instead of spending the budget on sideways moves.
  int64_t best_makespan = order.rbegin()->first;
  int since_better = 0;
  while (b.evaluations() < stop_at && since_better < int(members.size())) {
    const auto [M, k] = *order.rbegin();
    Group& gk = sol.groups[members[k]];
    if (gk.seqs.size() <= 1) break;
    int64_t best_score = M, best_a = 0, best_b = 0;
    int best_s = -1, best_j = -1;
    for (size_t i = 0; i < gk.seqs.size(); ++i) {
      const int32_t s = gk.seqs[i];
      const int64_t a = M - b.time(s, deg.cp[k]);
      int tried = 0;
      for (auto it = order.begin(); it != order.end() && tried < 4 && it->first < M; ++it) {
        const int j = it->second;
        if (j == k) continue;
        ++tried;
        const int64_t bb = it->first + b.time(s, deg.cp[j]);
        const int64_t score = std::max(a, bb);
        if (score >= best_score) continue;
        int64_t a2, t2;
        share(s, deg.cp[j], a2, t2);
        if (mem.rank_bytes(act[j] + a2, tokens[j] + t2) > mem.capacity()) continue;
        best_score = score, best_s = int(i), best_j = j, best_a = a, best_b = bb;
      }
    }
    if (best_s < 0) break;
    Group& gj = sol.groups[members[best_j]];
    const int32_t s = gk.seqs[best_s];
    gk.seqs.erase(gk.seqs.begin() + best_s);
    gk.work -= b.work(s);
    gj.seqs.push_back(s);
    gj.work += b.work(s);
    gj.dmin = b.group_min_degree(gj.seqs);
    gk.dmin = b.group_min_degree(gk.seqs);
    int64_t a, t;
    share(s, deg.cp[k], a, t);
    act[k] -= a, tokens[k] -= t;
    share(s, deg.cp[best_j], a, t);
    act[best_j] += a, tokens[best_j] += t;
    order.erase({M, k});
    order.erase({deg.time[best_j], best_j});
    deg.time[k] = best_a, deg.time[best_j] = best_b;
    order.insert({best_a, k});
    order.insert({best_b, best_j});
    ++moves;
    if (order.rbegin()->first < best_makespan) best_makespan = order.rbegin()->first, since_better = 0;
    else ++since_better;
  }
  const int64_t before = deg.makespan;
  deg.makespan = order.rbegin()->first;
  sol.makespan += deg.makespan - before;
  return moves;
}

// One candidate: pack at `target`, solve, move sequences, re-solve; the better of the two.
Solution attempt(const BatchCosts& b, const MemoryModel& mem, int n, const std::vector<int32_t>& seqs,
                 int64_t target, int64_t stop_at) {
  Solution sol;
  sol.groups = pack(b, mem, n, seqs, target);
  solve_waves(b, sol, n);
  if (b.evaluations() >= stop_at) return sol;
  for (int w = 0; w < int(sol.waves.size()); ++w) sol.moves += improve_wave(b, mem, sol, w, stop_at);
  if (sol.moves == 0) return sol;
  Solution again;
  again.groups = sol.groups;
  again.moves = sol.moves;
  solve_waves(b, again, n);
  return again.makespan < sol.makespan ? again : sol;
}

// The best plan of one set of sequences: pack at a rank's fair share, then re-pack at the
// makespan reached (short sequences then fill the time the long groups need anyway and free
// ranks for them) and at a few other bin sizes, while the budget lasts.
Solution optimise(const BatchCosts& b, const MemoryModel& mem, int n, const std::vector<int32_t>& seqs,
                  int64_t stop_at, PlanStats& stats) {
  int64_t work = 0;
  for (int32_t s : seqs) work += b.work(s);
  const int64_t fair = std::max<int64_t>(1, (work + n - 1) / n);
  std::set<int64_t> tried = {fair};
  Solution best = attempt(b, mem, n, seqs, fair, stop_at);
  ++stats.packings, stats.moves += best.moves;
  const double scales[] = {0.75, 1.25, 0.5, 1.5};
  size_t next_scale = 0;
  int failures = 0;  // consecutive packings that did not improve: two end the search
  while (b.evaluations() < stop_at && failures < 2) {
    int64_t target = best.makespan / int64_t(best.waves.size());
    if (tried.count(target)) {
      if (next_scale == std::size(scales)) break;
      target = int64_t(double(fair) * scales[next_scale++]);
      if (tried.count(target)) continue;
    }
    tried.insert(target);
    Solution cand = attempt(b, mem, n, seqs, target, stop_at);
    ++stats.packings, stats.moves += cand.moves;
    if (cand.makespan < best.makespan) best = std::move(cand), failures = 0;
    else ++failures;
  }
  return best;
}

// Splits the batch into w waves of balanced work (longest first to the lightest wave) whose
// activations, at 90% to leave room for packing, fit the ranks' free memory.
std::vector<std::vector<int32_t>> split_batch(const BatchCosts& b, const MemoryModel& mem, int n, int w) {
  std::vector<int32_t> order(b.size());
  for (int s = 0; s < b.size(); ++s) order[s] = s;
  std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return b.work(x) > b.work(y); });
  const double room = 0.9 * double(n) * double(mem.capacity() - mem.rank_bytes(0, 1 << 30));
  std::vector<std::vector<int32_t>> parts(w);
  std::vector<int64_t> load(w, 0);
  std::vector<double> bytes(w, 0);
  for (int32_t s : order) {
    const double need = double(mem.activation_bytes(b.seq(s), b.seq(s).tokens()));
    int pick = -1;
    for (int i = 0; i < w; ++i)
      if (bytes[i] + need <= room && (pick < 0 || load[i] < load[pick])) pick = i;
    if (pick < 0)  // nothing has room: the per-part planner splits further into waves
      pick = int(std::min_element(bytes.begin(), bytes.end()) - bytes.begin());
    parts[pick].push_back(s);
    load[pick] += b.work(s), bytes[pick] += need;
  }
  for (auto& p : parts) std::sort(p.begin(), p.end());
  parts.erase(std::remove_if(parts.begin(), parts.end(), [](const auto& p) { return p.empty(); }), parts.end());
  return parts;
}

void append(Solution& into, Solution&& part) {
  const int base = int(into.groups.size());
  for (auto& g : part.groups) into.groups.push_back(std::move(g));
  for (auto& w : part.waves) {
    for (int& k : w) k += base;
    into.waves.push_back(std::move(w));
  }
  for (auto& d : part.degrees) into.degrees.push_back(std::move(d));
  into.makespan += part.makespan;
}

// The barrier-wave solution (design.md §2.3 as first written): waves of groups whose
// degrees sum to N, each wave solved exactly. The budget counts from the start of planning.
Solution wave_solution(const BatchCosts& b, const MemoryModel& mem, int n, int64_t stop_at, PlanStats& st) {
  // Waves: at least as many as the activations need, and one more: a long sequence on every
  // rank followed by the short ones can beat running them side by side.
  double need = 0;
  for (int s = 0; s < b.size(); ++s) need += double(mem.activation_bytes(b.seq(s), b.seq(s).tokens()));
  const double room = 0.9 * double(n) * double(mem.capacity() - mem.rank_bytes(0, 1 << 30));
  // No more waves than sequences: a wave without a sequence would leave the solution empty
  // (a few sequences that nearly fill all N ranks can ask for more waves than they are).
  const int w0 = std::min(b.size(), std::max(1, int(std::ceil(need / std::max(1.0, room)))));
  Solution best;
  for (int w = w0; w <= w0 + 1 && w <= b.size(); ++w) {
    if (w > w0 && b.evaluations() >= stop_at) break;
    // The first split gets half of what is left, so that the second is tried too.
    const int64_t part_stop = w == w0 ? (b.evaluations() + stop_at) / 2 : stop_at;
    Solution total;
    total.makespan = 0;
    for (const auto& part : split_batch(b, mem, n, w)) append(total, optimise(b, mem, n, part, part_stop, st));
    if (best.waves.empty() || total.makespan < best.makespan) best = std::move(total);
  }
  return best;
}

// The groups of a wave solution with barrier start times: wave w starts when the slowest
// group of wave w-1 ends. Groups keep the ranks they own (degree), surplus included.
std::vector<PlanGroup> barrier_groups(const BatchCosts& b, const Solution& sol, int n, int ranks_per_node) {
  std::vector<PlanGroup> out;
  int64_t start = 0;
  for (int w = 0; w < int(sol.waves.size()); ++w) {
    const DegreeSolution& deg = sol.degrees[w];
    const std::vector<int> first = place_wave(deg.degree, n, ranks_per_node);
    for (int k = 0; k < int(sol.waves[w].size()); ++k) {
      PlanGroup g;
      g.wave = w;
      g.first_rank = first[k];
      g.degree = deg.degree[k];
      g.cp = deg.cp[k];
      g.seqs = sol.groups[sol.waves[w][k]].seqs;
      std::sort(g.seqs.begin(), g.seqs.end());
      g.start_ns = start;
      g.time_ns = deg.time[k];
      g.peak_bytes = b.group_bytes(g.seqs, g.cp);
      out.push_back(std::move(g));
    }
    start += deg.makespan;
  }
  std::stable_sort(out.begin(), out.end(), [](const PlanGroup& x, const PlanGroup& y) {
    return std::pair(x.wave, x.first_rank) < std::pair(y.wave, y.first_rank);
  });
  return out;
}

// The same groups on the same ranks in the same order per rank, but without barriers: each
// group starts when the last of its ring's ranks is free, and the surplus ranks a wave gave
// it (degree > cp) are released. By induction over the waves every start is no later than
// its barrier start, so the makespan never exceeds the barrier schedule's.
std::vector<PlanGroup> compact(std::vector<PlanGroup> groups, int n, int64_t* makespan) {
  std::vector<int64_t> free_at(size_t(n), 0);
  *makespan = 0;
  for (PlanGroup& g : groups) {  // in wave order
    g.degree = g.cp;
    int64_t start = 0;
    for (int r = g.first_rank; r < g.first_rank + g.cp; ++r) start = std::max(start, free_at[r]);
    g.start_ns = start;
    for (int r = g.first_rank; r < g.first_rank + g.cp; ++r) free_at[r] = start + g.time_ns;
    *makespan = std::max(*makespan, start + g.time_ns);
  }
  return groups;
}

// Moldable list scheduling. For a target M each sequence gets the fewest ranks that bring
// it under M (the memory minimum at least; the fastest degree if none does), which keeps
// the rank-time sum_k d_k·T_k(d_k) small while no single ring exceeds M; then the rings are
// list-scheduled longest first on rank timelines (Timelines). The makespan is at least
// max(rank-time / N, M-ish), so small M trades area for a short critical path; the search
// tries a grid of M from the lower bound up and refines around the best.
class Moldable {
 public:
  Moldable(const BatchCosts& b, int n, int ranks_per_node) : b_(b), n_(n), rpn_(ranks_per_node), table_(size_t(b.size())) {}

  // Time of sequence s on d ranks (d >= its memory minimum), each evaluated once.
  int64_t time(int s, int d) {
    if (d == 1) return b_.work(s);
    auto& t = table_[size_t(s)];
    if (int(t.size()) < d) t.resize(size_t(d), -1);
    if (t[size_t(d - 1)] < 0) t[size_t(d - 1)] = b_.time(s, d);
    return t[size_t(d - 1)];
  }

  // The smallest degree >= the memory minimum whose time is <= M; the fastest if none.
  std::pair<int, int64_t> degree_for(int s, int64_t M) {
    int best = b_.min_degree(s);
    int64_t tb = time(s, best);
    for (int d = best + 1; tb > M && d <= n_; ++d) {
      const int64_t t = time(s, d);
      if (t < tb) best = d, tb = t;
    }
    return {best, tb};
  }

  struct Result {
    std::vector<PlanGroup> groups;
    int64_t makespan = kNever;
  };

  Result run(int64_t M) {
    std::vector<int> deg(size_t(b_.size()));
    std::vector<int64_t> t(size_t(b_.size()));
    std::vector<int32_t> order(size_t(b_.size()));
    for (int s = 0; s < b_.size(); ++s) {
      std::tie(deg[s], t[s]) = degree_for(s, M);
      order[s] = s;
    }
    // Longest first; ties: the wider ring first (it needs a whole free block), then index.
    std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) {
      return t[x] != t[y] ? t[x] > t[y] : deg[x] > deg[y];
    });
    b_.charge(b_.size());
    std::vector<detail::Job> jobs;
    jobs.reserve(order.size());
    for (int32_t s : order) jobs.push_back({{s}, deg[s], deg[s], t[s]});
    Result r;
    r.groups = detail::list_schedule(b_, jobs, n_, rpn_, &r.makespan);
    return r;
  }

 private:
  const BatchCosts& b_;
  int n_, rpn_;
  std::vector<std::vector<int64_t>> table_;
};

}  // namespace

Plan Planner::plan_dhp_waves(const std::vector<SeqShape>& batch, PlanStats* stats) const {
  if (batch.empty()) return Plan("dhp-waves", world_, {}, {}, 0);
  BatchCosts b(*this, batch);
  PlanStats st;
  Solution sol = wave_solution(b, memory_, world_, wave_budget(), st);
  auto groups = barrier_groups(b, sol, world_, par_.ranks_per_node);
  if (stats) *stats = PlanStats{b.evaluations(), st.packings, st.moves};
  return Plan("dhp-waves", world_, batch, std::move(groups), detail::lower_bound(b, world_));
}

int64_t Planner::wave_budget() const {
  // The wave solver gets the first 40% of the budget; the barrier-free search the rest.
  return int64_t(0.4 * par_.planner_budget_ms * double(kEvaluationsPerMs));
}

Plan Planner::plan_dhp(const std::vector<SeqShape>& batch, PlanStats* stats) const {
  if (batch.empty()) return Plan("dhp", world_, {}, {}, 0);
  BatchCosts b(*this, batch);
  const int n = world_;
  // The budget counts from the start, so it bounds the whole planning time; the first
  // complete plan of each kind is always made.
  const int64_t stop_at = int64_t(par_.planner_budget_ms * double(kEvaluationsPerMs));
  PlanStats st;

  // Candidate 1: the packed wave solution (exact degrees per wave), run without barriers.
  // It is the same computation plan_dhp_waves() makes (same inputs, same budget point), so
  // the final makespan is never above the barrier schedule's when that one is node-local.
  Solution sol = wave_solution(b, memory_, n, wave_budget(), st);
  const int rpn = std::clamp(par_.ranks_per_node, 1, n);
  std::vector<PlanGroup> waves = barrier_groups(b, sol, n, par_.ranks_per_node);
  int64_t best_makespan = kNever;
  std::vector<PlanGroup> best;
  // place_wave must let a ring straddle two nodes when a wave's degrees do not bin-pack into
  // nodes; the cost model prices rings of <= a node's ranks at intra-node bandwidth, so such
  // a placement's predicted time is optimistic and it is not used (the barrier reference
  // plan_dhp_waves() keeps it, and its makespan is then not a valid bound for this one).
  const bool node_local = std::none_of(waves.begin(), waves.end(), [&](const PlanGroup& g) {
    return g.cp <= rpn && g.first_rank / rpn != (g.first_rank + g.cp - 1) / rpn;
  });
  if (node_local) best = compact(waves, n, &best_makespan);
  // The same groups list-scheduled wave by wave (slowest first) with node-aware placement.
  {
    std::vector<int> order(waves.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = int(i);
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
      return waves[x].wave != waves[y].wave ? waves[x].wave < waves[y].wave : waves[x].time_ns > waves[y].time_ns;
    });
    std::vector<detail::Job> jobs;
    for (int i : order) jobs.push_back({waves[i].seqs, waves[i].cp, waves[i].cp, waves[i].time_ns});
    int64_t span = 0;
    auto groups = detail::list_schedule(b, jobs, n, par_.ranks_per_node, &span);
    if (span < best_makespan) best_makespan = span, best = std::move(groups);
  }

  // Candidate 2..: moldable list schedules over a grid of targets M = f · lower bound, then
  // a geometric refinement around the best f. Stops when the budget is spent or when a
  // refinement round improves nothing.
  const int64_t lb = std::max<int64_t>(1, detail::lower_bound(b, n));
  Moldable mold(b, n, par_.ranks_per_node);
  std::vector<double> grid = {1.0, 1.03, 1.1, 1.25, 1.5, 2.0, 3.0};
  std::vector<int64_t> spans(grid.size(), kNever);
  int best_i = -1;
  auto target = [&](double f) { return int64_t(std::min(double(kNever), f * double(lb))); };
  auto consider = [&](Moldable::Result&& r) {
    ++st.packings;
    if (r.makespan < best_makespan) {
      best_makespan = r.makespan;
      best = std::move(r.groups);
      return true;
    }
    return false;
  };
  for (size_t i = 0; i < grid.size() && (i == 0 || b.evaluations() < stop_at); ++i) {
    Moldable::Result r = mold.run(target(grid[i]));
    spans[i] = r.makespan;
    if (best_i < 0 || spans[i] < spans[size_t(best_i)]) best_i = int(i);
    consider(std::move(r));
  }
  // Refine: halve the (log) step around the best grid point while it keeps improving.
  if (best_i >= 0) {
    double lo = best_i > 0 ? grid[size_t(best_i - 1)] : grid[0], hi = best_i + 1 < int(grid.size()) ? grid[size_t(best_i + 1)] : grid.back();
    double at = grid[size_t(best_i)];
    int64_t at_span = spans[size_t(best_i)];
    for (int round = 0; round < 6 && b.evaluations() < stop_at; ++round) {
      bool improved = false;
      for (double f : {std::sqrt(lo * at), std::sqrt(at * hi)}) {
        if (f == at || b.evaluations() >= stop_at) continue;
        Moldable::Result r = mold.run(target(f));
        const int64_t span = r.makespan;
        consider(std::move(r));
        if (span < at_span) {
          (f < at ? hi : lo) = at;
          at = f, at_span = span, improved = true;
          break;
        }
        (f < at ? lo : hi) = f;
      }
      if (!improved && round > 0) break;
    }
  }

  std::vector<PlanGroup> out = detail::finish_groups(b, detail::merge_runs(b, memory_, std::move(best), n), n);
  if (stats) *stats = PlanStats{b.evaluations(), st.packings, st.moves};
  return Plan("dhp", n, batch, std::move(out), detail::lower_bound(b, n));
}

}  // namespace dhp
