// The profiling pass of design.md §2.1: the shapes of micro-batches (text lengths, packed
// documents, images of several sizes and counts) whose measured step times the cost model's
// coefficients are fitted to (refit(), parallel/cost_model.h).
#pragma once

#include <cstdint>
#include <vector>

#include "types/batch.h"
#include "types/model_config.h"

namespace dhp {

// One shape: documents of `text` tokens each, with `images` images of grid x grid patches.
struct ProfileShape {
  int docs = 1;
  int64_t text = 0;
  int images = 0;  // per document
  int grid = 0;    // patches per side (a multiple of the merge factor)
};

// A batch of shape `sh` with random tokens and pixels drawn from `seed`.
Batch profile_batch(const ModelConfig& cfg, const ProfileShape& sh, uint64_t seed);

// The shapes profiled; `quick`: a few only (for tests).
std::vector<ProfileShape> profile_shapes(const ModelConfig& cfg, bool quick);

}  // namespace dhp
