#include "trainer/weights.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/bf16.h"
#include "core/check.h"
#include "core/files.h"
#include "core/input.h"
#include "core/text.h"
#include "trainer/checkpoint.h"
#include "trainer/hf_checkpoint.h"
#include "trainer/safetensors.h"

namespace dhp {
namespace {

using nlohmann::json;

// What marks a file as dhp's export (so a later export may replace it, and nothing else).
constexpr const char* kModelType = "dhp-vlm";
constexpr const char* kProducer = "dhp";

json model_config_json(const Config& c) {
  const auto& m = c.model;
  const auto& v = m.vision;
  return {{"model_type", kModelType},
          {"dim", m.dim}, {"layers", m.layers}, {"heads", m.heads}, {"kv_heads", m.kv_heads},
          {"head_dim", m.hd()}, {"ffn", m.ffn}, {"vocab_size", m.vocab_size},
          {"rope_theta", m.rope_theta}, {"tie_embeddings", m.tie_embeddings},
          {"vision", {{"patch", v.patch}, {"dim", v.dim}, {"layers", v.layers}, {"heads", v.heads},
                      {"ffn", v.ffn}, {"merge", v.merge}, {"min_pixels", v.min_pixels},
                      {"max_pixels", v.max_pixels}}}};
}

void load_safetensors(const InputFile& in, const std::string& path, Model& model) {
  const SafetensorsHeader header = read_safetensors_header(in, path);
  for (const auto& t : header.tensors)
    DHP_CHECK(model.table().find(t.name),
              "'{}' holds tensor '{}', which this model does not have (different model config?)",
              path, printable(t.name));
  // Every check before any conversion: a mismatched file is never half-loaded.
  for (const auto& spec : model.table().specs()) {
    const SafetensorsEntry* t = header.find(spec.name);
    DHP_CHECK(t, "'{}' has no tensor '{}'", path, spec.name);
    DHP_CHECK(t->shape == spec.shape, "'{}': tensor '{}' has shape [{}], the model expects [{}]", path,
              spec.name, fmt::join(t->shape, ", "), fmt::join(spec.shape, ", "));
    DHP_CHECK(is_float_dtype(t->dtype), "'{}': tensor '{}' has dtype {}; F32, F16 and BF16 are supported",
              path, spec.name, t->dtype);
  }
  std::vector<float> staged(model.n_params());
  std::vector<char> buffer;
  for (const auto& spec : model.table().specs()) {
    const SafetensorsEntry* t = header.find(spec.name);
    for_each_chunk(in, path, header, *t, int64_t(1) << 22, buffer, [&](const char* src, int64_t i0, int64_t c) {
      // Named here, at load: otherwise the first step fails with a misleading "lower optim.lr".
      DHP_CHECK(first_non_finite(src, t->dtype, c) < 0,
                "'{}': tensor '{}' holds non-finite values (NaN or infinity); these weights are "
                "unusable",
                path, spec.name);
      widen_to_f32(staged.data() + spec.offset + i0, src, t->dtype, c);
    });
  }
  model.upload_params(staged);
}

// An earlier export: a safetensors header whose metadata names dhp as its producer.
bool is_dhp_export(const std::string& path) {
  const auto meta = safetensors_metadata(path);
  const auto it = meta.find("producer");
  return it != meta.end() && it->second == kProducer;
}

bool is_dhp_config(const std::string& path) {
  const json c = json::parse(read_head(path, 1 << 20), nullptr, false);
  return c.is_object() && c.value("model_type", "") == kModelType;
}

}  // namespace

void check_export_paths(const std::string& path, const std::string& config_path, bool force) {
  check_output_path(path, "export: -o/--out", is_dhp_export, force);
  check_output_path(config_path, "export: the config.json beside -o/--out", is_dhp_config, force);
}

void export_safetensors(const Model& model, const Config& cfg, const std::string& path,
                        const std::string& config_path, bool force) {
  check_export_paths(path, config_path, force);
  DHP_CHECK(!path.empty() && path.back() != '/' && !std::filesystem::is_directory(path),
            "export: '{}' must name a file, not a folder", path);
  const auto parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  DHP_CHECK(!ec, "export: cannot create the folder of '{}': {}", path, ec.message());
  const std::vector<float> p = model.download_params();
  std::vector<SafetensorsOut> tensors;
  for (const auto& s : model.table().specs())
    tensors.push_back({s.name, "F32", s.shape, [&p, &s](char* out) {
                         std::memcpy(out, p.data() + s.offset, size_t(s.numel()) * 4);
                       }});
  write_safetensors(path, tensors, {{"format", "pt"}, {"producer", kProducer}});
  write_file_atomic(config_path, model_config_json(cfg).dump(2) + "\n");
}

void load_weights(const std::string& path, Model& model) {
  // A Hugging Face folder: the decoder's tensors by the name map, the rest left as they are.
  if (is_hf_folder(path)) {
    import_hf_checkpoint(path, model);
    return;
  }
  // A regular file, as every input (core/input.h): a FIFO or a device would block or never end.
  const InputFile file("weights file", path);
  if (std::filesystem::path(path).extension() == ".h5") {
    load_checkpoint(path, model, nullptr);
    // A checkpoint of a larger configuration loads into a smaller one: say what stays behind.
    const std::vector<std::string> left = checkpoint_params_not_in(path, model.table());
    if (!left.empty())
      spdlog::warn("--init '{}': {} tensors of the checkpoint are not in this model's configuration and were "
                   "not loaded: {}{}", path, left.size(),
                   fmt::join(left.begin(), left.begin() + long(std::min<size_t>(left.size(), 8)), ", "),
                   left.size() > 8 ? ", ..." : "");
  } else {
    load_safetensors(file, path, model);
  }
}

}  // namespace dhp
