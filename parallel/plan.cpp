#include "parallel/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <nlohmann/json.hpp>

#include "core/check.h"

namespace dhp {

std::vector<std::pair<int64_t, int64_t>> zigzag_ranges(int64_t length, int c, int i) {
  DHP_ASSERT(c >= 1 && i >= 0 && i < c && length >= 0);
  const int64_t chunks = 2 * int64_t(c), base = length / chunks, extra = length % chunks;
  auto begin = [&](int64_t j) { return j * base + std::min(j, extra); };
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t j : {int64_t(i), chunks - 1 - i}) {
    const int64_t b = begin(j), e = begin(j + 1);
    if (e > b) out.emplace_back(b, e);
  }
  return out;
}

int64_t retime_asap(std::vector<PlanGroup>& groups, int world) {
  std::vector<int64_t> free_at(size_t(world), 0);
  int64_t makespan = 0;
  for (PlanGroup& g : groups) {
    int64_t start = 0;
    for (int r = g.first_rank; r < g.first_rank + g.ranks; ++r) start = std::max(start, free_at[size_t(r)]);
    g.start_ns = start;
    for (int r = g.first_rank; r < g.first_rank + g.ranks; ++r) free_at[size_t(r)] = start + g.time_ns;
    makespan = std::max(makespan, start + g.time_ns);
  }
  return makespan;
}

Plan::Plan(Strategy strategy, int world, std::vector<SeqShape> seqs, std::vector<PlanGroup> groups,
           int64_t lower_bound_ns, std::string candidate, std::optional<Strategy> placement, std::string rule)
    : strategy_(strategy), placement_(placement.value_or(strategy)), barriers_(traits(strategy).barriers),
      candidate_(std::move(candidate)), rule_(std::move(rule)), world_(world), seqs_(std::move(seqs)), groups_(std::move(groups)) {
  summary_.lower_bound_ns = lower_bound_ns;
  summary_.groups = int(groups_.size());
  int64_t busy = 0;
  for (const auto& g : groups_) {
    DHP_ASSERT(g.ranks >= 1 && g.ring_degree >= 1 && g.ring_degree <= g.ranks);
    DHP_ASSERT(g.first_rank >= 0 && g.first_rank + g.ranks <= world_);
    summary_.makespan_ns = std::max(summary_.makespan_ns, g.start_ns + g.time_ns);
    summary_.waves = std::max(summary_.waves, g.wave + 1);
    busy += g.time_ns * g.ring_degree;
  }
  const double total = double(summary_.makespan_ns) * world_;
  summary_.idle_fraction = total > 0 ? 1.0 - double(busy) / total : 0.0;
}

Plan Plan::with_barriers() const {
  if (barriers_) return *this;
  std::vector<int64_t> wave_end(size_t(summary_.waves), 0);
  std::vector<PlanGroup> groups = groups_;
  for (int w = 0; w < summary_.waves; ++w)
    for (PlanGroup& g : groups)
      if (g.wave == w) {
        g.start_ns = w == 0 ? 0 : wave_end[size_t(w) - 1];
        wave_end[size_t(w)] = std::max(wave_end[size_t(w)], g.start_ns + g.time_ns);
      }
  Plan p(strategy_, world_, seqs_, std::move(groups), summary_.lower_bound_ns, candidate_, placement_, rule_);
  p.barriers_ = true;
  return p;
}

std::vector<TokenRange> Plan::ranges(int g, int rank) const {
  const PlanGroup& grp = groups_.at(size_t(g));
  std::vector<TokenRange> out;
  const int i = rank - grp.first_rank;
  if (i < 0 || i >= grp.ring_degree) return out;
  for (int32_t s : grp.seqs)
    for (auto [b, e] : zigzag_ranges(seqs_[size_t(s)].tokens(), grp.ring_degree, i)) out.push_back({s, b, e});
  return out;
}

std::vector<int> Plan::groups_of(int rank) const {
  std::vector<int> out;
  for (int g = 0; g < int(groups_.size()); ++g)
    if (rank >= groups_[g].first_rank && rank < groups_[g].first_rank + groups_[g].ranks) out.push_back(g);
  std::stable_sort(out.begin(), out.end(),
                   [&](int a, int b) { return groups_[a].start_ns < groups_[b].start_ns; });
  return out;
}

nlohmann::json Plan::to_json() const {
  nlohmann::json j;
  j["strategy"] = strategy_name(strategy_);
  if (!candidate_.empty()) j["candidate"] = candidate_;
  if (!rule_.empty()) j["rule"] = rule_;
  j["world"] = world_;
  j["makespan_ns"] = summary_.makespan_ns;
  j["lower_bound_ns"] = summary_.lower_bound_ns;
  j["waves"] = summary_.waves;
  j["idle_fraction"] = summary_.idle_fraction;
  auto& groups = j["groups"] = nlohmann::json::array();
  for (int g = 0; g < int(groups_.size()); ++g) {
    const PlanGroup& grp = groups_[g];
    nlohmann::json o;
    o["wave"] = grp.wave;
    o["ranks"] = {grp.first_rank, grp.first_rank + grp.ranks};
    o["degree"] = grp.ranks;
    o["cp"] = grp.ring_degree;
    o["start_ns"] = grp.start_ns;
    o["time_ns"] = grp.time_ns;
    o["peak_bytes"] = grp.peak_bytes;
    auto& samples = o["samples"] = nlohmann::json::array();
    for (int32_t s : grp.seqs)
      samples.push_back({{"id", seqs_[s].id}, {"text", seqs_[s].text_tokens}, {"vision", seqs_[s].vision_tokens}});
    auto& shards = o["shards"] = nlohmann::json::array();
    for (int i = 0; i < grp.ring_degree; ++i) {
      nlohmann::json r = nlohmann::json::array();
      for (const auto& t : ranges(g, grp.first_rank + i)) r.push_back({seqs_[t.seq].id, t.begin, t.end});
      shards.push_back({{"rank", grp.first_rank + i}, {"ranges", r}});
    }
    groups.push_back(std::move(o));
  }
  return j;
}

std::string Plan::to_string() const {
  std::string out = fmt::format("plan {}{} on {} ranks: {} groups, {} waves, makespan {:.3f} ms "
                                "(bound {:.3f} ms), idle {:.1f}%\n",
                                strategy_name(strategy_), candidate_.empty() ? "" : " (" + candidate_ + ")", world_, summary_.groups, summary_.waves, summary_.makespan_ns * 1e-6,
                                summary_.lower_bound_ns * 1e-6, 100.0 * summary_.idle_fraction);
  for (const auto& g : groups_) {
    int64_t tokens = 0;
    std::string ids;
    for (size_t k = 0; k < g.seqs.size(); ++k) {
      tokens += seqs_[g.seqs[k]].tokens();
      if (k < 6) ids += fmt::format("{}{}", k ? "," : "", seqs_[g.seqs[k]].id);
    }
    if (g.seqs.size() > 6) ids += fmt::format(",... ({} more)", g.seqs.size() - 6);
    out += fmt::format("  wave {:>2}  ranks {:>4}-{:<4} d={:<4} cp={:<4} {:>8} tokens  {:>10.3f} ms  "
                       "{:>7.2f} GiB  samples {}\n",
                       g.wave, g.first_rank, g.first_rank + g.ranks - 1, g.ranks, g.ring_degree, tokens,
                       g.time_ns * 1e-6, g.peak_bytes / double(int64_t(1) << 30), ids);
  }
  return out;
}

}  // namespace dhp
