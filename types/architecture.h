// The architectures dhp runs, one row each (docs/architecture.md, "Where a change goes"): what a
// vision tower or a decoder family is, as values. The model's blocks and parameter table, the
// cost and memory models, the Hugging Face import and export and the configuration checks read
// these traits; none of them compares an architecture's name. A new enum value without its row
// does not compile (the static_asserts below).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

#include "types/image_geometry.h"

namespace dhp {

// Which vision tower (model.vision.arch); its row in kTowerTraits says what it is.
enum class VisionArch : uint8_t { native, clip, siglip, qwen3_vl, intern_vit, intern_vit_6b };

// The projector's GELU (model.vision.projector_act); automatic = the tower's row's.
enum class ProjectorAct : uint8_t { automatic, gelu_tanh, gelu, quick_gelu };

// A block's normalisation: RMSNorm (a weight) or LayerNorm (a weight and a bias).
enum class NormKind : uint8_t { rms, layer };
// A block's MLP: SwiGLU, w2(silu(w1·x) ⊙ w3·x) without biases; or fc2(act(fc1·x)) with biases
// and the tower's GELU (model.vision.act).
enum class MlpKind : uint8_t { swiglu, gelu };
// How a tower's attention rotates q and k by each patch's grid row and column (2-D RoPE), if
// it does:
//   grid:        dhp's native tower: each head's pairs by row and column in turn (Ops::rope2d);
//   grid_halves: the Qwen-VL towers: the first hd/4 pairs by row, the next hd/4 by column,
//                each half over its own frequencies (transformers' rot_pos_emb; the M-RoPE
//                "restart" layout of kernels/rope_spec.h), at base 10000.
enum class TowerRope : uint8_t { none, grid, grid_halves };
// The projector's hidden width: the decoder's (LLaVA's Linear, GELU, Linear), or the merged
// features' m²·dv (the Qwen-VL patch mergers).
enum class ProjectorHidden : uint8_t { decoder, merged };
// How learned positions are resized to an image's grid (kernels/pos_resize.h): PyTorch's
// bicubic (CLIP, SigLIP) or Qwen3-VL's bilinear over linspace(0, in-1, out).
enum class PositionResize : uint8_t { bicubic, bilinear_corners };

// The parameters of one transformer block of width c, q/kv widths qd/kvd and MLP width f.
// `biases`: on q, k, v, the output projection and (GELU MLP) both MLP layers.
constexpr int64_t block_params(NormKind norm, MlpKind mlp, bool biases, int64_t c, int64_t qd,
                               int64_t kvd, int64_t f) {
  const int64_t attn = c * qd + 2 * c * kvd + qd * c + (biases ? qd + 2 * kvd + c : 0);
  const int64_t mlp_w = mlp == MlpKind::swiglu ? 3 * c * f : 2 * c * f + (biases ? f + c : 0);
  const int64_t norms = norm == NormKind::layer ? 4 * c : 2 * c;
  return attn + mlp_w + norms;
}

// The tensor names of a tower's Hugging Face checkpoints: trainer/hf_checkpoint.cpp holds one
// set of name rows per value. CLIP and SigLIP share CLIPVisionTransformer's.
// Qwen3-VL's tower lives inside Qwen3VLForConditionalGeneration (model.visual.*), with q, k
// and v fused into one qkv tensor. InternViT's inside InternVL, named two ways (transformers'
// model.vision_tower.*, OpenGVLab's remote code vision_model.* with a fused qkv).
enum class HfTowerNames : uint8_t { none, clip_vision_transformer, qwen3_vl, intern_vit };

struct TowerTraits {
  VisionArch arch;
  std::string_view name;           // model.vision.arch
  // The encoder's blocks.
  NormKind norm;
  MlpKind mlp;
  bool block_biases;               // q/k/v/o and the GELU MLP's biases
  bool qkv_bias;                   // with block_biases: q, k and v have theirs too
  // q and k RMSNormed over their whole width (all heads together; weights attn.q_norm,
  // attn.k_norm (dim), eps the tower's) before attention: InternViT-6B's qk_normalization.
  bool qk_norm;
  // Where the patches learn where they are: learned position rows added to the patch
  // embeddings, resized (position_resize) from the pretrained image_size / patch grid to each
  // image's grid; and RoPE in every attention. A tower may have both (Qwen3-VL).
  bool learned_positions;
  PositionResize position_resize;  // learned positions only
  TowerRope rope;
  double rope_theta;               // the tower's RoPE base; 0: model.rope_theta
  // The embedding: a bias on the patch embedding; a learned class row before each image's
  // patches (its own stream row, attended to, dropped from the features); a norm of the
  // embeddings before the first layer (CLIP's pre_layrnorm, a LayerNorm).
  // temporal_patch: frames per patch embedding (a Conv3d over that many frames; an image is its
  // frame repeated, a video's frames go in pairs).
  bool patch_bias;
  int temporal_patch;
  bool class_row;
  bool pre_norm;
  // A norm of the tower's own (vision.norm, of the row's kind) after the last layer feeds the
  // merge; without one the merge reads a hidden state as it is.
  bool final_norm;
  // The norms' eps, or 0: model.vision.norm_eps (a checkpoint's layer_norm_eps).
  float norm_eps;
  // A pretrained checkpoint's tower: runs the layers up to model.vision.feature_layer (LLaVA's
  // vision_feature_layer) and holds the rest, frozen and never run, with its post_layernorm
  // and, where the row says, an attention-pooling head, so that an export writes them back.
  bool feature_layer;
  bool pool_head;
  ProjectorAct projector_act;      // what model.vision.projector_act = "auto" means
  ProjectorHidden projector_hidden;
  // DeepStack (Qwen3-VL): the hidden states after the tower layers model.vision.deepstack
  // names, each through a merger of its own (m x m merge, LayerNorm over m²·dv, Linear, GELU,
  // Linear), added to the decoder's stream at the image rows after decoder layer 0, 1, ...
  bool deepstack;
  // LayerScale (InternViT's ls1/ls2): each block's attention and MLP outputs scaled per channel
  // by a learned vector before their residual adds.
  bool layer_scale;
  // A LayerNorm of the merged features before the projector (InternVL's mlp1), its eps.
  bool projector_norm;
  float projector_norm_eps;
  // model.vision.max_tiles's default: InternVL's dynamic tiling up to that many tiles an image
  // (types/image_geometry.h); 0: none.
  int max_tiles;
  std::array<double, 3> pixel_mean, pixel_std;  // the defaults of model.vision.pixel_mean/std
  // Hugging Face ("" and none where the tower has no Hugging Face counterpart): the vision config's
  // model_type, the tower's class and its dual-encoder class, LLaVA's
  // vision_feature_select_strategy for it ("default" drops hidden-state row 0, a class row),
  // the resize of the image processor transformers pairs with it (an export of a tower
  // trained at native resolution writes that one), and the config class's defaults (JSON:
  // save_pretrained leaves out the keys that equal them), and its tensor names.
  std::string_view hf_model_type;
  std::string_view hf_tower_class;
  std::string_view hf_dual_class;
  // The class of the whole vision-language model for a tower that comes only inside one
  // (Qwen3VLForConditionalGeneration); "" for the towers LLaVA composes with a decoder. A
  // model also published under its authors' remote code (InternVLChatModel) names that class
  // too ("" when there is none).
  std::string_view hf_model_class;
  std::string_view hf_remote_class;
  // The decoder family (DecoderTraits::model_type) that model holds, "" where it takes any the
  // export writes (InternVL: Qwen2, Qwen3, Llama).
  std::string_view hf_text_type;
  std::string_view hf_feature_select;
  ImageFit hf_fit;
  std::string_view hf_defaults;
  HfTowerNames hf_names;

  constexpr bool has_hf() const { return !hf_model_type.empty(); }
  // The encoder runs over a stream of its own rather than the patches: a class row per image,
  // or learned positions addressed by each image's first row and grid (model/device_batch.h).
  constexpr bool own_stream() const { return class_row || learned_positions; }
};

// InternVLVisionConfig's defaults, the class both InternViT rows' configs are.
inline constexpr std::string_view kInternVlVisionDefaults =
    R"({"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "attention_bias": false,
        "use_qk_norm": false, "intermediate_size": 4096, "hidden_act": "gelu", "norm_type": "layer_norm",
        "layer_norm_eps": 1e-6, "image_size": [448, 448], "patch_size": [14, 14], "num_channels": 3,
        "use_mask_token": false, "use_absolute_position_embeddings": true, "layer_scale_init_value": 0.1,
        "use_mean_pooling": true})";

inline constexpr TowerTraits kTowerTraits[] = {
    // model-spec.md's encoder: RMSNorm, SwiGLU, 2-D RoPE, a final norm.
    {VisionArch::native, "native", NormKind::rms, MlpKind::swiglu, false, true, false, false, PositionResize::bicubic,
     TowerRope::grid, 0.0, true, 1, false, false, true, 1e-6f, false, false, ProjectorAct::gelu_tanh,
     ProjectorHidden::decoder, false, false, false, 0.0f, 0, kClipPixelMean, kClipPixelStd,
     "", "", "", "", "", "", "", ImageFit::native, "", HfTowerNames::none},
    // CLIPVisionModel: class row, learned positions, pre_layrnorm, LayerNorm/GELU blocks.
    {VisionArch::clip, "clip", NormKind::layer, MlpKind::gelu, true, true, false, true, PositionResize::bicubic,
     TowerRope::none, 0.0, false, 1, true, true, false, 0.0f, true, false, ProjectorAct::gelu,
     ProjectorHidden::decoder, false, false, false, 0.0f, 0, kClipPixelMean, kClipPixelStd,
     "clip_vision_model", "CLIPVisionModel", "CLIPModel", "", "", "", "default", ImageFit::clip,
     R"({"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
         "num_channels": 3, "image_size": 224, "patch_size": 32, "hidden_act": "quick_gelu",
         "layer_norm_eps": 1e-5})",
     HfTowerNames::clip_vision_transformer},
    // SiglipVisionModel: as CLIP without the class row and pre_layrnorm; a patch bias; an
    // attention-pooling head.
    {VisionArch::siglip, "siglip", NormKind::layer, MlpKind::gelu, true, true, false, true, PositionResize::bicubic,
     TowerRope::none, 0.0, true, 1, false, false, false, 0.0f, true, true, ProjectorAct::gelu,
     ProjectorHidden::decoder, false, false, false, 0.0f, 0, kSiglipPixelMean, kSiglipPixelStd,
     "siglip_vision_model", "SiglipVisionModel", "SiglipModel", "", "", "", "full", ImageFit::siglip,
     R"({"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
         "num_channels": 3, "image_size": 224, "patch_size": 16, "hidden_act": "gelu_pytorch_tanh",
         "layer_norm_eps": 1e-6})",
     HfTowerNames::clip_vision_transformer},
    // Qwen3VLVisionModel: a Conv3d patch embedding over 2 frames with a bias, learned positions
    // resized bilinearly over the grid's corners, 2-D RoPE by halves, LayerNorm (eps 1e-6) and
    // GELU-MLP blocks with fused qkv; the merger's per-patch LayerNorm is the final norm, its
    // two Linears (erf GELU, hidden m²·dv) the projector; DeepStack mergers.
    {VisionArch::qwen3_vl, "qwen3_vl", NormKind::layer, MlpKind::gelu, true, true, false, true,
     PositionResize::bilinear_corners, TowerRope::grid_halves, 10000.0, true, 2, false, false, true, 1e-6f,
     false, false, ProjectorAct::gelu, ProjectorHidden::merged, true, false, false, 0.0f, 0, kSiglipPixelMean,
     kSiglipPixelStd,
     "qwen3_vl", "Qwen3VLVisionModel", "", "Qwen3VLForConditionalGeneration", "", "qwen3_vl_text", "",
     ImageFit::qwen,
     R"({"depth": 27, "hidden_size": 1152, "hidden_act": "gelu_pytorch_tanh", "intermediate_size": 4304,
         "num_heads": 16, "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
         "out_hidden_size": 3584, "num_position_embeddings": 2304, "deepstack_visual_indexes": [8, 16, 24]})",
     HfTowerNames::qwen3_vl},
    // InternViT (InternVL's tower): CLIP's class row and bicubically resized learned positions,
    // a patch bias, LayerNorm/GELU blocks with LayerScale, no pre- or final norm; features of a
    // feature layer without the class row, merged 2 x 2 (InternVL's pixel shuffle is the same
    // order), a LayerNorm (eps 1e-5), then Linear, GELU, Linear (mlp1).
    {VisionArch::intern_vit, "intern_vit", NormKind::layer, MlpKind::gelu, true, true, false, true, PositionResize::bicubic,
     TowerRope::none, 0.0, true, 1, true, false, false, 0.0f, true, false, ProjectorAct::gelu,
     ProjectorHidden::decoder, false, true, true, 1e-5f, 12, kImagenetPixelMean, kImagenetPixelStd,
     "internvl_vision", "InternVLVisionModel", "", "InternVLForConditionalGeneration", "InternVLChatModel",
     "", "default", ImageFit::siglip,
     kInternVlVisionDefaults,
     HfTowerNames::intern_vit},
    // InternViT-6B (InternVL3-38B and 78B): the same tower with RMSNorm blocks, no q/k/v biases
    // and q/k RMSNormed over the whole width; the same Hugging Face classes (its config's
    // norm_type and qk_normalization choose it, trainer/hf_config.cpp).
    {VisionArch::intern_vit_6b, "intern_vit_6b", NormKind::rms, MlpKind::gelu, true, false, true, true,
     PositionResize::bicubic, TowerRope::none, 0.0, true, 1, true, false, false, 0.0f, true, false,
     ProjectorAct::gelu, ProjectorHidden::decoder, false, true, true, 1e-5f, 12, kImagenetPixelMean,
     kImagenetPixelStd, "internvl_vision", "InternVLVisionModel", "", "InternVLForConditionalGeneration",
     "InternVLChatModel", "", "default", ImageFit::siglip,
     kInternVlVisionDefaults,
     HfTowerNames::intern_vit},
};

constexpr size_t kVisionArchCount = 6;
static_assert(std::size(kTowerTraits) == kVisionArchCount, "one row per VisionArch");
constexpr bool tower_rows_in_enum_order() {
  for (size_t i = 0; i < std::size(kTowerTraits); ++i)
    if (size_t(kTowerTraits[i].arch) != i) return false;
  return true;
}
static_assert(tower_rows_in_enum_order(), "kTowerTraits[i] is VisionArch i's row");

// 2-D RoPE and DeepStack read the encoder's rows as its patches (a patch's grid row and
// column, the m x m merge of a hidden state): a tower with either has no class rows.
constexpr bool patch_row_towers_have_no_class_row() {
  for (const TowerTraits& t : kTowerTraits)
    if ((t.rope != TowerRope::none || t.deepstack) && t.class_row) return false;
  return true;
}
static_assert(patch_row_towers_have_no_class_row(), "a RoPE or DeepStack tower's stream is its patches");

constexpr const TowerTraits& tower_traits(VisionArch a) { return kTowerTraits[size_t(a)]; }

// model.vision.arch's names, from the rows.
inline constexpr auto kVisionArchNames = [] {
  std::array<std::pair<VisionArch, std::string_view>, kVisionArchCount> n{};
  for (size_t i = 0; i < n.size(); ++i) n[i] = {kTowerTraits[i].arch, kTowerTraits[i].name};
  return n;
}();

// How a decoder family's config.json says which projections carry biases.
//   qkvo_optional: "attention_bias" biases q, k, v and o_proj together (Llama, Qwen3);
//   qkv_always:    q, k and v always carry biases, o_proj never (Qwen2);
//   none:          no biases ("attention_bias": true is refused; Mistral).
enum class DecoderBias : uint8_t { qkvo_optional, qkv_always, none };
// How it says its attention is windowed (dhp runs full causal attention: a window is accepted
// only when it is at least every sequence's length).
//   sliding_window:     a "sliding_window" value is a window (Llama, Mistral);
//   use_sliding_window: "use_sliding_window" turns "sliding_window" on (Qwen2);
//   per_layer:          windows of some layers ("use_sliding_window", "layer_types"): refused
//                       whatever their length (Qwen3).
enum class DecoderWindow : uint8_t { sliding_window, use_sliding_window, per_layer };

// The Llama-family decoders of Hugging Face: each block RMSNorm, SwiGLU with silu and 1-D RoPE;
// what differs is in the row.
struct DecoderTraits {
  std::string_view model_type;   // config.json's model_type (LLaVA's text_config too)
  std::string_view hf_class;     // its architectures entry
  DecoderBias bias;
  bool qk_norm;                  // q and k RMSNormed per head before RoPE (model.qk_norm)
  int default_head_dim;          // head_dim when config.json has none (0: hidden / heads)
  DecoderWindow window;
  // Its RoPE block holds M-RoPE's mrope_section (and mrope_interleaved, which must be true:
  // the family always interleaves), every token turning by three positions (model.mrope_section).
  bool mrope;
  // An export names this class for the models it describes (a Mistral is written as the
  // Llama it computes the same as).
  bool exported;
  std::string_view hf_defaults;  // the config class's defaults (JSON), as for the towers
  std::string_view hf_extra;     // keys an export writes for this class alone (JSON)
};

inline constexpr DecoderTraits kDecoderTraits[] = {
    {"llama", "LlamaForCausalLM", DecoderBias::qkvo_optional, false, 0, DecoderWindow::sliding_window, false, true,
     R"({"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
         "vocab_size": 32000, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu"})",
     R"({"mlp_bias": false, "pretraining_tp": 1})"},
    {"mistral", "MistralForCausalLM", DecoderBias::none, false, 0, DecoderWindow::sliding_window, false, false,
     R"({"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
         "num_key_value_heads": 8, "vocab_size": 32000, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
         "sliding_window": 4096, "hidden_act": "silu"})",
     "{}"},
    {"qwen2", "Qwen2ForCausalLM", DecoderBias::qkv_always, false, 0, DecoderWindow::use_sliding_window, false, true,
     R"({"hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32, "num_attention_heads": 32,
         "num_key_value_heads": 32, "vocab_size": 151936, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
         "hidden_act": "silu"})",
     "{}"},
    {"qwen3", "Qwen3ForCausalLM", DecoderBias::qkvo_optional, true, 128, DecoderWindow::per_layer, false, true,
     R"({"hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32, "num_attention_heads": 32,
         "num_key_value_heads": 32, "head_dim": 128, "vocab_size": 151936, "rms_norm_eps": 1e-6,
         "rope_theta": 10000.0, "hidden_act": "silu"})",
     "{}"},
    // Qwen3-VL's text model (Qwen3VLTextConfig): Qwen3's blocks under interleaved M-RoPE. Only
    // inside Qwen3VLForConditionalGeneration: an export writes it as that (types: the tower's
    // row, HfTowerNames::qwen3_vl).
    {"qwen3_vl_text", "Qwen3VLTextModel", DecoderBias::qkvo_optional, true, 128, DecoderWindow::per_layer, true,
     false,
     R"({"hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32, "num_attention_heads": 32,
         "num_key_value_heads": 32, "head_dim": 128, "vocab_size": 151936, "rms_norm_eps": 1e-6,
         "rope_theta": 500000.0, "hidden_act": "silu", "max_position_embeddings": 128000})",
     "{}"},
};

// The (attention_bias, attention_out_bias) pairs a family's checkpoints can have.
constexpr bool admits_biases(const DecoderTraits& t, bool qkv, bool out) {
  switch (t.bias) {
    case DecoderBias::qkvo_optional: return qkv == out;
    case DecoderBias::qkv_always: return qkv && !out;
    case DecoderBias::none: return !qkv && !out;
  }
  return false;
}

// The family an export names for a model of these traits: the first exported row that admits
// them (its index, -1 when none does; exported_family gives the row or nullptr).
constexpr int exported_row(bool qkv_bias, bool out_bias, bool qk_norm) {
  for (size_t i = 0; i < std::size(kDecoderTraits); ++i) {
    const DecoderTraits& t = kDecoderTraits[i];
    if (t.exported && t.qk_norm == qk_norm && admits_biases(t, qkv_bias, out_bias)) return int(i);
  }
  return -1;
}
inline const DecoderTraits* exported_family(bool qkv_bias, bool out_bias, bool qk_norm) {
  const int i = exported_row(qkv_bias, out_bias, qk_norm);
  return i < 0 ? nullptr : &kDecoderTraits[size_t(i)];
}

// Every combination of the decoder's traits is exported by some row, or refused with a reason
// (o_proj biased without q/k/v): a new row cannot leave one unnamed by accident.
static_assert(exported_row(false, false, false) >= 0 && exported_row(true, true, false) >= 0 &&
                  exported_row(true, false, false) >= 0 && exported_row(false, false, true) >= 0 &&
                  exported_row(true, true, true) >= 0,
              "every decoder dhp builds is exported as some Hugging Face class");

}  // namespace dhp
