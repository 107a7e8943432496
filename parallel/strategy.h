// The strategies that plan a step, as values. One table row per strategy holds its name (in
// configs, plans, logs and `dhp plan --strategies`), the traits that decide behaviour
// elsewhere (the config schema, the plan validator, the simulator, `dhp plan`) and the
// function that plans a batch. A new strategy is its planning file plus one row here.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dhp {

class Plan;
class Planner;
struct PlanStats;
struct SeqShape;

enum class Strategy : uint8_t { dhp, dhp_waves, static_layout, pow2 };

// Which ring degrees a strategy's groups may have.
enum class RingDegrees : uint8_t {
  any,    // any integer from 1 to the world
  pow2,   // powers of two
  fixed,  // one degree for the whole step (parallel.static_cp, or the smallest that fits)
};

struct StrategyTraits {
  Strategy id;
  std::string_view name;
  std::string_view summary;    // one line, for help texts and docs
  bool trainable;              // may be parallel.strategy; the others are references for `dhp plan`
  RingDegrees degrees;
  bool barriers;               // its waves are global barriers (every rank waits for the slowest)
  // Its placement may lay a ring of at most one node's ranks across two nodes (a static mesh
  // that ignores node boundaries); the plan validator refuses that for the others.
  bool rings_may_span_nodes;
  // Where every wave ends on all ranks together (ZeRO-2 sums each wave's gradients before the
  // next wave: trainer/grad_reducer.h), the other strategies whose plans it may run instead,
  // timed with barriers as its own: its barrier form, and the static layout where its own
  // portfolio adopts that layout too (dhp, pow2).
  std::span<const Strategy> under_barriers;
  // Plans `batch` on the planner's world; static_cp is used where degrees == fixed.
  Plan (*plan)(const Planner& planner, const std::vector<SeqShape>& batch, int static_cp, PlanStats* stats);
};

// Every strategy, in the order `dhp plan` lists them.
std::span<const StrategyTraits> strategy_table();
const StrategyTraits& traits(Strategy s);
inline std::string_view strategy_name(Strategy s) { return traits(s).name; }
std::optional<Strategy> find_strategy(std::string_view name);
// The names, comma-separated, of every strategy (trainable_only: those parallel.strategy takes).
std::string strategy_names(bool trainable_only);
std::ostream& operator<<(std::ostream& os, Strategy s);  // its name

}  // namespace dhp
