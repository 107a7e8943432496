// Activation recompute (parallel.recompute): what the forward pass keeps for backward and what
// backward rebuilds. The model runs it (model/block.h) and the planner's memory and cost
// models price the same choice (parallel/memory_model.h, parallel/cost_model.h).
//   off:       every activation the backward pass reads is kept.
//   selective: the linears' outputs (q, k, v, the attention output, the residual, the two
//              SwiGLU inputs; fc1's output in a clip/siglip tower's block) and the attention
//              kernel's lse are kept; the norms' outputs (and their statistics) and the SwiGLU
//              product (the GELU's output) are rebuilt in backward. The attention core never holds its
//              probabilities (the kernels recompute them from lse), so its backward runs no
//              second attention forward.
//   full:      each layer keeps only its input; backward reruns the layer's forward (ring
//              attention included: the ring exchange runs again) into one layer's buffers.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>

namespace dhp {

enum class Recompute : uint8_t { off, selective, full };
inline constexpr std::pair<Recompute, std::string_view> kRecomputeNames[] = {
    {Recompute::off, "off"}, {Recompute::selective, "selective"}, {Recompute::full, "full"}};
inline std::string_view recompute_name(Recompute r) {
  for (const auto& [value, name] : kRecomputeNames)
    if (value == r) return name;
  return "?";
}
inline std::optional<Recompute> find_recompute(std::string_view name) {
  for (const auto& [value, n] : kRecomputeNames)
    if (n == name) return value;
  return std::nullopt;
}

}  // namespace dhp
