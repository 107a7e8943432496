#include "trainer/evaluate.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/check.h"
#include "data/pack.h"
#include "data/tokenizer.h"
#include "trainer/executor.h"

namespace dhp {

Sample answer_prompt(const Sample& s, size_t a) {
  Sample prompt;
  prompt.id = s.id;
  prompt.tokens.assign(s.tokens.begin(), s.tokens.begin() + long(a));
  prompt.loss_mask.assign(a, 0);
  prompt.image_of.assign(s.image_of.begin(), s.image_of.begin() + long(a));
  prompt.images = s.images;
  // An M-RoPE model must see the positions it trained with (images take their grids).
  if (!s.rope_pos.empty()) prompt.rope_pos.assign(s.rope_pos.begin(), s.rope_pos.begin() + long(3 * a));
  return prompt;
}

namespace {

// Generates the first answer of `s` greedily from everything before it and compares it with
// the reference: the first run of loss-masked tokens. A run that ends the document ends with
// <eos>, which the model must produce too (generation stops there); a run that a later turn
// follows must match token for token over its length.
bool answer_matches(Model& model, const Sample& s, int32_t eos) {
  const auto first = std::find(s.loss_mask.begin(), s.loss_mask.end(), 1);
  if (first == s.loss_mask.end()) return false;
  const size_t a = size_t(first - s.loss_mask.begin());
  size_t e = a;
  while (e < s.loss_mask.size() && s.loss_mask[e]) ++e;
  const bool ends_document = e == s.tokens.size() && s.tokens.back() == eos;
  const Sample prompt = answer_prompt(s, a);
  const std::vector<int32_t> answer(s.tokens.begin() + a, s.tokens.begin() + (ends_document ? e - 1 : e));
  SamplingOptions greedy;
  greedy.max_new_tokens = int(answer.size()) + (ends_document ? 1 : 0);
  return model.generate(pack({&prompt}, model.config().vision), ends_document ? eos : -1,
                        greedy) == answer;
}

}  // namespace

EvalResult evaluate(Model& model, const Dataset& data, const EvalOptions& opt,
                    Communicator& comm, const Planner& planner) {
  const int64_t n = opt.max_samples > 0 ? std::min(opt.max_samples, data.size()) : data.size();
  DHP_CHECK(opt.batch > 0, "evaluation batch must be positive, got {}", opt.batch);
  // Batches are planned one ahead: the next one decodes while this one runs.
  std::vector<StepWork> chunks;
  for (int64_t i0 = 0; i0 < n; i0 += opt.batch) {
    std::vector<int64_t> ids;
    for (int64_t i = i0; i < std::min(n, i0 + opt.batch); ++i) ids.push_back(i);
    chunks.push_back(plan_step(planner, data, ids, comm.rank()));
  }

  Executor exec(model, data, opt.workers, comm);
  double stats[5] = {0.0, 0.0, 0.0, 0.0, 0.0};  // loss sum, targets, correct, exact, answers
  auto exact = [&](const std::vector<Sample>& samples) {
    for (const auto& s : samples) {
      // A placeholder for data that went bad has no answer; a sample split over a ring has no
      // rank holding its whole prompt.
      if (s.skipped || s.begin != 0 || int64_t(s.tokens.size()) != s.full_length) continue;
      stats[3] += answer_matches(model, s, opt.eos);
      stats[4] += 1;
    }
  };
  if (!chunks.empty()) exec.submit(chunks[0], opt.blank_images);
  for (size_t k = 0; k < chunks.size(); ++k) {
    if (k + 1 < chunks.size()) exec.submit(chunks[k + 1], opt.blank_images);
    const StepStats st = exec.run(chunks[k], 0.0f, false,
                                  opt.exact_match ? std::function(exact) : nullptr);
    stats[0] += st.loss_sum;
    stats[1] += double(st.targets);
    stats[2] += double(st.correct);
  }
  comm.all_reduce_sum(stats, 5);

  EvalResult r;
  r.samples = n;
  r.targets = int64_t(stats[1]);
  DHP_CHECK(r.targets > 0, "evaluation: none of the {} samples could be used (all were "
            "skipped as bad data: see the warnings above); a loss over no tokens means nothing", n);
  if (r.targets > 0) {
    r.loss = stats[0] / stats[1];
    r.perplexity = std::exp(r.loss);
    r.accuracy = stats[2] / stats[1];
  }
  if (opt.exact_match && stats[4] > 0) r.exact_match = stats[3] / stats[4];
  return r;
}

}  // namespace dhp
