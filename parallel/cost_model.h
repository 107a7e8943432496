// Cost model of design.md §2.1: the time of one sequence on a group of d ranks.
//
//   T(s, d) = (c_flop·F(s) + c_att·A(s)) / d  +  exposed ring time  +  c_seq
//
// F(s) is the token-linear work (decoder GEMMs, lm_head, vision encoder, projector), A(s) the
// attention work over the (query, key) pairs the masks keep: causal over the decoder sequence
// and bidirectional inside each image in the vision encoder, whose tokens are m² per decoder
// image token before the merge. Per layer a ring does d-1 steps; a step moves a K/V block of
// L/d tokens while computing the attention of the previous block (A/d² per rank), so only
// max(0, transfer - compute) per step is added. Times are returned as integer nanoseconds
// ("ticks") so every rank compares the same integers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace dhp {

// What the planner knows of a sample: lengths only, no pixels.
struct SeqShape {
  int64_t id = 0;             // sample id in the dataset, named in errors
  int64_t text_tokens = 0;    // decoder text tokens, markers included
  int64_t vision_tokens = 0;  // decoder image tokens (after the merge)
  int32_t images = 0;         // images the vision tokens split over (equal split assumed)
  int64_t tokens() const { return text_tokens + vision_tokens; }
};

// Seconds per unit of each term of the model; refit() estimates them from measured times.
struct CostCoeffs {
  double sec_per_flop = 0;        // token-linear FLOPs
  double sec_per_att_flop = 0;    // attention FLOPs
  double sec_per_byte_intra = 0;  // ring transfer, group inside one node
  double sec_per_byte_inter = 0;  // ring transfer, group larger than a node
  double sec_per_step = 0;        // latency of one ring step of one layer
  double sec_per_seq = 0;         // fixed cost of a sequence (launches, bookkeeping)
};

// A device: cost coefficients plus what the memory model needs to know about precision.
struct DeviceProfile {
  std::string name;
  CostCoeffs coeffs;
  int act_bytes = 4;              // bytes per stored activation element
  int weight_bytes = 4;           // working copy of a parameter
  int grad_bytes = 4;
  int optim_bytes = 8;            // optimizer state per parameter (master copy, moments)
  int64_t workspace_bytes = 0;    // kernels' scratch, allocator slack
  int64_t logits_chunk = 1024;    // tokens whose logits exist at once (chunked loss)
};

// "cpu" (defaults meant to be replaced by a measured profiling pass), "a100", "h100", "h200".
DeviceProfile device_profile(const std::string& name);
std::vector<std::string> device_profile_names();

// "tiny" (the built-in defaults of model/config.h) and "7b" (a Qwen2-VL-7B-like shape).
ModelConfig model_profile(const std::string& name);

// Per-sample terms, computed once; index 0 is the decoder, 1 the vision encoder.
struct SeqCost {
  double linear_flops = 0;     // forward + backward (+ recompute) token-linear FLOPs
  double att_flops[2] = {0, 0};   // attention FLOPs of one layer over the whole sequence
  double ring_bytes[2] = {0, 0};  // bytes one layer's rings move for the whole sequence
  int layers[2] = {0, 0};
};

class CostModel {
 public:
  CostModel(const ModelConfig& model, const DeviceProfile& device, int ranks_per_node,
            bool recompute = false);

  SeqCost prepare(const SeqShape& s) const;
  double seconds(const SeqCost& c, int d) const;
  int64_t ticks(const SeqCost& c, int d) const;  // nanoseconds, rounded

  // Mask-aware (query, key) pair counts of the decoder and of the vision encoder.
  static double decoder_pairs(const SeqShape& s);
  double vision_pairs(const SeqShape& s) const;

  // The model is linear in the coefficients once it is known which ring steps are exposed;
  // these are the features (one per CostCoeffs field, in order) under the current coeffs.
  std::vector<double> features(const SeqCost& c, int d) const;

  const CostCoeffs& coeffs() const { return coeffs_; }
  void set_coeffs(const CostCoeffs& c) { coeffs_ = c; }
  const ModelConfig& model() const { return model_; }
  const DeviceProfile& device() const { return device_; }
  int ranks_per_node() const { return ranks_per_node_; }
  bool recompute() const { return recompute_; }

 private:
  ModelConfig model_;
  DeviceProfile device_;
  CostCoeffs coeffs_;
  int ranks_per_node_;
  bool recompute_;
  double dec_flops_per_token_, vis_flops_per_patch_, proj_flops_per_token_;
  double dec_att_per_pair_, vis_att_per_pair_, dec_bytes_per_token_, vis_bytes_per_patch_;
  int ring_passes_;  // forward, backward (and the recompute forward) each run the ring
};

// One measured group: its sequences ran on `degree` ranks in `seconds`.
struct TimingObservation {
  std::vector<SeqShape> seqs;
  int degree = 1;
  double seconds = 0;
};

// Least squares on relative error, with a pull of weight `prior_weight` towards the model's
// current coefficients so that terms the observations do not exercise (e.g. ring transfer
// when every observation ran on one rank) keep their prior values. Iterates the choice of
// exposed ring steps until it settles. Coefficients stay positive.
CostCoeffs refit(const CostModel& model, const std::vector<TimingObservation>& obs,
                 double prior_weight = 1e-3);

}  // namespace dhp
