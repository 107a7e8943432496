// The training loop: global batches from the seeded sampler, planned into groups of ranks
// (parallel.strategy) and run by every rank's executor (trainer/executor.h), gradients
// accumulated and summed, then clipping, the schedule and one AdamW update. The loss of a step is normalised by the global
// count of loss targets, so the result does not depend on how the batch was split.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "trainer/config.h"
#include "trainer/metrics.h"

namespace dhp {

struct TrainResult {
  std::vector<StepRecord> steps;
  double final_accuracy = -1.0;        // held-out caption token accuracy, -1 = not evaluated
  double final_blank_accuracy = -1.0;  // the same with every image blanked
  double final_exact_match = -1.0;     // held-out answers generated exactly, -1 = not run
  double final_blank_exact_match = -1.0;
  double final_loss = 0.0;
  int64_t last_step = 0;               // optimizer steps completed when train() returned
  std::string checkpoint;              // the last checkpoint written, "" = none
};

struct TrainOptions {
  std::string resume;            // "" = fresh run; "auto" = newest checkpoint; or a path
  std::string init;              // weights to start from (safetensors or checkpoint), "" = none
  int64_t stop_after = -1;       // save a checkpoint and return after this step (-1 = never)
  const volatile int* stop_flag = nullptr;  // set by a signal handler: save and return
};

TrainResult train(const Config& cfg, Communicator& comm, const TrainOptions& opt = {});

}  // namespace dhp
