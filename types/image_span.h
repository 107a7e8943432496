// Where one image's merged tokens lie in its document: known from the dataset's index alone
// (no pixels), so the data path and the planner's image routing (parallel/image_routing.h)
// speak of the same spans.
#pragma once

#include <cstdint>

namespace dhp {

struct ImageSpan {
  int64_t first = 0;   // decoder position of its first image token
  int64_t tokens = 0;  // merged tokens (its patches / merge²)
};

}  // namespace dhp
