// The profiling pass of design.md §2.1: forward + backward of the model timed on
// micro-batches of many shapes (text lengths, packed documents, images of several sizes and
// counts), as the observations the cost model's coefficients are fitted to (refit(),
// parallel/cost_model.h). Ring transfer and latency need more than one rank: not measured.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "model/model.h"
#include "parallel/cost_model.h"
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

// The model of one configuration with weights from a fixed seed on `backend`, timed one shape
// at a time.
class StepProfiler {
 public:
  // threads: the CPU backend's compute threads (one thread is timed by its own CPU time,
  // immune to other processes); devices are timed by the wall clock, drained after each step.
  StepProfiler(const ModelConfig& cfg, std::unique_ptr<Backend> backend, int threads);
  StepProfiler(const ModelConfig& cfg, int threads);
  // The median of `repeats` timed steps (after one untimed warm-up) of a batch of shape `sh`
  // drawn from `seed`, as one group of ring degree 1.
  TimingObservation measure(const ProfileShape& sh, int repeats, uint64_t seed);

 private:
  const ModelConfig cfg_;
  const int threads_;
  std::unique_ptr<Backend> backend_;
  Model model_;

 public:
  Backend& backend() { return *backend_; }
};

}  // namespace dhp
