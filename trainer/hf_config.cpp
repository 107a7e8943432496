// config.json and preprocessor_config.json of Hugging Face folders (trainer/hf_checkpoint.h):
// read_hf_config, read_hf_tower_config, apply_hf_init.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <tuple>

#include "core/check.h"
#include "core/files.h"
#include "core/input.h"
#include "core/log.h"
#include "core/json_input.h"
#include "core/text.h"
#include "data/tokenizer.h"
#include "trainer/checkpoint.h"
#include "trainer/checkpoint_file.h"
#include "trainer/hf_checkpoint.h"

namespace dhp {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const char* const kLlavas[] = {"LlavaForConditionalGeneration", "LlavaLlamaForCausalLM"};

// The rows of types/architecture.h by their Hugging Face names (nullptr: none).
const DecoderTraits* decoder_of_class(std::string_view a) {
  for (const DecoderTraits& t : kDecoderTraits)
    if (t.hf_class == a) return &t;
  return nullptr;
}
const DecoderTraits* decoder_of_type(std::string_view type) {
  for (const DecoderTraits& t : kDecoderTraits)
    if (t.model_type == type) return &t;
  return nullptr;
}
// A tower a folder holds alone (model.vision.init): not one that comes only inside its
// vision-language model.
const TowerTraits* tower_of_class(std::string_view a) {
  for (const TowerTraits& t : kTowerTraits)
    if (t.has_hf() && t.hf_model_class.empty() && (t.hf_tower_class == a || t.hf_dual_class == a)) return &t;
  return nullptr;
}
// The tower whose vision-language model class `a` is (Qwen3VLForConditionalGeneration), in
// transformers' layout or its authors' remote code (InternVLChatModel).
const TowerTraits* tower_of_model_class(std::string_view a) {
  for (const TowerTraits& t : kTowerTraits)
    if (!t.hf_model_class.empty() && (t.hf_model_class == a || t.hf_remote_class == a)) return &t;
  return nullptr;
}
const TowerTraits* tower_of_type(std::string_view type) {
  for (const TowerTraits& t : kTowerTraits)
    if (t.has_hf() && t.hf_model_type == type) return &t;
  return nullptr;
}
std::vector<std::string> decoder_names(std::string_view DecoderTraits::*field) {
  std::vector<std::string> out;
  for (const DecoderTraits& t : kDecoderTraits) out.emplace_back(t.*field);
  return out;
}
std::vector<std::string> tower_names(std::string_view TowerTraits::*field) {
  std::vector<std::string> out;
  for (const TowerTraits& t : kTowerTraits)
    if (t.has_hf()) out.emplace_back(t.*field);
  return out;
}
std::vector<std::string> tower_classes() {
  std::vector<std::string> out;
  for (const TowerTraits& t : kTowerTraits)
    if (t.has_hf() && t.hf_model_class.empty())
      out.insert(out.end(), {std::string(t.hf_tower_class), std::string(t.hf_dual_class)});
  return out;
}
std::vector<std::string> vision_language_classes() {
  std::vector<std::string> out(std::begin(kLlavas), std::end(kLlavas));
  for (const TowerTraits& t : kTowerTraits) {
    if (!t.hf_model_class.empty()) out.emplace_back(t.hf_model_class);
    if (!t.hf_remote_class.empty()) out.emplace_back(t.hf_remote_class);
  }
  return out;
}

json read_json_file(const std::string& path, const char* what) {
  const InputFile in(what, path);
  json j = parse_json_input(in.read_all(int64_t(16) << 20, "16 MiB"), "'" + path + "'");
  DHP_CHECK(!j.is_discarded() && j.is_object(), "'{}' is not a JSON object", path);
  return j;
}

// Defaults of the transformers config classes a nested config may leave out: save_pretrained
// writes only the keys that differ from the class's defaults (llava-hf's text_config holds
// little more than its vocab_size). Each row of types/architecture.h holds its class's.
json class_defaults(const std::string& model_type) {
  std::string_view text;
  if (const DecoderTraits* d = decoder_of_type(model_type)) text = d->hf_defaults;
  if (const TowerTraits* t = tower_of_type(model_type)) text = t->hf_defaults;
  return text.empty() ? json::object() : json::parse(text);
}

// A config object read with every value's type checked, errors naming the key and where it is
// ("'DIR/config.json'" or "'DIR/config.json' text_config").
class ConfigJson {
 public:
  ConfigJson(json j, std::string where) : j_(std::move(j)), where_(std::move(where)) {}
  // A nested config (text_config, vision_config) over its class's defaults.
  ConfigJson nested(const char* key, const std::string& default_type) const {
    json sub = has(key) ? j_[key] : json::object();
    DHP_CHECK(sub.is_object(), "{}: \"{}\" is not an object", where_, key);
    const std::string type = sub.contains("model_type") && sub["model_type"].is_string()
                                 ? sub["model_type"].get<std::string>() : default_type;
    json full = class_defaults(type);
    full.update(sub);
    full["model_type"] = type;
    return ConfigJson(full, where_ + " " + key);
  }
  const std::string& where() const { return where_; }
  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  int64_t integer(const char* key, int64_t lo, int64_t hi) const {
    DHP_CHECK(has(key), "{} has no \"{}\"", where_, key);
    DHP_CHECK(j_[key].is_number_integer(), "{}: \"{}\" is not an integer", where_, key);
    // Read as int64 an unsigned value past 2^63 would wrap to a negative one.
    DHP_CHECK(!j_[key].is_number_unsigned() || j_[key].get<uint64_t>() <= uint64_t(hi),
              "{}: \"{}\" = {} is out of range [{}, {}]", where_, key, j_[key].get<uint64_t>(), lo, hi);
    const int64_t v = j_[key].get<int64_t>();
    DHP_CHECK(v >= lo && v <= hi, "{}: \"{}\" = {} is out of range [{}, {}]", where_, key, v, lo, hi);
    return v;
  }
  int64_t integer(const char* key, int64_t lo, int64_t hi, int64_t fallback) const {
    return has(key) ? integer(key, lo, hi) : fallback;
  }
  double number(const char* key, double lo, double hi) const {
    DHP_CHECK(has(key), "{} has no \"{}\"", where_, key);
    DHP_CHECK(j_[key].is_number(), "{}: \"{}\" is not a number", where_, key);
    const double v = j_[key].get<double>();
    DHP_CHECK(v >= lo && v <= hi, "{}: \"{}\" = {} is out of range [{}, {}]", where_, key, v, lo, hi);
    return v;
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    DHP_CHECK(j_[key].is_boolean(), "{}: \"{}\" is not true or false", where_, key);
    return j_[key].get<bool>();
  }
  std::string string(const char* key, const std::string& fallback = "") const {
    if (!has(key)) return fallback;
    DHP_CHECK(j_[key].is_string(), "{}: \"{}\" is not a string", where_, key);
    return j_[key].get<std::string>();
  }
  const json& raw() const { return j_; }

 private:
  json j_;
  std::string where_;
};

ConfigJson open_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.json").string();
  return ConfigJson(read_json_file(path, "Hugging Face config"), "'" + path + "'");
}

std::string architecture_of(const ConfigJson& c) {
  const json& j = c.raw();
  std::vector<std::string> known;
  for (const DecoderTraits& t : kDecoderTraits)
    if (!t.mrope) known.emplace_back(t.hf_class);  // an M-RoPE family comes inside its VL model
  const std::vector<std::string> vl = vision_language_classes();
  known.insert(known.end(), vl.begin(), vl.end());
  const std::vector<std::string> towers = tower_classes();
  known.insert(known.end(), towers.begin(), towers.end());
  DHP_CHECK(c.has("architectures") && j["architectures"].is_array() && j["architectures"].size() == 1 &&
                j["architectures"][0].is_string(),
            "{}: \"architectures\" must list one model class ({})", c.where(), fmt::join(known, ", "));
  const std::string a = j["architectures"][0].get<std::string>();
  DHP_CHECK(std::find(known.begin(), known.end(), a) != known.end(), "{}: \"architectures\" is {}; dhp reads {}",
            c.where(), printable(a), fmt::join(known, ", "));
  return a;
}

// RoPE's keys into m: rope_theta and rope_scaling (transformers 4), or one rope_parameters
// object holding rope_theta, rope_type and the scaling's keys (transformers 5). The default
// RoPE and Llama-3.x's "llama3" scaling are read; another rope_type (linear, dynamic, yarn,
// longrope, ...) and any key of the block dhp would not apply are refused by name.
// A family whose row says mrope (Qwen3-VL's text model) reads its mrope_section there (its
// class's default when absent); it always interleaves, so "mrope_interleaved": false is refused.
void read_rope(const ConfigJson& c, const DecoderTraits& family, int64_t max_tokens, ModelConfig& m) {
  const std::string& f = c.where();
  m.rope_scaling = RopeScaling::none;
  // Another family keeps the configuration's model.mrope_section (M-RoPE over a text folder).
  if (family.mrope) {
    m.mrope_section = {24, 20, 20};  // Qwen3VLTextRotaryEmbedding's default
    m.mrope_interleaved = true;
  }
  m.rope_theta = c.has("rope_theta") ? c.number("rope_theta", 1, 1e12) : 10000.0;
  const bool v5 = c.has("rope_parameters");
  DHP_CHECK(!v5 || !c.has("rope_scaling"), "{}: both \"rope_parameters\" and \"rope_scaling\" are set; "
            "dhp reads one description of RoPE (transformers 5's rope_parameters, or rope_theta with "
            "rope_scaling)", f);
  const char* key = v5 ? "rope_parameters" : "rope_scaling";
  if (!c.has(key)) return;
  DHP_CHECK(c.raw()[key].is_object(), "{}: \"{}\" is not an object ({})", f, key, json_excerpt(c.raw()[key]));
  const ConfigJson b(c.raw()[key], fmt::format("{} \"{}\"", f, key));
  if (v5 && b.has("rope_theta")) m.rope_theta = b.number("rope_theta", 1, 1e12);
  const std::string type = b.has("rope_type") ? b.string("rope_type") : b.string("type", "default");
  DHP_CHECK(type == "default" || type == "llama3" || type == "dynamic",
            "{}: \"{}\" has rope_type {} ({}); dhp implements the default RoPE, Llama-3's \"llama3\" "
            "scaling and \"dynamic\" within max_position_embeddings only", f, key, printable(type, 120),
            json_excerpt(c.raw()[key]));
  const bool llama3 = type == "llama3";
  if (type == "dynamic") {
    // transformers' dynamic NTK: the default frequencies up to max_position_embeddings, which
    // the run's sequences must stay within (the configuration check holds it to that).
    const int64_t positions = c.integer("max_position_embeddings", 1, int64_t(1) << 40, 0);
    DHP_CHECK(positions > 0 && max_tokens <= positions,
              "{}: \"{}\" has rope_type dynamic, which rescales RoPE beyond max_position_embeddings ({}) as dhp "
              "does not; data.max_tokens = {} reaches past it (lower it to {})", f, key, positions, max_tokens,
              positions);
    m.rope_scaling = RopeScaling::dynamic;
    m.rope_factor = b.number("factor", 1, 1e6);
  }
  for (const auto& [k, v] : b.raw().items()) {
    const bool known = k == "rope_type" || k == "type" || (v5 && k == "rope_theta") ||
                       (type == "dynamic" && k == "factor") ||
                       (family.mrope && (k == "mrope_section" || k == "mrope_interleaved")) ||
                       (llama3 && (k == "factor" || k == "low_freq_factor" || k == "high_freq_factor" ||
                                   k == "original_max_position_embeddings"));
    DHP_CHECK(known || v.is_null(), "{}: \"{}\" holds \"{}\" ({}), which dhp does not implement with "
              "rope_type {}", f, key, printable(k, 120), json_excerpt(v), printable(type, 120));
  }
  if (family.mrope && b.has("mrope_section")) {
    const json& a = b.raw()["mrope_section"];
    DHP_CHECK(a.is_array() && a.size() == 3 && std::all_of(a.begin(), a.end(), [](const json& x) {
                return x.is_number_integer() && x.get<int64_t>() >= 0 && x.get<int64_t>() < 4096;
              }),
              "{}: \"mrope_section\" must be three counts (temporal, height, width), got {}", b.where(),
              json_excerpt(a));
    for (size_t i = 0; i < 3; ++i) m.mrope_section[i] = a[i].get<int>();
  }
  DHP_CHECK(!family.mrope || b.boolean("mrope_interleaved", true),
            "{}: \"mrope_interleaved\" is false, but {} always interleaves M-RoPE's axes (transformers ignores "
            "the key); dhp will not guess which the checkpoint was trained with", b.where(), family.hf_class);
  if (!llama3) return;
  m.rope_scaling = RopeScaling::llama3;
  m.rope_factor = b.number("factor", 1, 1e6);
  m.rope_low_freq_factor = b.number("low_freq_factor", 1e-6, 1e6);
  m.rope_high_freq_factor = b.number("high_freq_factor", 1e-6, 1e6);
  m.rope_original_max_pos = b.integer("original_max_position_embeddings", 1, int64_t(1) << 40);
  DHP_CHECK(m.rope_high_freq_factor > m.rope_low_freq_factor,
            "{}: \"high_freq_factor\" ({}) must be above \"low_freq_factor\" ({})", b.where(),
            m.rope_high_freq_factor, m.rope_low_freq_factor);
}

// The decoder's keys of a Llama-family config (top level, or LLaVA's text_config) over `base`,
// read as its family's row says.
ModelConfig read_decoder(const ConfigJson& c, const DecoderTraits& family, const ModelConfig& base,
                         int64_t max_tokens, int vocab_size, int* file_vocab) {
  const std::string& f = c.where();
  // Refused by name: each changes the computation in a way dhp does not implement.
  DHP_CHECK(!c.has("quantization_config"), "{}: \"quantization_config\" is set; dhp reads unquantised "
            "F32, F16 and BF16 weights only", f);
  const std::string act = c.string("hidden_act", "silu");
  DHP_CHECK(act == "silu", "{}: \"hidden_act\" is {}; dhp's MLP is SwiGLU with silu", f, printable(act));
  DHP_CHECK(!c.boolean("mlp_bias", false), "{}: \"mlp_bias\" is true; dhp's MLP has no biases", f);
  const bool bias_key = c.boolean("attention_bias", false);
  DHP_CHECK(family.bias != DecoderBias::none || !bias_key, "{}: \"attention_bias\" is true in a {} config, "
            "whose attention has no biases", f, family.hf_class);
  const bool qkv_bias = family.bias == DecoderBias::qkv_always || (family.bias == DecoderBias::qkvo_optional && bias_key);
  const bool out_bias = family.bias == DecoderBias::qkvo_optional && bias_key;
  // Windows of some layers (max_window_layers, layer_types): refused whatever their length.
  if (family.window == DecoderWindow::per_layer) {
    DHP_CHECK(!c.boolean("use_sliding_window", false), "{}: \"use_sliding_window\" is true; dhp implements "
              "full causal attention only", f);
    if (c.has("layer_types")) {
      const json& types = c.raw()["layer_types"];
      DHP_CHECK(types.is_array() && std::all_of(types.begin(), types.end(), [](const json& t) {
                  return t.is_string() && t.get<std::string>() == "full_attention";
                }),
                "{}: \"layer_types\" is {}; dhp implements \"full_attention\" layers only", f,
                json_excerpt(types));
    }
  }
  // A sliding window at least as long as every sequence is the same as full attention.
  const bool window_on = family.window == DecoderWindow::use_sliding_window ? c.boolean("use_sliding_window", false)
                         : family.window == DecoderWindow::sliding_window && c.has("sliding_window");
  if (window_on && max_tokens > 0) {
    const int64_t w = c.integer("sliding_window", 1, int64_t(1) << 40);
    DHP_CHECK(w >= max_tokens,
              "{}: \"sliding_window\" = {} is below the run's longest sequence (data.max_tokens = {}); "
              "dhp implements full causal attention only (lower data.max_tokens to at most {})",
              f, w, max_tokens, w);
  }
  ModelConfig m = base;
  m.dim = int(c.integer("hidden_size", 1, 1 << 16));
  m.ffn = int(c.integer("intermediate_size", 1, 1 << 20));
  m.layers = int(c.integer("num_hidden_layers", 1, 1024));
  m.heads = int(c.integer("num_attention_heads", 1, 1024));
  m.kv_heads = int(c.integer("num_key_value_heads", 1, 1024, m.heads));
  // Qwen3Attention reads head_dim, whose default (Qwen3Config's) is 128, not hidden / heads.
  m.head_dim = int(c.integer("head_dim", 2, 4096, family.default_head_dim));
  m.rms_norm_eps = c.has("rms_norm_eps") ? c.number("rms_norm_eps", 1e-12, 0.1) : 1e-6;
  read_rope(c, family, max_tokens, m);
  m.tie_embeddings = c.boolean("tie_word_embeddings", false);
  m.max_positions = c.integer("max_position_embeddings", 1, int64_t(1) << 40, 0);
  m.attention_bias = qkv_bias;
  m.attention_out_bias = out_bias;
  m.qk_norm = family.qk_norm;
  *file_vocab = int(c.integer("vocab_size", 8, 1 << 24));
  DHP_CHECK(m.head_dim > 0 || m.dim % m.heads == 0,
            "{}: \"hidden_size\" ({}) is not divisible by \"num_attention_heads\" ({}) and there is no \"head_dim\"",
            f, m.dim, m.heads);
  DHP_CHECK(m.heads % m.kv_heads == 0, "{}: \"num_attention_heads\" ({}) is not a multiple of \"num_key_value_heads\" ({})",
            f, m.heads, m.kv_heads);
  DHP_CHECK(m.hd() % 2 == 0, "{}: the head dimension ({}, \"head_dim\") must be even for RoPE", f, m.hd());
  DHP_CHECK(vocab_size == 0 || vocab_size >= *file_vocab,
            "{}: the model's vocabulary ({} tokens) is smaller than the checkpoint's \"vocab_size\" ({}); "
            "a vocabulary may grow (added tokens), never shrink", f, vocab_size, *file_vocab);
  m.vocab_size = vocab_size > 0 ? vocab_size : *file_vocab;
  return m;
}

VisionAct vision_act(const ConfigJson& c, const char* key) {
  const std::string a = c.string(key);
  if (a == "quick_gelu") return VisionAct::quick_gelu;
  if (a == "gelu") return VisionAct::gelu;
  if (a == "gelu_pytorch_tanh" || a == "gelu_new") return VisionAct::gelu_tanh;
  throw Error(fmt::format("{}: \"{}\" is {}; dhp implements quick_gelu, gelu (erf) and gelu_pytorch_tanh / "
                          "gelu_new (tanh)", c.where(), key, printable(a)));
}

// The tower's keys of a CLIPVisionConfig / SiglipVisionConfig object over `base`.
VisionConfig read_tower(const ConfigJson& c, const VisionConfig& base) {
  const std::string type = c.string("model_type");
  const TowerTraits* tower = tower_of_type(type);
  DHP_CHECK(tower, "{}: \"model_type\" is {}; dhp's towers are {}", c.where(), printable(type),
            fmt::join(tower_names(&TowerTraits::hf_model_type), ", "));
  VisionConfig v = base;
  v.arch = tower->arch;
  v.dim = int(c.integer("hidden_size", 1, 1 << 16));
  v.ffn = int(c.integer("intermediate_size", 1, 1 << 20));
  v.layers = int(c.integer("num_hidden_layers", 1, 1024));
  v.heads = int(c.integer("num_attention_heads", 1, 1024));
  v.patch = int(c.integer("patch_size", 1, 1024));
  v.image_size = int(c.integer("image_size", 1, 1 << 16));
  v.norm_eps = c.number("layer_norm_eps", 1e-12, 0.1);
  v.act = vision_act(c, "hidden_act");
  DHP_CHECK(c.integer("num_channels", 1, 16, 3) == 3, "{}: \"num_channels\" must be 3 (RGB)", c.where());
  DHP_CHECK(v.dim % v.heads == 0, "{}: \"hidden_size\" ({}) is not divisible by \"num_attention_heads\" ({})",
            c.where(), v.dim, v.heads);
  DHP_CHECK(v.image_size % v.patch == 0, "{}: \"image_size\" ({}) is not a multiple of \"patch_size\" ({})",
            c.where(), v.image_size, v.patch);
  return v;
}

// Qwen3VLVisionConfig's keys over `base` (the tower of row `tower`): the blocks' shape (depth,
// num_heads), the patch (patch_size, temporal_patch_size, which must be the row's), the merge
// (spatial_merge_size), the learned position grid (num_position_embeddings, a square: image_size
// is its side in pixels), DeepStack's layers; out_hidden_size must be the decoder's width `d`.
VisionConfig read_qwen3_vl_tower(const ConfigJson& c, const TowerTraits& tower, const VisionConfig& base, int d) {
  const std::string& f = c.where();
  VisionConfig v = base;
  v.arch = tower.arch;
  v.dim = int(c.integer("hidden_size", 1, 1 << 16));
  v.ffn = int(c.integer("intermediate_size", 1, 1 << 20));
  v.layers = int(c.integer("depth", 1, 1024));
  v.heads = int(c.integer("num_heads", 1, 1024));
  v.patch = int(c.integer("patch_size", 1, 1024));
  v.merge = int(c.integer("spatial_merge_size", 1, 2));
  v.act = vision_act(c, "hidden_act");
  DHP_CHECK(c.integer("in_channels", 1, 16, 3) == 3, "{}: \"in_channels\" must be 3 (RGB)", f);
  const int64_t frames = c.integer("temporal_patch_size", 1, 16);
  DHP_CHECK(frames == tower.temporal_patch, "{}: \"temporal_patch_size\" is {}; dhp's {} tower embeds patches of {} "
            "frames", f, frames, tower.name, tower.temporal_patch);
  const int64_t out = c.integer("out_hidden_size", 1, 1 << 16);
  DHP_CHECK(out == d, "{}: \"out_hidden_size\" ({}) is not the text model's hidden_size ({})", f, out, d);
  const int64_t positions = c.integer("num_position_embeddings", 1, int64_t(1) << 24);
  const int64_t side = std::llround(std::sqrt(double(positions)));
  DHP_CHECK(side * side == positions, "{}: \"num_position_embeddings\" ({}) is not a square grid", f, positions);
  v.image_size = int(side) * v.patch;
  v.deepstack.clear();
  if (c.has("deepstack_visual_indexes")) {
    const json& a = c.raw()["deepstack_visual_indexes"];
    DHP_CHECK(a.is_array() && std::all_of(a.begin(), a.end(), [](const json& x) { return x.is_number_integer(); }),
              "{}: \"deepstack_visual_indexes\" must list layer indexes, got {}", f, json_excerpt(a));
    for (const json& x : a) {
      const int64_t i = x.get<int64_t>();
      DHP_CHECK(i >= 0 && i < v.layers && (v.deepstack.empty() || i > v.deepstack.back()),
                "{}: \"deepstack_visual_indexes\" {} must name increasing layers of the {}-layer tower", f,
                json_excerpt(a), v.layers);
      v.deepstack.push_back(int(i));
    }
  }
  DHP_CHECK(v.dim % v.heads == 0 && v.head_dim() % 4 == 0, "{}: \"hidden_size\" ({}) over \"num_heads\" ({}) must "
            "give a head dimension that is a multiple of 4 (2-D RoPE by halves)", f, v.dim, v.heads);
  return v;
}

// A square side given as one integer or as [height, width] (InternVLVisionConfig's image_size
// and patch_size).
int square_key(const ConfigJson& c, const char* key, int64_t hi) {
  const json& v = c.raw().contains(key) ? c.raw()[key] : json();
  if (v.is_array()) {
    DHP_CHECK(v.size() == 2 && v[0].is_number_integer() && v[1].is_number_integer() && v[0] == v[1] &&
                  v[0].get<int64_t>() >= 1 && v[0].get<int64_t>() <= hi,
              "{}: \"{}\" is {}; dhp's InternViT takes square tiles and patches ([S, S], S in [1, {}])", c.where(),
              key, json_excerpt(v), hi);
    return int(v[0].get<int64_t>());
  }
  return int(c.integer(key, 1, hi));
}

// InternViT's keys over `base`: InternVLVisionConfig (transformers) or the remote code's
// InternVisionConfig (`remote_code`). Its blocks choose the row among those of `tower`'s names:
// InternViT-300M's (InternVL3-1B to 14B: LayerNorm, q/k/v biases, no q/k norm) or InternViT-6B's
// (38B, 78B: RMSNorm, no q/k/v biases, q/k norms); another combination is refused by name.
VisionConfig read_intern_vit(const ConfigJson& c, const TowerTraits& tower, const VisionConfig& base,
                             bool remote_code) {
  const std::string& f = c.where();
  VisionConfig v = base;
  const std::string norm = c.string("norm_type", "rms_norm");
  DHP_CHECK(norm == "layer_norm" || norm == "rms_norm", "{}: \"norm_type\" is {}; InternViT's blocks use "
            "layer_norm or rms_norm", f, printable(norm));
  const char* qk = remote_code ? "qk_normalization" : "use_qk_norm";
  const char* bias = remote_code ? "qkv_bias" : "attention_bias";
  const bool qk_norm = c.boolean(qk, false), qkv_bias = c.boolean(bias, false);
  const NormKind kind = norm == "layer_norm" ? NormKind::layer : NormKind::rms;
  const TowerTraits* row = nullptr;
  for (const TowerTraits& t : kTowerTraits)
    if (!row && t.hf_names == tower.hf_names && t.norm == kind && t.qk_norm == qk_norm && t.qkv_bias == qkv_bias)
      row = &t;
  DHP_CHECK(row, "{}: \"norm_type\" {} with \"{}\" {} and \"{}\" {} is no InternViT dhp runs: InternViT-300M's "
            "blocks (layer_norm, q/k/v biases, no q/k norm) or InternViT-6B's (rms_norm, no q/k/v biases, q/k norms)",
            f, norm, qk, qk_norm, bias, qkv_bias);
  v.arch = row->arch;
  v.dim = int(c.integer("hidden_size", 1, 1 << 16));
  v.ffn = int(c.integer("intermediate_size", 1, 1 << 20));
  v.layers = int(c.integer("num_hidden_layers", 1, 1024));
  v.heads = int(c.integer("num_attention_heads", 1, 1024));
  v.patch = square_key(c, "patch_size", 1024);
  v.image_size = square_key(c, "image_size", 1 << 16);
  v.norm_eps = c.number("layer_norm_eps", 1e-12, 0.1);
  v.act = vision_act(c, "hidden_act");
  v.merge = 2;
  DHP_CHECK(c.integer("num_channels", 1, 16, 3) == 3, "{}: \"num_channels\" must be 3 (RGB)", f);
  if (!remote_code) {
    DHP_CHECK(c.boolean("use_mean_pooling", true), "{}: \"use_mean_pooling\" is false (a final LayerNorm over "
              "the features); dhp's InternViT reads the last layer as it is", f);
    DHP_CHECK(c.boolean("use_absolute_position_embeddings", true), "{}: \"use_absolute_position_embeddings\" is "
              "false; dhp's InternViT adds its learned positions", f);
  }
  DHP_CHECK(v.dim % v.heads == 0, "{}: \"hidden_size\" ({}) is not divisible by \"num_attention_heads\" ({})", f,
            v.dim, v.heads);
  DHP_CHECK(v.image_size % (v.patch * v.merge) == 0, "{}: \"image_size\" ({}) is not a multiple of twice "
            "\"patch_size\" ({}): the pixel shuffle folds 2 x 2 patches", f, v.image_size, v.patch);
  return v;
}

struct Preprocessor {
  bool found = false;
  std::array<double, 3> mean{}, std{};
  // What the processor does to an image's size: CLIP's short side and centre crop, SigLIP's
  // square resize, LlavaImageProcessor's do_pad first; to a square of `size`.
  ImageFit fit = ImageFit::native;
  int size = 0;
  // Qwen2VLImageProcessor: each image at its own size within [min_pixels, max_pixels].
  int64_t min_pixels = 0, max_pixels = 0;
  // GotOcr2ImageProcessor (InternVL): the tiles an image may become (0: the file says nothing).
  int min_patches = 0, max_patches = 0;
  std::string where;  // the file, for messages
};

// A side of the processor's "size" or "crop_size": an integer (older configs), or the object's
// `key` ("shortest_edge", "height", "width"); 0 when absent or not a count up to 2^40 (a pixel
// bound), which the callers then refuse or ignore as they do a missing side.
int64_t processor_side(const json& j, const char* key);

// A square processor's side, within an image side dhp takes (model.vision.image_size's range).
int square_side(int64_t side, const std::string& where) {
  DHP_CHECK(side <= (1 << 16), "{}: an image side of {} px is beyond 65536", where, side);
  return int(side);
}

int64_t processor_side(const json& j, const char* key) {
  const json* v = j.is_number_integer() ? &j : j.is_object() && j.contains(key) ? &j[key] : nullptr;
  if (!v || !v->is_number_integer() || (v->is_number_unsigned() && v->get<uint64_t>() > (uint64_t(1) << 40)))
    return 0;
  const int64_t x = v->get<int64_t>();
  return x > 0 && x <= (int64_t(1) << 40) ? x : 0;
}

// The image processor's constants (CLIPImageProcessor, SiglipImageProcessor,
// LlavaImageProcessor): what the tower was trained to see.
Preprocessor read_preprocessor(const std::string& dir) {
  Preprocessor p;
  const fs::path path = fs::path(dir) / "preprocessor_config.json";
  std::error_code ec;
  if (dir.empty() || !fs::exists(path, ec)) return p;
  const ConfigJson c(read_json_file(path.string(), "image processor config"), "'" + path.string() + "'");
  DHP_CHECK(c.boolean("do_normalize", true), "{}: \"do_normalize\" is false; dhp always normalises "
            "pixels by image_mean and image_std", c.where());
  DHP_CHECK(std::abs(c.has("rescale_factor") ? c.number("rescale_factor", 0, 1) - 1.0 / 255 : 0.0) < 1e-9,
            "{}: \"rescale_factor\" is not 1/255; dhp scales 8-bit pixels by 1/255", c.where());
  for (const auto& [key, out, positive] : {std::tuple{"image_mean", &p.mean, false}, std::tuple{"image_std", &p.std, true}}) {
    const json& a = c.raw().contains(key) ? c.raw()[key] : json();
    DHP_CHECK(a.is_array() && a.size() == 3 && std::all_of(a.begin(), a.end(), [](const json& x) { return x.is_number(); }),
              "{}: \"{}\" must be three numbers (R, G, B)", c.where(), key);
    for (size_t i = 0; i < 3; ++i) {
      (*out)[i] = a[i].get<double>();
      // Pixels are scaled to [0, 1] first: a mean outside it, or a spread no real processor
      // uses (CLIP's and SigLIP's are 0.26-0.5), would give NaN or huge inputs at step 0, and
      // the pad colour 255·mean would overflow.
      const double v = (*out)[i];
      DHP_CHECK(positive ? v > 1e-3 && v <= 10 : v >= 0 && v <= 1, "{}: \"{}\"[{}] = {} is outside {}", c.where(),
                key, i, v, positive ? "(0.001, 10]" : "[0, 1] (pixels are scaled to [0, 1] before it is subtracted)");
    }
  }
  // The resize: transformers' processors, by what they do (their keys), not their class name.
  DHP_CHECK(c.boolean("do_resize", true), "{}: \"do_resize\" is false; dhp resizes every image as the "
            "processor would", c.where());
  const json none;
  const json& size = c.raw().contains("size") ? c.raw()["size"] : none;
  const json& crop = c.raw().contains("crop_size") ? c.raw()["crop_size"] : none;
  const int64_t shortest = processor_side(size, "shortest_edge");
  const int64_t h = processor_side(size, "height"), w = processor_side(size, "width");
  // Qwen2VLImageProcessor's size bounds the pixel count (shortest_edge = min_pixels,
  // longest_edge = max_pixels; older files also say min_pixels / max_pixels).
  const bool bounds = processor_side(size, "longest_edge") > 0 || c.has("max_pixels");
  const bool pad = c.boolean("do_pad", false), center_crop = c.boolean("do_center_crop", shortest > 0 && !bounds);
  if (bounds) {
    p.fit = ImageFit::qwen;
    p.min_pixels = c.has("min_pixels") ? c.integer("min_pixels", 1, int64_t(1) << 40) : shortest;
    p.max_pixels = c.has("max_pixels") ? c.integer("max_pixels", 1, int64_t(1) << 40)
                                       : processor_side(size, "longest_edge");
    DHP_CHECK(p.min_pixels > 0 && p.min_pixels <= p.max_pixels, "{}: the pixel bounds [{}, {}] are not a range "
              "(size.shortest_edge / min_pixels to size.longest_edge / max_pixels)", c.where(), p.min_pixels,
              p.max_pixels);
  } else if (center_crop || pad) {
    const int64_t ch = processor_side(crop, "height"), cw = processor_side(crop, "width");
    DHP_CHECK(shortest > 0 && (!center_crop || (ch == shortest && cw == shortest)),
              "{}: the short side goes to {} and the centre crop is {}x{}; dhp's clip resize crops a square "
              "of the short side (size.shortest_edge = crop_size)", c.where(), shortest, cw, ch);
    p.fit = pad ? ImageFit::pad_square : ImageFit::clip;
    p.size = square_side(shortest, c.where());
  } else if (h > 0 || w > 0) {
    DHP_CHECK(h == w, "{}: \"size\" is {}x{}; dhp's siglip resize makes squares", c.where(), w, h);
    p.fit = ImageFit::siglip;
    p.size = square_side(h, c.where());
  }
  if (c.has("min_patches") || c.has("max_patches")) {
    p.min_patches = int(c.integer("min_patches", 1, 64, 1));
    p.max_patches = int(c.integer("max_patches", 1, 64, 12));  // GotOcr2ImageProcessor's default
    DHP_CHECK(p.min_patches <= p.max_patches, "{}: \"min_patches\" ({}) exceeds \"max_patches\" ({})", c.where(),
              p.min_patches, p.max_patches);
  }
  p.found = true;
  p.where = c.where();
  return p;
}

void apply_preprocessor(VisionConfig& v, const Preprocessor& p) {
  if (!p.found) {
    std::tie(v.pixel_mean, v.pixel_std) = default_pixel_norm(v.arch);
    return;
  }
  v.pixel_mean = p.mean;
  v.pixel_std = p.std;
  if (p.fit == ImageFit::native) return;
  if (p.fit == ImageFit::qwen) {
    v.resize = p.fit;
    v.min_pixels = p.min_pixels;
    v.max_pixels = p.max_pixels;
    return;
  }
  // The tower's position grid is image_size / patch: the processor must make images of it.
  DHP_CHECK(p.size == v.image_size, "{}: the image processor resizes images to {} px, but the tower's "
            "config.json says image_size {} (its position grid): dhp needs the two to agree", p.where, p.size,
            v.image_size);
  v.resize = p.fit;
}

// LLaVA's own keys: which hidden state the projector reads and how it is built.
void read_llava_settings(const ConfigJson& c, bool original, ModelConfig& m) {
  VisionConfig& v = m.vision;
  const char* layer_key = original ? "mm_vision_select_layer" : "vision_feature_layer";
  DHP_CHECK(!c.has(layer_key) || c.raw()[layer_key].is_number_integer(),
            "{}: \"{}\" must be one layer's index; dhp's projector reads one hidden state", c.where(), layer_key);
  // The original layout's tower is described elsewhere (model.vision.init): apply_hf_init checks
  // the index against its layers.
  const int64_t n = original ? 1024 : v.layers;
  v.feature_layer = int(c.integer(layer_key, -(n + 1), n, -2));
  v.merge = 1;  // LLaVA-1.5 feeds every patch to the projector (576 tokens at 336x336)
  const TowerTraits& tower = v.traits();
  if (original) {
    const std::string proj = c.string("mm_projector_type", "linear");
    DHP_CHECK(proj == "mlp2x_gelu", "{}: \"mm_projector_type\" is {}; dhp's projector is LLaVA-1.5's "
              "mlp2x_gelu (Linear, GELU, Linear)", c.where(), printable(proj));
    v.projector_act = ProjectorAct::gelu;
    const std::string select = c.string("mm_vision_select_feature", "patch");
    DHP_CHECK(select == "patch", "{}: \"mm_vision_select_feature\" is {}; dhp drops the class row (\"patch\")",
              c.where(), printable(select));
    const std::string merge = c.string("mm_patch_merge_type", "flat");
    DHP_CHECK(merge == "flat", "{}: \"mm_patch_merge_type\" is {}; dhp implements LLaVA-1.5's \"flat\"", c.where(),
              printable(merge));
    DHP_CHECK(!c.boolean("mm_use_im_start_end", false), "{}: \"mm_use_im_start_end\" is true; dhp's LLaVA "
              "template has no image start and end tokens", c.where());
    const std::string aspect = c.string("image_aspect_ratio", "square");
    DHP_CHECK(aspect.rfind("anyres", 0) != 0, "{}: \"image_aspect_ratio\" is {} (LLaVA-NeXT's tiling); dhp "
              "reads LLaVA-1.5", c.where(), printable(aspect));
    if (aspect == "pad") v.resize = ImageFit::pad_square;
    return;
  }
  const std::string strategy = c.string("vision_feature_select_strategy", "default");
  // "default" drops hidden state row 0: a class row, but the first patch of a tower without one.
  DHP_CHECK(strategy == tower.hf_feature_select,
            "{}: \"vision_feature_select_strategy\" is {} with a {} tower; dhp {} (\"{}\")", c.where(),
            printable(strategy), tower.hf_tower_class,
            tower.class_row ? "drops the class row" : "keeps every patch of a tower without a class row",
            tower.hf_feature_select);
  DHP_CHECK(c.boolean("multimodal_projector_bias", true), "{}: \"multimodal_projector_bias\" is false; dhp's "
            "projector has biases", c.where());
  const std::string act = c.string("projector_hidden_act", "gelu");
  v.projector_act = act == "gelu" ? ProjectorAct::gelu
                    : act == "gelu_pytorch_tanh" || act == "gelu_new" ? ProjectorAct::gelu_tanh
                    : act == "quick_gelu" ? ProjectorAct::quick_gelu
                    : throw Error(fmt::format("{}: \"projector_hidden_act\" is {}; dhp implements gelu, "
                                              "gelu_pytorch_tanh and quick_gelu", c.where(), printable(act)));
}

// InternVL (InternVLForConditionalGeneration, or the remote code's InternVLChatModel): the
// decoder of text_config / llm_config, InternViT's vision_config, the pixel shuffle
// (downsample_ratio 0.5: dhp's 2 x 2 merge), the feature layer, the image token.
void read_internvl(const ConfigJson& c, const TowerTraits& tower, const std::string& dir, int64_t max_tokens,
                   int vocab_size, HfConfig& h) {
  const bool remote = h.remote_code;
  const ConfigJson text = c.nested(remote ? "llm_config" : "text_config", "qwen2");
  const std::string type = text.string("model_type");
  const DecoderTraits* family = decoder_of_type(type);
  DHP_CHECK(family && !family->mrope, "{}: \"model_type\" is {}; dhp's InternVL decoders are {}", text.where(),
            printable(type), fmt::join(decoder_names(&DecoderTraits::model_type), ", "));
  h.model = read_decoder(text, *family, h.model, max_tokens, vocab_size, &h.file_vocab);
  // transformers 4.x ties by text_config's key, 5.x by the top level's (default true): a folder
  // whose two keys disagree would load differently in the two.
  if (c.has("tie_word_embeddings") && text.has("tie_word_embeddings"))
    DHP_CHECK(c.boolean("tie_word_embeddings", true) == h.model.tie_embeddings,
              "{}: \"tie_word_embeddings\" is {} here and {} in its {}; transformers' versions read different ones",
              c.where(), c.boolean("tie_word_embeddings", true), h.model.tie_embeddings, remote ? "llm_config" : "text_config");
  const ConfigJson vision = c.nested("vision_config", std::string(tower.hf_model_type));
  const std::string vtype = vision.string("model_type");
  const char* want_type = remote ? "intern_vit_6b" : "internvl_vision";
  DHP_CHECK(vtype == want_type, "{}: \"model_type\" is {}; {} holds an {} tower", vision.where(), printable(vtype),
            h.architecture, want_type);
  h.model.vision = read_intern_vit(vision, tower, h.model.vision, remote);
  const double ratio = c.has("downsample_ratio") ? c.number("downsample_ratio", 0.01, 1.0) : 0.5;
  DHP_CHECK(ratio == 0.5, "{}: \"downsample_ratio\" is {}; dhp's pixel shuffle folds 2 x 2 patches (0.5)",
            c.where(), ratio);
  const char* layer_key = remote ? "select_layer" : "vision_feature_layer";
  DHP_CHECK(!c.has(layer_key) || c.raw()[layer_key].is_number_integer(),
            "{}: \"{}\" must be one layer's index; dhp's projector reads one hidden state", c.where(), layer_key);
  const int n = h.model.vision.layers;
  h.model.vision.feature_layer = int(c.integer(layer_key, -(n + 1), n, -1));
  VisionConfig& v = h.model.vision;
  v.projector_act = ProjectorAct::gelu;
  if (remote) {
    const std::string ps = c.string("ps_version", "v1");
    DHP_CHECK(ps == "v2", "{}: \"ps_version\" is {}; dhp's pixel shuffle is InternVL's v2 order (v1 lists the "
              "merged rows column by column)", c.where(), printable(ps));
    DHP_CHECK(!c.boolean("pad2square", false), "{}: \"pad2square\" is true (images padded to a square before "
              "tiling); dhp tiles each image as it is", c.where());
    const int64_t force = c.integer("force_image_size", 1, 1 << 16, v.image_size);
    DHP_CHECK(force == v.image_size, "{}: \"force_image_size\" ({}) is not the tower's image_size ({}): the tiles "
              "would be resized against the position table", c.where(), force, v.image_size);
    // No preprocessor_config.json: InternVL's build_transform (a square resize, ImageNet's
    // mean and std).
    std::tie(v.pixel_mean, v.pixel_std) = default_pixel_norm(v.arch);
    v.resize = ImageFit::siglip;
    // Its dynamic_preprocess: tiles of image_size unless dynamic_image_size is off (one tile,
    // the image resized to it).
    const bool dynamic = c.boolean("dynamic_image_size", true);
    v.min_tiles = int(c.integer("min_dynamic_patch", 1, 64, 1));
    v.max_tiles = dynamic ? int(c.integer("max_dynamic_patch", 1, 64, 12)) : 0;
    v.thumbnail = c.boolean("use_thumbnail", true);
    DHP_CHECK(!dynamic || v.min_tiles <= v.max_tiles, "{}: \"min_dynamic_patch\" ({}) exceeds \"max_dynamic_patch\" ({})",
              c.where(), v.min_tiles, v.max_tiles);
    // The remote code takes <IMG_CONTEXT>'s id from the tokenizer: added_tokens.json beside it.
    const fs::path added = fs::path(dir) / "added_tokens.json";
    std::error_code ec;
    if (fs::exists(added, ec)) {
      const json a = read_json_file(added.string(), "added tokens");
      if (a.contains("<IMG_CONTEXT>") && a["<IMG_CONTEXT>"].is_number_integer()) {
        const int64_t id = a["<IMG_CONTEXT>"].get<int64_t>();
        DHP_CHECK(id >= 0 && id < (int64_t(1) << 24), "'{}': <IMG_CONTEXT> has id {}, not a token id",
                  added.string(), id);
        h.image_token = int32_t(id);
      }
    }
    return;
  }
  const std::string strategy = c.string("vision_feature_select_strategy", "default");
  DHP_CHECK(strategy == "default", "{}: \"vision_feature_select_strategy\" is {}; InternVL drops the class row "
            "(\"default\")", c.where(), printable(strategy));
  const std::string act = c.string("projector_hidden_act", "gelu");
  DHP_CHECK(act == "gelu", "{}: \"projector_hidden_act\" is {}; InternVL's mlp1 uses erf GELU (\"gelu\")", c.where(),
            printable(act));
  v.resize = ImageFit::siglip;
  const Preprocessor pre = read_preprocessor(dir);
  apply_preprocessor(v, pre);
  // InternVLProcessor asks its image processor for tiles (crop_to_patches) between
  // min_patches and max_patches, with a thumbnail, whatever the file's crop_to_patches says.
  if (pre.found) {
    v.min_tiles = pre.max_patches > 0 ? pre.min_patches : 1;
    v.max_tiles = pre.max_patches > 0 ? pre.max_patches : 12;
    v.thumbnail = true;
  }
  h.image_token = int32_t(c.integer("image_token_id", 0, int64_t(1) << 24, 151667));
  // The tokens a tile gives: InternVLProcessor writes image_seq_length of them.
  const int64_t per_tile = int64_t(v.image_size / v.patch / 2) * (v.image_size / v.patch / 2);
  DHP_CHECK(c.integer("image_seq_length", 1, int64_t(1) << 24, per_tile) == per_tile,
            "{}: \"image_seq_length\" is {}; a tile of {} px in {} px patches folded 2 x 2 gives {} tokens", c.where(),
            c.integer("image_seq_length", 1, int64_t(1) << 24, per_tile), v.image_size, v.patch, per_tile);
}

}  // namespace

HfConfig read_hf_config(const std::string& dir, const ModelConfig& base, int64_t max_tokens, int vocab_size) {
  const ConfigJson c = open_config(dir);
  HfConfig h;
  h.architecture = architecture_of(c);
  h.model = base;
  if (tower_of_class(h.architecture)) {
    h.kind = HfKind::Tower;
    return h;
  }
  if (const DecoderTraits* family = decoder_of_class(h.architecture)) {
    h.model = read_decoder(c, *family, base, max_tokens, vocab_size, &h.file_vocab);
    return h;
  }
  if (const TowerTraits* tower = tower_of_model_class(h.architecture);
      tower && tower->hf_names == HfTowerNames::intern_vit) {
    h.kind = HfKind::Composite;
    h.remote_code = h.architecture == tower->hf_remote_class;
    read_internvl(c, *tower, dir, max_tokens, vocab_size, h);
    return h;
  }
  if (const TowerTraits* tower = tower_of_model_class(h.architecture)) {
    // A vision-language model of the tower's own (Qwen3VLForConditionalGeneration): its
    // text_config's family, its vision_config, its image processor.
    h.kind = HfKind::Composite;
    const ConfigJson text = c.nested("text_config", std::string(tower->hf_model_type) + "_text");
    const DecoderTraits* family = decoder_of_type(text.string("model_type"));
    DHP_CHECK(family && family->mrope, "{}: \"model_type\" is {}; {} holds a {}_text model", text.where(),
              printable(text.string("model_type")), h.architecture, tower->hf_model_type);
    h.model = read_decoder(text, *family, base, max_tokens, vocab_size, &h.file_vocab);
    // Qwen3VLConfig keeps tie_word_embeddings at the top (its text_config's is not read).
    h.model.tie_embeddings = c.boolean("tie_word_embeddings", h.model.tie_embeddings);
    const ConfigJson vision = c.nested("vision_config", std::string(tower->hf_model_type));
    DHP_CHECK(vision.string("model_type") == tower->hf_model_type, "{}: \"model_type\" is {}; {} holds a {} tower",
              vision.where(), printable(vision.string("model_type")), h.architecture, tower->hf_model_type);
    h.model.vision = read_qwen3_vl_tower(vision, *tower, h.model.vision, h.model.dim);
    apply_preprocessor(h.model.vision, read_preprocessor(dir));
    h.image_token = int32_t(c.integer("image_token_id", 0, int64_t(1) << 24, -1));
    h.image_begin = int32_t(c.integer("vision_start_token_id", 0, int64_t(1) << 24, -1));
    return h;
  }
  h.kind = HfKind::Llava;
  h.original_llava = h.architecture == "LlavaLlamaForCausalLM";
  if (h.original_llava) {
    // A Llama config with LLaVA's mm_* keys; the tower is named (mm_vision_tower), not described.
    const DecoderTraits* llama = decoder_of_class("LlamaForCausalLM");  // what LlavaLlamaForCausalLM extends
    DHP_ASSERT(llama);
    h.model = read_decoder(c, *llama, base, max_tokens, vocab_size, &h.file_vocab);
    read_llava_settings(c, true, h.model);
    h.mm_vision_tower = c.string("mm_vision_tower", "");
    h.unfreeze_tower = c.boolean("unfreeze_mm_vision_tower", false);
    return h;
  }
  const ConfigJson text = c.nested("text_config", "llama");
  const std::string type = text.string("model_type");
  const DecoderTraits* family = decoder_of_type(type);
  DHP_CHECK(family, "{}: \"model_type\" is {}; dhp's decoders are {}", text.where(), printable(type),
            fmt::join(decoder_names(&DecoderTraits::model_type), ", "));
  h.model = read_decoder(text, *family, base, max_tokens, vocab_size, &h.file_vocab);
  // LlavaConfig's default tower is CLIP ViT-L/14-336's.
  json tower_defaults = class_defaults("clip_vision_model");
  tower_defaults.update(json{{"model_type", "clip_vision_model"}, {"hidden_size", 1024}, {"intermediate_size", 4096},
                             {"num_hidden_layers", 24}, {"num_attention_heads", 16}, {"patch_size", 14},
                             {"image_size", 336}});
  const ConfigJson vision = c.has("vision_config")
                                ? c.nested("vision_config", "clip_vision_model")
                                : ConfigJson(tower_defaults, c.where() + " (LlavaConfig's default tower)");
  h.model.vision = read_tower(vision, h.model.vision);
  apply_preprocessor(h.model.vision, read_preprocessor(dir));
  read_llava_settings(c, false, h.model);
  return h;
}

VisionConfig read_hf_tower_config(const std::string& dir, const VisionConfig& base) {
  const ConfigJson c = open_config(dir);
  const std::string a = architecture_of(c);
  const TowerTraits* row = tower_of_class(a);
  DHP_CHECK(row, "{}: \"architectures\" is {}; model.vision.init takes a vision tower ({})", c.where(), a,
            fmt::join(tower_classes(), ", "));
  const bool dual = a == row->hf_dual_class;
  const std::string type(row->hf_model_type);
  ConfigJson tower = dual ? c.nested("vision_config", type) : [&] {
    json full = class_defaults(type);
    full.update(c.raw());
    return ConfigJson(full, c.where());
  }();
  VisionConfig v = read_tower(tower, base);
  apply_preprocessor(v, read_preprocessor(dir));
  return v;
}

void apply_hf_init_for_run(Config& cfg, const std::string& resume) {
  const std::string& init = cfg.model.init;
  const std::string& vinit = cfg.model.vision.init;
  const bool gone = (!init.empty() && !is_hf_folder(init)) || (!vinit.empty() && !is_hf_folder(vinit));
  if (!resume.empty() && gone) {
    std::string path;
    try {
      path = resolve_checkpoint(resume, cfg.checkpoint.dir, false);
    } catch (const Error&) {
    }
    if (!path.empty() && !is_hf_folder(path)) {
      const Config saved = checkpoint_config(path, {}, false);
      spdlog::info("model.init '{}' is not here: the model's keys come from the checkpoint resumed, '{}'",
                   init.empty() ? vinit : init, path);
      cfg.model = saved.model;
      validate(cfg, true);
      return;
    }
  }
  apply_hf_init(cfg);
}

bool apply_hf_init_if_here(Config& cfg) {
  const std::string& init = cfg.model.init;
  const std::string& vinit = cfg.model.vision.init;
  if (init.empty() && vinit.empty()) return false;
  for (const std::string* f : {&init, &vinit})
    if (!f->empty() && !is_hf_folder(*f)) {
      spdlog::warn("{} '{}' is not a Hugging Face folder here: the model's shape is the configuration's keys",
                   f == &init ? "model.init" : "model.vision.init", printable(*f));
      return false;
    }
  apply_hf_init(cfg);
  return true;
}

void apply_hf_init(Config& cfg) {
  const std::string init = folder_name(cfg.model.init), vinit = folder_name(cfg.model.vision.init);
  if (init.empty() && vinit.empty()) return;
  DHP_CHECK(init.empty() || is_hf_folder(init),
            "{}: model.init '{}' is not a Hugging Face checkpoint folder (a folder with config.json); "
            "dhp's own exports and checkpoints start a run through --init", cfg.source, printable(init));
  DHP_CHECK(vinit.empty() || is_hf_folder(vinit),
            "{}: model.vision.init '{}' is not a Hugging Face folder (a CLIP or SigLIP checkpoint with "
            "config.json)", cfg.source, printable(vinit));
  ModelConfig m = cfg.model;
  if (!init.empty()) {
    // A run on other data that names no tokenizer takes the folder's own.
    if (cfg.data.tokenizer.empty() && holds_tokenizer(init)) {
      cfg.data.tokenizer = init;
      spdlog::info("data.tokenizer: the tokenizer of model.init '{}'", init);
    }
    HfConfig file = read_hf_config(init, cfg.model, cfg.data.max_tokens);
    DHP_CHECK(file.kind != HfKind::Tower, "{}: model.init '{}' is a vision tower ({}); name it in "
              "model.vision.init, and a language model in model.init", cfg.source, init, file.architecture);
    DHP_CHECK(file.kind != HfKind::Composite || vinit.empty(),
              "{}: model.init '{}' is a {} checkpoint with its own vision tower; model.vision.init '{}' would "
              "replace it (leave model.vision.init empty)", cfg.source, init, file.architecture, vinit);
    DHP_CHECK(file.kind != HfKind::Llava || file.original_llava || vinit.empty(),
              "{}: model.init '{}' is a LLaVA checkpoint with its own vision tower; model.vision.init '{}' "
              "would replace it (leave model.vision.init empty)", cfg.source, init, vinit);
    DHP_CHECK(!file.original_llava || !vinit.empty(),
              "{}: model.init '{}' is an original LLaVA checkpoint (LlavaLlamaForCausalLM), whose config "
              "names its vision tower but not the tower's shape; set model.vision.init to that tower's "
              "folder (e.g. a download of openai/clip-vit-large-patch14-336)", cfg.source, init);
    // Like every decoder key, the vocabulary is the file's, except that the tokenizer's added
    // tokens (LLaVA's <image> and <pad> after Llama's 32000 pieces) need rows: it grows to the
    // tokenizer's size rounded up to a multiple of 64, so a user never sizes it by hand. Applying
    // this twice gives the same. A tokenizer not found here is the data loader's error to give.
    int vocab = file.file_vocab;
    std::error_code ec;
    if (!cfg.data.tokenizer.empty() && std::filesystem::exists(cfg.data.tokenizer, ec)) {
      const Tokenizer tok(cfg.data.tokenizer, cfg.data.added_tokens);
      // Only added tokens grow the vocabulary: a tokenizer whose own pieces outnumber the
      // checkpoint's rows is another model's, and its ids past the rows were never trained.
      const int own = tok.files().sentencepiece_size;
      DHP_CHECK(own <= file.file_vocab,
                "{}: data.tokenizer '{}' has {} pieces of its own, more than the {} rows of model.init '{}' "
                "(its config.json's vocab_size): it is not this checkpoint's tokenizer (ids {}..{} were never "
                "trained); only added tokens such as <image> and <pad> may grow the vocabulary",
                cfg.source, printable(tok.path()), own, file.file_vocab, init, file.file_vocab, own - 1);
      // Rows are added only for tokens the file lacks: a tokenizer that fits keeps the file's
      // vocabulary (and softmax) exactly.
      if (tok.vocab_size() > file.file_vocab) vocab = std::max(vocab, tok.padded_vocab_size(64));
      // The model finds an image's positions by its config's image_token_id; the data path lays
      // out the tokenizer's <|image_pad|>: they must be one id.
      DHP_CHECK(file.image_token < 0 || tok.ids().image_pad == file.image_token,
                "{}: model.init '{}' says image_token_id = {}, but data.tokenizer '{}' has {} for an image's "
                "positions: it is not this checkpoint's tokenizer", cfg.source, init, file.image_token,
                printable(tok.path()), tok.ids().image_pad >= 0 ? fmt::format("<|image_pad|> = {}", tok.ids().image_pad)
                                                               : std::string("no <|image_pad|>"));
      DHP_CHECK(file.image_begin < 0 || tok.ids().img_begin == file.image_begin,
                "{}: model.init '{}' says vision_start_token_id = {}, but data.tokenizer '{}' starts an image with "
                "id {}: it is not this checkpoint's tokenizer", cfg.source, init, file.image_begin,
                printable(tok.path()), tok.ids().img_begin);
    }
    file.model.vocab_size = vocab;
    // A resize the configuration names wins over a LLaVA folder's processor (LLaVA's own
    // fine-tuning pads, "pad_square", where llava-hf's processor centre-crops).
    if (cfg.model.vision.resize_stated && file.model.vision.resize != cfg.model.vision.resize) {
      spdlog::info("model.vision.resize = {}, as the configuration says (model.init '{}''s preprocessor_config.json "
                   "would give {})", image_fit_name(cfg.model.vision.resize), init, image_fit_name(file.model.vision.resize));
      file.model.vision.resize = cfg.model.vision.resize;
    }
    m = file.model;
  }
  if (!vinit.empty()) {
    // The tower's shape and pixel constants; LLaVA's settings (feature layer, projector, pad)
    // stay those of an original LLaVA model.init, the TOML's when composing.
    const ImageFit resize = m.vision.resize;
    m.vision = read_hf_tower_config(vinit, m.vision);
    if (resize == ImageFit::pad_square || m.vision.resize_stated) m.vision.resize = resize;
    const int f = m.vision.feature_layer, n = m.vision.layers;
    DHP_CHECK(f >= -(n + 1) && f <= n, "{}: the tower of model.vision.init '{}' has {} layers; feature layer "
              "{} (model.vision.feature_layer, or the LLaVA config's) is not a hidden state of it "
              "(-{} .. {})", cfg.source, vinit, n, f, n + 1, n);
  }
  m.init = init;
  m.vision.init = vinit;
  find_held_tensors(m);
  cfg.model = m;
  validate(cfg, true);
  check_hf_weights(cfg.model);
}

}  // namespace dhp
