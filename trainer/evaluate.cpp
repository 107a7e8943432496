#include "trainer/evaluate.h"

#include <algorithm>
#include <cmath>

#include "data/loader.h"
#include "data/pack.h"

namespace dhp {

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

  double stats[3] = {0.0, 0.0, 0.0};  // loss sum, targets, correct
  for (size_t k = 0; k < mine.size(); ++k) {
    std::vector<Sample> samples = loader.next();
    if (k + ahead < mine.size()) loader.submit(packs[mine[k + ahead]], opt.blank_images);
    std::vector<const Sample*> ptrs;
    for (const auto& s : samples) ptrs.push_back(&s);
    StepStats st = model.step(pack(ptrs, model.config().vision), 0.0f, false);
    stats[0] += st.loss_sum;
    stats[1] += double(st.targets);
    stats[2] += double(st.correct);
  }
  comm.allreduce_sum(stats, 3);

  EvalResult r;
  r.samples = n;
  r.targets = int64_t(stats[1]);
  if (r.targets > 0) {
    r.loss = stats[0] / stats[1];
    r.perplexity = std::exp(r.loss);
    r.accuracy = stats[2] / stats[1];
  }
  return r;
}

}  // namespace dhp
