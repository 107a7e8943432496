// The vision-language model of model-spec.md: parameters in one arena, activations in another
// (carved per micro-batch shape, so a steady-state step allocates nothing), a hand-written
// forward and backward pass over a packed micro-batch already on the device, and the masked
// next-token loss.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/check.h"
#include "kernels/backend.h"
#include "model/attention.h"
#include "model/block.h"
#include "model/device_batch.h"
#include "model/layer_window.h"
#include "model/image_route.h"
#include "model/params.h"
#include "model/shard.h"
#include "model/vision.h"
#include "types/batch.h"
#include "types/model_config.h"

namespace dhp {

struct StepStats {
  double loss_sum = 0.0;  // sum of -log p over the loss targets
  int64_t targets = 0;    // loss targets
  int64_t correct = 0;    // targets whose argmax prediction is right
};

struct SamplingOptions {
  int max_new_tokens = 64;
  double temperature = 0.0;  // 0 = greedy
  double top_p = 1.0;        // nucleus sampling when temperature > 0
  uint64_t seed = 0;
};

// Called during a backward pass with decreasing offsets into the gradient arena: every
// parameter gradient at an offset >= the one given is complete for the pass (the optimizer
// starts summing those over ranks while backward goes on).
using GradsFinal = std::function<void(int64_t offset)>;

// ZeRO-3 (model/layer_window.h): where the working weights of the decoder layers share two
// slots, whoever runs the passes brings each layer's weights into its slot before the pass
// reads them (trainer/layer_gather.h). A pass asks for layers 0 .. L-1 going forward, then,
// training, L-1 .. 0 going backward (a layer rebuilt by recompute is asked for once, before
// its backward).
class LayerFeed {
 public:
  virtual ~LayerFeed() = default;
  virtual void need(int layer, bool backward) = 0;
};

class Model {
 public:
  // `groups`: which parameter groups train. A frozen parameter has no gradient: the backward
  // pass skips its weight-gradient GEMM, and the whole pass below the lowest trainable
  // parameter (the vision tower when it and the projector are frozen).
  // `master`: the ranks the optimizer shards over. Over several ranks, with working weights
  // narrower than fp32 (bf16), this rank keeps the fp32 master weights of its part of the
  // trainable parameters only (model/shard.h; the distributed optimizer): the working copy is
  // then the one full copy, the optimizer refreshes it, and frozen parameters exist in it alone.
  // `window_grads`: the gradients of the decoder layers share two slots (model/layer_window.h,
  // ZeRO-2); whoever runs the backward pass empties each slot before its next layer fills it.
  // `window_weights` (ZeRO-3, over several ranks): the fp32 master is sharded whatever the
  // storage dtype, and the working weights of the decoder layers share two slots too, filled
  // by a LayerFeed (set_layer_feed) before the passes read them.
  Model(const ModelConfig& cfg, Backend& backend, const ParamGroups& groups = {}, OptimizerShard master = {},
        bool window_grads = false, bool window_weights = false);
  // A copy would share nothing but the config; weights live on a device. Copy explicitly
  // through params() when that is what is meant.
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return cfg_; }
  const ParamTable& table() const { return table_; }
  Backend& backend() const { return backend_; }
  int64_t n_params() const { return table_.total(); }
  // Elements of the gradient arena: the trainable parameters, at their grad_offset.
  int64_t n_grads() const { return table_.trainable_total(); }
  // Device pointers to the fp32 parameter (master weights, n_params floats) and gradient
  // (n_grads floats) arenas. The forward and backward passes read a working copy in the ops'
  // storage dtype (the master arena itself when that is fp32 and not sharded); taking the mutable pointer
  // marks the copy stale, and the next pass refreshes it.
  // Not where the master is sharded (sheds_master()): read_params and write_params serve both.
  float* params() {
    DHP_ASSERT(!sheds_);
    weights_stale_ = true;
    return params_.as<float>();
  }
  // Not where the gradients are windowed: grad_buffer() and grad_window() serve both.
  float* grads() {
    DHP_ASSERT(!window_.windowed());
    return grads_.as<float>();
  }
  float* grad_buffer() { return grads_.as<float>(); }
  const LayerWindow& grad_window() const { return window_; }
  // How the working copy holds the weight arena (windowed under ZeRO-3).
  const LayerWindow& weight_window() const { return weights_window_; }
  // Who fills the weight window's slots (required where it is windowed); the model does not own it.
  void set_layer_feed(LayerFeed* feed) { feed_ = feed; }
  LayerFeed* layer_feed() const { return feed_; }
  const float* params() const {
    DHP_ASSERT(!sheds_);
    return params_.as<float>();
  }
  // The distributed optimizer's state: whether this rank holds the fp32 master of its shard
  // only, that shard's layout, the master of the elements it holds (CompactShard::held) and the
  // working copy the optimizer refreshes.
  bool sheds_master() const { return sheds_; }
  const CompactShard& master_shard() const { return master_shard_; }
  // Taking the mutable master counts as changing it (weights_version()).
  float* master() {
    ++weights_version_;
    return master_.as<float>();
  }
  const float* master() const { return master_.as<float>(); }
  // The working copy's buffer, laid out by weight_window().
  Act working() { return Act(work_.data(), dtype_); }
  DType storage_dtype() const { return dtype_; }
  // Changes whenever the weights may have: a gathered layer older than this is stale.
  uint64_t weights_version() const { return weights_version_; }
  const float* grads() const {
    DHP_ASSERT(!window_.windowed());
    return grads_.as<float>();
  }

  // What the passes keep for backward and rebuild (types/recompute.h); off until set. The
  // gradients do not depend on it; the activation arena does.
  void set_recompute(Recompute mode) { recompute_ = mode; }
  Recompute recompute() const { return recompute_; }
  // Bytes of activations the last pass carved (the arena itself holds the largest pass so
  // far, with headroom: Arena).
  size_t activation_bytes() const { return arena_.carved(); }

  void initialise(uint64_t seed);
  // The weights on the host (checkpoints, exports) and back; each synchronises with the device.
  // Where the master is sharded these are read_params and write_params of the whole arena: a
  // rank's download holds the master of its shard alone (gather_weights, trainer/optimizer.h,
  // assembles the whole), an upload keeps the master of its shard.
  std::vector<float> download_params() const;
  void upload_params(const std::vector<float>& host);
  // Host values of arena range [offset, offset + count) in and out: the master where this rank
  // holds it, the working copy widened to fp32 elsewhere (out) and rounded from them (in).
  // Under ZeRO-3 a decoder layer has no working copy between passes: out, the elements whose
  // master this rank does not hold read as zeros there.
  void write_params(int64_t offset, const float* host, int64_t count);
  void read_params(int64_t offset, int64_t count, float* host) const;
  // Whether write_params of arena range [offset, offset + count) keeps any of it on this rank:
  // always, but under ZeRO-3 a decoder layer only where this rank holds its master.
  bool keeps_any(int64_t offset, int64_t count) const;
  // The working copy widened to fp32, as the next pass reads it: the same on every rank (zeros
  // in decoder layers windowed by ZeRO-3).
  void read_working(int64_t offset, int64_t count, float* host) const;
  void zero_grads();

  // Uploads a host micro-batch into the model's batch buffers (valid until the next upload).
  const DeviceBatch& upload(const Batch& b) { return uploader_.upload(b); }
  // Runs the micro-batch forward and adds its loss statistics to the model's statistics
  // buffer. With backward = true it also back-propagates d(loss)/d(logit) scaled by
  // loss_scale (1 / the number of loss targets of the whole global batch, so that
  // accumulated gradients are those of the mean loss) and accumulates the parameter
  // gradients. `attn` is the decoder's attention (null: local attention over the pack);
  // `route` brings image tokens encoded on other ranks (null: the pack's own images).
  // `final`, when set, hears as the backward pass completes parameter gradients.
  void run(const DeviceBatch& b, float loss_scale, bool backward, Attention* attn = nullptr,
           ImageRoute* route = nullptr, const GradsFinal& final = {});
  // The statistics accumulated since the last call; synchronises with the device.
  StepStats take_stats();
  // upload + run + take_stats, for callers with one micro-batch at hand.
  StepStats step(const Batch& b, float loss_scale, bool backward);
  // What a pass tells its LayerFeed and `final`, in the same order, computing nothing: a rank
  // with no micro-batch in a wave takes part in the wave's collectives this way.
  void skip_pass(bool backward, const GradsFinal& final = {});

  // Continues a prompt of one document (targets unused) token by token with a KV cache: the
  // prompt runs once, then each new token costs one position. Stops after `eos` (not
  // returned) or max_new_tokens. logits_out, when given, receives each step's logits (V each).
  std::vector<int32_t> generate(const Batch& prompt, int32_t eos, const SamplingOptions& opt,
                                std::vector<float>* logits_out = nullptr);

 private:
  void carve(int64_t T, int64_t P, int64_t S, int64_t N, int64_t R, bool backward);
  // Vision path, decoder and final norm; leaves the normed stream in xf_ (T, d).
  void forward_hidden(const DeviceBatch& b, Attention& attn, ImageRoute* route);
  Act stream(int layer) const { return layer < int(acts_.size()) ? acts_[layer].x_in : x_final_; }
  // Rounds the master weights into the working copy if they changed since the last pass.
  void refresh_weights();
  // Where the master is sharded: f(arena offset, offset in master_, count) for each piece of
  // arena range [offset, offset + count) whose master this rank holds.
  template <class F>
  void for_each_master_piece(int64_t offset, int64_t count, F&& f) const;

  ModelConfig cfg_;
  Backend& backend_;
  const Ops& ops_;
  ParamTable table_;
  DType dtype_;                  // storage of activations and working weights (Ops::dtype)
  CompactShard master_shard_;
  LayerWindow weights_window_;   // how work_ holds the weight arena
  bool sheds_;                   // the fp32 master is this rank's shard alone (master_)
  DeviceBuffer params_;          // (n_params) fp32 master weights; empty when sheds_
  DeviceBuffer master_;          // (master_shard_.held_size()) fp32, when sheds_
  LayerWindow window_;            // how grads_ holds the gradient layout
  DeviceBuffer grads_;           // (window_.elements()) fp32
  // (weights_window_.elements()) working weights when dtype_ is not fp32 or the master is sharded
  DeviceBuffer work_;
  bool weights_stale_ = true;
  uint64_t weights_version_ = 0;
  LayerFeed* feed_ = nullptr;
  DeviceBuffer stats_;           // (1) CrossEntropyStats accumulated on the device
  ModelWeights w_;  // the working weights
  ModelParams g_;
  BlockDims dims_;
  // Where the backward pass completes gradients, for GradsFinal: the first gradient offset of
  // the lm_head (-1 when tied), the final norm, each decoder layer and the token embedding.
  int64_t lm_head_at_ = -1, final_norm_at_ = 0, tok_embed_at_ = 0;
  std::vector<int64_t> layer_at_;
  VisionPath vision_;
  LocalAttention local_attn_;
  BatchUploader uploader_;
  Arena arena_;                  // activations of the current shape
  Recompute recompute_ = Recompute::off;
  std::vector<BlockActs> acts_;  // per decoder layer
  BlockActs rebuilt_{};          // the buffers recompute rebuilds, shared by the layers
  BlockScratch scratch_{};
  Act x_final_;                  // (T, d) input of the final norm
  Act xf_;                       // (T, d) final-normed stream
  float* rstd_ = nullptr;        // (T)
  Act logits_;                   // (rows, V), rows = min(T, kLogitRows); then d(logits)
  float* lse_ = nullptr;         // (rows)
  Act dxf_;                      // (T, d) gradient of xf
  Act dx_;                       // (T, d) gradient of the decoder stream
  Act deep_rows_;                // DeepStack: (T, d) one set's rows, zero at text positions
  Act drows_;                    // (R, sets·d) gradient of routed image token rows
};

}  // namespace dhp
