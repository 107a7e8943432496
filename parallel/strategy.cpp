#include "parallel/strategy.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <ostream>

#include "core/check.h"
#include "parallel/planner.h"

namespace dhp {
namespace {

constexpr Strategy kDhpUnderBarriers[] = {Strategy::dhp_waves, Strategy::static_layout};
constexpr Strategy kPow2UnderBarriers[] = {Strategy::static_layout};

constexpr std::array<StrategyTraits, 4> kStrategies{{
    {Strategy::dhp, "dhp", "groups of any ring degree, sized and placed every step from the batch's lengths",
     true, RingDegrees::any, false, false, kDhpUnderBarriers,
     [](const Planner& p, const std::vector<SeqShape>& b, int, PlanStats* st) { return p.plan_dhp(b, st); }},
    {Strategy::dhp_waves, "dhp-waves",
     "dhp's packed waves with every wave a global barrier (the reference dhp's schedule never loses to)",
     false, RingDegrees::any, true, true, {},
     [](const Planner& p, const std::vector<SeqShape>& b, int, PlanStats* st) { return p.plan_dhp_waves(b, st); }},
    {Strategy::static_layout, "static", "one DP x CP mesh for the whole step (parallel.static_cp)", true,
     RingDegrees::fixed, false, true, {},
     [](const Planner& p, const std::vector<SeqShape>& b, int cp, PlanStats* st) { return p.plan_static(b, cp, st); }},
    {Strategy::pow2, "pow2", "groups whose ring degrees are powers of two", true, RingDegrees::pow2, false, false, kPow2UnderBarriers,
     [](const Planner& p, const std::vector<SeqShape>& b, int, PlanStats* st) { return p.plan_pow2(b, st); }},
}};

}  // namespace

std::span<const StrategyTraits> strategy_table() { return kStrategies; }

const StrategyTraits& traits(Strategy s) {
  for (const auto& t : kStrategies)
    if (t.id == s) return t;
  DHP_ASSERT(false);
  return kStrategies[0];
}

std::optional<Strategy> find_strategy(std::string_view name) {
  for (const auto& t : kStrategies)
    if (t.name == name) return t.id;
  return std::nullopt;
}

std::string strategy_names(bool trainable_only) {
  std::vector<std::string_view> names;
  for (const auto& t : kStrategies)
    if (t.trainable || !trainable_only) names.push_back(t.name);
  return fmt::format("{}", fmt::join(names, ", "));
}

std::ostream& operator<<(std::ostream& os, Strategy s) { return os << strategy_name(s); }

}  // namespace dhp
