#include "trainer/hf_checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "core/check.h"
#include "core/files.h"
#include "core/input.h"
#include "core/text.h"
#include "data/tokenizer.h"
#include "trainer/safetensors.h"

namespace dhp {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The name map (docs/pretrained.md): Hugging Face's names on the left, model-spec.md's on the
// right; "{i}" is a decoder layer. Both import and export read this table and nothing else.
// HF Llama's q_proj/k_proj rows are already in the half-split RoPE order model-spec.md uses
// (rotate_half), so no tensor needs a permutation; only the vocabulary rows may grow.
struct HfPattern {
  const char* hf;
  const char* dhp;
  HfTransform transform;
};
constexpr HfPattern kNameMap[] = {
    {"model.embed_tokens.weight", "tok_embed.weight", HfTransform::VocabRows},
    {"model.layers.{i}.input_layernorm.weight", "layers.{i}.attn_norm.weight", HfTransform::None},
    {"model.layers.{i}.self_attn.q_proj.weight", "layers.{i}.attn.wq.weight", HfTransform::None},
    {"model.layers.{i}.self_attn.k_proj.weight", "layers.{i}.attn.wk.weight", HfTransform::None},
    {"model.layers.{i}.self_attn.v_proj.weight", "layers.{i}.attn.wv.weight", HfTransform::None},
    {"model.layers.{i}.self_attn.q_proj.bias", "layers.{i}.attn.wq.bias", HfTransform::None},
    {"model.layers.{i}.self_attn.k_proj.bias", "layers.{i}.attn.wk.bias", HfTransform::None},
    {"model.layers.{i}.self_attn.v_proj.bias", "layers.{i}.attn.wv.bias", HfTransform::None},
    {"model.layers.{i}.self_attn.o_proj.weight", "layers.{i}.attn.wo.weight", HfTransform::None},
    {"model.layers.{i}.post_attention_layernorm.weight", "layers.{i}.mlp_norm.weight", HfTransform::None},
    {"model.layers.{i}.mlp.gate_proj.weight", "layers.{i}.mlp.w1.weight", HfTransform::None},
    {"model.layers.{i}.mlp.down_proj.weight", "layers.{i}.mlp.w2.weight", HfTransform::None},
    {"model.layers.{i}.mlp.up_proj.weight", "layers.{i}.mlp.w3.weight", HfTransform::None},
    {"model.norm.weight", "final_norm.weight", HfTransform::None},
    {"lm_head.weight", "lm_head.weight", HfTransform::VocabRows},
};

// Tensors some checkpoints carry that hold nothing dhp needs: RoPE's inverse frequencies are a
// function of rope_theta and head_dim (older transformers versions saved them as buffers).
bool ignored(const std::string& hf_name) {
  const std::string suffix = "rotary_emb.inv_freq";
  return hf_name.size() >= suffix.size() &&
         hf_name.compare(hf_name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string with_layer(std::string pattern, int i) {
  const auto at = pattern.find("{i}");
  if (at != std::string::npos) pattern.replace(at, 3, std::to_string(i));
  return pattern;
}

const char* const kArchitectures[] = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"};

// config.json read with every value's type checked, errors naming the key and the file.
class ConfigJson {
 public:
  explicit ConfigJson(const std::string& dir) : path_((fs::path(dir) / "config.json").string()) {
    const InputFile in("Hugging Face config", path_);
    const std::string text = in.read_all(int64_t(16) << 20, "16 MiB");
    j_ = json::parse(text, nullptr, false);
    DHP_CHECK(!j_.is_discarded() && j_.is_object(), "'{}' is not a JSON object", path_);
  }
  const std::string& path() const { return path_; }
  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  int64_t integer(const char* key, int64_t lo, int64_t hi) const {
    DHP_CHECK(has(key), "'{}' has no \"{}\"", path_, key);
    DHP_CHECK(j_[key].is_number_integer(), "'{}': \"{}\" is not an integer", path_, key);
    const int64_t v = j_[key].get<int64_t>();
    DHP_CHECK(v >= lo && v <= hi, "'{}': \"{}\" = {} is out of range [{}, {}]", path_, key, v, lo, hi);
    return v;
  }
  double number(const char* key, double lo, double hi) const {
    DHP_CHECK(has(key), "'{}' has no \"{}\"", path_, key);
    DHP_CHECK(j_[key].is_number(), "'{}': \"{}\" is not a number", path_, key);
    const double v = j_[key].get<double>();
    DHP_CHECK(v >= lo && v <= hi, "'{}': \"{}\" = {} is out of range [{}, {}]", path_, key, v, lo, hi);
    return v;
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    DHP_CHECK(j_[key].is_boolean(), "'{}': \"{}\" is not true or false", path_, key);
    return j_[key].get<bool>();
  }
  std::string string(const char* key) const {
    if (!has(key)) return "";
    DHP_CHECK(j_[key].is_string(), "'{}': \"{}\" is not a string", path_, key);
    return j_[key].get<std::string>();
  }
  const json& raw() const { return j_; }

 private:
  std::string path_;
  json j_;
};

std::string architecture_of(const ConfigJson& c) {
  const json& j = c.raw();
  DHP_CHECK(c.has("architectures") && j["architectures"].is_array() && j["architectures"].size() == 1 &&
                j["architectures"][0].is_string(),
            "'{}': \"architectures\" must list one model class ({})", c.path(),
            fmt::join(kArchitectures, ", "));
  const std::string a = j["architectures"][0].get<std::string>();
  DHP_CHECK(std::find(std::begin(kArchitectures), std::end(kArchitectures), a) != std::end(kArchitectures),
            "'{}': \"architectures\" is {}; dhp reads {}", c.path(), printable(a),
            fmt::join(kArchitectures, ", "));
  return a;
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
};

Checkpoint open_checkpoint(const std::string& dir) {
  Checkpoint ck;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single = fs::path(dir) / "model.safetensors";
  std::error_code ec;
  auto open_shard = [&](const std::string& name) {
    auto s = std::make_unique<Shard>();
    s->path = (fs::path(dir) / name).string();
    // Confined to the folder: an index naming "../x" or a symlink out of it is refused.
    s->in = std::make_unique<InputFile>("checkpoint shard", dir, s->path, "listed in " + index.string());
    s->header = read_safetensors_header(*s->in, s->path);
    ck.shards.push_back(std::move(s));
    return ck.shards.back().get();
  };
  if (fs::exists(index, ec)) {
    const InputFile in("checkpoint index", index.string());
    const json j = json::parse(in.read_all(int64_t(64) << 20, "64 MiB"), nullptr, false);
    DHP_CHECK(!j.is_discarded() && j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
              "'{}' has no \"weight_map\" object", index.string());
    std::map<std::string, std::string> where;  // tensor -> file
    for (const auto& [name, file] : j["weight_map"].items()) {
      DHP_CHECK(file.is_string(), "'{}': the file of '{}' is not a string", index.string(), printable(name));
      const std::string f = file.get<std::string>();
      DHP_CHECK(!f.empty() && f.find('/') == std::string::npos && f != "." && f != "..",
                "'{}': '{}' is not a file name in the folder (for '{}')", index.string(), printable(f),
                printable(name));
      where[name] = f;
    }
    std::map<std::string, Shard*> by_file;
    for (const auto& [name, f] : where)
      if (!by_file.count(f)) by_file[f] = open_shard(f);
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
    const Shard* s = open_shard("model.safetensors");
    for (const auto& t : s->header.tensors) ck.tensors[t.name] = {s, &t};
  }
  return ck;
}

// Why a config.json does not describe `cfg`'s decoder, or "".
std::string shape_difference(const ModelConfig& want, const ModelConfig& file) {
  const std::pair<const char*, std::pair<std::string, std::string>> keys[] = {
      {"dim", {fmt::format("{}", want.dim), fmt::format("{}", file.dim)}},
      {"layers", {fmt::format("{}", want.layers), fmt::format("{}", file.layers)}},
      {"heads", {fmt::format("{}", want.heads), fmt::format("{}", file.heads)}},
      {"kv_heads", {fmt::format("{}", want.kv_heads), fmt::format("{}", file.kv_heads)}},
      {"head_dim", {fmt::format("{}", want.hd()), fmt::format("{}", file.hd())}},
      {"ffn", {fmt::format("{}", want.ffn), fmt::format("{}", file.ffn)}},
      {"rope_theta", {fmt::format("{}", want.rope_theta), fmt::format("{}", file.rope_theta)}},
      {"rms_norm_eps", {fmt::format("{}", want.rms_norm_eps), fmt::format("{}", file.rms_norm_eps)}},
      {"tie_embeddings", {fmt::format("{}", want.tie_embeddings), fmt::format("{}", file.tie_embeddings)}},
      {"attention_bias", {fmt::format("{}", want.attention_bias), fmt::format("{}", file.attention_bias)}},
  };
  for (const auto& [key, v] : keys)
    if (v.first != v.second) return fmt::format("model.{} is {} here, {} in the checkpoint", key, v.first, v.second);
  return "";
}

}  // namespace

std::vector<HfBinding> hf_name_map(const ModelConfig& cfg) {
  const ParamTable table(cfg);
  std::map<std::string, HfBinding> by_dhp;
  for (const auto& p : kNameMap) {
    const bool per_layer = std::string(p.hf).find("{i}") != std::string::npos;
    for (int i = 0; i < (per_layer ? cfg.layers : 1); ++i) {
      HfBinding b{with_layer(p.hf, i), with_layer(p.dhp, i), p.transform};
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

HfConfig read_hf_config(const std::string& dir, const ModelConfig& base, int64_t max_tokens,
                        int vocab_size) {
  const ConfigJson c(dir);
  const std::string& f = c.path();
  HfConfig h;
  h.architecture = architecture_of(c);
  const bool qwen2 = h.architecture == "Qwen2ForCausalLM";
  // Refused by name: each changes the computation in a way dhp does not implement.
  DHP_CHECK(!c.has("rope_scaling"), "'{}': \"rope_scaling\" is set ({}); dhp implements plain RoPE only",
            f, c.raw()["rope_scaling"].dump());
  DHP_CHECK(!c.has("quantization_config"), "'{}': \"quantization_config\" is set; dhp reads unquantised "
            "F32, F16 and BF16 weights only", f);
  const std::string act = c.has("hidden_act") ? c.string("hidden_act") : "silu";
  DHP_CHECK(act == "silu", "'{}': \"hidden_act\" is {}; dhp's MLP is SwiGLU with silu", f, printable(act));
  DHP_CHECK(!c.boolean("mlp_bias", false), "'{}': \"mlp_bias\" is true; dhp's MLP has no biases", f);
  // Qwen2's q/k/v always carry biases (and o_proj none); Llama's attention_bias adds one to
  // o_proj as well, which dhp does not have.
  DHP_CHECK(qwen2 || !c.boolean("attention_bias", false),
            "'{}': \"attention_bias\" is true in a {} config, which biases o_proj too; dhp implements "
            "q/k/v biases only (Qwen2ForCausalLM)", f, h.architecture);
  // A sliding window at least as long as every sequence is the same as full attention.
  const bool window_on = qwen2 ? c.boolean("use_sliding_window", false) : c.has("sliding_window");
  if (window_on && max_tokens > 0) {
    const int64_t w = c.integer("sliding_window", 1, int64_t(1) << 40);
    DHP_CHECK(w >= max_tokens,
              "'{}': \"sliding_window\" = {} is below the run's longest sequence (data.max_tokens = {}); "
              "dhp implements full causal attention only (lower data.max_tokens to at most {})",
              f, w, max_tokens, w);
  }
  ModelConfig m = base;
  m.dim = int(c.integer("hidden_size", 1, 1 << 16));
  m.ffn = int(c.integer("intermediate_size", 1, 1 << 20));
  m.layers = int(c.integer("num_hidden_layers", 1, 1024));
  m.heads = int(c.integer("num_attention_heads", 1, 1024));
  m.kv_heads = c.has("num_key_value_heads") ? int(c.integer("num_key_value_heads", 1, 1024)) : m.heads;
  m.head_dim = c.has("head_dim") ? int(c.integer("head_dim", 2, 4096)) : 0;
  m.rms_norm_eps = c.has("rms_norm_eps") ? c.number("rms_norm_eps", 1e-12, 0.1) : 1e-6;
  m.rope_theta = c.has("rope_theta") ? c.number("rope_theta", 1, 1e12) : 10000.0;
  m.tie_embeddings = c.boolean("tie_word_embeddings", false);
  m.attention_bias = qwen2;
  h.file_vocab = int(c.integer("vocab_size", 8, 1 << 24));
  DHP_CHECK(m.head_dim > 0 || m.dim % m.heads == 0,
            "'{}': \"hidden_size\" ({}) is not divisible by \"num_attention_heads\" ({}) and there is no \"head_dim\"",
            f, m.dim, m.heads);
  DHP_CHECK(m.heads % m.kv_heads == 0, "'{}': \"num_attention_heads\" ({}) is not a multiple of \"num_key_value_heads\" ({})",
            f, m.heads, m.kv_heads);
  DHP_CHECK(m.hd() % 2 == 0, "'{}': the head dimension ({}, \"head_dim\") must be even for RoPE", f, m.hd());
  DHP_CHECK(vocab_size == 0 || vocab_size >= h.file_vocab,
            "'{}': the model's vocabulary ({} tokens) is smaller than the checkpoint's \"vocab_size\" ({}); "
            "a vocabulary may grow (added tokens), never shrink", f, vocab_size, h.file_vocab);
  m.vocab_size = vocab_size > 0 ? vocab_size : h.file_vocab;
  h.model = m;
  return h;
}

void apply_hf_init(Config& cfg) {
  if (cfg.model.init.empty()) return;
  DHP_CHECK(is_hf_folder(cfg.model.init),
            "{}: model.init '{}' is not a Hugging Face checkpoint folder (a folder with config.json); "
            "dhp's own exports and checkpoints start a run through --init", cfg.source,
            printable(cfg.model.init));
  HfConfig file = read_hf_config(cfg.model.init, cfg.model, cfg.data.max_tokens);
  // Like every decoder key, the vocabulary is the file's, except that the tokenizer's added
  // tokens (LLaVA's <image> and <pad> after Llama's 32000 pieces) need rows: it grows to the
  // tokenizer's size rounded up to a multiple of 64, so a user never sizes it by hand. Applying
  // this twice gives the same. A tokenizer not found here is the data loader's error to give.
  int vocab = file.file_vocab;
  std::error_code ec;
  if (!cfg.data.tokenizer.empty() && std::filesystem::exists(cfg.data.tokenizer, ec)) {
    const Tokenizer tok(cfg.data.tokenizer, cfg.data.added_tokens);
    vocab = std::max(vocab, tok.padded_vocab_size(64));
  }
  file.model.vocab_size = vocab;
  cfg.model = file.model;
}

HfImport import_hf_weights(const std::string& dir, const ModelConfig& cfg, const ParamTable& table,
                           Backend& backend, float* arena) {
  const HfConfig file = read_hf_config(dir, cfg, 0, cfg.vocab_size);
  const std::string diff = shape_difference(cfg, file.model);
  DHP_CHECK(diff.empty(), "'{}/config.json' describes another decoder: {}", dir, diff);
  const Checkpoint ck = open_checkpoint(dir);
  const std::vector<HfBinding> map = hf_name_map(cfg);
  std::set<std::string> mapped;
  for (const auto& b : map) mapped.insert(b.hf);
  for (const auto& [name, at] : ck.tensors) {
    if (mapped.count(name) || ignored(name)) continue;
    DHP_CHECK(!(name == "lm_head.weight" && cfg.tie_embeddings),
              "'{}' holds lm_head.weight, but config.json says tie_word_embeddings = true", at.shard->path);
    throw Error(fmt::format("'{}' holds tensor '{}', which the model does not have (the names dhp "
                            "maps are in docs/pretrained.md)", at.shard->path, printable(name)));
  }
  // Every check before the first byte is written.
  HfImport r;
  r.file_vocab = file.file_vocab;
  for (const auto& b : map) {
    const auto it = ck.tensors.find(b.hf);
    DHP_CHECK(it != ck.tensors.end(), "'{}' has no tensor '{}' (dhp's {})", dir, b.hf, b.dhp);
    const SafetensorsEntry& t = *it->second.entry;
    std::vector<int64_t> want = table.get(b.dhp).shape;
    if (b.transform == HfTransform::VocabRows) want[0] = file.file_vocab;
    DHP_CHECK(t.shape == want, "'{}': tensor '{}' has shape [{}]; config.json implies [{}]",
              it->second.shard->path, b.hf, fmt::join(t.shape, ", "), fmt::join(want, ", "));
    DHP_CHECK(is_float_dtype(t.dtype), "'{}': tensor '{}' has dtype {}; F32, F16 and BF16 are supported",
              it->second.shard->path, b.hf, t.dtype);
    if (r.dtype.empty()) r.dtype = t.dtype;
  }
  std::vector<std::unique_ptr<MappedFile>> maps;
  std::map<const Shard*, const MappedFile*> map_of;
  for (const auto& s : ck.shards) {
    maps.push_back(std::make_unique<MappedFile>(*s->in, s->path));
    map_of[s.get()] = maps.back().get();
  }
  auto source = [&](const Located& at) {
    return map_of.at(at.shard)->data() + at.shard->header.data_start + at.entry->begin;
  };
  auto prefetch = [&](size_t i) {
    if (i >= map.size()) return;
    const Located& at = ck.tensors.at(map[i].hf);
    const int64_t first_byte = at.shard->header.data_start + at.entry->begin;
    map_of.at(at.shard)->prefetch(first_byte, first_byte + at.entry->end - at.entry->begin);
  };
  prefetch(0);
  for (size_t i = 0; i < map.size(); ++i) {
    const HfBinding& b = map[i];
    prefetch(i + 1);
    const Located& at = ck.tensors.at(b.hf);
    const int64_t bad = first_non_finite(source(at), at.entry->dtype, at.entry->numel());
    const int64_t first_byte = at.shard->header.data_start + at.entry->begin;
    map_of.at(at.shard)->release(first_byte, first_byte + at.entry->end - at.entry->begin);
    DHP_CHECK(bad < 0, "'{}': tensor '{}' holds a non-finite value (NaN or infinity) at element {}; "
              "these weights are unusable", at.shard->path, b.hf, bad);
  }

  // Converted a chunk at a time: the arena plus one chunk is all that is held, and each
  // chunk's mapped pages leave the resident set once converted. The CPU backend's arena is
  // host memory: chunks are converted straight into it.
  constexpr int64_t kChunk = int64_t(1) << 22;  // floats (16 MiB)
  const bool host = backend.device() == Device::CPU;
  std::vector<float> staged;
  std::set<std::string> done;
  for (const auto& b : map) {
    const Located& at = ck.tensors.at(b.hf);
    const ParamSpec& spec = table.get(b.dhp);
    const MappedFile& m = *map_of.at(at.shard);
    const int64_t n = at.entry->numel(), width = safetensors_dtype_width(at.entry->dtype);
    const int64_t first_byte = at.shard->header.data_start + at.entry->begin;
    const bool grow = b.transform == HfTransform::VocabRows && spec.shape[0] > at.entry->shape[0];
    const int64_t d = spec.shape.size() == 2 ? spec.shape[1] : 1;
    std::vector<double> column_sum(grow ? size_t(d) : 0, 0.0);  // (d)
    for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
      const int64_t k = std::min(kChunk, n - i0);
      if (!host) staged.resize(size_t(k));
      float* dst = host ? arena + spec.offset + i0 : staged.data();
      widen_to_f32(dst, m.data() + first_byte + i0 * width, at.entry->dtype, k);
      if (grow)
        for (int64_t i = 0; i < k; ++i) column_sum[size_t((i0 + i) % d)] += dst[i];
      if (!host) backend.upload(arena + spec.offset + i0, dst, size_t(k) * sizeof(float));
      m.release(first_byte + i0 * width, first_byte + (i0 + k) * width);
    }
    if (grow) {
      // New rows (added tokens) start at the mean of the file's rows: a token the model has
      // never seen begins as the average token, so its logit starts near the others' and
      // nothing it does moves the pretrained distribution far at the first steps.
      const int64_t rows = at.entry->shape[0], extra = spec.shape[0] - rows;
      std::vector<float> row(static_cast<size_t>(d));
      for (int64_t c = 0; c < d; ++c) row[size_t(c)] = float(column_sum[size_t(c)] / double(rows));
      for (int64_t rw = 0; rw < extra; ++rw)
        backend.upload(arena + spec.offset + (rows + rw) * d, row.data(), size_t(d) * sizeof(float));
      r.grown_rows = int(extra);
    }
    r.imported.push_back(b.dhp);
    done.insert(b.dhp);
  }
  for (const auto& s : table.specs())
    if (!done.count(s.name)) r.initialised.push_back(s.name);
  return r;
}

HfImport import_hf_checkpoint(const std::string& dir, Model& model) {
  return import_hf_weights(dir, model.config(), model.table(), model.backend(), model.params());
}

std::string hf_checkpoint_dtype(const std::string& dir) {
  try {
    const Checkpoint ck = open_checkpoint(dir);
    const auto it = ck.tensors.find("model.embed_tokens.weight");
    return it == ck.tensors.end() ? "" : it->second.entry->dtype;
  } catch (const Error&) {
    return "";
  }
}

}  // namespace dhp
