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

namespace dhp {

struct StepRecord {
  int64_t step = 0;
  double loss = 0.0;
  double lr = 0.0;
  double grad_norm = 0.0;
  double tokens_per_s = 0.0;
  double samples_per_s = 0.0;
  double elapsed_s = 0.0;
  double loader_wait_s = 0.0;
  int64_t groups = 0;        // groups of the step's plan (all ranks)
  int max_degree = 1;        // the widest ring of the plan
  std::vector<int> degrees;  // ring degree of every group of the plan, widest first
  double plan_s = 0.0;       // planner wall time
  double predicted_s = 0.0;  // the plan's predicted makespan
  double measured_s = 0.0;   // the plan's schedule replayed with the measured group times
  double cost_error = 0.0;   // mean |predicted - measured| / measured over the step's groups
  double busy_s = 0.0;       // this rank's compute time (thread CPU time, waits left out)
  std::vector<double> rank_busy_s;  // every rank's busy_s
  double ring_wait_s = 0.0;  // this rank's time waiting for ring neighbours
  double step_s = 0.0;
  double imbalance = 1.0;  // slowest rank's compute time over the mean of all ranks
  int threads = 0;         // compute threads this rank used for the step
};

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
