// Packing samples into the model's micro-batch, and choosing which samples share a pack.
#pragma once

#include <cstdint>
#include <vector>

#include "data/batch.h"
#include "data/dataset.h"
#include "model/config.h"

namespace dhp {

// Lays the samples end to end as documents 0, 1, ... of one Batch: targets[t] = tokens[t+1]
// when t+1 is in the same document and has loss_mask 1 (else -1); pos restarts per
// document; image_slot numbers the merged image tokens in the order images x row-major
// merged grid; patches are concatenated in image order.
Batch pack(const std::vector<const Sample*>& samples, const VisionConfig& v);

// Deterministic first-fit-decreasing of positions 0..n-1 into packs of at most micro_tokens
// tokens; a sample longer than micro_tokens gets a pack of its own. Each pack lists its
// positions ascending; packs come in the order they were opened.
std::vector<std::vector<int64_t>> split_micro_batches(const std::vector<int64_t>& lengths,
                                                      int64_t micro_tokens);

}  // namespace dhp
