// The one parameter table (model-spec.md "Parameter names"): every tensor's name, shape, flags,
// group and initialiser, carved out of one contiguous arena. Gradients and optimizer moments
// exist for trainable parameters only: they live in a second, compact layout (grad_offset)
// that runs over the trainable parameters in table order. With every group trainable the two
// layouts coincide, so one offset addresses a parameter in all arenas.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/op_types.h"
#include "types/param_group.h"
#include "types/model_config.h"

namespace dhp {

enum class Init { Normal, Zeros, Ones };

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;  // Linear weights (out_features, in_features)
  Init init = Init::Normal;
  float std = 0.02f;           // for Init::Normal
  bool decay = false;          // AdamW weight decay applies
  int64_t offset = 0;          // elements from the start of the arena
  ParamGroup group = ParamGroup::Language;  // from the name's prefix
  bool trainable = true;       // its group trains in this run
  // Elements from the start of the gradient (and moment) layout; for a frozen parameter the
  // offset the next trainable one has, so "every gradient at >= grad_offset" stays meaningful.
  int64_t grad_offset = 0;
  int64_t numel() const;
  // Elements it takes in the arena and the gradient layout: every tensor is 16-float aligned
  // so rows of SIMD loads never straddle two tensors.
  int64_t padded() const { return (numel() + 15) / 16 * 16; }
};

class ParamTable {
 public:
  // `groups` says which groups train; a parameter whose name falls in no group is an error.
  explicit ParamTable(const ModelConfig& cfg, const ParamGroups& groups = {});
  const std::vector<ParamSpec>& specs() const { return specs_; }
  int64_t total() const { return total_; }
  // Elements of the gradient and moment layout: the trainable parameters.
  int64_t trainable_total() const { return trainable_total_; }
  bool all_trainable() const { return trainable_total_ == total_; }
  // Elements of the parameters of group g (unpadded).
  int64_t group_numel(ParamGroup g) const;
  const ParamGroups& groups() const { return groups_; }
  // Throws dhp::Error for an unknown name.
  const ParamSpec& get(const std::string& name) const;
  const ParamSpec* find(const std::string& name) const;
  // f(weight offset, gradient-layout offset, count) for each trainable parameter's piece of
  // gradient range [begin, end).
  template <class F>
  void for_each_trainable(int64_t begin, int64_t end, F&& f) const {
    for (const ParamSpec& p : specs_) {
      if (!p.trainable) continue;
      const int64_t a = std::max(p.grad_offset, begin), b = std::min(p.grad_offset + p.numel(), end);
      if (a < b) f(p.offset + (a - p.grad_offset), a, b - a);
    }
  }

  // Seeded initialisation of an arena of total() floats. Each parameter draws from a stream
  // keyed by its name, so the weights depend on (seed, name) only: the same on every rank and
  // world size, and unchanged when another parameter is added.
  void initialise(float* arena, uint64_t seed) const;

 private:
  void add(std::string name, std::vector<int64_t> shape, Init init, bool decay, float std = 0.02f);
  std::vector<ParamSpec> specs_;
  int64_t total_ = 0, trainable_total_ = 0;
  ParamGroups groups_;
};

// The group a parameter name belongs to, by its prefix; nullopt for a name of no group.
std::optional<ParamGroup> group_of(const std::string& name);

// Pointers into an arena for one transformer block: P is float* for the fp32 arenas (master
// weights, gradients) and Act for the working weights in the ops' storage dtype.
template <class P>
struct BlockParamsOf {
  P attn_norm;  // (C)
  P wq;         // (Hq·hd, C)
  P wk;         // (Hkv·hd, C)
  P wv;         // (Hkv·hd, C)
  P wo;         // (C, Hq·hd)
  P mlp_norm;   // (C)
  P w1;         // (F, C)
  P w2;         // (C, F)
  P w3;         // (F, C)
  P bq;         // (Hq·hd) or null: q/k/v biases (model.attention_bias; towers with biases)
  P bk;         // (Hkv·hd) or null
  P bv;         // (Hkv·hd) or null
  P q_norm;     // (hd) or null: Qwen3's per-head q/k RMSNorm weights (model.qk_norm)
  P k_norm;     // (hd) or null
  // LayerNorm's biases, the output projection's bias and the GELU MLP fc2(act(fc1(x))), whose
  // weights are w1 (fc1, (F, C)) and w2 (fc2, (C, F)); w3 is null there (types/architecture.h:
  // the row's norm, MLP and biases). Each null where the block has none.
  P attn_norm_b;  // (C)
  P bo;           // (C); also the decoder's, with model.attention_out_bias (else null)
  P mlp_norm_b;   // (C)
  P b1;           // (F)  fc1 bias
  P b2;           // (C)  fc2 bias
  // LayerScale (InternViT's ls1, ls2; TowerTraits::layer_scale), or null: the attention's and
  // the MLP's outputs scaled per channel before their residual adds.
  P ls1;          // (C)
  P ls2;          // (C)
};

// One DeepStack merger (model.vision.deepstack): a LayerNorm of the merged features, then the
// projector's Linear, GELU, Linear.
template <class P>
struct DeepstackParamsOf {
  P norm_w, norm_b;  // (m²·dv)
  P fc1_w;           // (hidden, m²·dv)
  P fc1_b;           // (hidden)
  P fc2_w;           // (d, hidden)
  P fc2_b;           // (d)
};

// Every parameter of the model as pointers into one arena.
template <class P>
struct ModelParamsOf {
  P patch_embed_w;           // (dv, temporal_patch·p·p·3)
  // Each optional tensor is null where the tower's row (TowerTraits) has none.
  P patch_embed_b;           // (dv): patch_bias
  P class_embed;             // (dv): class_row
  P pos_embed;               // (g0² (+ 1 with a class row), dv): learned positions
  P pre_norm_w, pre_norm_b;  // (dv): pre_norm (CLIP's pre_layrnorm)
  // Every layer of the table (all model.vision.layers), though a pretrained tower runs only
  // vision.layers_run() of them.
  std::vector<BlockParamsOf<P>> vision_layers;
  P vision_norm;             // (dv): final_norm (LLaVA's features skip the last norm)
  P vision_norm_b;           // (dv): a final LayerNorm's bias
  P proj_norm_w, proj_norm_b;  // (m²·dv): TowerTraits::projector_norm, before fc1
  // The projector, hidden = VisionConfig::projector_hidden(d).
  P fc1_w;                   // (hidden, m²·dv)
  P fc1_b;                   // (hidden)
  P fc2_w;                   // (d, hidden)
  P fc2_b;                   // (d)
  std::vector<DeepstackParamsOf<P>> deepstack;
  P tok_embed;               // (V, d)
  std::vector<BlockParamsOf<P>> layers;
  P final_norm;              // (d)
  P lm_head;                 // (V, d); equals tok_embed when tied
};

using BlockParams = BlockParamsOf<float*>;
using ModelParams = ModelParamsOf<float*>;
using BlockWeights = BlockParamsOf<Act>;
using ModelWeights = ModelParamsOf<Act>;

// P is float* or Act.
template <class P>
ModelParamsOf<P> bind_params(const ParamTable& table, const ModelConfig& cfg, P arena);
// Pointers into a gradient buffer laid out by `window` (model/layer_window.h): null for a frozen
// parameter, which tells the backward pass to skip that gradient.
struct LayerWindow;
ModelParams bind_grads(const ParamTable& table, const ModelConfig& cfg, float* buffer, const LayerWindow& window);
// Pointers into a working copy laid out by `window` (ZeRO-3 windows the decoder layers: each
// layer's pointers are valid while its slot holds it).
ModelWeights bind_weights(const ParamTable& table, const ModelConfig& cfg, Act buffer, const LayerWindow& window);

}  // namespace dhp
