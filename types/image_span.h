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

// An image's merged tokens as its grid: rows x cols, row-major in its span.
struct MergedGrid {
  int rows = 0, cols = 0;
  int64_t tokens() const { return int64_t(rows) * cols; }
};

}  // namespace dhp
