// The split -> load -> pack -> upload -> forward/backward loop that training and evaluation
// share. A step's work is decided from sample lengths alone, identically on every rank; each
// rank then decodes (in the background) and runs only its own packs.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "data/dataset.h"
#include "data/loader.h"
#include "model/model.h"

namespace dhp {

// One step's global batch as packs (micro-batches), and which of them are this rank's.
struct StepWork {
  std::vector<std::vector<int64_t>> packs;  // dataset ids per pack, every rank's
  std::vector<size_t> mine;                 // indices into packs run by this rank, in order
  int64_t loss_tokens = 0;                  // of the whole global batch
  int64_t tokens = 0;
  int64_t samples = 0;
  std::vector<int64_t> my_ids() const;      // this rank's samples, pack after pack
};

// Packs of at most micro_tokens tokens (first-fit decreasing; a longer sample gets its own),
// dealt to the ranks in turn.
StepWork split_step(const Dataset& data, const std::vector<int64_t>& ids, int64_t micro_tokens,
                    int rank, int world);

class Executor {
 public:
  Executor(Model& model, const Dataset& data, int workers);
  // Starts decoding this rank's samples of `work`. Submit a step before running the one
  // before it, so decoding overlaps compute; runs take submissions in order.
  void submit(const StepWork& work, bool blank_images);
  // Runs this rank's packs of `work` (submitted earlier) through the model and returns this
  // rank's loss statistics. `after` sees each pack's samples once its pass is done.
  StepStats run(const StepWork& work, float loss_scale, bool backward,
                const std::function<void(const std::vector<Sample>&)>& after = {});
  double last_wait_seconds() const { return loader_.last_wait_seconds(); }

 private:
  Model& model_;
  BatchLoader loader_;
  std::vector<const Sample*> ptrs_;
};

}  // namespace dhp
