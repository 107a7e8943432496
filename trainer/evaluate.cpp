#include "trainer/evaluate.h"

#include <algorithm>
#include <cmath>

#include "data/loader.h"
#include "data/pack.h"
#include "data/tokenizer.h"
#include "kernels/check.h"

namespace dhp {
namespace {

// Generates the first answer of `s` greedily from everything before it and compares it with
// the reference: the first run of loss-masked tokens. A run that ends the document ends with
// <eos>, which the model must produce too (generation stops there); a run that a later turn
// follows must match token for token over its length.
bool answer_matches(Model& model, const Sample& s) {
  const auto first = std::find(s.loss_mask.begin(), s.loss_mask.end(), 1);
  if (first == s.loss_mask.end()) return false;
  const size_t a = size_t(first - s.loss_mask.begin());
  size_t e = a;
  while (e < s.loss_mask.size() && s.loss_mask[e]) ++e;
  const bool ends_document = e == s.tokens.size() && s.tokens.back() == Tokenizer::kEos;
  Sample prompt;
  prompt.id = s.id;
  prompt.tokens.assign(s.tokens.begin(), s.tokens.begin() + a);
  prompt.loss_mask.assign(a, 0);
  prompt.image_of.assign(s.image_of.begin(), s.image_of.begin() + a);
  prompt.images = s.images;
  const std::vector<int32_t> answer(s.tokens.begin() + a, s.tokens.begin() + (ends_document ? e - 1 : e));
  SamplingOptions greedy;
  greedy.max_new_tokens = int(answer.size()) + (ends_document ? 1 : 0);
  return model.generate(pack({&prompt}, model.config().vision), ends_document ? Tokenizer::kEos : -1,
                        greedy) == answer;
}

}  // namespace

EvalResult evaluate(Model& model, const Dataset& data, const EvalOptions& opt,
                    const Comm& comm) {
  const int64_t n = opt.max_samples > 0 ? std::min(opt.max_samples, data.size()) : data.size();
  std::vector<int64_t> lengths(n);
  for (int64_t i = 0; i < n; ++i) lengths[i] = data.length(i);
  const auto packs = split_micro_batches(lengths, opt.micro_tokens);

  BatchLoader loader(data, opt.workers);
  std::vector<size_t> mine;
  for (size_t p = 0; p < packs.size(); ++p)
    if (int(p % comm.size()) == comm.rank()) mine.push_back(p);
  // Keep a few packs in flight so decoding overlaps the forward passes.
  const size_t ahead = 2;
  for (size_t k = 0; k < std::min(ahead, mine.size()); ++k)
    loader.submit(packs[mine[k]], opt.blank_images);

  double stats[5] = {0.0, 0.0, 0.0, 0.0, 0.0};  // loss sum, targets, correct, exact, answers
  for (size_t k = 0; k < mine.size(); ++k) {
    std::vector<Sample> samples = loader.next();
    if (k + ahead < mine.size()) loader.submit(packs[mine[k + ahead]], opt.blank_images);
    std::vector<const Sample*> ptrs;
    for (const auto& s : samples) ptrs.push_back(&s);
    StepStats st = model.step(pack(ptrs, model.config().vision), 0.0f, false);
    stats[0] += st.loss_sum;
    stats[1] += double(st.targets);
    stats[2] += double(st.correct);
    if (!opt.exact_match) continue;
    for (const auto& s : samples) {
      if (s.skipped) continue;  // a placeholder for data that went bad has no answer
      stats[3] += answer_matches(model, s);
      stats[4] += 1;
    }
  }
  comm.allreduce_sum(stats, 5);

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
