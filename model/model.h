// The vision-language model of model-spec.md: parameters in one arena, a hand-written forward
// and backward pass over a packed micro-batch, and the masked next-token loss.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "data/batch.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"
#include "model/block.h"
#include "model/config.h"
#include "model/params.h"
#include "model/vision.h"

namespace dhp {

struct StepStats {
  double loss_sum = 0.0;  // sum of -log p over the micro-batch's loss targets
  int64_t targets = 0;    // loss targets in the micro-batch
  int64_t correct = 0;    // targets whose argmax prediction is right
};

// Keys and values of the tokens generated so far, for incremental decoding.
struct KvCache {
  std::vector<LayerCache> layers;      // one per decoder layer
  std::vector<int32_t> doc, idx, blk;  // (L) attention metadata of the cached keys
  int64_t len() const { return int64_t(idx.size()); }
};

struct SamplingOptions {
  int max_new_tokens = 64;
  double temperature = 0.0;  // 0 = greedy
  double top_p = 1.0;        // nucleus sampling when temperature > 0
  uint64_t seed = 0;
};

class Model {
 public:
  Model(const ModelConfig& cfg, const Ops& ops);

  const ModelConfig& config() const { return cfg_; }
  const ParamTable& table() const { return table_; }
  int64_t n_params() const { return table_.total(); }
  float* params() { return params_.f32(); }
  float* grads() { return grads_.f32(); }
  const float* params() const { return params_.f32(); }

  void initialise(uint64_t seed) { table_.initialise(params_.f32(), seed); }
  void zero_grads();

  // Runs the micro-batch forward and returns its loss statistics. With backward = true it
  // also back-propagates d(loss)/d(logit) scaled by loss_scale (1 / the number of loss targets
  // of the whole global batch, so that accumulated gradients are those of the mean loss) and
  // accumulates the parameter gradients.
  StepStats step(const Batch& b, float loss_scale, bool backward);

  // Continues a prompt of one document (targets unused) token by token with a KV cache: the
  // prompt runs once, then each new token costs one position. Stops after `eos` (not
  // returned) or max_new_tokens. logits_out, when given, receives each step's logits (V each).
  std::vector<int32_t> generate(const Batch& prompt, int32_t eos, const SamplingOptions& opt,
                                std::vector<float>* logits_out = nullptr);

 private:
  // Vision path, decoder and final norm; leaves the normed stream in xf_ (T, d). With a
  // cache, positions continue after the cached tokens and attend to them too.
  void forward_hidden(const Batch& b, KvCache* cache);

  ModelConfig cfg_;
  const Ops& ops_;
  ParamTable table_;
  Tensor params_, grads_;  // (n_params) arenas of the same layout
  ModelParams p_, g_;
  BlockDims dims_;
  VisionPath vision_;
  std::vector<BlockActs> acts_;          // per decoder layer
  BlockScratch scratch_;
  std::vector<int32_t> ids_;             // (T) token ids, -1 where an image token sits
  std::vector<int32_t> idx_, blk_;       // (T) attention metadata
  std::vector<float> x_;                 // (T, d) residual stream, then its gradient
  std::vector<float> x_final_;           // (T, d) input of the final norm
  std::vector<float> xf_, rstd_;         // (T, d) final-normed stream, (T)
  std::vector<float> logits_, lse_;      // (chunk, V), (chunk)
  std::vector<float> dimg_;              // (N, d) gradient of the image tokens
};

}  // namespace dhp
