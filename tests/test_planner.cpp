// The planner: exactness of the degree solver, plan invariants for every strategy and many
// world sizes (non-powers of two included), determinism, errors, and the cost / memory models.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <random>
#include <set>

#include "data/presets.h"
#include "kernels/check.h"
#include "parallel/cost_model.h"
#include "parallel/planner.h"
#include "parallel/solver.h"

namespace dhp {
namespace {

// Prefix minimum of a table row, the time a group owning d ranks achieves.
int64_t hat(const GroupTimes& t, int k, int d) {
  int64_t best = kNever;
  for (int e = 1; e <= d; ++e) best = std::min(best, t.time(k, e));
  return best;
}

void expect_consistent(const GroupTimes& t, const DegreeSolution& s, int n) {
  ASSERT_TRUE(s.feasible);
  int sum = 0;
  int64_t worst = 0;
  for (int k = 0; k < t.groups(); ++k) {
    sum += s.degree[k];
    ASSERT_GE(s.degree[k], 1);
    ASSERT_LE(s.cp[k], s.degree[k]);
    EXPECT_EQ(s.time[k], hat(t, k, s.degree[k]));
    EXPECT_EQ(s.time[k], t.time(k, s.cp[k]));
    worst = std::max(worst, s.time[k]);
  }
  EXPECT_EQ(sum, n);
  EXPECT_EQ(worst, s.makespan);
}

// Random tables of several shapes: arbitrary (non-monotone), few distinct values (ties),
// infeasible prefixes (memory), and decreasing-then-rising (ring overhead).
std::vector<std::vector<int64_t>> random_table(std::mt19937_64& rng, int K, int n, int shape) {
  std::vector<std::vector<int64_t>> t(K, std::vector<int64_t>(n));
  for (int k = 0; k < K; ++k) {
    const int64_t work = 1 + int64_t(rng() % 1000);
    const int blocked = shape == 2 ? int(rng() % n) : 0;
    for (int d = 1; d <= n; ++d) {
      int64_t v;
      switch (shape) {
        case 0: v = 1 + int64_t(rng() % 1000); break;
        case 1: v = 1 + int64_t(rng() % 4); break;
        case 2: v = work / d + 1; break;
        default: v = work / d + int64_t(rng() % 7) * (d - 1) + 1; break;
      }
      t[k][d - 1] = d <= blocked ? kNever : v;
    }
  }
  return t;
}

TEST(Solver, ExactAgainstExhaustiveOnSmallInstances) {
  std::mt19937_64 rng(7);
  int checked = 0;
  for (int iter = 0; iter < 6000; ++iter) {
    const int n = 1 + int(rng() % 8);
    const int K = 1 + int(rng() % std::min(6, n));
    TableTimes t(random_table(rng, K, n, iter % 4));
    auto ex = solve_degrees_exhaustive(t, n);
    auto dp = solve_degrees_dp(t, n);
    auto fast = solve_degrees(t, n);
    ASSERT_EQ(ex.feasible, fast.feasible) << "iter " << iter;
    ASSERT_EQ(ex.feasible, dp.feasible) << "iter " << iter;
    if (!ex.feasible) continue;
    ++checked;
    ASSERT_EQ(ex.makespan, dp.makespan) << "iter " << iter;
    ASSERT_EQ(ex.makespan, fast.makespan) << "iter " << iter;
    expect_consistent(t, fast, n);
    expect_consistent(t, dp, n);
  }
  EXPECT_GT(checked, 4000);
}

TEST(Solver, MatchesPlainDpOnLargerInstances) {
  std::mt19937_64 rng(11);
  for (int iter = 0; iter < 300; ++iter) {
    const int n = 8 + int(rng() % 57);
    const int K = 1 + int(rng() % std::min(24, n));
    TableTimes t(random_table(rng, K, n, iter % 4));
    auto dp = solve_degrees_dp(t, n);
    auto fast = solve_degrees(t, n);
    ASSERT_EQ(dp.feasible, fast.feasible);
    if (!dp.feasible) continue;
    ASSERT_EQ(dp.makespan, fast.makespan) << "iter " << iter << " n " << n << " K " << K;
    expect_consistent(t, fast, n);
  }
}

TEST(Solver, InfeasibleWhenGroupsOutnumberRanks) {
  TableTimes t({{1, 1}, {1, 1}, {1, 1}});
  EXPECT_FALSE(solve_degrees(t, 2).feasible);
  EXPECT_FALSE(solve_degrees_dp(t, 2).feasible);
}

TEST(Zigzag, RangesTileEverySequenceWithoutPadding) {
  for (int64_t L : {1, 2, 3, 5, 7, 8, 13, 64, 100, 1001}) {
    for (int c : {1, 2, 3, 5, 6, 7, 8, 12}) {
      std::vector<std::pair<int64_t, int64_t>> all;
      for (int i = 0; i < c; ++i) {
        auto r = zigzag_ranges(L, c, i);
        int64_t held = 0;
        for (auto [b, e] : r) held += e - b, all.push_back({b, e});
        EXPECT_GE(held, L / c) << L << " " << c << " " << i;
        EXPECT_LE(held, (L + c - 1) / c) << L << " " << c << " " << i;
        if (L >= 2 * c) {
          ASSERT_EQ(r.size(), 2u);
          EXPECT_EQ(r[0].first, (L / (2 * c)) * i + std::min<int64_t>(i, L % (2 * c)));
        }
      }
      std::sort(all.begin(), all.end());
      int64_t at = 0;
      for (auto [b, e] : all) {
        EXPECT_EQ(b, at);
        at = e;
      }
      EXPECT_EQ(at, L);
    }
  }
}

std::vector<SeqShape> preset_batch(const std::string& name, int count, uint64_t seed) {
  std::vector<SeqShape> out;
  for (const auto& s : preset_samples(preset_params(name), 0, count, seed, 28))
    out.push_back({s.id, s.text_tokens, s.vision_tokens, int32_t(s.images.size())});
  return out;
}

std::vector<SeqShape> random_batch(std::mt19937_64& rng, int count, int64_t longest) {
  std::vector<SeqShape> out;
  for (int i = 0; i < count; ++i) {
    const bool tail = rng() % 10 == 0;
    const int64_t L = 1 + int64_t(rng() % uint64_t(tail ? longest : std::max<int64_t>(2, longest / 50)));
    const int64_t v = int64_t(rng() % uint64_t(L));
    out.push_back({1000 + i, L - v, v, int32_t(v > 0 ? 1 + rng() % 4 : 0)});
  }
  return out;
}

ParallelConfig par_for(const std::string& device, double gb, int rpn, bool recompute = false) {
  ParallelConfig p;
  p.recompute = recompute;
  p.device = device;
  p.memory_gb = gb;
  p.ranks_per_node = rpn;
  return p;
}

void expect_valid(const Planner& planner, const Plan& plan, const std::vector<SeqShape>& batch) {
  auto bad = planner.check(plan);
  EXPECT_TRUE(bad.empty()) << plan.strategy() << " N=" << planner.world() << ": " << bad.size()
                           << " violations, first: " << (bad.empty() ? "" : bad[0]);
  EXPECT_EQ(plan.seqs().size(), batch.size());
  // Rounding every sequence's time to whole nanoseconds may move the bound by up to a
  // nanosecond per sequence; anything beyond that would be a wrong bound or a wrong plan.
  EXPECT_GE(plan.makespan_ns() + int64_t(batch.size()), plan.summary().lower_bound_ns) << plan.strategy();
}

TEST(Planner, EveryStrategyGivesValidPlansOnManyWorlds) {
  const ModelConfig seven = model_profile("7b");
  std::mt19937_64 rng(3);
  for (int n : {1, 2, 3, 5, 6, 7, 8, 12, 16, 24}) {
    // A 7B model's states need several 141 GiB devices to shard over; recompute keeps the
    // 64k-token samples within reach of small worlds.
    Planner gpu(seven, par_for("h200", 141, 8, true), std::max(n, 3));
    Planner cpu(ModelConfig{}, par_for("cpu", 2, 4), n);
    for (const char* preset : {"captions", "mixed", "video-longtail"}) {
      auto batch = preset_batch(preset, 8 * n, 100 + n);
      for (const Planner* p : {&gpu, &cpu}) {
        expect_valid(*p, p->plan_dhp(batch), batch);
        expect_valid(*p, p->plan_static(batch, 0), batch);
        if (p->static_min_cp(batch) <= int(std::bit_floor(unsigned(n)))) expect_valid(*p, p->plan_pow2(batch), batch);
      }
    }
    auto batch = random_batch(rng, 3 * n, 4000);
    expect_valid(cpu, cpu.plan_dhp(batch), batch);
    expect_valid(cpu, cpu.plan_static(batch, 0), batch);
  }
}

TEST(Planner, StaticTriesEveryDivisor) {
  const int n = 12;
  Planner p(model_profile("7b"), par_for("h100", 80, 8), n);
  auto batch = preset_batch("video-longtail", 96, 5);
  const int cmin = p.static_min_cp(batch);
  for (int c = cmin; c <= n; ++c) {
    if (n % c) {
      EXPECT_THROW(p.plan_static(batch, c), Error);
      continue;
    }
    auto plan = p.plan_static(batch, c);
    expect_valid(p, plan, batch);
    for (const auto& g : plan.groups()) EXPECT_EQ(g.degree, c);
  }
}

TEST(Planner, SameInputsGiveTheSamePlan) {
  for (int n : {3, 5, 6, 7, 12, 64}) {
    auto batch = preset_batch("video-longtail", 8 * n, 42);
    Planner a(model_profile("7b"), par_for("h200", 141, 8), n);
    Planner b(model_profile("7b"), par_for("h200", 141, 8), n);
    for (const std::string s : {"dhp", "static", "pow2"}) {
      ParallelConfig par = par_for("h200", 141, 8);
      par.strategy = s;
      Planner c(model_profile("7b"), par, n);
      auto p1 = c.plan(batch), p2 = c.plan(batch);
      EXPECT_TRUE(p1 == p2) << s;
      EXPECT_EQ(p1.to_json().dump(), p2.to_json().dump()) << s;
    }
    EXPECT_EQ(a.plan_dhp(batch).to_json().dump(), b.plan_dhp(batch).to_json().dump());
  }
}

TEST(Planner, DhpUsesAnyIntegerDegree) {
  std::set<int> degrees;
  for (int n : {3, 5, 6, 7, 12}) {
    // Nodes of 16 ranks, so that no ring leaves NVLink and the whole world is the best ring.
    Planner p(model_profile("7b"), par_for("h200", 141, 16, true), n);
    // One long document that wants every rank, next to short captions.
    std::vector<SeqShape> batch = {{1, 30000, 2000, 1}};
    auto plan = p.plan_dhp(batch);
    expect_valid(p, plan, batch);
    ASSERT_EQ(plan.groups().size(), 1u);
    EXPECT_EQ(plan.groups()[0].degree, n);
    degrees.insert(plan.groups()[0].cp);
    auto mixed = preset_batch("video-longtail", 6 * n, 9);
    auto plan2 = p.plan_dhp(mixed);
    expect_valid(p, plan2, mixed);
    for (const auto& g : plan2.groups()) degrees.insert(g.degree);
  }
  // Non-powers of two must be chosen when they are best (a lone long sequence on 3..12).
  for (int d : {3, 5, 6, 7, 12}) EXPECT_TRUE(degrees.count(d)) << d;
}

// The barrier-free schedule, re-derived here independently of Planner::check: every rank
// runs its groups in start order without overlap, each group starts exactly when the last
// of its ranks is free, its wave is its micro-step depth, and the makespan is the latest
// end over the ranks.
void expect_as_soon_as_possible(const Plan& plan) {
  const int n = plan.world();
  const auto& groups = plan.groups();
  std::vector<int> order(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) order[g] = int(g);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return std::pair(groups[a].start_ns, groups[a].first_rank) < std::pair(groups[b].start_ns, groups[b].first_rank);
  });
  std::vector<int64_t> free_at(size_t(n), 0);
  std::vector<int> depth(size_t(n), 0);
  for (int g : order) {
    const PlanGroup& x = groups[g];
    int64_t ready = 0;
    int wave = 0;
    for (int r = x.first_rank; r < x.first_rank + x.degree; ++r) {
      ASSERT_LE(free_at[r], x.start_ns) << plan.strategy() << " rank " << r << " group " << g;
      ready = std::max(ready, free_at[r]);
      wave = std::max(wave, depth[r]);
    }
    EXPECT_EQ(x.start_ns, ready) << plan.strategy() << " group " << g;
    EXPECT_EQ(x.wave, wave) << plan.strategy() << " group " << g;
    for (int r = x.first_rank; r < x.first_rank + x.degree; ++r) free_at[r] = x.start_ns + x.time_ns, depth[r] = x.wave + 1;
  }
  EXPECT_EQ(plan.makespan_ns(), *std::max_element(free_at.begin(), free_at.end())) << plan.strategy();
}

TEST(Schedule, BarrierFreeInvariantsOnRandomInstances) {
  std::mt19937_64 rng(17);
  int compared = 0;
  for (int n : {1, 2, 3, 5, 6, 7, 8, 12, 16}) {
    for (int iter = 0; iter < 6; ++iter) {
      // Tight memory on the tiny model (long samples need several ranks, several micro-steps
      // per rank) and a 7B model without recompute (memory-bound) on odd node sizes.
      const int rpn = 1 + int(rng() % 8);
      Planner tight(ModelConfig{}, par_for("cpu", 0.4, rpn), n);
      const int64_t room = tight.memory().capacity() - tight.memory().rank_bytes(0, 1 << 20);
      const int64_t worst = tight.memory().bytes_per_token() + 4 * tight.memory().bytes_per_patch();
      auto batch = random_batch(rng, 5 + int(rng() % (20 * n)), std::max<int64_t>(2, int64_t(n) * room / worst / 3));
      // 7B states need a few 141 GiB devices; samples that fit on no ring of this world are
      // dropped (their error is tested elsewhere), the rest keep memory binding.
      Planner seven(model_profile("7b"), par_for("h200", 141, rpn), std::max(n, 3));
      std::vector<SeqShape> longtail;
      for (const auto& s : preset_batch("video-longtail", 4 * std::max(n, 3), 1000 + iter * 31 + n))
        if (seven.memory().min_degree({&s}, seven.world()) <= seven.world()) longtail.push_back(s);
      for (auto [p, b] : {std::pair{&tight, &batch}, std::pair{&seven, &longtail}}) {
        int need = 1;
        for (const auto& s : *b) need = std::max(need, p->min_degree(s));
        const Plan dhp = p->plan_dhp(*b), waves = p->plan_dhp_waves(*b);
        expect_valid(*p, dhp, *b);
        expect_valid(*p, waves, *b);
        expect_as_soon_as_possible(dhp);
        // Never worse than the barrier schedule of the same wave solution, whenever that one
        // is priced correctly (no ring of <= a node's ranks straddling two nodes).
        const bool node_local = std::none_of(waves.groups().begin(), waves.groups().end(), [&](const PlanGroup& g) {
          return g.cp <= rpn && g.first_rank / rpn != (g.first_rank + g.cp - 1) / rpn;
        });
        if (node_local) {
          ++compared;
          EXPECT_LE(dhp.makespan_ns(), waves.makespan_ns()) << "N=" << n << " iter " << iter;
        }
        for (const auto& g : dhp.groups()) {
          EXPECT_LE(g.peak_bytes, p->memory().capacity());
          // A ring of at most a node's ranks stays inside one node, as the cost model assumes.
          if (g.cp <= rpn) {
            EXPECT_EQ(g.first_rank / rpn, (g.first_rank + g.cp - 1) / rpn) << "N=" << n;
          }
        }
        if (need <= int(std::bit_floor(unsigned(p->world())))) {
          const Plan pow2 = p->plan_pow2(*b);
          expect_valid(*p, pow2, *b);
          expect_as_soon_as_possible(pow2);
        }
        expect_as_soon_as_possible(p->plan_static(*b, 0));
        // Deterministic: the same inputs give the same plan, serialised byte for byte.
        EXPECT_EQ(p->plan_dhp(*b).to_json().dump(), dhp.to_json().dump());
        EXPECT_EQ(p->plan_dhp_waves(*b).to_json().dump(), waves.to_json().dump());
      }
    }
  }
  EXPECT_GT(compared, 90);  // of 108 instances (103 today); the rest straddle nodes in the barrier plan
}

TEST(Schedule, BarrierFreeBeatsWavesWhenMemoryForcesMicroSteps) {
  // 7B without recompute on 80 GiB: about 9.5k tokens of activations per rank, so the
  // long-tail batch needs several micro-steps. Barriers make every rank wait for the slowest
  // group of each wave; the barrier-free schedule only synchronises at the end.
  Planner p(model_profile("7b"), par_for("h100", 80, 8), 64);
  auto batch = preset_batch("video-longtail", 512, 7);
  const Plan dhp = p.plan_dhp(batch), waves = p.plan_dhp_waves(batch);
  expect_valid(p, dhp, batch);
  expect_as_soon_as_possible(dhp);
  EXPECT_GT(dhp.summary().waves, 1);
  EXPECT_LT(dhp.makespan_ns(), waves.makespan_ns());
  EXPECT_LE(double(dhp.makespan_ns()), 1.05 * double(dhp.summary().lower_bound_ns));
}

TEST(Schedule, CheckRejectsBrokenSchedules) {
  Planner p(ModelConfig{}, par_for("cpu", 2, 4), 4);
  std::vector<SeqShape> seqs = {{1, 100, 0, 0}, {2, 50, 0, 0}};
  auto group = [](int wave, int first, int degree, std::vector<int32_t> s, int64_t start, int64_t time) {
    PlanGroup g;
    g.wave = wave, g.first_rank = first, g.degree = degree, g.cp = degree, g.seqs = std::move(s);
    g.start_ns = start, g.time_ns = time, g.peak_bytes = int64_t(1) << 40;
    return g;
  };
  // Valid: sequence 1 on ranks 0-1, then sequence 2 on rank 1 as soon as it is free.
  EXPECT_TRUE(p.check(Plan("dhp", 4, seqs, {group(0, 0, 2, {0}, 0, 10), group(1, 1, 1, {1}, 10, 5)}, 0)).empty());
  // Overlap on rank 1.
  EXPECT_FALSE(p.check(Plan("dhp", 4, seqs, {group(0, 0, 2, {0}, 0, 10), group(1, 1, 1, {1}, 5, 5)}, 0)).empty());
  // Idle gap: the group could have started at 10.
  EXPECT_FALSE(p.check(Plan("dhp", 4, seqs, {group(0, 0, 2, {0}, 0, 10), group(1, 1, 1, {1}, 12, 5)}, 0)).empty());
  // Wrong micro-step depth.
  EXPECT_FALSE(p.check(Plan("dhp", 4, seqs, {group(0, 0, 2, {0}, 0, 10), group(0, 1, 1, {1}, 10, 5)}, 0)).empty());
  // A sequence twice, another missing.
  EXPECT_FALSE(p.check(Plan("dhp", 4, seqs, {group(0, 0, 2, {0}, 0, 10), group(1, 1, 1, {0}, 10, 5)}, 0)).empty());
  // Barrier reference: a wave whose degrees do not sum to the world.
  EXPECT_FALSE(p.check(Plan("dhp-waves", 4, seqs, {group(0, 0, 2, {0}, 0, 10), group(1, 0, 4, {1}, 10, 5)}, 0)).empty());
  EXPECT_TRUE(p.check(Plan("dhp-waves", 4, seqs, {group(0, 0, 4, {0}, 0, 10), group(1, 0, 4, {1}, 10, 5)}, 0)).empty());
}

TEST(Planner, MemoryForcesWavesAndLargeDegrees) {
  // 2 GiB per rank on the tiny CPU model: long samples need several ranks and the batch
  // does not fit in one wave.
  for (int n : {3, 5, 7, 12}) {
    ParallelConfig par = par_for("cpu", 0.4, 4);
    Planner p(ModelConfig{}, par, n);
    std::mt19937_64 rng(n);
    // The longest samples need up to three ranks' activation memory.
    const int64_t room = p.memory().capacity() - p.memory().rank_bytes(0, 1 << 20);
    const int64_t worst = p.memory().bytes_per_token() + 4 * p.memory().bytes_per_patch();
    auto batch = random_batch(rng, 40 * n, 5 * room / worst / 2);
    int need = 1;
    for (const auto& s : batch) need = std::max(need, p.min_degree(s));
    auto plan = p.plan_dhp(batch);
    expect_valid(p, plan, batch);
    EXPECT_GT(plan.summary().waves, 1) << n;
    EXPECT_GT(need, 1) << n;
    expect_valid(p, p.plan_static(batch, 0), batch);
  }
}

TEST(Planner, FewSequencesThatFillAlmostAllMemoryAreAllPlanned) {
  // One sequence whose activations need ~95% of all ranks' free memory: the wave estimate
  // (activations over 90% of the free memory) asks for 2 waves of a 1-sequence batch. The
  // wave solution must still hold the sequence instead of coming back empty.
  for (int n : {2, 3, 4}) {
    Planner p(ModelConfig{}, par_for("cpu", 0.4, 4), n);
    const int64_t room = p.memory().capacity() - p.memory().rank_bytes(0, 1 << 30);
    const int64_t L = int64_t(0.95 * double(n) * double(room)) / p.memory().bytes_per_token();
    std::vector<SeqShape> batch = {{7, L, 0, 0}};
    ASSERT_LE(p.min_degree(batch[0]), n);
    expect_valid(p, p.plan_dhp(batch), batch);
    expect_valid(p, p.plan_dhp_waves(batch), batch);
  }
}

TEST(Planner, TooLongSequenceNamesTheSample) {
  Planner p(model_profile("7b"), par_for("h100", 80, 8), 5);
  std::vector<SeqShape> batch = preset_batch("captions", 20, 1);
  batch.push_back({4242, 3'000'000, 0, 0});
  for (auto f : {&Planner::plan_dhp, &Planner::plan_pow2}) {
    try {
      (p.*f)(batch, nullptr);
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("sample 4242"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(p.plan_static(batch, 0), Error);
}

TEST(Placement, ContiguousPartitionAndNodeAware) {
  std::mt19937_64 rng(5);
  for (int iter = 0; iter < 2000; ++iter) {
    const int n = 1 + int(rng() % 40), rpn = 1 + int(rng() % 9);
    std::vector<int> deg;
    for (int left = n; left > 0;) {
      int d = 1 + int(rng() % std::min(left, 12));
      deg.push_back(d), left -= d;
    }
    auto first = place_wave(deg, n, rpn);
    std::vector<int> owner(n, -1);
    for (size_t k = 0; k < deg.size(); ++k)
      for (int r = first[k]; r < first[k] + deg[k]; ++r) {
        ASSERT_GE(r, 0);
        ASSERT_LT(r, n);
        ASSERT_EQ(owner[r], -1);
        owner[r] = int(k);
      }
  }
  // Groups that divide the node size never straddle a node boundary.
  auto first = place_wave({2, 4, 2, 8, 1, 1, 4, 2}, 24, 8);
  const std::vector<int> deg = {2, 4, 2, 8, 1, 1, 4, 2};
  for (size_t k = 0; k < deg.size(); ++k) EXPECT_EQ(first[k] / 8, (first[k] + deg[k] - 1) / 8) << k;
}

TEST(CostModel, PairsAndShape) {
  CostModel m(ModelConfig{}, device_profile("cpu"), 8);
  SeqShape s{0, 10, 8, 2};  // two images of 4 decoder tokens = 16 patches each (m = 2)
  EXPECT_EQ(CostModel::decoder_pairs(s), 18.0 * 19 / 2);
  EXPECT_EQ(m.vision_pairs(s), 2.0 * 16 * 16);
  SeqShape odd{0, 0, 9, 2};   // 5 + 4 tokens
  EXPECT_EQ(m.vision_pairs(odd), 20.0 * 20 + 16.0 * 16);
  // Long sequences get faster with more ranks; a one-token sequence only pays the ring.
  CostModel big(model_profile("7b"), device_profile("h100"), 8);
  auto c = big.prepare({0, 20000, 12000, 1});
  EXPECT_LT(big.ticks(c, 8), big.ticks(c, 4));
  EXPECT_LT(big.ticks(c, 4), big.ticks(c, 2));
  auto tiny = big.prepare({0, 1, 0, 0});
  EXPECT_GT(big.ticks(tiny, 8), big.ticks(tiny, 1));
  // The features reproduce the time exactly under the current coefficients.
  for (int d : {1, 2, 3, 7, 8, 9, 16}) {
    auto f = big.features(c, d);
    const auto& k = big.coeffs();
    double t = f[0] * k.sec_per_flop + f[1] * k.sec_per_att_flop + f[2] * k.sec_per_byte_intra +
               f[3] * k.sec_per_byte_inter + f[4] * k.sec_per_step + f[5] * k.sec_per_seq;
    EXPECT_NEAR(t, big.seconds(c, d), 1e-9 * t) << d;
  }
}

TEST(CostModel, RefitRecoversCoefficientsFromTimings) {
  CostModel truth(ModelConfig{}, device_profile("cpu"), 4);
  CostCoeffs k = truth.coeffs();
  k.sec_per_flop *= 1.7, k.sec_per_att_flop *= 0.6, k.sec_per_byte_intra *= 2.5;
  k.sec_per_byte_inter *= 0.8, k.sec_per_step *= 3.0, k.sec_per_seq *= 0.5;
  truth.set_coeffs(k);
  std::mt19937_64 rng(1);
  std::vector<TimingObservation> obs;
  for (int i = 0; i < 300; ++i) {
    TimingObservation o;
    o.degree = 1 + int(rng() % 8);
    const int count = 1 + int(rng() % 3);
    for (int j = 0; j < count; ++j) {
      const int64_t L = 1 + int64_t(rng() % (rng() % 2 ? 200 : 20000));
      const int64_t v = int64_t(rng() % uint64_t(L));
      o.seqs.push_back({j, L - v, v, int32_t(v ? 1 : 0)});
    }
    for (const auto& s : o.seqs) o.seconds += truth.seconds(truth.prepare(s), o.degree);
    obs.push_back(o);
  }
  CostModel prior(ModelConfig{}, device_profile("cpu"), 4);
  CostCoeffs fit = refit(prior, obs, 1e-9);
  EXPECT_NEAR(fit.sec_per_flop / k.sec_per_flop, 1.0, 0.02);
  EXPECT_NEAR(fit.sec_per_att_flop / k.sec_per_att_flop, 1.0, 0.02);
  EXPECT_NEAR(fit.sec_per_seq / k.sec_per_seq, 1.0, 0.02);
  EXPECT_NEAR(fit.sec_per_step / k.sec_per_step, 1.0, 0.05);
  EXPECT_NEAR(fit.sec_per_byte_intra / k.sec_per_byte_intra, 1.0, 0.05);
  EXPECT_NEAR(fit.sec_per_byte_inter / k.sec_per_byte_inter, 1.0, 0.05);
}

TEST(MemoryModel, ZeroOneAndMonotoneInDegree) {
  const ModelConfig m = model_profile("7b");
  const DeviceProfile dev = device_profile("h100");
  MemoryModel one(m, dev, 1, 80, true), many(m, dev, 64, 80, true), plain(m, dev, 64, 80, false);
  EXPECT_LT(many.static_bytes(), one.static_bytes());
  EXPECT_EQ(one.static_bytes(), plain.static_bytes());
  EXPECT_GT(many.parameters(), int64_t(7e9));
  EXPECT_LT(many.parameters(), int64_t(10e9));
  SeqShape s{0, 40000, 20000, 4};
  int64_t prev = many.group_bytes({&s}, 1);
  for (int c = 2; c <= 64; ++c) {
    const int64_t b = many.group_bytes({&s}, c);
    EXPECT_LE(b, prev);
    prev = b;
  }
  const int d = many.min_degree({&s}, 64);
  ASSERT_LE(d, 64);
  EXPECT_LE(many.group_bytes({&s}, d), many.capacity());
  if (d > 1) {
    EXPECT_GT(many.group_bytes({&s}, d - 1), many.capacity());
  }
}

TEST(Presets, DeterministicLongTailed) {
  for (const auto& name : preset_names()) {
    const auto p = preset_params(name);
    auto a = preset_samples(p, 0, 3000, 9, 28);
    auto b = preset_samples(p, 1500, 10, 9, 28);
    for (int i = 0; i < 10; ++i) {
      EXPECT_EQ(a[1500 + i].tokens(), b[i].tokens());
      EXPECT_EQ(a[1500 + i].images.size(), b[i].images.size());
    }
    std::vector<int64_t> len;
    for (const auto& s : a) {
      int64_t v = 0;
      for (const auto& im : s.images) {
        EXPECT_EQ(im.height % 28, 0);
        EXPECT_EQ(im.width % 28, 0);
        EXPECT_EQ(im.tokens, int64_t(im.height / 28) * (im.width / 28));
        v += im.tokens;
      }
      EXPECT_EQ(v, s.vision_tokens);
      EXPECT_LE(s.tokens(), p.max_tokens);
      EXPECT_GE(s.loss_tokens, 1);
      EXPECT_LE(s.loss_tokens, s.text_tokens);
      len.push_back(s.tokens());
    }
    std::sort(len.begin(), len.end());
    const double median = double(len[len.size() / 2]), top = double(len.back());
    if (name == "video-longtail") {
      EXPECT_LT(median, 600);
      EXPECT_GT(top / median, 50);
    }
    if (name == "captions") {
      EXPECT_LT(median, 600);
    }
  }
  EXPECT_THROW(preset_params("nope"), std::invalid_argument);
}

}  // namespace
}  // namespace dhp
