// The search dhp and pow2 share, and the dhp portfolio (planner.h).
#include <algorithm>
#include <cmath>
#include <set>

#include "core/check.h"
#include "parallel/planner.h"
#include "parallel/planner_detail.h"
#include "parallel/solver.h"

namespace dhp {
namespace detail {
namespace {

struct Group {
  std::vector<int32_t> seqs;
  int dmin = 1;       // memory alone
  int64_t work = 0;   // time on one rank (a packed bin: its sequences' marginal times + fixed)
};

// What a micro-batch pays once on every rank whatever it holds (the decoder's weights
// streamed), in ticks; a sequence's marginal time on one rank is its time alone minus that.
int64_t fixed_ticks(const BatchCosts& b) { return std::llround(b.cost().fixed_seconds() * 1e9); }
int64_t marginal(const BatchCosts& b, int32_t s, int64_t fixed) { return std::max<int64_t>(1, b.work(s) - fixed); }

// Best-fit-decreasing of `small` (longest first) into one-rank bins of at most `target` time
// that fit one rank's memory. Past max_bins bins, what fits in no bin goes to the roomiest
// bin it fits in (bins then grow beyond the target) instead of opening another.
std::vector<Group> pack_bins(const BatchCosts& b, const std::vector<int32_t>& small, int64_t target,
                             int64_t max_bins) {
  const MemoryModel& mem = b.memory();
  const int64_t fixed = fixed_ticks(b);
  struct Bin {
    Group g;
    int64_t act = 0, tokens = 0;
  };
  std::vector<Bin> bins;
  // (target - load, bin), ascending: best fit = the least room that still holds the item.
  thread_local std::vector<std::pair<int64_t, int>> by_room;
  by_room.clear();
  for (int32_t s : small) {
    const int64_t L = b.seq(s).tokens(), a = b.one_rank_bytes(s), w = marginal(b, s, fixed);
    int chosen = -1, tries = 0;
    // Memory rarely binds before time does; a few roomier bins are tried before a new one.
    for (auto it = std::lower_bound(by_room.begin(), by_room.end(), std::pair<int64_t, int>(w, -1));
         it != by_room.end() && tries < 8; ++it, ++tries) {
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
      bins.back().g.work = fixed;
    }
    Bin& bin = bins[chosen];
    bin.g.seqs.push_back(s);
    bin.g.work += w;
    bin.act += a;
    bin.tokens += L;
    const std::pair<int64_t, int> key(target - bin.g.work, chosen);
    by_room.insert(std::lower_bound(by_room.begin(), by_room.end(), key), key);
  }
  b.charge(int64_t(small.size()) / 2 + 1);
  std::vector<Group> out;
  out.reserve(bins.size());
  for (auto& bin : bins) out.push_back(std::move(bin.g));
  return out;
}

// The degree problem of one wave. Degrees outside the set, below the memory minimum, or
// asked for after the budget ran out are "never" (the solver then does without them).
class WaveTimes : public GroupTimes {
 public:
  WaveTimes(const BatchCosts& b, const std::vector<Group>& g, const std::vector<int>& members, Degrees ds,
            int64_t stop_at)
      : b_(b), g_(g), m_(members), ds_(ds), stop_at_(stop_at) {}
  int groups() const override { return int(m_.size()); }
  int64_t time(int k, int d) const override {
    const Group& g = g_[m_[k]];
    if (d < g.dmin || !allowed(ds_, d) || b_.evaluations() >= stop_at_) return kNever;
    return g.seqs.size() == 1 ? b_.time(g.seqs[0], d) : b_.group_time(g.seqs, d);
  }
  int min_degree(int k) const override { return g_[m_[k]].dmin; }

 private:
  const BatchCosts& b_;
  const std::vector<Group>& g_;
  const std::vector<int>& m_;
  Degrees ds_;
  int64_t stop_at_;
};

struct Solution {
  std::vector<Group> groups;
  std::vector<std::vector<int>> waves;   // group indices of each wave
  std::vector<DegreeSolution> degrees;   // per wave, aligned with waves[w]
  int64_t makespan = kNever;             // sum over waves
  int moves = 0;
};

// Stage 1: sequences that need several ranks (memory) or more than `target` alone stay
// alone; the rest are packed into one-rank bins of at most `target` time.
std::vector<Group> pack(const BatchCosts& b, int n, const std::vector<int32_t>& seqs, int64_t target) {
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
  std::stable_sort(small.begin(), small.end(), [&](int32_t x, int32_t y) { return b.work(x) > b.work(y); });
  for (auto& g : pack_bins(b, small, target, std::max<int64_t>(1, n - large_ranks))) groups.push_back(std::move(g));
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

// Exact degrees per wave; false (and makespan kNever) when a wave has no solution, which
// happens when the budget runs out inside the solver.
bool solve_waves(const BatchCosts& b, Solution& sol, int n, Degrees ds, int64_t stop_at) {
  sol.waves = split_waves(sol.groups, n);
  sol.degrees.clear();
  sol.makespan = 0;
  b.charge(int64_t(sol.groups.size()));
  for (const auto& members : sol.waves) {
    WaveTimes t(b, sol.groups, members, ds, stop_at);
    sol.degrees.push_back(solve_degrees(t, n));
    if (!sol.degrees.back().feasible || sol.degrees.back().makespan >= kNever) {
      sol.makespan = kNever;
      return false;
    }
    sol.makespan += sol.degrees.back().makespan;
  }
  return true;
}

// Moves short sequences out of the slowest group of a wave into groups that finish early,
// degrees fixed, while the wave's makespan drops and the budget lasts. A move is judged by
// the sequences' times alone; the groups it touched are priced exactly at the end.
int improve_wave(const BatchCosts& b, Solution& sol, int w, int64_t stop_at) {
  const MemoryModel& mem = b.memory();
  const auto& members = sol.waves[w];
  DegreeSolution& deg = sol.degrees[w];
  std::set<std::pair<int64_t, int>> order;  // (time, k)
  // Activation bytes and tokens of one-rank groups, kept up to date so that a move's memory
  // check costs O(1); wider rings are checked exactly.
  std::vector<int64_t> act(members.size(), 0), tokens(members.size(), 0);
  std::vector<char> dirty(members.size(), 0);
  for (int k = 0; k < int(members.size()); ++k) {
    order.insert({deg.time[k], k});
    for (int32_t s : sol.groups[members[k]].seqs) act[k] += b.one_rank_bytes(s), tokens[k] += b.seq(s).tokens();
  }
  auto fits = [&](int j, int32_t s) {
    const Group& gj = sol.groups[members[j]];
    if (deg.cp[j] == 1) return mem.rank_bytes(act[j] + b.one_rank_bytes(s), tokens[j] + b.seq(s).tokens()) <= mem.capacity();
    std::vector<int32_t> grown = gj.seqs;
    grown.push_back(s);
    return b.group_bytes(grown, deg.cp[j]) <= mem.capacity();
  };
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
        if (score >= best_score || !fits(j, s)) continue;
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
    act[k] -= b.one_rank_bytes(s), tokens[k] -= b.seq(s).tokens();
    act[best_j] += b.one_rank_bytes(s), tokens[best_j] += b.seq(s).tokens();
    dirty[k] = dirty[best_j] = 1;
    order.erase({M, k});
    order.erase({deg.time[best_j], best_j});
    deg.time[k] = best_a, deg.time[best_j] = best_b;
    order.insert({best_a, k});
    order.insert({best_b, best_j});
    ++moves;
    if (order.rbegin()->first < best_makespan) best_makespan = order.rbegin()->first, since_better = 0;
    else ++since_better;
  }
  // Exact prices of the groups that changed.
  int64_t span = 0;
  for (int k = 0; k < int(members.size()); ++k) {
    if (dirty[k]) deg.time[k] = b.group_time(sol.groups[members[k]].seqs, deg.cp[k]);
    span = std::max(span, deg.time[k]);
  }
  sol.makespan += span - deg.makespan;
  deg.makespan = span;
  return moves;
}

// One candidate: pack at `target`, solve, move sequences, re-solve; the better of the two.
Solution attempt(const BatchCosts& b, int n, const std::vector<int32_t>& seqs, int64_t target, Degrees ds,
                 int64_t stop_at) {
  Solution sol;
  sol.groups = pack(b, n, seqs, target);
  if (!solve_waves(b, sol, n, ds, stop_at) || b.evaluations() >= stop_at) return sol;
  for (int w = 0; w < int(sol.waves.size()); ++w) sol.moves += improve_wave(b, sol, w, stop_at);
  if (sol.moves == 0) return sol;
  Solution again;
  again.groups = sol.groups;
  again.moves = sol.moves;
  if (!solve_waves(b, again, n, ds, stop_at)) return sol;
  return again.makespan < sol.makespan ? again : sol;
}

// The best plan of one set of sequences: pack at a rank's fair share, then re-pack at the
// makespan reached (short sequences then fill the time the long groups need anyway and free
// ranks for them) and at a few other bin sizes, while the budget lasts.
Solution optimise(const BatchCosts& b, int n, const std::vector<int32_t>& seqs, Degrees ds, int64_t stop_at,
                  PlanStats& stats) {
  int64_t work = 0;
  for (int32_t s : seqs) work += b.work(s);
  const int64_t fair = std::max<int64_t>(1, (work + n - 1) / n);
  std::set<int64_t> tried = {fair};
  Solution best = attempt(b, n, seqs, fair, ds, stop_at);
  ++stats.packings, stats.moves += best.moves;
  const double scales[] = {0.75, 1.25, 0.5, 1.5};
  size_t next_scale = 0;
  int failures = 0;  // consecutive packings that did not improve: two end the search
  while (b.evaluations() < stop_at && failures < 2 && best.makespan < kNever) {
    int64_t target = best.makespan / int64_t(best.waves.size());
    if (tried.count(target)) {
      if (next_scale == std::size(scales)) break;
      target = int64_t(double(fair) * scales[next_scale++]);
      if (tried.count(target)) continue;
    }
    tried.insert(target);
    Solution cand = attempt(b, n, seqs, target, ds, stop_at);
    ++stats.packings, stats.moves += cand.moves;
    if (cand.makespan < best.makespan) best = std::move(cand), failures = 0;
    else ++failures;
  }
  return best;
}

// Splits the batch into w waves of balanced work (longest first to the lightest wave) whose
// activations, at 90% to leave room for packing, fit the ranks' free memory.
std::vector<std::vector<int32_t>> split_batch(const BatchCosts& b, int n, int w) {
  const MemoryModel& mem = b.memory();
  std::vector<int32_t> order(b.size());
  for (int s = 0; s < b.size(); ++s) order[s] = s;
  std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return b.work(x) > b.work(y); });
  const double room = 0.9 * double(n) * double(mem.capacity() - mem.rank_bytes(0, 1 << 30));
  std::vector<std::vector<int32_t>> parts(w);
  std::vector<int64_t> load(w, 0);
  std::vector<double> bytes(w, 0);
  for (int32_t s : order) {
    const double need = double(b.one_rank_bytes(s));
    int pick = -1;
    for (int i = 0; i < w; ++i)
      if (bytes[i] + need <= room && (pick < 0 || load[i] < load[pick])) pick = i;
    if (pick < 0)  // nothing has room: the per-part planner splits further into waves
      pick = int(std::min_element(bytes.begin(), bytes.end()) - bytes.begin());
    parts[pick].push_back(s);
    load[pick] += b.work(s), bytes[pick] += need;
  }
  b.charge(int64_t(b.size()) * w / 8 + 1);
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
  into.makespan = into.makespan >= kNever || part.makespan >= kNever ? kNever : into.makespan + part.makespan;
}

// The barrier-wave solution (design.md §2.3 as first written): waves of groups whose
// degrees sum to N, each wave solved exactly. makespan kNever when the budget ran out.
Solution wave_solution(const BatchCosts& b, int n, Degrees ds, int64_t stop_at, PlanStats& st) {
  const MemoryModel& mem = b.memory();
  // Waves: at least as many as the activations need, and one more: a long sequence on every
  // rank followed by the short ones can beat running them side by side.
  double need = 0;
  for (int s = 0; s < b.size(); ++s) need += double(b.one_rank_bytes(s));
  const double room = 0.9 * double(n) * double(mem.capacity() - mem.rank_bytes(0, 1 << 30));
  // No more waves than sequences: a wave without a sequence would leave the solution empty
  // (a few sequences that nearly fill all N ranks can ask for more waves than they are).
  const int w0 = std::min(b.size(), std::max(1, int(std::min(1e6, std::ceil(need / std::max(1.0, room))))));
  Solution best;
  for (int w = w0; w <= w0 + 1 && w <= b.size(); ++w) {
    if (b.evaluations() >= stop_at) break;
    // The first split gets half of what is left, so that the second is tried too.
    const int64_t part_stop = w == w0 ? (b.evaluations() + stop_at) / 2 : stop_at;
    Solution total;
    total.makespan = 0;
    for (const auto& part : split_batch(b, n, w)) {
      append(total, optimise(b, n, part, ds, part_stop, st));
      if (total.makespan >= kNever) break;
    }
    if (total.makespan < best.makespan) best = std::move(total);
  }
  return best;
}

// The groups of a wave solution with barrier start times: wave w starts when the slowest
// group of wave w-1 ends. Groups keep the ranks they own (degree), surplus included. A ring
// that place_wave had to lay across two nodes is priced at inter-node bandwidth.
std::vector<PlanGroup> barrier_groups(const BatchCosts& b, const Solution& sol, int n, int ranks_per_node,
                                      bool* node_local) {
  std::vector<PlanGroup> out;
  int64_t start = 0;
  *node_local = true;
  for (int w = 0; w < int(sol.waves.size()); ++w) {
    const DegreeSolution& deg = sol.degrees[w];
    const std::vector<int> first = place_wave(deg.degree, n, ranks_per_node);
    int64_t end = start;
    for (int k = 0; k < int(sol.waves[w].size()); ++k) {
      PlanGroup g;
      g.wave = w;
      g.first_rank = first[k];
      g.ranks = deg.degree[k];
      g.ring_degree = deg.cp[k];
      g.seqs = sol.groups[sol.waves[w][k]].seqs;
      std::sort(g.seqs.begin(), g.seqs.end());
      g.start_ns = start;
      g.time_ns = deg.time[k];
      if (!b.cost().inter(g.ring_degree) && b.spans_nodes(g.first_rank, g.ring_degree)) {
        g.time_ns = b.group_time(g.seqs, g.ring_degree, true);
        *node_local = false;
      }
      end = std::max(end, start + g.time_ns);
      out.push_back(std::move(g));
    }
    start = end;
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
std::vector<PlanGroup> compact(std::vector<PlanGroup> groups, int n) {
  for (PlanGroup& g : groups) g.ranks = g.ring_degree;
  retime_asap(groups, n);  // in wave order
  return groups;
}

// Moldable list scheduling. For a target M each long sequence gets the fewest allowed
// degrees (at least its memory minimum) that bring it under M (the fastest degree if none
// does), which keeps the rank-time sum d·T(d) small while no ring exceeds M; short ones are
// packed into one-rank micro-batches of at most M/4; then everything is list-scheduled
// longest first on rank timelines (Timelines). The makespan is at least max(rank-time / N,
// M-ish), so small M trades area for a short critical path; the search tries a grid of M
// from the lower bound up and refines around the best.
class Moldable {
 public:
  static constexpr int64_t kBinFraction = 4;
  Moldable(const BatchCosts& b, Degrees ds) : b_(b), ds_(ds), n_(b.world()), table_(size_t(b.size())) {
    order_.resize(size_t(b.size()));
    for (int s = 0; s < b.size(); ++s) order_[s] = s;
    std::stable_sort(order_.begin(), order_.end(), [&](int32_t x, int32_t y) { return b.work(x) > b.work(y); });
  }

  // Time of sequence s on d ranks (d >= its memory minimum), each evaluated once.
  int64_t time(int s, int d) {
    if (d == 1) return b_.work(s);
    auto& t = table_[size_t(s)];
    for (const auto& [e, v] : t)
      if (e == d) return v;
    const int64_t v = b_.time(s, d);
    t.push_back({d, v});
    return v;
  }

  // The smallest allowed degree >= the memory minimum whose time is <= M; the fastest if
  // none. Degrees are probed geometrically (doubling), then the crossing is found by
  // bisection (any integer) or the fastest by a ternary search around the best probe.
  std::pair<int, int64_t> degree_for(int s, int64_t M) {
    const int lo = int(round_up(ds_, b_.min_degree(s)));
    DHP_ASSERT(lo <= n_);
    int64_t t_lo = time(s, lo);
    if (t_lo <= M) return {lo, t_lo};
    int best = lo, prev = lo;
    int64_t tb = t_lo;
    for (int64_t d = int64_t(lo) * 2;; d *= 2) {
      if (ds_ == Degrees::Pow2 && d > n_) break;
      const int dd = int(std::min<int64_t>(d, n_));
      if (dd <= prev) break;
      const int64_t t = time(s, dd);
      if (t <= M) {
        if (ds_ == Degrees::Pow2 || dd == prev + 1) return {dd, t};
        // Any integer: the smallest degree in (prev, dd] under M, assuming the time falls
        // monotonically between the two probes (it does until the ring dominates).
        int a = prev, c = dd;
        int64_t tc = t;
        while (c - a > 1) {
          const int mid = a + (c - a) / 2;
          const int64_t tm = time(s, mid);
          if (tm <= M) c = mid, tc = tm;
          else a = mid;
        }
        return {c, tc};
      }
      if (t < tb) best = dd, tb = t;
      else if (ds_ == Degrees::Pow2 || t > tb) break;  // past the fastest degree
      prev = dd;
    }
    if (ds_ == Degrees::Any) {
      // None reaches M: the fastest degree, by a ternary search between the best probe's
      // neighbours (the time is unimodal there: compute falls as 1/d, the ring grows).
      int a = std::max(lo, best / 2), c = std::min(n_, best * 2);
      while (c - a > 2) {
        const int m1 = a + (c - a) / 3, m2 = c - (c - a) / 3;
        if (time(s, m1) <= time(s, m2)) c = m2;
        else a = m1;
      }
      for (int d = a; d <= c; ++d) {
        const int64_t t = time(s, d);
        if (t < tb) best = d, tb = t;
      }
    }
    return {best, tb};
  }

  // The jobs for a target M, list-scheduled; groups before merging. Short sequences (one
  // rank, at most a quarter of the lower bound alone) are packed once into one-rank
  // micro-batches of at most that size; the others get degree_for(M).
  std::vector<PlanGroup> run(int64_t M, int64_t* makespan) {
    const int64_t bin = std::max<int64_t>(1, M / kBinFraction);
    if (bin != bin_) {
      bin_ = bin;
      long_.clear(), bins_.clear();
      std::vector<int32_t> small;
      for (int32_t s : order_) {
        if (b_.min_degree(s) == 1 && b_.work(s) <= bin) small.push_back(s);
        else long_.push_back(s);
      }
      for (auto& g : pack_bins(b_, small, bin, int64_t(1) << 40)) {
        const int64_t t = g.seqs.size() == 1 ? b_.work(g.seqs[0]) : b_.group_time(g.seqs, 1);
        bins_.push_back({std::move(g.seqs), 1, 1, t});
      }
    }
    std::vector<Job> jobs;
    jobs.reserve(long_.size() + bins_.size());
    for (int32_t s : long_) {
      auto [d, t] = degree_for(s, M);
      jobs.push_back({{s}, d, d, t});
    }
    jobs.insert(jobs.end(), bins_.begin(), bins_.end());
    // Longest first; ties: the wider ring first (it needs a whole free block), then the
    // first sequence's index.
    std::stable_sort(jobs.begin(), jobs.end(), [&](const Job& x, const Job& y) {
      if (x.time != y.time) return x.time > y.time;
      if (x.ranks != y.ranks) return x.ranks > y.ranks;
      return x.seqs[0] < y.seqs[0];
    });
    b_.charge(int64_t(jobs.size()) / 4 + 1);
    return list_schedule(b_, jobs, n_, b_.ranks_per_node(), makespan);
  }

 private:
  const BatchCosts& b_;
  Degrees ds_;
  int n_;
  std::vector<int32_t> order_, long_;
  std::vector<Job> bins_;
  int64_t bin_ = -1;
  std::vector<std::vector<std::pair<int, int64_t>>> table_;
};

}  // namespace

Candidate search(const BatchCosts& b, const ParallelConfig& par, Degrees ds, int64_t stop_at, PlanStats& st,
                 int64_t wave_units) {
  const int n = b.world();
  for (int s = 0; s < b.size(); ++s)
    if (round_up(ds, b.min_degree(s)) > n) return Candidate{};  // this degree set cannot hold s
  Candidate best;
  auto consider = [&](std::vector<PlanGroup> groups, const char* name) {
    int64_t span = 0;
    auto merged = merge_runs(b, std::move(groups), n, &span);
    ++st.packings;
    if (span < best.makespan) best = Candidate{std::move(merged), span, name};
    return span;
  };
  Moldable mold(b, ds);
  const int64_t lb = std::max<int64_t>(1, b.lower_bound());
  auto target = [&](double f) { return int64_t(std::min(double(kNever / 2), f * double(lb))); };
  // The first schedule is made whatever the budget: a complete plan always exists.
  int64_t last_cost = 0;
  auto run_mold = [&](double f) {
    const int64_t before = b.evaluations();
    int64_t raw = 0;
    auto groups = mold.run(target(f), &raw);
    const int64_t span = consider(std::move(groups), "moldable");
    last_cost = b.evaluations() - before;
    return span;
  };
  // Optional work starts only when a conservative estimate of it still fits.
  auto affordable = [&] { return b.evaluations() + last_cost * 3 / 2 <= stop_at; };
  std::vector<double> grid = {1.0, 1.03, 1.1, 1.25, 1.5, 2.0, 3.0};
  std::vector<int64_t> spans(grid.size(), kNever);
  spans[0] = run_mold(grid[0]);
  st.floor += last_cost;

  // The packed wave solution (exact degrees per wave), up to 40% of what is left, run
  // without barriers and also list-scheduled wave by wave (slowest first).
  if (b.evaluations() + 3 * last_cost <= stop_at) {
    // Its solver stops hard at wave_stop; turning its solution into schedules costs about
    // two moldable schedules more.
    int64_t wave_stop = b.evaluations() + int64_t(0.4 * double(stop_at - b.evaluations() - 2 * last_cost));
    if (wave_units >= 0 && b.evaluations() + wave_units + 2 * last_cost <= stop_at)
      wave_stop = b.evaluations() + wave_units;
    Solution sol = wave_solution(b, n, ds, wave_stop, st);
    if (sol.makespan < kNever) {
      bool node_local = true;
      std::vector<PlanGroup> waves = barrier_groups(b, sol, n, par.ranks_per_node, &node_local);
      // place_wave may lay a ring across two nodes when a wave's degrees do not bin-pack
      // into nodes; such a ring is slower (priced at inter-node bandwidth), and dhp and
      // pow2 keep rings of at most a node's ranks inside a node, so that form is not used.
      if (node_local) consider(compact(waves, n), "waves");
      std::vector<int> order(waves.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = int(i);
      std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
        return waves[x].wave != waves[y].wave ? waves[x].wave < waves[y].wave : waves[x].time_ns > waves[y].time_ns;
      });
      std::vector<Job> jobs;
      for (int i : order) {
        const PlanGroup& g = waves[i];
        // A ring re-priced across nodes goes back to its node-local price: the list
        // scheduler keeps it inside a node.
        const int64_t t = b.cost().inter(g.ring_degree) || !b.spans_nodes(g.first_rank, g.ring_degree) ? g.time_ns : b.group_time(g.seqs, g.ring_degree);
        jobs.push_back({g.seqs, g.ring_degree, g.ring_degree, t});
      }
      int64_t span = 0;
      consider(list_schedule(b, jobs, n, par.ranks_per_node, &span), "waves-list");
    }
  }

  // The moldable grid of targets M = f · lower bound, then a geometric refinement around the
  // best f. Stops when the budget is spent or when a refinement round improves nothing.
  int best_i = 0;
  for (size_t i = 1; i < grid.size() && affordable(); ++i) {
    spans[i] = run_mold(grid[i]);
    if (spans[i] < spans[size_t(best_i)]) best_i = int(i);
  }
  // Refine between the best grid point's neighbours (the grid holds distinct factors; the
  // first one is tried first because it is the one made whatever the budget).
  double at = grid[size_t(best_i)], lo = 0, hi = 1e300;
  for (size_t i = 0; i < grid.size(); ++i) {
    if (spans[i] >= kNever) continue;
    if (grid[i] < at) lo = std::max(lo, grid[i]);
    if (grid[i] > at) hi = std::min(hi, grid[i]);
  }
  if (lo == 0) lo = at;
  if (hi == 1e300) hi = at;
  int64_t at_span = spans[size_t(best_i)];
  for (int round = 0; round < 6 && affordable(); ++round) {
    bool improved = false;
    for (double f : {std::sqrt(lo * at), std::sqrt(at * hi)}) {
      if (f == at || !affordable()) continue;
      const int64_t span = run_mold(f);
      if (span < at_span) {
        (f < at ? hi : lo) = at;
        at = f, at_span = span, improved = true;
        break;
      }
      (f < at ? lo : hi) = f;
    }
    if (!improved && round > 0) break;
  }
  return best;
}

}  // namespace detail

using detail::BatchCosts;
using detail::Degrees;

namespace {

// Static layouts (static_layout) at the CP degrees that divide the world, hold every
// sequence, and are (pow2_only) or are not powers of two, each unless a lower bound shows it
// cannot beat `best`, while a conservative estimate of its cost fits before stop_at.
void try_static(const BatchCosts& b, detail::Candidate& best, bool pow2_only, int64_t stop_at, PlanStats& st) {
  const int n = b.world();
  int need = 1;
  for (int s = 0; s < b.size(); ++s) need = std::max(need, b.min_degree(s));
  const int64_t estimate = int64_t(b.size()) * 4;  // more than one layout costs
  for (int c = need; c <= n; ++c) {
    if (n % c || std::has_single_bit(unsigned(c)) != pow2_only) continue;
    if (b.evaluations() + b.size() / 2 + 1 > stop_at) break;
    // Every sequence on exactly c ranks.
    double area[2] = {0, 0}, crit = 0;
    for (int s = 0; s < b.size(); ++s) {
      const SeqCost& sc = b.cost_of(s);
      area[0] += b.cost().area_lower_bound(sc, c, 0.0), area[1] += b.cost().area_lower_bound(sc, c, 1.0);
      crit = std::max(crit, b.cost().time_lower_bound(sc, c));
    }
    b.charge(b.size() / 2 + 1);
    const double bound = std::max({area[0] / n, area[1] / n, crit}) * 1e9;
    if (bound >= double(best.makespan)) continue;
    if (b.evaluations() + estimate > stop_at) break;
    detail::Candidate cand = detail::static_layout(b, c);
    ++st.packings;
    if (cand.makespan < best.makespan) best = std::move(cand);
  }
}

// pow2: dhp's search with power-of-two degrees, and the static layouts at power-of-two CP
// degrees (they are power-of-two plans too), within the pow2 share of the budget counted
// from the point the batch was prepared. plan_pow2 and plan_dhp run exactly this.
detail::Candidate pow2_portfolio(const BatchCosts& b, const ParallelConfig& par, int64_t budget, PlanStats& st) {
  const int64_t base = b.evaluations();
  const int64_t share = int64_t(Planner::kPow2Share * double(std::max<int64_t>(0, budget - base)));
  detail::Candidate best = detail::search(b, par, Degrees::Pow2, base + share * 17 / 20, st);
  try_static(b, best, true, base + share, st);
  return best;
}

void require_pow2(const BatchCosts& b) {
  const int n = b.world();
  const int top = int(std::bit_floor(unsigned(n)));
  for (int s = 0; s < b.size(); ++s)
    DHP_CHECK(b.min_degree(s) <= top,
              "pow2 strategy: sample {} ({} tokens) needs {} ranks, more than the largest power of two ({}) in a "
              "world of {}",
              b.seq(s).id, b.seq(s).tokens(), b.min_degree(s), top, n);
}

// The chosen candidate's groups finished (waves, placement, memory) into the Plan, with what
// finishing cost counted in the stats' floor.
Plan finish_plan(const BatchCosts& b, detail::Candidate c, Strategy strategy,
                 const std::vector<SeqShape>& batch, PlanStats& st, PlanStats* stats) {
  const int64_t before = b.evaluations();
  auto groups = detail::finish_groups(b, std::move(c.groups), b.world());
  st.floor += b.evaluations() - before;
  st.evaluations = b.evaluations();
  st.candidate = c.name;
  if (stats) *stats = st;
  return Plan(strategy, b.world(), batch, std::move(groups), b.lower_bound(), c.name, c.placement, st.rule);
}

}  // namespace

// The evaluations the wave solution gets, in plan_dhp_waves and inside plan_dhp alike.
int64_t wave_units(const BatchCosts& b, int64_t budget) {
  return std::max<int64_t>(0, budget - b.evaluations()) / 5;
}

Plan Planner::plan_dhp_waves(const std::vector<SeqShape>& batch, PlanStats* stats) const {
  if (batch.empty()) return Plan(Strategy::dhp_waves, world_, {}, {}, 0);
  BatchCosts b(*this, batch);
  PlanStats st;
  st.budget = budget();
  st.floor = b.evaluations();
  // The reference always completes: when the budget runs out before the first solution,
  // it gets more (this is a reference, not a strategy the trainer runs).
  detail::Solution sol;
  for (int64_t units = wave_units(b, budget());; units = std::max<int64_t>(2 * units, 1024)) {
    sol = detail::wave_solution(b, world_, Degrees::Any, b.evaluations() + units, st);
    if (sol.makespan < kNever) break;
  }
  bool node_local = true;
  auto groups = detail::barrier_groups(b, sol, world_, par_.ranks_per_node, &node_local);
  for (auto& g : groups) g.peak_bytes = b.group_bytes(g.seqs, g.ring_degree);
  st.evaluations = b.evaluations();
  if (stats) *stats = st;
  return Plan(Strategy::dhp_waves, world_, batch, std::move(groups), b.lower_bound(), "waves");
}

Plan Planner::plan_pow2(const std::vector<SeqShape>& batch, PlanStats* stats) const {
  if (batch.empty()) return Plan(Strategy::pow2, world_, {}, {}, 0);
  BatchCosts b(*this, batch);
  require_pow2(b);
  PlanStats st;
  st.budget = budget();
  st.floor = b.evaluations();
  detail::Candidate c = pow2_portfolio(b, par_, budget(), st);
  DHP_ASSERT(c.makespan < kNever);
  return finish_plan(b, std::move(c), Strategy::pow2, batch, st, stats);
}

Plan Planner::plan_dhp(const std::vector<SeqShape>& batch, PlanStats* stats) const {
  if (batch.empty()) return Plan(Strategy::dhp, world_, {}, {}, 0);
  BatchCosts b(*this, batch);
  PlanStats st;
  st.budget = budget();
  st.floor = b.evaluations();
  const int64_t waves = wave_units(b, budget());
  // 1. pow2, exactly as plan_pow2 plans it.
  detail::Candidate best = pow2_portfolio(b, par_, budget(), st);
  best.name = "pow2/" + best.name;
  // 2. The static layout at the other CP degrees that divide the world and hold the batch.
  try_static(b, best, false, b.evaluations() + std::max<int64_t>(0, budget() - b.evaluations()) / 5, st);
  // 3. Any integer degree, then the robust choice between it and the best baseline.
  detail::Candidate any = detail::search(b, par_, Degrees::Any, budget(), st, waves);
  if (any.makespan < kNever) any.name = "any/" + any.name;
  const RobustChoice choice = choose_robustly(cost_, best, any);
  st.rule = choice.rule;
  return finish_plan(b, std::move(choice.any ? any : best), Strategy::dhp, batch, st, stats);
}

double predicted_error(const CostModel& cost, const std::vector<PlanGroup>& groups) {
  double weighted = 0, total = 0;
  for (const PlanGroup& g : groups) {
    const double t = double(g.time_ns) * double(g.ranks);
    weighted += t * cost.relative_error(g.ring_degree), total += t;
  }
  return total > 0 ? weighted / total : 0.0;
}

RingLoad ring_load(const std::vector<PlanGroup>& groups) {
  RingLoad r;
  for (const PlanGroup& g : groups) {
    r.ring_steps += g.ring_degree - 1;
    r.widest = std::max(r.widest, g.ring_degree);
  }
  return r;
}

RobustChoice choose_robustly(const CostModel& cost, const detail::Candidate& base, const detail::Candidate& any) {
  if (any.makespan >= kNever) return {false, "baseline: no plan with other degrees"};
  if (base.makespan >= kNever) return {true, "any degree: the baselines cannot hold the batch"};
  // Never a plan predicted slower than the best baseline.
  if (any.makespan >= base.makespan) return {false, "baseline: predicted fastest"};
  const double lead = double(base.makespan - any.makespan) / double(any.makespan);
  const double margin = std::max(predicted_error(cost, base.groups), predicted_error(cost, any.groups));
  if (lead > margin)
    return {true, fmt::format("faster: {:.1f}% ahead, beyond the model's {:.1f}% error", 100 * lead, 100 * margin)};
  // A near tie: the plan with fewer and smaller rings, whose price has fewer ring steps to
  // get wrong; the faster one when neither has.
  const RingLoad a = ring_load(any.groups), b = ring_load(base.groups);
  const bool base_safer = std::pair(b.ring_steps, b.widest) < std::pair(a.ring_steps, a.widest);
  return {!base_safer, fmt::format("near tie: {:.1f}% ahead within the model's {:.1f}% error, {} has fewer and "
                                   "smaller rings",
                                   100 * lead, 100 * margin, base_safer ? "the baseline" : "the faster plan")};
}

}  // namespace dhp
