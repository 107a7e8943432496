// The model's shape, exactly the names of model-spec.md's [model] and [model.vision] sections,
// plus the pretrained towers' keys (docs/vision_towers.md).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "types/architecture.h"
#include "types/image_geometry.h"

namespace dhp {

// A GELU of the tower's MLP or the projector (kernels' GeluKind by name):
//   gelu_tanh: the tanh approximation (Hugging Face gelu_pytorch_tanh);
//   gelu:      the exact erf form (nn.GELU());  quick_gelu: x·sigmoid(1.702x).
enum class VisionAct : uint8_t { gelu_tanh, gelu, quick_gelu };
inline constexpr std::pair<VisionAct, std::string_view> kVisionActNames[] = {
    {VisionAct::quick_gelu, "quick_gelu"}, {VisionAct::gelu_tanh, "gelu_tanh"},
    {VisionAct::gelu, "gelu"}};
inline constexpr std::pair<ProjectorAct, std::string_view> kProjectorActNames[] = {
    {ProjectorAct::automatic, "auto"}, {ProjectorAct::gelu_tanh, "gelu_tanh"},
    {ProjectorAct::gelu, "gelu"}, {ProjectorAct::quick_gelu, "quick_gelu"}};

// RoPE's frequency scaling (model.rope_scaling): none, or Llama-3.x's "llama3" (kernels/
// rope_spec.h has the formula; its parameters are model.rope_factor, rope_low_freq_factor,
// rope_high_freq_factor and rope_original_max_pos), or transformers' "dynamic" NTK scaling
// (InternVL3's Qwen2.5 configs), which changes nothing on sequences within
// max_position_embeddings: dhp runs it as plain RoPE there, refuses longer ones and writes it
// back (with model.rope_factor) on export.
enum class RopeScaling : uint8_t { none, llama3, dynamic };
inline constexpr std::pair<RopeScaling, std::string_view> kRopeScalingNames[] = {
    {RopeScaling::none, "none"}, {RopeScaling::llama3, "llama3"}, {RopeScaling::dynamic, "dynamic"}};

// The image geometry (patch, merge, min_pixels, max_pixels, resize, image_size and the pixel
// constants) plus the encoder's shape.
struct VisionConfig : ImageGeometry {
  VisionArch arch = VisionArch::native;
  int dim = 64;              // dv (HF hidden_size)
  int layers = 1;            // encoder layers (HF num_hidden_layers: every one is a parameter;
                             // clip/siglip run those up to feature_layer); 0 = patch embedding,
                             // norm and projector only
  int heads = 4;             // vheads; head dim = dim / heads
  int ffn = 128;             // vffn: the MLP's hidden size (SwiGLU or GELU MLP: the row's)
  // Where the tower's row (TowerTraits) reads them:
  double norm_eps = 1e-5;    // the norms' eps unless the row fixes it (HF layer_norm_eps)
  VisionAct act = VisionAct::quick_gelu;  // a GELU MLP's activation (HF hidden_act)
  // A pretrained tower's hidden_states index the projector reads (LLaVA vision_feature_layer):
  // negative counts from the end (-1 = the last layer's output), 0 = the embeddings (after
  // pre_layrnorm).
  int feature_layer = -2;
  // DeepStack (TowerTraits::deepstack): the tower layers (0-based, increasing) whose outputs
  // feed their own mergers, added into the decoder's stream after layers 0, 1, ... (HF
  // deepstack_visual_indexes). Empty: none.
  std::vector<int> deepstack;
  ProjectorAct projector_act = ProjectorAct::automatic;
  // A CLIP or SigLIP Hugging Face folder the tower starts from (trainer/hf_*). "" = none.
  std::string init;
  // Parts of a pretrained tower that LLaVA never runs, held (frozen, never run) so that an
  // export writes every tensor its folder had: post_layernorm, SigLIP's attention-pooling head
  // (SiglipMultiheadAttentionPoolingHead). Set from the folder's tensors by the import.
  bool post_norm = false;
  bool pool_head = false;
  // An original LLaVA checkpoint holding a copy of its tower: read that copy instead of
  // model.vision.init's (LLaVA itself reads it only when its config sets
  // unfreeze_mm_vision_tower, which has the same effect here).
  bool embedded_tower = false;
  // model.vision.resize was named by the configuration file or the command line (not a key:
  // set by the parser): it then wins over a folder's preprocessor_config.json.
  bool resize_stated = false;

  int head_dim() const { return dim / heads; }
  const TowerTraits& traits() const { return tower_traits(arch); }
  // The patch embedding's input: temporal_patch frames of patch_numel() values.
  int64_t embed_numel() const { return traits().temporal_patch * patch_numel(); }
  // The merged features' width and the projector's hidden width, for a decoder of width d.
  int64_t merged_dim() const { return int64_t(merge) * merge * dim; }
  int64_t projector_hidden(int64_t d) const {
    return traits().projector_hidden == ProjectorHidden::merged ? merged_dim() : d;
  }
  // Image token sets the decoder takes per merged token: the projector's, then one per
  // DeepStack layer.
  int image_sets() const { return 1 + int(deepstack.size()); }
  // Encoder layers that run: all, or those up to feature_layer (TowerTraits::feature_layer).
  int layers_run() const {
    if (!traits().feature_layer) return layers;
    return feature_layer < 0 ? layers + 1 + feature_layer : feature_layer;
  }
  // The pretrained position grid's side: image_size / patch.
  int pos_grid() const { return patch > 0 ? image_size / patch : 0; }
  int64_t pos_rows() const {
    return int64_t(pos_grid()) * pos_grid() + (traits().class_row ? 1 : 0);
  }
  ProjectorAct projector_gelu() const {
    if (projector_act != ProjectorAct::automatic) return projector_act;
    return traits().projector_act;
  }
};

// What the data path reads of a tower: its image geometry, with the row's frames per image.
inline ImageGeometry data_geometry(const VisionConfig& v) {
  ImageGeometry g = v;
  g.video_frames_per_image = v.traits().temporal_patch;
  if (g.max_tiles < 0) g.max_tiles = v.traits().max_tiles;
  return g;
}

// The pixel constants a tower normalises by when the config does not set them.
inline std::pair<std::array<double, 3>, std::array<double, 3>> default_pixel_norm(VisionArch a) {
  return {tower_traits(a).pixel_mean, tower_traits(a).pixel_std};
}

struct ModelConfig {
  int dim = 128;        // d
  int layers = 2;
  int heads = 4;
  int kv_heads = 2;
  int head_dim = 0;     // 0 = dim / heads
  int ffn = 256;
  int vocab_size = 512;
  double rope_theta = 10000.0;
  bool tie_embeddings = false;
  // Names added by dhp beyond model-spec.md (docs/pretrained.md), for Hugging Face decoders:
  bool attention_bias = false;   // q/k/v projections of the decoder carry biases (Qwen2)
  // The attention's output projection carries a bias too (Llama's and Qwen3's attention_bias
  // bias q, k, v and o).
  bool attention_out_bias = false;
  double rms_norm_eps = 1e-6;    // eps of the decoder's RMSNorms; the vision encoder keeps 1e-6
  // Qwen3: q and k RMSNormed over each head (weights attn.q_norm, attn.k_norm (head_dim), eps
  // rms_norm_eps) after their projections, before RoPE.
  bool qk_norm = false;
  // The decoder's RoPE frequencies (the vision encoder's stay plain): Llama-3.x's "llama3"
  // scaling with its four parameters (Llama-3.1's values by default).
  RopeScaling rope_scaling = RopeScaling::none;
  double rope_factor = 8.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int64_t rope_original_max_pos = 8192;
  // config.json's max_position_embeddings of the folder the decoder came from, which an
  // export writes back (0: none known; an export then writes the run's data.max_tokens).
  int64_t max_positions = 0;
  // M-RoPE (Qwen2-VL's multimodal RoPE, kernels/rope_spec.h): the decoder's rotary pairs split
  // over each token's temporal, height and width positions (Batch::rope_pos: an image's
  // tokens take their rows and columns), the counts summing to head_dim / 2; all 0 = 1-D RoPE.
  // Interleaved is Qwen3-VL's layout of the axes over the pairs, blocked Qwen2-VL's.
  std::array<int, 3> mrope_section = {0, 0, 0};
  bool mrope_interleaved = true;
  // A Hugging Face folder the decoder starts from (trainer/hf_checkpoint.h): its config.json
  // sets the decoder's shape, its tensors the decoder's weights. "" = none.
  std::string init;
  VisionConfig vision;

  int hd() const { return head_dim > 0 ? head_dim : dim / heads; }
  bool mrope() const { return mrope_section[0] + mrope_section[1] + mrope_section[2] > 0; }
  int q_dim() const { return heads * hd(); }
  int kv_dim() const { return kv_heads * hd(); }
};

}  // namespace dhp
