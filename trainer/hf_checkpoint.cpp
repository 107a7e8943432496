#include "trainer/hf_checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <span>

#include "core/check.h"
#include "core/files.h"
#include "core/input.h"
#include "core/json_input.h"
#include "core/log.h"
#include "core/progress.h"
#include "core/text.h"
#include "data/tokenizer.h"
#include "trainer/safetensors.h"

namespace dhp {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The name map (docs/pretrained.md): Hugging Face's names on the left, relative to the part of
// the model they belong to (a layout puts each part under its own prefix), model-spec.md's and
// the tower table's on the right; "{i}" is a decoder or tower layer. Both import and export
// read this table and nothing else. HF Llama's q_proj/k_proj rows are already in the
// half-split RoPE order model-spec.md uses (rotate_half), so no decoder tensor needs a
// permutation; the vocabulary rows may grow, and the tower's conv patch embedding is permuted
// to dhp's (ky, kx, c) patch rows.
// "{j}" is a DeepStack merger; a RowConcat row's dhp names are separated by '|'.
enum class HfPart : uint8_t { Decoder, LmHead, Vision, Projector1, Projector2, ProjectorNorm };
struct HfPattern {
  HfPart part;
  const char* hf;
  const char* dhp;
  HfTransform transform;
};
constexpr HfTransform kCopy = HfTransform::None;
constexpr HfPattern kNameMap[] = {
    {HfPart::Decoder, "embed_tokens.weight", "tok_embed.weight", HfTransform::VocabRows},
    {HfPart::Decoder, "layers.{i}.input_layernorm.weight", "layers.{i}.attn_norm.weight", kCopy},
    {HfPart::Decoder, "layers.{i}.self_attn.q_proj.weight", "layers.{i}.attn.wq.weight", kCopy},
    {HfPart::Decoder, "layers.{i}.self_attn.k_proj.weight", "layers.{i}.attn.wk.weight", kCopy},
    {HfPart::Decoder, "layers.{i}.self_attn.v_proj.weight", "layers.{i}.attn.wv.weight", kCopy},
    {HfPart::Decoder, "layers.{i}.self_attn.q_proj.bias", "layers.{i}.attn.wq.bias", kCopy},
    {HfPart::Decoder, "layers.{i}.self_attn.k_proj.bias", "layers.{i}.attn.wk.bias", kCopy},
    {HfPart::Decoder, "layers.{i}.self_attn.v_proj.bias", "layers.{i}.attn.wv.bias", kCopy},
    {HfPart::Decoder, "layers.{i}.self_attn.o_proj.weight", "layers.{i}.attn.wo.weight", kCopy},
    {HfPart::Decoder, "layers.{i}.self_attn.o_proj.bias", "layers.{i}.attn.wo.bias", kCopy},
    // Qwen3's per-head RMSNorm weights (head_dim) of q and k.
    {HfPart::Decoder, "layers.{i}.self_attn.q_norm.weight", "layers.{i}.attn.q_norm.weight", kCopy},
    {HfPart::Decoder, "layers.{i}.self_attn.k_norm.weight", "layers.{i}.attn.k_norm.weight", kCopy},
    {HfPart::Decoder, "layers.{i}.post_attention_layernorm.weight", "layers.{i}.mlp_norm.weight", kCopy},
    {HfPart::Decoder, "layers.{i}.mlp.gate_proj.weight", "layers.{i}.mlp.w1.weight", kCopy},
    {HfPart::Decoder, "layers.{i}.mlp.down_proj.weight", "layers.{i}.mlp.w2.weight", kCopy},
    {HfPart::Decoder, "layers.{i}.mlp.up_proj.weight", "layers.{i}.mlp.w3.weight", kCopy},
    {HfPart::Decoder, "norm.weight", "final_norm.weight", kCopy},
    {HfPart::LmHead, "", "lm_head.weight", HfTransform::VocabRows},
    // LLaVA's mlp2x_gelu: Linear, GELU, Linear.
    {HfPart::Projector1, "weight", "projector.fc1.weight", kCopy},
    {HfPart::Projector1, "bias", "projector.fc1.bias", kCopy},
    {HfPart::Projector2, "weight", "projector.fc2.weight", kCopy},
    {HfPart::Projector2, "bias", "projector.fc2.bias", kCopy},
    // InternVL's mlp1 starts with a LayerNorm of the merged features.
    {HfPart::ProjectorNorm, "weight", "projector.norm.weight", kCopy},
    {HfPart::ProjectorNorm, "bias", "projector.norm.bias", kCopy},
};

// Each tower's own rows, by its row's TowerTraits::hf_names (types/architecture.h).
// CLIPVisionTransformer / SiglipVisionTransformer, under "vision_model.".
constexpr HfPattern kClipTowerNames[] = {
    {HfPart::Vision, "embeddings.patch_embedding.weight", "vision.patch_embed.weight", HfTransform::ConvPatch},
    {HfPart::Vision, "embeddings.patch_embedding.bias", "vision.patch_embed.bias", kCopy},  // SigLIP
    {HfPart::Vision, "embeddings.class_embedding", "vision.class_embed", kCopy},             // CLIP
    {HfPart::Vision, "embeddings.position_embedding.weight", "vision.pos_embed.weight", kCopy},
    {HfPart::Vision, "pre_layrnorm.weight", "vision.pre_norm.weight", kCopy},                // CLIP
    {HfPart::Vision, "pre_layrnorm.bias", "vision.pre_norm.bias", kCopy},
    {HfPart::Vision, "encoder.layers.{i}.layer_norm1.weight", "vision.layers.{i}.attn_norm.weight", kCopy},
    {HfPart::Vision, "encoder.layers.{i}.layer_norm1.bias", "vision.layers.{i}.attn_norm.bias", kCopy},
    {HfPart::Vision, "encoder.layers.{i}.self_attn.q_proj.weight", "vision.layers.{i}.attn.wq.weight", kCopy},
    {HfPart::Vision, "encoder.layers.{i}.self_attn.q_proj.bias", "vision.layers.{i}.attn.wq.bias", kCopy},
    {HfPart::Vision, "encoder.layers.{i}.self_attn.k_proj.weight", "vision.layers.{i}.attn.wk.weight", kCopy},
    {HfPart::Vision, "encoder.layers.{i}.self_attn.k_proj.bias", "vision.layers.{i}.attn.wk.bias", kCopy},
    {HfPart::Vision, "encoder.layers.{i}.self_attn.v_proj.weight", "vision.layers.{i}.attn.wv.weight", kCopy},
    {HfPart::Vision, "encoder.layers.{i}.self_attn.v_proj.bias", "vision.layers.{i}.attn.wv.bias", kCopy},
    {HfPart::Vision, "encoder.layers.{i}.self_attn.out_proj.weight", "vision.layers.{i}.attn.wo.weight", kCopy},
    {HfPart::Vision, "encoder.layers.{i}.self_attn.out_proj.bias", "vision.layers.{i}.attn.wo.bias", kCopy},
    {HfPart::Vision, "encoder.layers.{i}.layer_norm2.weight", "vision.layers.{i}.mlp_norm.weight", kCopy},
    {HfPart::Vision, "encoder.layers.{i}.layer_norm2.bias", "vision.layers.{i}.mlp_norm.bias", kCopy},
    {HfPart::Vision, "encoder.layers.{i}.mlp.fc1.weight", "vision.layers.{i}.mlp.fc1.weight", kCopy},
    {HfPart::Vision, "encoder.layers.{i}.mlp.fc1.bias", "vision.layers.{i}.mlp.fc1.bias", kCopy},
    {HfPart::Vision, "encoder.layers.{i}.mlp.fc2.weight", "vision.layers.{i}.mlp.fc2.weight", kCopy},
    {HfPart::Vision, "encoder.layers.{i}.mlp.fc2.bias", "vision.layers.{i}.mlp.fc2.bias", kCopy},
    // Held, never run (VisionConfig::post_norm, pool_head): exported as they came.
    {HfPart::Vision, "post_layernorm.weight", "vision.post_norm.weight", kCopy},
    {HfPart::Vision, "post_layernorm.bias", "vision.post_norm.bias", kCopy},
    {HfPart::Vision, "head.probe", "vision.head.probe", kCopy},
    {HfPart::Vision, "head.attention.in_proj_weight", "vision.head.attn.in_proj.weight", kCopy},
    {HfPart::Vision, "head.attention.in_proj_bias", "vision.head.attn.in_proj.bias", kCopy},
    {HfPart::Vision, "head.attention.out_proj.weight", "vision.head.attn.out_proj.weight", kCopy},
    {HfPart::Vision, "head.attention.out_proj.bias", "vision.head.attn.out_proj.bias", kCopy},
    {HfPart::Vision, "head.layernorm.weight", "vision.head.norm.weight", kCopy},
    {HfPart::Vision, "head.layernorm.bias", "vision.head.norm.bias", kCopy},
    {HfPart::Vision, "head.mlp.fc1.weight", "vision.head.mlp.fc1.weight", kCopy},
    {HfPart::Vision, "head.mlp.fc1.bias", "vision.head.mlp.fc1.bias", kCopy},
    {HfPart::Vision, "head.mlp.fc2.weight", "vision.head.mlp.fc2.weight", kCopy},
    {HfPart::Vision, "head.mlp.fc2.bias", "vision.head.mlp.fc2.bias", kCopy},
};

// Qwen3VLVisionModel under "model.visual.": a Conv3d patch embedding, fused qkv, the merger
// (its LayerNorm is the tower's final norm, its Linears dhp's projector) and the DeepStack
// mergers.
constexpr HfPattern kQwen3VlTowerNames[] = {
    {HfPart::Vision, "patch_embed.proj.weight", "vision.patch_embed.weight", HfTransform::ConvPatch},
    {HfPart::Vision, "patch_embed.proj.bias", "vision.patch_embed.bias", kCopy},
    {HfPart::Vision, "pos_embed.weight", "vision.pos_embed.weight", kCopy},
    {HfPart::Vision, "blocks.{i}.norm1.weight", "vision.layers.{i}.attn_norm.weight", kCopy},
    {HfPart::Vision, "blocks.{i}.norm1.bias", "vision.layers.{i}.attn_norm.bias", kCopy},
    {HfPart::Vision, "blocks.{i}.attn.qkv.weight",
     "vision.layers.{i}.attn.wq.weight|vision.layers.{i}.attn.wk.weight|vision.layers.{i}.attn.wv.weight",
     HfTransform::RowConcat},
    {HfPart::Vision, "blocks.{i}.attn.qkv.bias",
     "vision.layers.{i}.attn.wq.bias|vision.layers.{i}.attn.wk.bias|vision.layers.{i}.attn.wv.bias",
     HfTransform::RowConcat},
    {HfPart::Vision, "blocks.{i}.attn.proj.weight", "vision.layers.{i}.attn.wo.weight", kCopy},
    {HfPart::Vision, "blocks.{i}.attn.proj.bias", "vision.layers.{i}.attn.wo.bias", kCopy},
    {HfPart::Vision, "blocks.{i}.norm2.weight", "vision.layers.{i}.mlp_norm.weight", kCopy},
    {HfPart::Vision, "blocks.{i}.norm2.bias", "vision.layers.{i}.mlp_norm.bias", kCopy},
    {HfPart::Vision, "blocks.{i}.mlp.linear_fc1.weight", "vision.layers.{i}.mlp.fc1.weight", kCopy},
    {HfPart::Vision, "blocks.{i}.mlp.linear_fc1.bias", "vision.layers.{i}.mlp.fc1.bias", kCopy},
    {HfPart::Vision, "blocks.{i}.mlp.linear_fc2.weight", "vision.layers.{i}.mlp.fc2.weight", kCopy},
    {HfPart::Vision, "blocks.{i}.mlp.linear_fc2.bias", "vision.layers.{i}.mlp.fc2.bias", kCopy},
    {HfPart::Vision, "merger.norm.weight", "vision.norm.weight", kCopy},
    {HfPart::Vision, "merger.norm.bias", "vision.norm.bias", kCopy},
    {HfPart::Vision, "merger.linear_fc1.weight", "projector.fc1.weight", kCopy},
    {HfPart::Vision, "merger.linear_fc1.bias", "projector.fc1.bias", kCopy},
    {HfPart::Vision, "merger.linear_fc2.weight", "projector.fc2.weight", kCopy},
    {HfPart::Vision, "merger.linear_fc2.bias", "projector.fc2.bias", kCopy},
    {HfPart::Vision, "deepstack_merger_list.{j}.norm.weight", "projector.deepstack.{j}.norm.weight", kCopy},
    {HfPart::Vision, "deepstack_merger_list.{j}.norm.bias", "projector.deepstack.{j}.norm.bias", kCopy},
    {HfPart::Vision, "deepstack_merger_list.{j}.linear_fc1.weight", "projector.deepstack.{j}.fc1.weight", kCopy},
    {HfPart::Vision, "deepstack_merger_list.{j}.linear_fc1.bias", "projector.deepstack.{j}.fc1.bias", kCopy},
    {HfPart::Vision, "deepstack_merger_list.{j}.linear_fc2.weight", "projector.deepstack.{j}.fc2.weight", kCopy},
    {HfPart::Vision, "deepstack_merger_list.{j}.linear_fc2.bias", "projector.deepstack.{j}.fc2.bias", kCopy},
};

// InternViT as transformers names it (InternVLVisionModel under "model.vision_tower.").
constexpr HfPattern kInternVitNames[] = {
    {HfPart::Vision, "embeddings.cls_token", "vision.class_embed", HfTransform::Unsqueezed},
    {HfPart::Vision, "embeddings.patch_embeddings.projection.weight", "vision.patch_embed.weight", HfTransform::ConvPatch},
    {HfPart::Vision, "embeddings.patch_embeddings.projection.bias", "vision.patch_embed.bias", kCopy},
    {HfPart::Vision, "embeddings.position_embeddings", "vision.pos_embed.weight", HfTransform::Unsqueezed},
    {HfPart::Vision, "encoder.layer.{i}.attention.q_proj.weight", "vision.layers.{i}.attn.wq.weight", kCopy},
    {HfPart::Vision, "encoder.layer.{i}.attention.q_proj.bias", "vision.layers.{i}.attn.wq.bias", kCopy},
    {HfPart::Vision, "encoder.layer.{i}.attention.k_proj.weight", "vision.layers.{i}.attn.wk.weight", kCopy},
    {HfPart::Vision, "encoder.layer.{i}.attention.k_proj.bias", "vision.layers.{i}.attn.wk.bias", kCopy},
    {HfPart::Vision, "encoder.layer.{i}.attention.v_proj.weight", "vision.layers.{i}.attn.wv.weight", kCopy},
    {HfPart::Vision, "encoder.layer.{i}.attention.v_proj.bias", "vision.layers.{i}.attn.wv.bias", kCopy},
    {HfPart::Vision, "encoder.layer.{i}.attention.q_norm.weight", "vision.layers.{i}.attn.q_norm.weight", kCopy},
    {HfPart::Vision, "encoder.layer.{i}.attention.k_norm.weight", "vision.layers.{i}.attn.k_norm.weight", kCopy},
    {HfPart::Vision, "encoder.layer.{i}.attention.projection_layer.weight", "vision.layers.{i}.attn.wo.weight", kCopy},
    {HfPart::Vision, "encoder.layer.{i}.attention.projection_layer.bias", "vision.layers.{i}.attn.wo.bias", kCopy},
    {HfPart::Vision, "encoder.layer.{i}.lambda_1", "vision.layers.{i}.attn.ls.weight", kCopy},
    {HfPart::Vision, "encoder.layer.{i}.lambda_2", "vision.layers.{i}.mlp.ls.weight", kCopy},
    {HfPart::Vision, "encoder.layer.{i}.layernorm_before.weight", "vision.layers.{i}.attn_norm.weight", kCopy},
    {HfPart::Vision, "encoder.layer.{i}.layernorm_before.bias", "vision.layers.{i}.attn_norm.bias", kCopy},
    {HfPart::Vision, "encoder.layer.{i}.layernorm_after.weight", "vision.layers.{i}.mlp_norm.weight", kCopy},
    {HfPart::Vision, "encoder.layer.{i}.layernorm_after.bias", "vision.layers.{i}.mlp_norm.bias", kCopy},
    {HfPart::Vision, "encoder.layer.{i}.mlp.fc1.weight", "vision.layers.{i}.mlp.fc1.weight", kCopy},
    {HfPart::Vision, "encoder.layer.{i}.mlp.fc1.bias", "vision.layers.{i}.mlp.fc1.bias", kCopy},
    {HfPart::Vision, "encoder.layer.{i}.mlp.fc2.weight", "vision.layers.{i}.mlp.fc2.weight", kCopy},
    {HfPart::Vision, "encoder.layer.{i}.mlp.fc2.bias", "vision.layers.{i}.mlp.fc2.bias", kCopy},
};

// InternViT as OpenGVLab's remote code names it (InternVisionModel under "vision_model."): q, k
// and v fused, ls1/ls2 for the layer scales.
constexpr HfPattern kInternVitOriginalNames[] = {
    {HfPart::Vision, "embeddings.class_embedding", "vision.class_embed", HfTransform::Unsqueezed},
    {HfPart::Vision, "embeddings.patch_embedding.weight", "vision.patch_embed.weight", HfTransform::ConvPatch},
    {HfPart::Vision, "embeddings.patch_embedding.bias", "vision.patch_embed.bias", kCopy},
    {HfPart::Vision, "embeddings.position_embedding", "vision.pos_embed.weight", HfTransform::Unsqueezed},
    {HfPart::Vision, "encoder.layers.{i}.attn.qkv.weight",
     "vision.layers.{i}.attn.wq.weight|vision.layers.{i}.attn.wk.weight|vision.layers.{i}.attn.wv.weight",
     HfTransform::RowConcat},
    {HfPart::Vision, "encoder.layers.{i}.attn.qkv.bias",
     "vision.layers.{i}.attn.wq.bias|vision.layers.{i}.attn.wk.bias|vision.layers.{i}.attn.wv.bias",
     HfTransform::RowConcat},
    {HfPart::Vision, "encoder.layers.{i}.attn.q_norm.weight", "vision.layers.{i}.attn.q_norm.weight", kCopy},
    {HfPart::Vision, "encoder.layers.{i}.attn.k_norm.weight", "vision.layers.{i}.attn.k_norm.weight", kCopy},
    {HfPart::Vision, "encoder.layers.{i}.attn.proj.weight", "vision.layers.{i}.attn.wo.weight", kCopy},
    {HfPart::Vision, "encoder.layers.{i}.attn.proj.bias", "vision.layers.{i}.attn.wo.bias", kCopy},
    {HfPart::Vision, "encoder.layers.{i}.ls1", "vision.layers.{i}.attn.ls.weight", kCopy},
    {HfPart::Vision, "encoder.layers.{i}.ls2", "vision.layers.{i}.mlp.ls.weight", kCopy},
    {HfPart::Vision, "encoder.layers.{i}.norm1.weight", "vision.layers.{i}.attn_norm.weight", kCopy},
    {HfPart::Vision, "encoder.layers.{i}.norm1.bias", "vision.layers.{i}.attn_norm.bias", kCopy},
    {HfPart::Vision, "encoder.layers.{i}.norm2.weight", "vision.layers.{i}.mlp_norm.weight", kCopy},
    {HfPart::Vision, "encoder.layers.{i}.norm2.bias", "vision.layers.{i}.mlp_norm.bias", kCopy},
    {HfPart::Vision, "encoder.layers.{i}.mlp.fc1.weight", "vision.layers.{i}.mlp.fc1.weight", kCopy},
    {HfPart::Vision, "encoder.layers.{i}.mlp.fc1.bias", "vision.layers.{i}.mlp.fc1.bias", kCopy},
    {HfPart::Vision, "encoder.layers.{i}.mlp.fc2.weight", "vision.layers.{i}.mlp.fc2.weight", kCopy},
    {HfPart::Vision, "encoder.layers.{i}.mlp.fc2.bias", "vision.layers.{i}.mlp.fc2.bias", kCopy},
};

std::span<const HfPattern> tower_names(HfTowerNames n, HfLayout layout) {
  switch (n) {
    case HfTowerNames::none: return {};
    case HfTowerNames::clip_vision_transformer: return kClipTowerNames;
    case HfTowerNames::qwen3_vl: return kQwen3VlTowerNames;
    case HfTowerNames::intern_vit:
      return layout == HfLayout::InternVlOriginal ? std::span<const HfPattern>(kInternVitOriginalNames)
                                                  : std::span<const HfPattern>(kInternVitNames);
  }
  return {};
}

// Where each layout keeps each part (nullptr: not in such a folder).
struct LayoutNames {
  HfLayout layout;
  const char* name;
  const char* decoder;    // prefix of the decoder's tensors
  const char* lm_head;    // the output layer's full name
  const char* vision;     // prefix of the tower's tensors
  const char* projector1;
  const char* projector2;
  const char* projector_norm = nullptr;
};
constexpr LayoutNames kLayouts[] = {
    {HfLayout::Decoder, "Llama", "model.", "lm_head.weight", nullptr, nullptr, nullptr},
    {HfLayout::Tower, "vision tower", nullptr, nullptr, "vision_model.", nullptr, nullptr},
    {HfLayout::LlavaOriginal, "original LLaVA", "model.", "lm_head.weight",
     "model.vision_tower.vision_tower.vision_model.", "model.mm_projector.0.", "model.mm_projector.2."},
    {HfLayout::LlavaHf, "llava-hf", "language_model.model.", "language_model.lm_head.weight",
     "vision_tower.vision_model.", "multi_modal_projector.linear_1.", "multi_modal_projector.linear_2."},
    {HfLayout::LlavaNew, "llava (transformers >= 4.52)", "model.language_model.", "lm_head.weight",
     "model.vision_tower.vision_model.", "model.multi_modal_projector.linear_1.",
     "model.multi_modal_projector.linear_2."},
    {HfLayout::Qwen3Vl, "Qwen3-VL", "model.language_model.", "lm_head.weight", "model.visual.", nullptr, nullptr},
    {HfLayout::InternVl, "InternVL (transformers)", "model.language_model.", "lm_head.weight", "model.vision_tower.",
     "model.multi_modal_projector.linear_1.", "model.multi_modal_projector.linear_2.",
     "model.multi_modal_projector.layer_norm."},
    {HfLayout::InternVlOriginal, "InternVL (OpenGVLab's remote code)", "language_model.model.",
     "language_model.lm_head.weight", "vision_model.", "mlp1.1.", "mlp1.3.", "mlp1.0."},
};

const LayoutNames& names_of(HfLayout layout) {
  for (const auto& l : kLayouts)
    if (l.layout == layout) return l;
  throw Error("unknown Hugging Face layout");
}

const char* prefix_of(const LayoutNames& l, HfPart part) {
  switch (part) {
    case HfPart::Decoder: return l.decoder;
    case HfPart::LmHead: return l.lm_head;
    case HfPart::Vision: return l.vision;
    case HfPart::Projector1: return l.projector1;
    case HfPart::Projector2: return l.projector2;
    case HfPart::ProjectorNorm: return l.projector_norm;
  }
  return nullptr;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// Tensors some folders carry that hold nothing dhp's model uses, each with the reason the log
// gives; "" when `name` is not one of them.
std::string ignored_because(const std::string& name, const LayoutNames& l) {
  if (ends_with(name, "rotary_emb.inv_freq"))
    return "RoPE's inverse frequencies (older transformers saved them; they follow from rope_theta)";
  if (ends_with(name, "embeddings.position_ids")) return "position_ids buffers (0, 1, 2, ...)";
  if (l.vision) {
    const std::string v = l.vision;
    if (starts_with(name, v + "post_layernorm."))
      return "the tower's post_layernorm (LLaVA's features are taken before it)";
    if (starts_with(name, v + "head.")) return "SigLIP's attention-pooling head (LLaVA reads every patch)";
  }
  if (l.layout == HfLayout::Tower) {
    if (starts_with(name, "text_model.")) return "the dual encoder's text tower";
    if (starts_with(name, "visual_projection.") || starts_with(name, "text_projection.") ||
        name == "logit_scale" || name == "logit_bias")
      return "the dual encoder's embedding projections and logit scale";
  }
  return "";
}

std::vector<std::string> split_names(const std::string& s) {
  std::vector<std::string> out(1);
  for (char ch : s) {
    if (ch == '|') out.emplace_back();
    else out.back() += ch;
  }
  return out;
}

// Every "{i}" (or the given placeholder) of a pattern replaced by i.
std::string with_layer(std::string pattern, int i, const std::string& mark = "{i}") {
  for (auto at = pattern.find(mark); at != std::string::npos; at = pattern.find(mark))
    pattern.replace(at, mark.size(), std::to_string(i));
  return pattern;
}

// One safetensors file of a checkpoint, open and with its header checked.
struct Shard {
  std::string path;
  std::unique_ptr<InputFile> in;
  SafetensorsHeader header;
};

struct Located {
  const Shard* shard;
  const SafetensorsEntry* entry;
};

// The folder's safetensors files and where each tensor lies.
struct Checkpoint {
  std::vector<std::unique_ptr<Shard>> shards;
  std::map<std::string, Located> tensors;
  std::string note;  // what was read when the folder offered a choice ("" when it did not)
};

Checkpoint open_checkpoint(const std::string& named) {
  const std::string dir = folder_name(named);
  Checkpoint ck;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single = fs::path(dir) / "model.safetensors";
  std::error_code ec;
  auto open_shard = [&](const std::string& name, const std::string& hint) {
    auto s = std::make_unique<Shard>();
    s->path = (fs::path(dir) / name).string();
    // A plain name in the folder (the index is checked for that below). Symbolic links are
    // followed: the user named the folder, and the hub cache's snapshots/<rev>/ folders hold
    // nothing but links to ../../blobs/<hash>, as config.json and the rest of the folder do.
    s->in = std::make_unique<InputFile>("checkpoint shard", s->path, hint);
    s->header = read_safetensors_header(*s->in, s->path);
    ck.shards.push_back(std::move(s));
    return ck.shards.back().get();
  };
  // transformers loads model.safetensors when a folder holds it, whatever index lies beside
  // it (an index and shards left by another save), so dhp reads what transformers reads.
  if (fs::exists(single, ec) && fs::exists(index, ec))
    ck.note = fmt::format("'{}' holds both model.safetensors and model.safetensors.index.json; read "
                          "model.safetensors, as transformers does (the index and its shards are ignored)",
                          dir);
  if (!fs::exists(single, ec) && fs::exists(index, ec)) {
    const InputFile in("checkpoint index", index.string());
    const json j = parse_json_input(in.read_all(int64_t(64) << 20, "64 MiB"), "'" + index.string() + "'");
    DHP_CHECK(!j.is_discarded() && j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
              "'{}' has no \"weight_map\" object", index.string());
    std::map<std::string, std::string> where;  // tensor -> file
    for (const auto& [name, file] : j["weight_map"].items()) {
      DHP_CHECK(file.is_string(), "'{}': the file of '{}' is not a string", index.string(), printable(name));
      const std::string f = file.get<std::string>();
      DHP_CHECK(!f.empty() && f.find('/') == std::string::npos && f.find('\0') == std::string::npos &&
                    f != "." && f != "..",
                "'{}': '{}' is not a file name in the folder (for '{}')", index.string(), printable(f),
                printable(name));
      where[name] = f;
    }
    std::map<std::string, Shard*> by_file;
    for (const auto& [name, f] : where)
      if (!by_file.count(f)) by_file[f] = open_shard(f, " (listed in " + index.string() + ")");
    for (const auto& [f, shard] : by_file)
      for (const auto& t : shard->header.tensors) {
        const auto it = where.find(t.name);
        DHP_CHECK(it != where.end(), "'{}' holds tensor '{}', which '{}' does not list", shard->path,
                  printable(t.name), index.string());
        DHP_CHECK(it->second == f, "'{}' lists tensor '{}' in '{}', but it is in '{}'", index.string(),
                  printable(t.name), it->second, f);
        ck.tensors[t.name] = {shard, &t};
      }
    for (const auto& [name, f] : where)
      DHP_CHECK(ck.tensors.count(name), "'{}' lists tensor '{}' in '{}', which does not hold it",
                index.string(), printable(name), f);
  } else {
    DHP_CHECK(fs::exists(single, ec),
              "'{}' has neither model.safetensors nor model.safetensors.index.json (dhp reads "
              "safetensors checkpoints only, not pytorch_model.bin)",
              dir);
    const Shard* s = open_shard("model.safetensors", "");
    for (const auto& t : s->header.tensors) ck.tensors[t.name] = {s, &t};
  }
  return ck;
}

// Why a config.json does not describe `cfg`'s decoder (with `decoder`) and vision tower (with
// `tower`), or "".
std::string shape_difference(const ModelConfig& want, const ModelConfig& file, bool decoder, bool tower) {
  auto s = [](auto v) { return fmt::format("{}", v); };
  // The scaling's parameters count only where it is on.
  auto rope = [&](const ModelConfig& m) {
    if (m.rope_scaling == RopeScaling::none) return std::string("none");
    if (m.rope_scaling == RopeScaling::dynamic) return fmt::format("dynamic (factor {})", m.rope_factor);
    return fmt::format("llama3 (factor {}, low_freq_factor {}, high_freq_factor {}, original_max_pos {})",
                       m.rope_factor, m.rope_low_freq_factor, m.rope_high_freq_factor, m.rope_original_max_pos);
  };
  const auto& w = want.vision;
  const auto& f = file.vision;
  struct Key {
    bool of_tower;
    const char* name;
    std::string here, there;
  };
  const Key keys[] = {
      {false, "dim", s(want.dim), s(file.dim)},
      {false, "layers", s(want.layers), s(file.layers)},
      {false, "heads", s(want.heads), s(file.heads)},
      {false, "kv_heads", s(want.kv_heads), s(file.kv_heads)},
      {false, "head_dim", s(want.hd()), s(file.hd())},
      {false, "ffn", s(want.ffn), s(file.ffn)},
      {false, "rope_theta", s(want.rope_theta), s(file.rope_theta)},
      {false, "rms_norm_eps", s(want.rms_norm_eps), s(file.rms_norm_eps)},
      {false, "tie_embeddings", s(want.tie_embeddings), s(file.tie_embeddings)},
      {false, "attention_bias", s(want.attention_bias), s(file.attention_bias)},
      {false, "attention_out_bias", s(want.attention_out_bias), s(file.attention_out_bias)},
      {false, "qk_norm", s(want.qk_norm), s(file.qk_norm)},
      {false, "rope_scaling", rope(want), rope(file)},
      {true, "vision.arch", std::string(w.traits().name), std::string(f.traits().name)},
      {true, "vision.dim", s(w.dim), s(f.dim)},
      {true, "vision.layers", s(w.layers), s(f.layers)},
      {true, "vision.heads", s(w.heads), s(f.heads)},
      {true, "vision.ffn", s(w.ffn), s(f.ffn)},
      {true, "vision.patch", s(w.patch), s(f.patch)},
      {true, "vision.image_size", s(w.image_size), s(f.image_size)},
  };
  for (const Key& k : keys)
    if ((k.of_tower ? tower : decoder) && k.here != k.there)
      return fmt::format("model.{} is {} here, {} in the checkpoint", k.name, k.here, k.there);
  return "";
}

// One folder an import reads: its layout, the tensors it provides and where they lie.
struct Source {
  std::string dir;
  HfLayout layout = HfLayout::Decoder;
  int file_vocab = 0;  // the decoder's rows in the file (config.json's vocab_size)
  std::vector<HfBinding> map;
  Checkpoint ck;
  // An original LLaVA's copy of its tower, set aside for model.vision.init's (LLaVA's rule):
  // its tensors are ignored, the reason named.
  std::string tower_set_aside;
  std::string note;  // which tower an original LLaVA runs with, and why
};

bool holds_prefix(const Checkpoint& ck, const std::string& prefix) {
  const auto it = ck.tensors.lower_bound(prefix);
  return it != ck.tensors.end() && starts_with(it->first, prefix);
}

// The folders of an import: `dir` (decoder or LLaVA) and, where the model needs a tower from
// elsewhere, cfg.vision.init. Config checks first, then the layout by tensor names.
std::vector<Source> plan_sources(const std::string& dir, const ModelConfig& cfg) {
  std::vector<Source> out;
  bool need_tower = cfg.vision.traits().has_hf() && !cfg.vision.init.empty();
  if (need_tower) {
    // The tower's shape comes from model.vision.init whether its tensors do or not.
    ModelConfig file = cfg;
    file.vision = read_hf_tower_config(cfg.vision.init, cfg.vision);
    const std::string diff = shape_difference(cfg, file, false, true);
    DHP_CHECK(diff.empty(), "'{}/config.json' describes another vision tower: {}", cfg.vision.init, diff);
  }
  if (!dir.empty()) {
    const HfConfig file = read_hf_config(dir, cfg, 0, cfg.vocab_size);
    DHP_CHECK(file.kind != HfKind::Tower, "'{}' is a vision tower ({}); it starts model.vision.init, not "
              "the language model", dir, file.architecture);
    const bool llava_tower = (file.kind == HfKind::Llava && !file.original_llava) || file.kind == HfKind::Composite;
    const std::string diff = shape_difference(cfg, file.model, true, llava_tower);
    DHP_CHECK(diff.empty(), "'{}/config.json' describes another model: {}", dir, diff);
    Source s;
    s.dir = dir;
    s.file_vocab = file.file_vocab;
    s.ck = open_checkpoint(dir);
    if (file.kind == HfKind::Decoder) {
      s.layout = HfLayout::Decoder;
    } else if (file.kind == HfKind::Composite) {
      s.layout = composite_layout(cfg.vision.traits(), file.remote_code);
    } else if (file.original_llava) {
      s.layout = HfLayout::LlavaOriginal;
    } else if (holds_prefix(s.ck, "model.language_model.")) {
      s.layout = HfLayout::LlavaNew;
    } else {
      DHP_CHECK(holds_prefix(s.ck, "language_model.model."),
                "'{}' is a LlavaForConditionalGeneration checkpoint whose tensors follow neither llava-hf's "
                "names (language_model.model.*) nor those of transformers >= 4.52 (model.language_model.*)", dir);
      s.layout = HfLayout::LlavaHf;
    }
    DHP_CHECK(s.layout == HfLayout::Decoder || cfg.vision.traits().has_hf(),
              "'{}' is a LLaVA checkpoint, but the model's tower (model.vision.arch = \"{}\") has no Hugging "
              "Face counterpart; start the run through model.init so that its config sets the tower", dir,
              cfg.vision.traits().name);
    s.map = hf_name_map(cfg, s.layout);
    if (s.layout == HfLayout::LlavaOriginal) {
      // LLaVA's own checkpoints hold the tower only when it was trained; otherwise it is the
      // tower folder's (model.vision.init).
      // LLaVA's CLIPVisionTower reads the copy saved in the checkpoint only when the config
      // sets unfreeze_mm_vision_tower; otherwise it loads mm_vision_tower (model.vision.init).
      const bool has_copy = holds_prefix(s.ck, names_of(s.layout).vision);
      const bool use_copy = has_copy && (file.unfreeze_tower || cfg.vision.embedded_tower);
      const std::string named = file.mm_vision_tower.empty() ? "" : " ('" + printable(file.mm_vision_tower) + "')";
      if (use_copy) {
        need_tower = false;  // model.vision.init gave the tower's shape; the tensors are LLaVA's
        s.note = fmt::format("vision tower: the copy saved in '{}' ({})", dir,
                             file.unfreeze_tower ? "its config sets unfreeze_mm_vision_tower, as LLaVA reads it"
                                                 : "model.vision.embedded_tower = true");
      } else {
        DHP_CHECK(need_tower, "'{}' is an original LLaVA checkpoint without the vision tower's tensors; set "
                  "model.vision.init to the tower's folder (e.g. a download of openai/clip-vit-large-patch14-336)",
                  dir);
        std::erase_if(s.map, [](const HfBinding& b) { return starts_with(b.dhp, "vision."); });
        if (has_copy) s.tower_set_aside = names_of(s.layout).vision;
        s.note = fmt::format("vision tower: model.vision.init '{}', the tower LLaVA loads from mm_vision_tower{}{}",
                             cfg.vision.init, named,
                             has_copy ? "; the copy saved in the checkpoint is not read (LLaVA reads it only with "
                                        "unfreeze_mm_vision_tower; model.vision.embedded_tower = true reads it)"
                                      : "");
      }
    } else if (s.layout != HfLayout::Decoder) {
      DHP_CHECK(!need_tower, "'{}' holds its own vision tower; model.vision.init '{}' would replace it",
                dir, cfg.vision.init);
    }
    out.push_back(std::move(s));
  }
  if (need_tower) {
    const std::string& vdir = cfg.vision.init;
    Source s;
    s.dir = vdir;
    s.layout = HfLayout::Tower;
    s.ck = open_checkpoint(vdir);
    s.map = hf_name_map(cfg, s.layout);
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

void find_held_tensors(ModelConfig& cfg) {
  if (!cfg.vision.traits().has_hf() || (cfg.init.empty() && cfg.vision.init.empty())) return;
  ModelConfig plain = cfg;
  plain.vision.post_norm = plain.vision.pool_head = false;
  for (const Source& s : plan_sources(cfg.init, plain)) {
    const char* v = names_of(s.layout).vision;
    // The folder whose tower the model takes: an original LLaVA without one gave none.
    if (!v || !std::any_of(s.map.begin(), s.map.end(), [](const HfBinding& b) { return starts_with(b.dhp, "vision."); }))
      continue;
    cfg.vision.post_norm = s.ck.tensors.count(std::string(v) + "post_layernorm.weight") > 0;
    cfg.vision.pool_head = cfg.vision.traits().pool_head && s.ck.tensors.count(std::string(v) + "head.probe") > 0;
  }
}

const char* hf_layout_name(HfLayout layout) { return names_of(layout).name; }

HfLayout composite_layout(const TowerTraits& tower, bool remote_code) {
  switch (tower.hf_names) {
    case HfTowerNames::qwen3_vl: return HfLayout::Qwen3Vl;
    case HfTowerNames::intern_vit: return remote_code ? HfLayout::InternVlOriginal : HfLayout::InternVl;
    case HfTowerNames::none:
    case HfTowerNames::clip_vision_transformer: break;
  }
  throw Error(fmt::format("the {} tower comes in no vision-language model of its own", tower.name));
}

bool is_composite_layout(HfLayout layout) {
  return layout == HfLayout::Qwen3Vl || layout == HfLayout::InternVl || layout == HfLayout::InternVlOriginal;
}

HfLayout hf_export_layout(const ModelConfig& cfg, bool remote_code) {
  const TowerTraits& tower = cfg.vision.traits();
  if (!tower.hf_model_class.empty()) return composite_layout(tower, remote_code && !tower.hf_remote_class.empty());
  return tower.has_hf() ? HfLayout::LlavaHf : HfLayout::Decoder;
}

std::vector<std::string> binding_tensors(const HfBinding& b) {
  std::vector<std::string> out = {b.dhp};
  out.insert(out.end(), b.more.begin(), b.more.end());
  return out;
}

std::vector<int64_t> hf_file_shape(const HfBinding& b, const ParamTable& table, const ModelConfig& cfg) {
  std::vector<int64_t> shape = table.get(b.dhp).shape;
  const int64_t p = cfg.vision.patch, frames = cfg.vision.traits().temporal_patch;
  if (b.transform == HfTransform::ConvPatch)
    shape = frames > 1 ? std::vector<int64_t>{shape[0], 3, frames, p, p} : std::vector<int64_t>{shape[0], 3, p, p};
  while (b.transform == HfTransform::Unsqueezed && shape.size() < 3) shape.insert(shape.begin(), 1);
  for (const std::string& m : b.more) shape[0] += table.get(m).shape[0];
  return shape;
}

void hf_permute_patch(float* dst, const float* src, int64_t rows, int64_t p, int64_t frames, bool to_conv) {
  const int64_t pp = p * p, row = 3 * frames * pp;
  for (int64_t o = 0; o < rows; ++o)
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t f = 0; f < frames; ++f)
        for (int64_t k = 0; k < pp; ++k) {
          const int64_t conv = o * row + (c * frames + f) * pp + k, patch = o * row + f * 3 * pp + k * 3 + c;
          if (to_conv) dst[conv] = src[patch];
          else dst[patch] = src[conv];
        }
}

std::vector<HfBinding> hf_name_map(const ModelConfig& cfg, HfLayout layout) {
  const ParamTable table(cfg);
  const LayoutNames& names = names_of(layout);
  std::map<std::string, HfBinding> by_dhp;
  std::vector<HfPattern> rows(std::begin(kNameMap), std::end(kNameMap));
  const std::span<const HfPattern> tower = tower_names(cfg.vision.traits().hf_names, layout);
  rows.insert(rows.end(), tower.begin(), tower.end());
  for (const auto& p : rows) {
    const char* prefix = prefix_of(names, p.part);
    if (!prefix) continue;
    const std::string hf = p.hf;
    const bool merger = hf.find("{j}") != std::string::npos, per_layer = hf.find("{i}") != std::string::npos;
    const std::string mark = merger ? "{j}" : "{i}";
    const int n = merger ? int(cfg.vision.deepstack.size())
                  : !per_layer ? 1 : p.part == HfPart::Vision ? cfg.vision.layers : cfg.layers;
    for (int i = 0; i < n; ++i) {
      std::vector<std::string> parts = split_names(with_layer(p.dhp, i, mark));
      HfBinding b{std::string(prefix) + with_layer(hf, i, mark), parts[0], p.transform};
      b.more.assign(parts.begin() + 1, parts.end());
      if (table.find(b.dhp)) by_dhp[b.dhp] = std::move(b);
    }
  }
  std::vector<HfBinding> out;
  for (const auto& s : table.specs()) {
    const auto it = by_dhp.find(s.name);
    if (it != by_dhp.end()) out.push_back(it->second);
  }
  return out;
}

bool is_hf_folder(const std::string& path) {
  std::error_code ec;
  return !path.empty() && fs::is_directory(path, ec) && fs::exists(fs::path(path) / "config.json", ec);
}

bool holds_tokenizer(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / "tokenizer.model", ec) || fs::is_regular_file(fs::path(dir) / "tokenizer.json", ec);
}

namespace {

// Every check that needs no tensor data, over every folder of an import: the names against the
// map, shapes and dtypes. What it finds so far goes into the import's report.
HfImport verify_sources(const std::vector<Source>& sources, const ModelConfig& cfg, const ParamTable& table) {
  HfImport r;
  std::map<std::string, int> ignored;
  std::vector<std::string> reasons;  // in the order first met
  // Every check before the first byte is written: names, shapes and dtypes of every folder.
  for (const Source& src : sources) {
    const LayoutNames& names = names_of(src.layout);
    std::set<std::string> mapped;
    for (const auto& b : src.map) mapped.insert(b.hf);
    for (const auto& [name, at] : src.ck.tensors) {
      if (mapped.count(name)) continue;
      const std::string why = !src.tower_set_aside.empty() && starts_with(name, src.tower_set_aside)
                                  ? "the copy of the tower saved in an original LLaVA checkpoint (LLaVA loads "
                                    "mm_vision_tower instead unless unfreeze_mm_vision_tower)"
                                  : ignored_because(name, names);
      if (!why.empty()) {
        if (!ignored[why]++) reasons.push_back(why);
        continue;
      }
      // A tower's layout has no output layer (lm_head is null there).
      DHP_CHECK(!(names.lm_head && name == names.lm_head && cfg.tie_embeddings),
                "'{}' holds {}, but its config says tie_word_embeddings = true", at.shard->path, name);
      throw Error(fmt::format("'{}' holds tensor '{}', which the model does not have (the names dhp "
                              "maps are in docs/pretrained.md)", at.shard->path, printable(name)));
    }
    std::string dtype;
    for (const auto& b : src.map) {
      const auto it = src.ck.tensors.find(b.hf);
      DHP_CHECK(it != src.ck.tensors.end(), "'{}' has no tensor '{}' (dhp's {})", src.dir, b.hf, b.dhp);
      const SafetensorsEntry& t = *it->second.entry;
      std::vector<int64_t> want = hf_file_shape(b, table, cfg);
      if (b.transform == HfTransform::VocabRows) want[0] = src.file_vocab;
      DHP_CHECK(t.shape == want, "'{}': tensor '{}' has shape [{}]; config.json implies [{}]{}",
                it->second.shard->path, b.hf, fmt::join(t.shape, ", "), fmt::join(want, ", "),
                b.transform == HfTransform::VocabRows && t.shape.size() == 2 && t.shape[0] != want[0]
                    ? fmt::format(" (its vocab_size is {})", src.file_vocab) : "");
      DHP_CHECK(is_float_dtype(t.dtype), "'{}': tensor '{}' has dtype {}; F32, F16 and BF16 are supported",
                it->second.shard->path, b.hf, t.dtype);
      if (dtype.empty()) dtype = t.dtype;
    }
    if (r.dtype.empty()) r.dtype = dtype;
    if (r.file_vocab == 0) r.file_vocab = src.file_vocab;
    if (!src.ck.note.empty()) r.notes.push_back(src.ck.note);
    if (!src.note.empty()) r.notes.push_back(src.note);
    const char* what = src.layout == HfLayout::Decoder ? "decoder tensors"
                       : src.layout == HfLayout::Tower ? "vision tower tensors"
                                                       : "tensors of the decoder, vision tower and projector";
    r.sources.push_back(fmt::format("{} {} ({}) from {} ({} layout)", src.map.size(), what, dtype, src.dir,
                                    names.name));
  }
  for (const auto& why : reasons) r.ignored.push_back({why, ignored[why]});
  return r;
}

}  // namespace

void check_hf_weights(const ModelConfig& cfg) {
  if (cfg.init.empty() && cfg.vision.init.empty()) return;
  verify_sources(plan_sources(cfg.init, cfg), cfg, ParamTable(cfg));
}

WeightWriter host_arena_writer(float* arena) {
  return {[arena](int64_t offset, const float* values, int64_t count) { std::copy_n(values, count, arena + offset); },
          arena};
}

HfImport import_hf_weights(const std::string& dir, const ModelConfig& cfg, const ParamTable& table,
                           const WeightWriter& out, bool report) {
  const std::vector<Source> sources = plan_sources(dir, cfg);
  HfImport r = verify_sources(sources, cfg, table);
  // Every tensor is read twice: checked finite, then converted.
  int64_t bytes = 0;
  for (const Source& src : sources)
    for (const HfBinding& b : src.map) {
      const SafetensorsEntry& e = *src.ck.tensors.at(b.hf).entry;
      bytes += 2 * (e.end - e.begin);
    }
  ByteProgress progress(fmt::format("importing {}", dir), bytes, report);
  const auto counted = [&](const SafetensorsEntry& e, int64_t elements) {
    progress.add(elements * safetensors_dtype_width(e.dtype));
  };

  // Read, not mapped (for_each_chunk): a shard truncated while it is imported is an error
  // naming it, not SIGBUS. Every value is checked finite before the first byte is written.
  constexpr int64_t kChunk = int64_t(1) << 22;  // elements (16 MiB of fp32)
  std::vector<char> raw;
  for (const Source& src : sources)
    for (const HfBinding& b : src.map) {
      const Located& at = src.ck.tensors.at(b.hf);
      for_each_chunk(*at.shard->in, at.shard->path, at.shard->header, *at.entry, kChunk, raw,
                     [&](const char* bytes, int64_t i0, int64_t c) {
                       counted(*at.entry, c);
                       const int64_t bad = first_non_finite(bytes, at.entry->dtype, c);
                       DHP_CHECK(bad < 0, "'{}': tensor '{}' holds a non-finite value (NaN or infinity) at "
                                 "element {}; these weights are unusable", at.shard->path, b.hf, i0 + bad);
                     });
    }

  // Converted a chunk at a time: the arena plus one chunk is all that is held. An arena in
  // host memory (the CPU backend's) takes chunks converted straight into it.
  float* const in_place = out.in_place;
  std::vector<float> staged, permuted;
  std::set<std::string> done;
  for (const Source& src : sources)
    for (const auto& b : src.map) {
      const Located& at = src.ck.tensors.at(b.hf);
      const ParamSpec& spec = table.get(b.dhp);
      const int64_t n = at.entry->numel();
      if (b.transform == HfTransform::ConvPatch || b.transform == HfTransform::RowConcat) {
        // Small (a tower's patch embedding, one layer's qkv): converted whole, then permuted
        // or split into dhp's tensors.
        staged.resize(size_t(n));
        permuted.resize(size_t(n));
        for_each_chunk(*at.shard->in, at.shard->path, at.shard->header, *at.entry, n, raw,
                       [&](const char* bytes, int64_t, int64_t c) {
                         widen_to_f32(staged.data(), bytes, at.entry->dtype, c);
                         counted(*at.entry, c);
                       });
        if (b.transform == HfTransform::ConvPatch)
          hf_permute_patch(permuted.data(), staged.data(), spec.shape[0], cfg.vision.patch,
                           cfg.vision.traits().temporal_patch, false);
        else
          permuted.swap(staged);
        int64_t at_value = 0;
        for (const std::string& name : binding_tensors(b)) {
          const ParamSpec& part = table.get(name);
          out.write(part.offset, permuted.data() + at_value, part.numel());
          at_value += part.numel();
          r.imported.push_back(name);
          done.insert(name);
        }
        continue;
      }
      const bool grow = b.transform == HfTransform::VocabRows && spec.shape[0] > at.entry->shape[0];
      const int64_t d = spec.shape.size() == 2 ? spec.shape[1] : 1;
      std::vector<double> column_sum(grow ? size_t(d) : 0, 0.0);  // (d)
      for_each_chunk(*at.shard->in, at.shard->path, at.shard->header, *at.entry, kChunk, raw,
                     [&](const char* bytes, int64_t i0, int64_t c) {
                       if (!in_place) staged.resize(size_t(c));
                       float* dst = in_place ? in_place + spec.offset + i0 : staged.data();
                       widen_to_f32(dst, bytes, at.entry->dtype, c);
                       counted(*at.entry, c);
                       if (grow)
                         for (int64_t i = 0; i < c; ++i) column_sum[size_t((i0 + i) % d)] += dst[i];
                       if (!in_place) out.write(spec.offset + i0, dst, c);
                     });
      if (grow) {
        // New rows (added tokens) start at the mean of the file's rows: a token the model has
        // never seen begins as the average token, so its logit starts near the others' and
        // nothing it does moves the pretrained distribution far at the first steps.
        const int64_t rows = at.entry->shape[0], extra = spec.shape[0] - rows;
        std::vector<float> row(static_cast<size_t>(d));
        for (int64_t c = 0; c < d; ++c) row[size_t(c)] = float(column_sum[size_t(c)] / double(rows));
        for (int64_t rw = 0; rw < extra; ++rw)
          out.write(spec.offset + (rows + rw) * d, row.data(), d);
        r.grown_rows = int(extra);
      }
      r.imported.push_back(b.dhp);
      done.insert(b.dhp);
    }
  for (const auto& s : table.specs())
    if (!done.count(s.name)) r.initialised.push_back(s.name);
  return r;
}

HfImport import_hf_checkpoint(const std::string& dir, Model& model, bool report) {
  const bool host = model.backend().device() == Device::CPU && !model.sheds_master();
  const WeightWriter out{[&model](int64_t offset, const float* values, int64_t count) {
                           model.write_params(offset, values, count);
                         },
                         host ? model.params() : nullptr};
  return import_hf_weights(dir, model.config(), model.table(), out, report);
}

void log_hf_import(const HfImport& r, const ModelConfig& cfg) {
  for (const auto& n : r.notes) spdlog::warn("{}", n);
  for (const auto& s : r.sources) spdlog::info("imported {}", s);
  spdlog::info("imported tensors: {}", fmt::join(r.imported, ", "));
  if (!r.initialised.empty())
    spdlog::info("kept their seeded initialisation ({} tensors not in the checkpoint): {}", r.initialised.size(),
                 fmt::join(r.initialised, ", "));
  for (const auto& [why, n] : r.ignored) spdlog::info("ignored {} tensors the model does not use: {}", n, why);
  if (r.grown_rows > 0)
    spdlog::info("vocabulary grown from {} to {} rows for the tokenizer's added tokens (data.added_tokens); the "
                 "new rows start at the mean of the checkpoint's rows and their logits join the softmax, so the "
                 "loss is not the checkpoint's own (data.added_tokens = \"none\" keeps its vocabulary: image "
                 "positions then hold the pad, or unk, as LLaVA-1.5's do)",
                 r.file_vocab, cfg.vocab_size);
}

std::string hf_checkpoint_dtype(const std::string& dir) {
  try {
    const Checkpoint ck = open_checkpoint(dir);
    for (const char* name : {"model.embed_tokens.weight", "language_model.model.embed_tokens.weight",
                             "model.language_model.embed_tokens.weight"}) {
      const auto it = ck.tensors.find(name);
      if (it != ck.tensors.end()) return it->second.entry->dtype;
    }
    return "";
  } catch (const Error&) {
    return "";
  }
}

}  // namespace dhp
