// Held-out evaluation: loss, perplexity and next-token accuracy over the loss targets (the
// caption tokens and their <eos>), optionally with every image blanked to the mean colour.
// The gap between the two accuracies is how much the model reads the images. Optionally also
// exact match: the answer generated greedily from the prompt (with a KV cache) equals the
// reference answer token for token.
#pragma once

#include <cstdint>

#include "data/dataset.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "parallel/communicator.h"
#include "parallel/planner.h"

namespace dhp {

struct EvalResult {
  double loss = 0.0;       // mean over targets
  double perplexity = 0.0;
  double accuracy = 0.0;   // fraction of targets predicted exactly (argmax)
  int64_t targets = 0;
  int64_t samples = 0;
  double exact_match = -1.0;  // fraction of answers generated exactly (greedy); -1 = not run
};

struct EvalOptions {
  int64_t batch = 32;           // samples planned together (like one training batch)
  int64_t max_samples = 0;      // 0 = the whole dataset
  bool blank_images = false;
  int workers = 1;              // decode threads
  bool exact_match = false;     // also generate every answer greedily and compare it whole
  int32_t eos = SpecialIds{}.eos;  // the tokenizer's <eos>: where a generated answer ends
};

// The data set in batches of opt.batch samples, each planned and run forward through the
// training step's executor (so a sequence that needs several ranks is evaluated on a ring);
// the result is summed over ranks.
// The prompt an exact-match check generates from: the first `a` tokens of the whole sample `s`,
// with its images and their M-RoPE positions (Sample::rope_pos).
Sample answer_prompt(const Sample& s, size_t a);

EvalResult evaluate(Model& model, const Dataset& data, const EvalOptions& opt,
                    Communicator& comm, const Planner& planner);

}  // namespace dhp
