// Parameter groups: every parameter of the model belongs to exactly one, fixed by its name's
// prefix in the parameter table (model/params.cpp). A run freezes groups and scales their
// learning rates (optim.groups.<name> in the config); the model, the optimizer and the
// planner's memory model read the same settings.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>

namespace dhp {

enum class ParamGroup : int {
  Language,    // decoder layers and the final norm
  Embeddings,  // tok_embed and lm_head (one tensor when tied)
  Vision,      // the vision encoder: vision.*
  Projector,   // the merge projector: projector.*
};
inline constexpr size_t kParamGroups = 4;
inline constexpr std::array<std::string_view, kParamGroups> kParamGroupNames = {
    "language", "embeddings", "vision", "projector"};
inline std::string_view param_group_name(ParamGroup g) { return kParamGroupNames[size_t(g)]; }

struct GroupSettings {
  bool trainable = true;  // false: no gradient, no optimizer state, no update
  double lr_scale = 1.0;  // multiplies the schedule's learning rate
};

// Settings of every group, indexed by ParamGroup.
struct ParamGroups {
  std::array<GroupSettings, kParamGroups> group{};
  const GroupSettings& operator[](ParamGroup g) const { return group[size_t(g)]; }
  GroupSettings& operator[](ParamGroup g) { return group[size_t(g)]; }
  bool trainable(ParamGroup g) const { return group[size_t(g)].trainable; }
  bool all_trainable() const {
    for (const auto& s : group)
      if (!s.trainable) return false;
    return true;
  }
  bool any_trainable() const {
    for (const auto& s : group)
      if (s.trainable) return true;
    return false;
  }
};

}  // namespace dhp
