// Sizes checked against what the data and the machine can hold, before anything is allocated
// for them: a batch size typed with three zeros too many must be a message, not a process
// whose memory grows until the kernel kills it.
#pragma once

#include <cstdint>

#include "trainer/config.h"

namespace dhp {

class Dataset;

// Physical memory of this machine in bytes (0 when unknown: the memory check is skipped).
int64_t available_memory_bytes();

// Refuses a train.batch_size larger than the training set (a step would hold the same sample
// more than once) or one whose decoded samples (two steps in flight: the one computing and
// the one prefetched) would need more than `memory_bytes`. Throws dhp::Error with the sizes.
void check_batch_fits(const Config& cfg, const Dataset& train_set, int64_t memory_bytes);

}  // namespace dhp
