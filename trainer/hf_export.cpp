// export_hf_checkpoint and its output-path rules (trainer/hf_checkpoint.h).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/check.h"
#include "core/files.h"
#include "core/input.h"
#include "core/progress.h"
#include "core/text.h"
#include "trainer/hf_checkpoint.h"
#include "trainer/run_lock.h"
#include "trainer/safetensors.h"

namespace dhp {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Files dhp writes into an export folder are listed here, so a later export may replace them
// (and only them) without --force.
constexpr const char* kManifest = "dhp_export.json";
constexpr const char* kProducer = "dhp";
// The names an export may write, whatever its shard count: what the path check looks at.
const char* const kFixedFiles[] = {"config.json",          "generation_config.json",
                                   "model.safetensors",    "model.safetensors.index.json",
                                   "tokenizer.model",      "tokenizer.json",
                                   "tokenizer_config.json", "special_tokens_map.json",
                                   "added_tokens.json",    "preprocessor_config.json",
                                   "processor_config.json"};

std::string torch_dtype(const std::string& d) {
  return d == "BF16" ? "bfloat16" : d == "F16" ? "float16" : "float32";
}

// The files an earlier export listed, or empty when the manifest is not one of dhp's.
std::set<std::string> earlier_files(const std::string& dir) {
  std::set<std::string> out;
  const json j = json::parse(read_head((fs::path(dir) / kManifest).string(), 1 << 20), nullptr, false);
  if (!j.is_object() || j.value("producer", "") != kProducer || !j.contains("files") || !j["files"].is_array())
    return out;
  for (const auto& f : j["files"])
    if (f.is_string()) out.insert(f.get<std::string>());
  return out;
}

// The tokenizer's files of an export (with a tokenizer).
const char* const kTokenizerFiles[] = {"tokenizer.model", "tokenizer.json", "tokenizer_config.json",
                                       "special_tokens_map.json", "added_tokens.json"};

bool is_shard_name(const std::string& n) {
  return n.rfind("model-", 0) == 0 && n.size() > 12 && n.compare(n.size() - 12, 12, ".safetensors") == 0;
}

json special_entry(const std::string& text) {
  return {{"content", text}, {"lstrip", false}, {"normalized", false}, {"rstrip", false},
          {"single_word", false}};
}

// The tokenizer files transformers' LlamaTokenizer(Fast) reads: the special tokens by text,
// every special and added token by id, and the added tokens' ids.
std::vector<std::pair<std::string, std::string>> tokenizer_files(const HfTokenizerFiles& t,
                                                                 int64_t vocab) {
  json decoder = json::object(), map = json::object(), added = json::object(), cfg;
  std::set<int32_t> ids;
  auto note = [&](const std::string& text, int32_t id) {
    DHP_CHECK(id >= 0 && id < vocab, "export: token '{}' has id {}, outside the model's vocabulary of {}",
              printable(text), id, vocab);
    json e = special_entry(text);
    e["special"] = true;
    decoder[std::to_string(id)] = e;
  };
  for (const auto& [key, tok] : {std::pair{"unk_token", &t.unk}, std::pair{"bos_token", &t.bos},
                                 std::pair{"eos_token", &t.eos}, std::pair{"pad_token", &t.pad}}) {
    if (tok->id < 0) {
      cfg[key] = nullptr;
      continue;
    }
    note(tok->text, tok->id);
    map[key] = special_entry(tok->text);
    cfg[key] = tok->text;
  }
  for (const auto& [text, id] : t.added) {
    DHP_CHECK(ids.insert(id).second, "export: added token id {} appears twice", id);
    note(text, id);
    added[text] = id;
  }
  cfg["add_bos_token"] = t.add_bos;
  cfg["add_eos_token"] = false;
  cfg["added_tokens_decoder"] = decoder;
  cfg["clean_up_tokenization_spaces"] = false;
  cfg["legacy"] = t.legacy;
  cfg["model_max_length"] = t.model_max_length;
  if (!t.chat_template.empty()) cfg["chat_template"] = t.chat_template;
  cfg["padding_side"] = "right";
  cfg["sp_model_kwargs"] = json::object();
  cfg["tokenizer_class"] = "LlamaTokenizer";
  return {{"tokenizer_config.json", cfg.dump(2) + "\n"},
          {"special_tokens_map.json", map.dump(2) + "\n"},
          {"added_tokens.json", added.dump(2) + "\n"}};
}

// The RoPE block: Llama-3.x's rope_scaling as Llama-3.1's config.json holds it, M-RoPE's as
// Qwen3-VL's does, null for plain RoPE.
json rope_scaling(const ModelConfig& m) {
  if (m.mrope())
    return {{"mrope_interleaved", m.mrope_interleaved}, {"mrope_section", m.mrope_section}, {"rope_type", "default"}};
  if (m.rope_scaling == RopeScaling::none) return nullptr;
  if (m.rope_scaling == RopeScaling::dynamic) return {{"factor", m.rope_factor}, {"rope_type", "dynamic"}};
  return {{"factor", m.rope_factor},
          {"high_freq_factor", m.rope_high_freq_factor},
          {"low_freq_factor", m.rope_low_freq_factor},
          {"original_max_position_embeddings", m.rope_original_max_pos},
          {"rope_type", "llama3"}};
}

// The decoder's config as `family`'s class holds it.
json decoder_config(const ModelConfig& m, const HfExportOptions& o, const DecoderTraits& family) {
  json c = {{"architectures", {family.hf_class}},
            {"model_type", family.model_type},
            {"hidden_size", m.dim},
            {"intermediate_size", m.ffn},
            {"num_hidden_layers", m.layers},
            {"num_attention_heads", m.heads},
            {"num_key_value_heads", m.kv_heads},
            {"head_dim", m.hd()},
            {"hidden_act", "silu"},
            // The source folder's, else the exporting run's longest sequence.
            {"max_position_embeddings", m.max_positions > 0 ? m.max_positions : o.max_position_embeddings},
            {"initializer_range", 0.02},
            {"rms_norm_eps", m.rms_norm_eps},
            {"rope_theta", m.rope_theta},
            {"rope_scaling", rope_scaling(m)},
            {"tie_word_embeddings", m.tie_embeddings},
            {"vocab_size", m.vocab_size},
            {"attention_dropout", 0.0},
            {"use_cache", true},
            {"torch_dtype", torch_dtype(o.dtype)}};
  // Qwen3VLTextConfig has no window keys.
  if (family.window != DecoderWindow::sliding_window && !family.mrope) {
    c["use_sliding_window"] = false;
    c["sliding_window"] = nullptr;
    c["max_window_layers"] = m.layers;
  }
  if (family.bias == DecoderBias::qkvo_optional) c["attention_bias"] = m.attention_bias;
  c.update(json::parse(family.hf_extra));
  const HfTokenizerFiles* t = o.tokenizer;
  c["bos_token_id"] = t && t->bos.id >= 0 ? json(t->bos.id) : json(nullptr);
  c["eos_token_id"] = t && t->eos.id >= 0 ? json(t->eos.id) : json(nullptr);
  if (t && t->pad.id >= 0) c["pad_token_id"] = t->pad.id;
  return c;
}

json model_config(const ModelConfig& m, const HfExportOptions& o) {
  // The class whose attention the model's is: the first family of types/architecture.h an
  // export names whose traits are the model's (Qwen3 with the per-head q/k norms, Qwen2 with
  // biases on q/k/v alone, Llama otherwise). Biases on o_proj without q/k/v have no class.
  // No decoder class an export writes alone turns by three positions: the folder would load
  // into a decoder that computes another rotation, so it is refused before any file is written.
  DHP_CHECK(!m.mrope(), "export: the model's decoder has M-RoPE (model.mrope_section = [{}, {}, {}]), which no "
            "Hugging Face decoder class dhp writes has (their RoPE turns by one position a token; a Qwen3-VL "
            "model, model.vision.arch = \"qwen3_vl\", is written with its own)",
            m.mrope_section[0], m.mrope_section[1], m.mrope_section[2]);
  const DecoderTraits* family = exported_family(m.attention_bias, m.attention_out_bias, m.qk_norm);
  if (!family) {
    std::vector<std::string> classes;
    for (const DecoderTraits& t : kDecoderTraits)
      if (t.exported)
        classes.push_back(fmt::format("{} ({}{})", t.hf_class,
                                      t.bias == DecoderBias::qkvo_optional ? "biases on q, k, v and o_proj together or none"
                                      : t.bias == DecoderBias::qkv_always  ? "biases on q, k and v, none on o_proj"
                                                                           : "no biases",
                                      t.qk_norm ? ", q/k norms" : ""));
    throw Error(fmt::format("export: the model has {} (model.attention_bias = {}, model.attention_out_bias = {}, "
                            "model.qk_norm = {}); no Hugging Face class has that attention: {}",
                            m.attention_bias ? "q/k/v biases" : "an o_proj bias", m.attention_bias,
                            m.attention_out_bias, m.qk_norm, fmt::join(classes, "; ")));
  }
  return decoder_config(m, o, *family);
}

const char* act_name(VisionAct a) {
  return a == VisionAct::quick_gelu ? "quick_gelu" : a == VisionAct::gelu ? "gelu" : "gelu_pytorch_tanh";
}

// LlavaConfig: the decoder's config as text_config, the tower's as vision_config, and LLaVA's
// own keys.
json llava_config(const ModelConfig& m, const HfExportOptions& o, int64_t image_token) {
  const VisionConfig& v = m.vision;
  const TowerTraits& tower = v.traits();
  json text = model_config(m, o);
  text.erase("architectures");
  // llava-hf keeps the pad token's id at the top level.
  const json pad = text.contains("pad_token_id") ? text["pad_token_id"] : json(nullptr);
  text.erase("pad_token_id");
  json vision = {{"model_type", tower.hf_model_type},
                 {"hidden_size", v.dim},
                 {"intermediate_size", v.ffn},
                 {"num_hidden_layers", v.layers},
                 {"num_attention_heads", v.heads},
                 {"num_channels", 3},
                 {"image_size", v.image_size},
                 {"patch_size", v.patch},
                 {"hidden_act", act_name(v.act)},
                 {"layer_norm_eps", v.norm_eps},
                 {"attention_dropout", 0.0}};
  if (tower.pool_head) vision["vision_use_head"] = v.pool_head;  // written when the source had it
  const ProjectorAct pa = v.projector_gelu();
  const int64_t grid = int64_t(v.pos_grid()) * v.pos_grid();
  json c = {{"architectures", {"LlavaForConditionalGeneration"}},
          {"model_type", "llava"},
          {"text_config", text},
          {"vision_config", vision},
          {"image_token_index", image_token},
          {"projector_hidden_act", pa == ProjectorAct::gelu ? "gelu" : pa == ProjectorAct::quick_gelu ? "quick_gelu"
                                                                                                   : "gelu_pytorch_tanh"},
          {"multimodal_projector_bias", true},
          {"vision_feature_layer", v.feature_layer},
          // "default" drops hidden-state row 0, a class row; "full" keeps every row.
          {"vision_feature_select_strategy", tower.hf_feature_select},
          {"image_seq_length", grid},
          {"ignore_index", -100},
          {"tie_word_embeddings", m.tie_embeddings},
          {"vocab_size", m.vocab_size},
          {"torch_dtype", torch_dtype(o.dtype)}};
  if (!pad.is_null()) c["pad_token_id"] = pad;
  return c;
}

// A vision-language model of the tower's own (TowerTraits::hf_model_class; Qwen3VLConfig): its
// text model's config (the family whose row says mrope), the tower's, the image token.
json composite_config(const ModelConfig& m, const HfExportOptions& o, int64_t image_token) {
  const VisionConfig& v = m.vision;
  const TowerTraits& tower = v.traits();
  const DecoderTraits* family = nullptr;
  for (const DecoderTraits& t : kDecoderTraits)
    if (t.model_type == tower.hf_text_type) family = &t;
  DHP_ASSERT(family);
  DHP_CHECK(m.mrope() && m.mrope_interleaved && m.qk_norm == family->qk_norm &&
                admits_biases(*family, m.attention_bias, m.attention_out_bias),
            "export: a {} holds a {} text model (q/k norms, interleaved M-RoPE, biases on q, k, v and o_proj "
            "together or none); this model has model.qk_norm = {}, model.mrope_section = [{}, {}, {}], "
            "model.mrope_interleaved = {}, model.attention_bias = {}, model.attention_out_bias = {}",
            tower.hf_model_class, family->model_type, m.qk_norm, m.mrope_section[0], m.mrope_section[1],
            m.mrope_section[2], m.mrope_interleaved, m.attention_bias, m.attention_out_bias);
  json text = decoder_config(m, o, *family);
  text.erase("architectures");
  json vision = {{"model_type", tower.hf_model_type},
                 {"depth", v.layers},
                 {"hidden_size", v.dim},
                 {"hidden_act", act_name(v.act)},
                 {"intermediate_size", v.ffn},
                 {"num_heads", v.heads},
                 {"in_channels", 3},
                 {"patch_size", v.patch},
                 {"spatial_merge_size", v.merge},
                 {"temporal_patch_size", tower.temporal_patch},
                 {"out_hidden_size", m.dim},
                 {"num_position_embeddings", int64_t(v.pos_grid()) * v.pos_grid()},
                 {"deepstack_visual_indexes", v.deepstack},
                 {"initializer_range", 0.02}};
  json c = {{"architectures", {tower.hf_model_class}},
            {"model_type", tower.hf_model_type},
            {"text_config", text},
            {"vision_config", vision},
            {"image_token_id", image_token},
            {"tie_word_embeddings", m.tie_embeddings},
            {"torch_dtype", torch_dtype(o.dtype)}};
  // get_rope_index finds each image by the token before it: the run's, when its tokenizer is
  // known (else the class's default, Qwen's own ids).
  if (o.tokenizer && o.tokenizer->image_begin >= 0) c["vision_start_token_id"] = o.tokenizer->image_begin;
  if (o.tokenizer && o.tokenizer->image_end >= 0) c["vision_end_token_id"] = o.tokenizer->image_end;
  return c;
}

// InternVL's config in either layout: transformers' InternVLConfig (text_config, an
// internvl_vision vision_config) or the remote code's InternVLChatConfig (llm_config, an
// intern_vit_6b vision_config and its tiling keys).
json internvl_config(const ModelConfig& m, const HfExportOptions& o, int64_t image_token, bool remote) {
  const VisionConfig& v = m.vision;
  const TowerTraits& tower = v.traits();
  DHP_CHECK(v.merge == 2, "export: InternVL folds 2 x 2 patches (downsample_ratio 0.5); this model merges {0}x{0} "
            "(model.vision.merge = {0})", v.merge);
  DHP_CHECK(v.projector_gelu() == ProjectorAct::gelu, "export: InternVL's mlp1 uses erf GELU; this model's "
            "projector uses another (model.vision.projector_act)");
  json text = model_config(m, o);
  const ImageGeometry tiles = data_geometry(v);
  // transformers' processor always adds the thumbnail to a grid of tiles.
  DHP_CHECK(remote || !tiles.tiled() || tiles.thumbnail, "export: transformers' InternVL processor always adds a "
            "thumbnail to an image's tiles; this model tiles without one (model.vision.thumbnail = false): export "
            "with --remote-code, whose use_thumbnail holds it");
  if (remote)
    spdlog::info("export: the remote-code layout loads through InternVL's own configuration_internvl_chat.py, "
                 "modeling_internvl_chat.py and modeling_intern_vit.py, which dhp does not write: copy them beside "
                 "it from the model's original folder");
  json vision = {{"architectures", {"InternVisionModel"}},
                 {"hidden_size", v.dim},
                 {"intermediate_size", v.ffn},
                 {"num_hidden_layers", v.layers},
                 {"num_attention_heads", v.heads},
                 {"num_channels", 3},
                 {"hidden_act", act_name(v.act)},
                 {"layer_norm_eps", v.norm_eps},
                 {"norm_type", tower.norm == NormKind::layer ? "layer_norm" : "rms_norm"},
                 {"attention_dropout", 0.0},
                 {"dropout", 0.0},
                 {"initializer_factor", 0.1},
                 {"initializer_range", 1e-10},
                 {"torch_dtype", torch_dtype(o.dtype)}};
  if (remote) {
    vision.update({{"model_type", "intern_vit_6b"}, {"image_size", v.image_size}, {"patch_size", v.patch},
                   {"qk_normalization", tower.qk_norm}, {"qkv_bias", tower.qkv_bias}, {"drop_path_rate", 0.0},
                   {"use_flash_attn", false}});
    return {{"architectures", {tower.hf_remote_class}},
            {"auto_map", {{"AutoConfig", "configuration_internvl_chat.InternVLChatConfig"},
                          {"AutoModel", "modeling_internvl_chat.InternVLChatModel"},
                          {"AutoModelForCausalLM", "modeling_internvl_chat.InternVLChatModel"}}},
            {"model_type", "internvl_chat"},
            {"llm_config", text},
            {"vision_config", vision},
            {"downsample_ratio", 0.5},
            {"select_layer", v.feature_layer},
            {"ps_version", "v2"},
            {"template", "internvl2_5"},
            {"force_image_size", v.image_size},
            {"dynamic_image_size", tiles.tiled()},
            {"use_thumbnail", tiles.thumbnail},
            {"min_dynamic_patch", tiles.min_tiles},
            {"max_dynamic_patch", tiles.tiled() ? tiles.max_tiles : 12},
            {"pad2square", false},
            {"use_backbone_lora", 0},
            {"use_llm_lora", 0},
            {"tie_word_embeddings", m.tie_embeddings},
            {"torch_dtype", torch_dtype(o.dtype)}};
  }
  vision.update({{"model_type", tower.hf_model_type}, {"image_size", {v.image_size, v.image_size}},
                 {"patch_size", {v.patch, v.patch}}, {"attention_bias", tower.qkv_bias}, {"use_qk_norm", tower.qk_norm},
                 {"use_mean_pooling", true}, {"use_absolute_position_embeddings", true},
                 {"layer_scale_init_value", 0.1}, {"use_mask_token", false}, {"hidden_dropout_prob", 0.0},
                 {"projection_dropout", 0.0}});
  const int64_t g = v.image_size / v.patch / v.merge;
  return {{"architectures", {tower.hf_model_class}},
          {"model_type", "internvl"},
          {"text_config", text},
          {"vision_config", vision},
          {"image_token_id", image_token},
          {"image_seq_length", g * g},
          {"downsample_ratio", 0.5},
          {"projector_hidden_act", "gelu"},
          {"vision_feature_layer", v.feature_layer},
          {"vision_feature_select_strategy", tower.hf_feature_select},
          {"tie_word_embeddings", m.tie_embeddings},
          {"torch_dtype", torch_dtype(o.dtype)}};
}

// LlavaProcessor's processor_config.json: how many positions an image's <image> becomes.
json processor_config(const VisionConfig& v) {
  const TowerTraits& tower = v.traits();
  return {{"image_token", "<image>"},
          {"num_additional_image_tokens", tower.class_row ? 1 : 0},
          {"patch_size", v.patch},
          {"processor_class", "LlavaProcessor"},
          {"vision_feature_select_strategy", tower.hf_feature_select}};
}

// The image processor that does what training did (model.vision.resize): CLIP's short side and
// centre crop, SigLIP's square resize, LlavaImageProcessor's do_pad (LLaVA-1.5's "pad"); a
// tower trained at its images' own resolutions (native, qwen) gets its row's processor, the nearest
// transformers has.
json preprocessor_config(const VisionConfig& v, HfLayout layout) {
  if (layout == HfLayout::InternVl)
    // GotOcr2ImageProcessor, as transformers' InternVL conversion writes it: a square resize of
    // each tile (InternVLProcessor asks it for the tiles at call time, crop_to_patches).
    return {{"image_processor_type", "GotOcr2ImageProcessorFast"}, {"processor_class", "InternVLProcessor"},
            {"do_normalize", true}, {"do_rescale", true}, {"do_resize", true}, {"do_convert_rgb", true},
            {"image_mean", v.pixel_mean}, {"image_std", v.pixel_std}, {"resample", 3},
            {"rescale_factor", 1.0 / 255}, {"size", {{"height", v.image_size}, {"width", v.image_size}}},
            {"crop_to_patches", false}, {"min_patches", data_geometry(v).min_tiles},
            {"max_patches", std::max(data_geometry(v).max_tiles, 1)}};
  const ImageFit fit = !v.fixed_square() ? v.traits().hf_fit : v.resize;
  const bool pad = fit == ImageFit::pad_square;
  const bool clip = fit == ImageFit::clip;
  json c = {{"do_normalize", true}, {"do_rescale", true}, {"do_resize", true}, {"do_convert_rgb", true},
            {"image_mean", v.pixel_mean}, {"image_std", v.pixel_std}, {"resample", 3},
            {"rescale_factor", 1.0 / 255}};
  if (fit == ImageFit::qwen) {
    // Qwen2VLImageProcessor: each image at its own size within the pixel bounds.
    c["image_processor_type"] = "Qwen2VLImageProcessor";
    c["patch_size"] = v.patch;
    c["merge_size"] = v.merge;
    c["temporal_patch_size"] = v.traits().temporal_patch;
    c["size"] = {{"shortest_edge", v.min_pixels}, {"longest_edge", v.max_pixels}};
  } else if (pad || clip) {
    c["image_processor_type"] = pad ? "LlavaImageProcessor" : "CLIPImageProcessor";
    c["size"] = {{"shortest_edge", v.image_size}};
    c["crop_size"] = {{"height", v.image_size}, {"width", v.image_size}};
    c["do_center_crop"] = true;
    if (pad) c["do_pad"] = true;
  } else {
    c["image_processor_type"] = "SiglipImageProcessor";
    c["size"] = {{"height", v.image_size}, {"width", v.image_size}};
  }
  return c;
}

}  // namespace

HfTokenizerFiles hf_tokenizer_files(const TokenizerFiles& f, int64_t model_max_length, ChatTemplate chat) {
  HfTokenizerFiles t;
  t.model_max_length = model_max_length;
  t.legacy = f.legacy;
  t.chat_template = jinja_chat_template(chat, f.legacy);
  t.vocab = f.sentencepiece_size + int32_t(f.added.size());
  for (const AddedToken& a : f.added) t.added.push_back({a.text, a.id});
  t.image_pad = f.ids.image_pad;
  t.image_begin = f.ids.img_begin;
  t.image_end = f.ids.img_end;
  if (f.kind == TokenizerKind::HuggingFace) {
    // The files themselves: transformers reads them as they were read here.
    t.copied.push_back(f.model_path);
    if (!f.config_path.empty()) t.copied.push_back(f.config_path);
    std::error_code ec;
    const fs::path map = fs::path(f.model_path).parent_path() / "special_tokens_map.json";
    if (fs::is_regular_file(map, ec)) t.copied.push_back(map.string());
    t.unk = {"", f.ids.unk};
    t.bos = {"", f.ids.bos};
    t.eos = {"", f.ids.eos};
    t.pad = {"", f.ids.pad};
    return t;
  }
  t.sentencepiece_model = f.model_path;
  t.unk = {"<unk>", f.ids.unk};
  t.bos = {"<s>", f.ids.bos};
  t.eos = {"</s>", f.ids.eos};
  if (f.model_has_pad) t.pad = {"<pad>", f.ids.pad};
  for (const AddedToken& a : f.added)
    if (!f.model_has_pad && a.id == f.ids.pad) t.pad = {a.text, a.id};
  return t;
}

void check_hf_export_paths(const HfExportOptions& o) {
  DHP_CHECK(!o.dir.empty(), "export: -o/--out names no folder");
  DHP_CHECK(o.dtype == "F32" || o.dtype == "BF16" || o.dtype == "F16",
            "export: dtype '{}' is not one of f32, bf16, f16", printable(o.dtype));
  DHP_CHECK(o.max_shard_bytes > 0, "export: the shard size must be positive");
  std::error_code ec;
  const auto st = fs::symlink_status(o.dir, ec);
  if (!fs::exists(st)) return;
  DHP_CHECK(fs::is_directory(st), "export: -o/--out '{}' is not a folder (--format hf writes a folder)",
            printable(o.dir));
  const std::set<std::string> ours = earlier_files(o.dir);
  auto is_ours = [&](const std::string& p) { return ours.count(fs::path(p).filename().string()) > 0; };
  check_output_path((fs::path(o.dir) / kManifest).string(), "export: its file list",
                    [](const std::string& p) {
                      return earlier_files(fs::path(p).parent_path().string()).size() > 0;
                    },
                    o.force);
  for (const char* f : kFixedFiles)
    check_output_path((fs::path(o.dir) / f).string(), fmt::format("export: {}", f), is_ours, o.force);
  for (const auto& e : fs::directory_iterator(o.dir, ec))
    if (is_shard_name(e.path().filename().string()))
      check_output_path(e.path().string(), "export: a shard", is_ours, o.force);
}

void export_hf_checkpoint(const Model& model, const HfExportOptions& o) {
  const float* arena = model.params();
  Backend& backend = model.backend();
  export_hf_checkpoint(model.config(), model.table(), [&](const ParamSpec& s, float* out) {
    backend.download(out, arena + s.offset, size_t(s.numel()) * sizeof(float));
  }, o);
}

void export_hf_checkpoint(const ModelConfig& model_cfg, const ParamTable& table, const TensorSource& weights,
                          const HfExportOptions& o) {
  check_hf_export_paths(o);
  std::error_code ec;
  fs::create_directories(o.dir, ec);
  DHP_CHECK(!ec, "export: cannot create the folder '{}': {}", o.dir, ec.message());
  // One export into a folder at a time: two would share the file list's temporary file and
  // each remove the other's files as stale. Checked again under the lock: another export may
  // have written the folder since.
  const std::string lock_path = (fs::path(o.dir) / kRunLockFile).string();
  RunLock lock(lock_path, fmt::format("export folder '{}'", o.dir),
               "two exports into one folder would remove each other's files: wait for it to end or "
               "choose another folder");
  check_hf_export_paths(o);
  // A clip or siglip tower makes it a LLaVA model (llava-hf's layout), a tower that comes in a
  // model of its own (qwen3_vl) that model; the native tower has no Hugging Face counterpart
  // and only the decoder is written.
  const TowerTraits& tower = model_cfg.vision.traits();
  const HfLayout layout = hf_export_layout(model_cfg, o.remote_code);
  const bool composite = is_composite_layout(layout), llava = layout == HfLayout::LlavaHf;
  const bool internvl = layout == HfLayout::InternVl || layout == HfLayout::InternVlOriginal;
  // What is written: the model's config, the vocabulary grown when the tokenizer lacks the
  // token an image's positions hold (below).
  ModelConfig m = model_cfg;
  HfExportOptions out_opts = o;
  HfTokenizerFiles grown_tok;
  int64_t image_token = o.image_token_index;
  if (llava) {
    DHP_CHECK(m.vision.merge == 1, "export: a LLaVA checkpoint feeds every patch to the projector; this "
              "model merges {0}x{0} patches (model.vision.merge = {0}), which transformers' LLaVA cannot run",
              m.vision.merge);
    if (image_token < 0 && o.tokenizer) image_token = o.tokenizer->image_pad;
    if (image_token < 0 && o.tokenizer)
      for (const auto& [text, id] : o.tokenizer->added)
        if (text == "<image>") image_token = id;
    if (image_token < 0 && o.tokenizer) {
      // transformers' LLaVA finds an image's positions by a token, which a tokenizer that never
      // held one (Vicuna's, an original LLaVA's: LLaVA splices the image in by position) lacks:
      // <image>, and <pad> when there is no pad, go after its vocabulary as llava-hf's
      // conversion adds them, and the embedding and output rows grow to a multiple of 64 at
      // the mean row. Their logits join the softmax, so the folder's loss on text is not
      // exactly the run's; the image's rows are never read.
      grown_tok = *o.tokenizer;
      int32_t next = std::max(grown_tok.vocab, int32_t(0));
      image_token = next;
      grown_tok.added.push_back({"<image>", next++});
      const bool add_pad = grown_tok.pad.id < 0;
      if (add_pad) {
        grown_tok.pad = {"<pad>", next};
        grown_tok.added.push_back({"<pad>", next++});
      }
      m.vocab_size = std::max(m.vocab_size, (next + 63) / 64 * 64);
      out_opts.tokenizer = &grown_tok;
      spdlog::info("export: the tokenizer has no token for an image's positions; <image> = {}{} added after its "
                   "{} ids, {}", image_token, add_pad ? fmt::format(" and <pad> = {}", next - 1) : "",
                   o.tokenizer->vocab,
                   m.vocab_size > model_cfg.vocab_size
                       ? fmt::format("and the vocabulary grown from {} to {} rows (mean rows), as llava-hf's "
                                     "conversion does", model_cfg.vocab_size, m.vocab_size)
                       : fmt::format("within the model's {} rows", m.vocab_size));
    }
    DHP_CHECK(image_token >= 0 && image_token < m.vocab_size,
              "export: a LLaVA checkpoint names the token an image's positions hold (image_token_index: "
              "<image>, or the family's own such as <|image_pad|>), and the run's tokenizer has none in "
              "the model's vocabulary of {} (pass --data.tokenizer=PATH so that the export can add <image>)",
              m.vocab_size);
  }
  if (composite) {
    if (image_token < 0 && o.tokenizer) image_token = o.tokenizer->image_pad;
    DHP_CHECK(image_token >= 0 && image_token < m.vocab_size,
              "export: a {} checkpoint names the token an image's positions hold (image_token_id, Qwen's "
              "<|image_pad|>, InternVL's <IMG_CONTEXT>), and the run's tokenizer has none in the model's "
              "vocabulary of {}", tower.hf_model_class, m.vocab_size);
  }
  const HfTokenizerFiles* tk = out_opts.tokenizer;
  // The tokenizer's files are made (and their ids checked) before anything is written.
  std::vector<std::pair<std::string, std::string>> tok_files;
  if (tk && !tk->copied.empty()) {
    for (const std::string& path : tk->copied)
      tok_files.emplace_back(fs::path(path).filename().string(),
                             InputFile("tokenizer file", path).read_all(int64_t(64) << 20, "64 MiB"));
    // Tokens the run added after the file's own ids, which the file cannot hold.
    if (!tk->added.empty()) {
      json added = json::object();
      for (const auto& [text, id] : tk->added) {
        DHP_CHECK(id >= 0 && id < m.vocab_size, "export: added token '{}' has id {}, outside the model's "
                  "vocabulary of {}", printable(text), id, m.vocab_size);
        added[text] = id;
      }
      tok_files.emplace_back("added_tokens.json", added.dump(2) + "\n");
    }
  } else if (tk) {
    tok_files = tokenizer_files(*tk, m.vocab_size);
    tok_files.emplace_back("tokenizer.model", InputFile("tokenizer model", tk->sentencepiece_model)
                                                  .read_all(int64_t(256) << 20, "256 MiB"));
  }
  // config.json before any file is written: it refuses a model no Hugging Face class holds.
  const json config = internvl  ? internvl_config(m, out_opts, image_token, layout == HfLayout::InternVlOriginal)
                      : composite ? composite_config(m, out_opts, image_token)
                      : llava   ? llava_config(m, out_opts, image_token)
                                : model_config(m, out_opts);
  // Tensors in the name map's order, cut into shards of at most max_shard_bytes (a tensor
  // larger than that is a shard of its own).
  const std::vector<HfBinding> map = hf_name_map(m, layout);
  const int width = safetensors_dtype_width(o.dtype);
  std::vector<std::vector<const HfBinding*>> shards(1);
  int64_t in_shard = 0, total = 0;
  // Rows of a vocabulary tensor beyond the model's are the mean row (the grown vocabulary).
  auto exported_numel = [&](const HfBinding& b) {
    const ParamSpec& s = table.get(b.dhp);
    if (b.transform == HfTransform::VocabRows) return s.numel() / model_cfg.vocab_size * m.vocab_size;
    int64_t n = 0;
    for (const std::string& name : binding_tensors(b)) n += table.get(name).numel();
    return n;
  };
  for (const auto& b : map) {
    const int64_t bytes = exported_numel(b) * width;
    if (!shards.back().empty() && in_shard + bytes > o.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(&b);
    in_shard += bytes;
    total += bytes;
  }
  const size_t n = shards.size();
  auto shard_name = [&](size_t i) {
    return n == 1 ? std::string("model.safetensors") : fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, n);
  };
  std::vector<std::string> files = {"config.json", "generation_config.json"};
  if (llava) files.insert(files.end(), {"preprocessor_config.json", "processor_config.json"});
  // The remote code has no image processor's file (build_transform is code).
  if (composite && layout != HfLayout::InternVlOriginal) files.push_back("preprocessor_config.json");
  for (size_t i = 0; i < n; ++i) files.push_back(shard_name(i));
  if (n > 1) files.push_back("model.safetensors.index.json");
  for (const auto& f : tok_files) files.push_back(f.first);
  const std::set<std::string> before = earlier_files(o.dir);
  // Tokenizer files of an earlier export that this one cannot write would be left beside
  // weights they may not belong to, or deleted with nothing in their place: refused, unless
  // --force, which keeps them.
  std::vector<std::string> orphans;
  for (const char* f : kTokenizerFiles)
    if (!o.tokenizer && before.count(f) && fs::exists(fs::path(o.dir) / f, ec)) orphans.push_back(f);
  DHP_CHECK(orphans.empty() || o.force,
            "export: the earlier export in '{}' has tokenizer files ({}) and this one has none (the "
            "run's tokenizer is not found from here): pass --data.tokenizer=PATH to export it, or "
            "--force to keep the earlier tokenizer files beside the new weights",
            o.dir, fmt::join(orphans, ", "));
  for (const auto& f : orphans) files.push_back(f);
  // Weight files this export supersedes go before any is written: an index and shards of
  // another count, a single file replaced by shards (or the reverse), whoever wrote them
  // (--force let foreign ones through). Left in place, a loader would read a mixture: dhp's
  // import and transformers prefer different files when both kinds are present.
  for (const auto& e : fs::directory_iterator(o.dir, ec)) {
    const std::string name = e.path().filename().string();
    const bool weights = name == "model.safetensors" || name == "model.safetensors.index.json" ||
                         is_shard_name(name);
    if (weights && !std::count(files.begin(), files.end(), name)) fs::remove(e.path(), ec);
  }
  // The list first, with what an earlier export left, so that a crash half way leaves every
  // file dhp wrote recognisable as its own.
  auto write_manifest = [&](const std::set<std::string>& names) {
    write_file_atomic((fs::path(o.dir) / kManifest).string(),
                      json{{"producer", kProducer}, {"files", names}}.dump(2) + "\n");
  };
  std::set<std::string> listed(files.begin(), files.end());
  listed.insert(before.begin(), before.end());
  write_manifest(listed);

  ByteProgress progress(fmt::format("exporting to {}", o.dir), total);
  json weight_map = json::object();
  for (size_t i = 0; i < n; ++i) {
    std::vector<SafetensorsOut> out;
    for (const HfBinding* b : shards[i]) {
      const ParamSpec& s = table.get(b->dhp);
      std::vector<int64_t> shape = hf_file_shape(*b, table, model_cfg);
      const bool conv = b->transform == HfTransform::ConvPatch;
      const int64_t numel = exported_numel(*b);
      if (b->transform == HfTransform::VocabRows) shape[0] = m.vocab_size;
      out.push_back({b->hf, o.dtype, shape, [&, b, s, conv, numel](char* dst) {
                       // The binding's tensors one after another (a fused qkv's three).
                       std::vector<float> host;
                       for (const std::string& name : binding_tensors(*b)) {
                         const ParamSpec& part = table.get(name);
                         const size_t at = host.size();
                         host.resize(at + size_t(part.numel()));
                         weights(part, host.data() + at);
                       }
                       if (numel > int64_t(host.size())) {
                         const int64_t cols = s.shape[1], rows = s.shape[0];
                         std::vector<double> mean(size_t(cols), 0.0);
                         for (int64_t r = 0; r < rows; ++r)
                           for (int64_t c = 0; c < cols; ++c) mean[size_t(c)] += host[size_t(r * cols + c)];
                         host.resize(size_t(numel));
                         for (int64_t r = rows; r < numel / cols; ++r)
                           for (int64_t c = 0; c < cols; ++c) host[size_t(r * cols + c)] = float(mean[size_t(c)] / double(rows));
                       }
                       if (conv) {
                         std::vector<float> kernel(host.size());
                         hf_permute_patch(kernel.data(), host.data(), s.shape[0], m.vision.patch,
                                          m.vision.traits().temporal_patch, true);
                         host.swap(kernel);
                       }
                       narrow_from_f32(dst, host.data(), o.dtype, numel);
                     }});
      weight_map[b->hf] = shard_name(i);
    }
    write_safetensors((fs::path(o.dir) / shard_name(i)).string(), out, {{"format", "pt"}, {"producer", kProducer}},
                      &progress);
  }
  if (n > 1)
    write_file_atomic((fs::path(o.dir) / "model.safetensors.index.json").string(),
                      json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2) + "\n");
  write_file_atomic((fs::path(o.dir) / "config.json").string(), config.dump(2) + "\n");
  if (llava || (composite && layout != HfLayout::InternVlOriginal))
    write_file_atomic((fs::path(o.dir) / "preprocessor_config.json").string(),
                      preprocessor_config(m.vision, layout).dump(2) + "\n");
  if (llava) {
    write_file_atomic((fs::path(o.dir) / "processor_config.json").string(),
                      processor_config(m.vision).dump(2) + "\n");
  }
  json gen = {{"_from_model_config", true}};
  if (tk) {
    if (tk->bos.id >= 0) gen["bos_token_id"] = tk->bos.id;
    if (tk->eos.id >= 0) gen["eos_token_id"] = tk->eos.id;
    if (tk->pad.id >= 0) gen["pad_token_id"] = tk->pad.id;
  }
  write_file_atomic((fs::path(o.dir) / "generation_config.json").string(), gen.dump(2) + "\n");
  for (const auto& [name, text] : tok_files) write_file_atomic((fs::path(o.dir) / name).string(), text);
  // Files of an earlier export that this one neither wrote nor kept (a preprocessor config of a
  // LLaVA export under a decoder's) would mislead a loader: they go, and the list is exact.
  for (const auto& f : before)
    if (!std::count(files.begin(), files.end(), f) && f.find('/') == std::string::npos)
      fs::remove(fs::path(o.dir) / f, ec);
  write_manifest(std::set<std::string>(files.begin(), files.end()));
  // Removed while still held: an export arriving now finds no lock file and makes its own.
  fs::remove(lock_path, ec);
}

}  // namespace dhp
