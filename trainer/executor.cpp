#include "trainer/executor.h"

#include "data/pack.h"
#include "kernels/check.h"

namespace dhp {

std::vector<int64_t> StepWork::my_ids() const {
  std::vector<int64_t> out;
  for (size_t p : mine) out.insert(out.end(), packs[p].begin(), packs[p].end());
  return out;
}

StepWork split_step(const Dataset& data, const std::vector<int64_t>& ids, int64_t micro_tokens,
                    int rank, int world) {
  StepWork w;
  std::vector<int64_t> lengths;
  lengths.reserve(ids.size());
  for (int64_t id : ids) {
    lengths.push_back(data.length(id));
    w.loss_tokens += data.loss_tokens(id);
    w.tokens += lengths.back();
  }
  w.samples = int64_t(ids.size());
  for (const auto& positions : split_micro_batches(lengths, micro_tokens)) {
    std::vector<int64_t> pk;
    for (int64_t pos : positions) pk.push_back(ids[size_t(pos)]);
    if (int(w.packs.size() % size_t(world)) == rank) w.mine.push_back(w.packs.size());
    w.packs.push_back(std::move(pk));
  }
  return w;
}

Executor::Executor(Model& model, const Dataset& data, int workers)
    : model_(model), loader_(data, workers) {}

void Executor::submit(const StepWork& work, bool blank_images) {
  loader_.submit(work.my_ids(), blank_images);
}

StepStats Executor::run(const StepWork& work, float loss_scale, bool backward,
                        const std::function<void(const std::vector<Sample>&)>& after) {
  std::vector<Sample> samples = loader_.next();
  size_t at = 0;
  std::vector<Sample> pack_samples;
  for (size_t p : work.mine) {
    const size_t n = work.packs[p].size();
    DHP_ASSERT(at + n <= samples.size());
    ptrs_.clear();
    for (size_t k = 0; k < n; ++k) ptrs_.push_back(&samples[at + k]);
    model_.run(model_.upload(pack(ptrs_, model_.config().vision)), loss_scale, backward);
    if (after) {
      pack_samples.assign(std::make_move_iterator(samples.begin() + long(at)),
                          std::make_move_iterator(samples.begin() + long(at + n)));
      after(pack_samples);
    }
    at += n;
  }
  DHP_ASSERT(at == samples.size());
  return model_.take_stats();
}

}  // namespace dhp
