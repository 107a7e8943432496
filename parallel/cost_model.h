// Cost model of design.md §2.1: the time of one micro-batch (a group of sequences) run
// together on a ring of d ranks, priced as the execution engine runs it (design.md §4).
//
//   T(G, d) = vision + exchange + decoder + c_seq·|G|
//
//   vision    images are never split: the group's images are dealt longest-first to the
//             least loaded rank by patch count (balance_images); the vision stage lasts as
//             long as its busiest rank: c_flop·(encoder + projector FLOPs of its images)
//             + c_att·(their bidirectional attention pairs) + c_wbyte·(vision weights
//             streamed once per pass). No ring in the vision encoder. A clip/siglip tower
//             runs its layers up to feature_layer only, with LayerNorm and a two-matrix GELU
//             MLP; a clip image's class row is one more encoder row, inside its attention.
//   exchange  (d > 1) each rank sends the merged tokens of its images to the ranks whose
//             zigzag ranges hold their positions, and the gradients come back:
//             c_byte·bytes·(d-1)/d² + 2·c_step.
//   decoder   c_flop·F/d + c_wbyte·(decoder weights streamed once per pass)
//             + per layer: the local block (A/d²) and d-1 ring steps, each costing
//             max(compute A/d², transfer) where transfer = passes·c_step + c_byte·B/d
//             (compute + transfer on a device that does not overlap them, the CPU):
//             the ring moves one K/V block of the whole micro-batch per step, so its
//             latency is paid once per ring step of the micro-batch, not per sequence.
//
// F: decoder token-linear FLOPs (GEMMs, lm_head) of every sequence, A: attention FLOPs of one
// layer over the (query, key) pairs the causal mask keeps (packed documents never see each
// other), B: K/V bytes (and dK/dV in backward) one layer's ring moves. The c_wbyte term is the
// efficiency loss of small per-rank chunks: a GEMM over t tokens streams its weights once
// whatever t is, so at small t it is bound by memory bandwidth, not FLOPs; equivalently GEMM
// efficiency t/(t + t_half) with t_half = c_wbyte·weight bytes / (c_flop·FLOPs per token).
//
// Times are returned as integer nanoseconds ("ticks") so every rank compares the same
// integers. A ring is priced at inter-node bandwidth when its ranks span more than one node.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <vector>

#include "types/model_config.h"
#include "types/recompute.h"

namespace dhp {

// What the planner knows of a sample: lengths only, no pixels.
struct SeqShape {
  int64_t id = 0;             // sample id in the dataset, named in errors
  int64_t text_tokens = 0;    // decoder text tokens, markers included
  int64_t vision_tokens = 0;  // decoder image tokens (after the merge)
  int32_t images = 0;         // images the vision tokens split over (equal split assumed)
  // The tower's images those make (InternVL's tiles: one image is several, each its own
  // attention, all encoded on one rank); 0: one each.
  int32_t tiles = 0;
  int64_t tokens() const { return text_tokens + vision_tokens; }
  // The tower's images an image makes (its tiles), the equal split's.
  int64_t tiles_per_image() const { return images > 0 && tiles > images ? tiles / images : 1; }
};

// The largest token count of one sample the planner accepts (and the largest image count):
// beyond it sums of tokens, pairs and bytes would lose precision or overflow.
inline constexpr int64_t kMaxSampleTokens = int64_t(1) << 26;

// Throws dhp::Error naming the sample when its counts are negative, empty, absurdly large,
// or when its images do not match its vision tokens (images >= 1 iff vision tokens > 0, and
// no more images than vision tokens).
void validate_shape(const SeqShape& s);

// Seconds per unit of each term of the model; refit() estimates them from measured times.
struct CostCoeffs {
  double sec_per_flop = 0;        // token-linear FLOPs (GEMMs)
  double sec_per_att_flop = 0;    // attention FLOPs
  double sec_per_byte_intra = 0;  // ring / image-token transfer, ring inside one node
  double sec_per_byte_inter = 0;  // the same across nodes
  double sec_per_step = 0;        // latency of one ring step (one pass of one layer)
  double sec_per_seq = 0;         // fixed cost of a sequence in a micro-batch
  double sec_per_weight_byte = 0; // weights streamed from memory, once per pass per micro-batch
  static constexpr int kCount = 7;
  double& operator[](int i);
  double operator[](int i) const;
  static const char* name(int i);
  nlohmann::json to_json() const;
  static CostCoeffs from_json(const nlohmann::json& j);  // every field required, each > 0
};

// A device: cost coefficients plus what the memory model needs to know about precision.
struct DeviceProfile {
  std::string name;
  CostCoeffs coeffs;
  int act_bytes = 4;              // bytes per element of the storage dtype (activations, and
                                  // the working copy of the weights: types/state_bytes.h)
  int weight_bytes = 4;           // bytes a pass streams per weight
  int64_t workspace_bytes = 0;    // kernels' scratch, allocator slack
  int64_t logits_chunk = 1024;    // tokens whose logits exist at once (chunked loss)
  // Does a ring step's transfer run beside its compute (a GPU's copy engines and NCCL)? On
  // the CPU the one compute thread also copies the blocks and merges the partial results, so
  // a step costs compute + transfer there, and max(compute, transfer) where they overlap.
  bool ring_overlap = true;
  // MFU's denominator per device: a GPU's dense BF16 tensor-core peak (datasheet); on the CPU,
  // the one-thread GEMM rate its profile measured (peak_measured: times the compute threads,
  // and the step line says so).
  double peak_flops = 0;
  bool peak_measured = false;
};

// "cpu" (measured with `dhp profile`, see cost_model.cpp), "a100", "h100", "h200" (sourced
// hardware figures and stated assumptions; the profiling pass and the online refit replace
// them).
// "auto" is the profile a run picks once it knows its device (profile_for_device); before that
// (dhp plan, a Planner made outside a run) it is the CPU's.
DeviceProfile device_profile(const std::string& name);
std::vector<std::string> device_profile_names();

// The profile that prices a GPU named `device_name` (its product name, "NVIDIA H100 80GB
// HBM3"): the one of its chip, else the nearest by generation; `why` says which and why.
std::string profile_for_device(const std::string& device_name, std::string* why);

// "tiny" (the built-in defaults of model/config.h), and the decoders of published
// vision-language models behind one vision tower: "7b", "13b", "34b", "72b" (cost_model.cpp).
ModelConfig model_profile(const std::string& name);
std::vector<std::string> model_profile_names();

// Images of a group with the same patch count, dealt as one class.
// `count` images of `patches` patches each, every one of them `tiles` tower images (InternVL's
// tiles) of patches / tiles patches: encoded on one rank, attention within each tile.
struct ImageClass {
  int64_t patches = 0;
  int64_t count = 0;
  int64_t tiles = 1;
  double squares() const { return double(patches) * double(patches) / double(tiles); }  // attention pairs
};

// Sorts image classes largest first and merges classes of equal patch count (the order
// balance_images expects).
void merge_image_classes(std::vector<ImageClass>& classes);

// The vision encoder's assignment: images dealt longest-first (by patch count) to the least
// loaded rank of d. Ranks that received the same images form one level.
struct ImageLevel {
  int64_t patches = 0;   // patches each rank of the level encodes
  double squares = 0;    // sum of its images' patches squared (attention pairs per layer)
  int64_t images = 0;    // images each rank of the level encodes
  int64_t ranks = 0;
};
// `classes` sorted by patches, largest first, patch counts distinct. Levels ascending by
// patches. `work` counts the steps taken (for the planner's budget).
void balance_images(std::span<const ImageClass> classes, int d, std::vector<ImageLevel>& levels,
                    int64_t* work = nullptr);

// The images of a sample as classes, larger first: its vision tokens split evenly over its
// images (the first vision_tokens mod images one token larger), m2 patches per token, plus
// `extra` encoder rows per image (a clip tower's class row: ImageClass::patches counts the
// rows of the image's encoder stream). Returns how many of out[0..1] are used.
int image_classes(const SeqShape& s, int m2, ImageClass out[2], int extra = 0);
// The encoder rows an image has beyond its patches: 1 for a clip tower's class row.
inline int extra_image_rows(const ModelConfig& m) { return m.vision.traits().class_row ? 1 : 0; }

// Per-sample terms, computed once. Integer counts, so that a group's sums, and with them its
// time, do not depend on the order its sequences are added in.
struct SeqCost {
  int64_t tokens = 0;          // decoder tokens
  int64_t pairs = 0;           // decoder (query, key) pairs under the causal mask
  int64_t vision_tokens = 0;   // merged image tokens (exchanged between ranks)
  ImageClass img[2];           // its images: the larger ones first (equal split of the tokens)
};

// A micro-batch being assembled, sequence by sequence (CostModel prices it).
class GroupCost {
 public:
  void add(const SeqCost& c);
  void clear();
  int64_t seqs() const { return seqs_; }

 private:
  friend class CostModel;
  int64_t tokens_ = 0, pairs_ = 0, vision_tokens_ = 0, seqs_ = 0;
  int64_t patches_ = 0;          // all images on one rank
  double squares_ = 0;
  std::vector<ImageClass> classes_;
};

class CostModel {
 public:
  // recompute: selective costs as off (its rebuilt ops are pointwise, memory-bound and small
  // beside the GEMMs); full adds a forward pass, the ring's included.
  CostModel(const ModelConfig& model, const DeviceProfile& device, int ranks_per_node,
            Recompute recompute = Recompute::off);

  SeqCost prepare(const SeqShape& s) const;

  // A micro-batch of sequences on a ring of d ranks; inter: the ring spans several nodes.
  // `work` (optional) receives the bookkeeping steps of the image balancing.
  double seconds(const GroupCost& g, int d, bool inter, int64_t* work = nullptr) const;
  int64_t ticks(const GroupCost& g, int d, bool inter, int64_t* work = nullptr) const;
  double group_seconds(std::span<const SeqCost* const> g, int d, bool inter, int64_t* work = nullptr) const;
  int64_t group_ticks(std::span<const SeqCost* const> g, int d, bool inter, int64_t* work = nullptr) const;
  // One sequence alone, on a ring placed as the planners place it (inside a node if it fits).
  double seconds(const SeqCost& c, int d) const;
  int64_t ticks(const SeqCost& c, int d) const;
  bool inter(int d) const { return d > ranks_per_node_; }

  // Mask-aware (query, key) pair counts of the decoder and of the vision encoder (per layer).
  static double decoder_pairs(const SeqShape& s);
  double vision_pairs(const SeqShape& s) const;

  // The time is linear in the coefficients once it is known which ring steps are exposed and
  // which rank is the vision stage's slowest; these are the features (one per CostCoeffs
  // field, in order) under the current coefficients: time = sum of features[i] · coeffs[i].
  std::vector<double> features(const GroupCost& g, int d, bool inter) const;
  std::vector<double> features(const SeqCost& c, int d) const;

  // A lower bound on what sequence s adds to the rank-time (d x time) of any micro-batch
  // with ring degree d that holds it, for any lambda in [0, 1]: the ring steps' max(compute,
  // transfer) is bounded below by lambda·compute + (1-lambda)·transfer (latency left out),
  // which splits over the sequences of the group; the vision stage by its average load.
  double area_lower_bound(const SeqCost& c, int d, double lambda) const;
  // A lower bound on any micro-batch holding s with ring degree d: s's own vision, decoder,
  // ring (with its latency) and weight streaming, with the vision stage at
  // max(largest image, average load).
  double time_lower_bound(const SeqCost& c, int d) const;
  // min over d in [lo, hi] of area_lower_bound(c, d, lambda), exactly: on each side of the
  // node size the bound is K + alpha/d + beta·d, so only the ends and the integers next to
  // sqrt(alpha/beta) need evaluating.
  double min_area_lower_bound(const SeqCost& c, int lo, int hi, double lambda) const;
  // What any micro-batch pays on each of its ranks whatever it holds: the decoder's weights
  // streamed once per pass (used to stop scans early).
  // The model FLOPs of training on `s` (forward and backward, 3x the forward's; recompute and
  // flash attention's recomputed scores not counted, as MFU counts them): the decoder's GEMMs
  // and lm_head per token, causal attention over the sample's real length, the vision tower
  // (GEMMs and attention per image) and the projector.
  double model_flops(const SeqShape& s) const;
  double fixed_seconds() const { return coeffs_.sec_per_weight_byte * dec_weight_bytes_; }
  // The ring-step latency of one layer pass set (what each of the d-1 steps costs at least).
  double step_latency() const { return model_.layers * ring_passes_ * coeffs_.sec_per_step; }
  // Bytes the decoder's RMSNorms stream per token over all passes (sec_per_weight_byte's feature).
  double norm_bytes_per_token() const { return dec_norm_bytes_per_token_; }

  const CostCoeffs& coeffs() const { return coeffs_; }
  void set_coeffs(const CostCoeffs& c) { coeffs_ = c; }
  // The model's measured relative error per ring degree (measured_error below): how far apart
  // two predictions must be before the planner trusts the difference. Empty: not measured,
  // every prediction is taken as exact.
  const std::vector<double>& error_by_degree() const { return error_; }
  void set_error_by_degree(std::vector<double> e) { error_ = std::move(e); }
  // The error of a group on a ring of d ranks: the measured one of its degree, or where that
  // degree was not observed, the largest measured at any degree (0 when nothing was).
  double relative_error(int d) const;
  const ModelConfig& model() const { return model_; }
  const DeviceProfile& device() const { return device_; }
  int ranks_per_node() const { return ranks_per_node_; }
  Recompute recompute() const { return recompute_; }
  double decoder_weight_bytes() const { return dec_weight_bytes_; }
  // ZeRO-3 (trainer/layer_gather.h): before a pass reads a decoder layer its weights,
  // `layer_bytes` of them, are gathered over the `world` ranks from their owners, the next layer's
  // while this one computes. A training pass gathers every layer going forward and all but the
  // last two going backward; each of those layers then costs the larger of its GEMMs and its
  // gather. 0 bytes: none.
  void price_layer_gathers(int64_t layer_bytes, int world);
  double gather_seconds() const;  // one gather, as priced
  double vision_weight_bytes() const { return vis_weight_bytes_; }

 private:
  struct Vision {
    bool images = false;
    int64_t patches = 0;  // the slowest vision rank's patches and squared patches
    double squares = 0;
  };
  Vision vision(const GroupCost& g, int d, int64_t* work) const;
  double evaluate(const GroupCost& g, const Vision& v, int d, bool inter, double* f) const;
  double image_lin(int64_t patches) const;
  double image_att(const ImageClass& im) const;  // one image's

  ModelConfig model_;
  DeviceProfile device_;
  CostCoeffs coeffs_;
  std::vector<double> error_;  // [d]: relative error at ring degree d (0 = not observed)
  int ranks_per_node_;
  Recompute recompute_;
  int m2_;
  int extra_rows_;   // encoder rows per image beyond its patches (extra_image_rows)
  double dec_flops_per_token_, vis_flops_per_patch_, proj_flops_per_token_;
  // Forward FLOPs of the model (model_flops): per decoder token, per kept decoder (query, key)
  // pair over all layers, per encoder row, per encoder pair over the layers run, per merged token.
  double fwd_per_token_, fwd_per_pair_, fwd_per_patch_, fwd_per_patch_pair_, fwd_per_merged_;
  double dec_att_per_pair_, vis_att_per_pair_, dec_bytes_per_token_, xfer_bytes_per_token_;
  double dec_weight_bytes_, vis_weight_bytes_;
  double dec_norm_bytes_per_token_;  // the decoder's RMSNorms (q/k norms included), streamed
  int passes_;       // GEMM passes: forward, backward dX, backward dW (+ recompute forward)
  int ring_passes_;  // forward, backward (and the recompute forward) each run the ring
  double gather_moved_ = 0;    // bytes a rank sends per layer gather (ZeRO-3); 0: none
  bool gather_inter_ = false;  // the gathers span several nodes
};

// One measured group: its sequences ran together on a ring of `degree` ranks in `seconds`.
struct TimingObservation {
  std::vector<SeqShape> seqs;
  int degree = 1;
  double seconds = 0;
  bool inter = false;  // the ring spanned several nodes
};

// Least squares on relative error, with a pull of weight `prior_weight` towards the model's
// current coefficients so that terms the observations do not exercise (e.g. ring transfer
// when every observation ran on one rank) keep their prior values. Iterates the choice of
// exposed ring steps and of the slowest vision rank until it settles. Coefficients stay
// positive.
CostCoeffs refit(const CostModel& model, const std::vector<TimingObservation>& obs,
                 double prior_weight = 1e-3);

// The online refit's state, kept in checkpoints so a resumed run plans with what the run had
// learned: the coefficients in use, the observations they came from, and the cost profile
// (parallel.cost_profile) they refine.
struct CostState {
  std::string device;
  CostCoeffs coeffs;
  std::vector<TimingObservation> window;  // oldest first
  nlohmann::json to_json() const;
  static CostState from_json(const nlohmann::json& j);  // throws dhp::Error on a bad state
};

// Mean |predicted - measured| / measured of the model over the observations.
double mean_relative_error(const CostModel& model, const std::vector<TimingObservation>& obs);

// Per ring degree d, the median |predicted - measured| / measured of the model over the
// observations of degree d ([d]; 0 where none ran at d; index 0 unused). Degrees with fewer
// than `min_count` observations count as not observed.
std::vector<double> measured_error(const CostModel& model, const std::vector<TimingObservation>& obs,
                                   int min_count = 3);

}  // namespace dhp
