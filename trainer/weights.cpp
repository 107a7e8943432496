#include "trainer/weights.h"

#include <fmt/ranges.h>

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

namespace dhp {
namespace {

using nlohmann::json;

// What marks a file as dhp's export (so a later export may replace it, and nothing else).
constexpr const char* kModelType = "dhp-vlm";
constexpr const char* kProducer = "dhp";

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while (!(man & 0x400)) man <<= 1, --exp;
      bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp - 15 + 127) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

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
  const int64_t file_size = in.size();
  uint64_t n = 0;
  DHP_CHECK(in.read_at(&n, 8, 0) == 8 && n > 1,
            "'{}' is not a safetensors file (bad header length: the file has {} bytes)", path, file_size);
  // Compared unsigned: a length near 2^64 must not wrap to a small or negative size.
  DHP_CHECK(n <= uint64_t(file_size - 8),
            "'{}' is not a safetensors file (bad header length: {} exceeds the file's {} bytes; truncated?)",
            path, n, file_size);
  std::string text(n, '\0');
  in.read_at(text.data(), int64_t(n), 8);
  // Duplicate names are refused (as the reference loader does): the JSON library would keep
  // the last one silently, loading whichever bytes it points at.
  std::set<std::string> names;
  std::string duplicate;
  const auto once = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth == 1 && event == json::parse_event_t::key && !names.insert(parsed.get<std::string>()).second &&
        duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  json header;
  try {
    header = json::parse(text, once);
  } catch (const json::parse_error& e) {
    // The parser's own text quotes the bytes it read, which may be binary.
    throw Error(fmt::format("'{}': the safetensors header is not valid JSON (at byte {} of {})", path,
                            e.byte, n));
  } catch (const json::exception&) {
    throw Error(fmt::format("'{}': the safetensors header is not valid JSON", path));
  }
  DHP_CHECK(duplicate.empty(), "'{}': tensor '{}' appears twice in the safetensors header", path,
            printable(duplicate));
  DHP_CHECK(header.is_object(), "'{}': the safetensors header is not a JSON object", path);
  const int64_t data_start = 8 + int64_t(n), data_size = file_size - data_start;

  std::vector<float> staged(model.n_params());
  for (auto it = header.begin(); it != header.end(); ++it)
    DHP_CHECK(it.key() == "__metadata__" || model.table().find(it.key()),
              "'{}' holds tensor '{}', which this model does not have (different model config?)",
              path, printable(it.key()));
  std::vector<std::pair<std::pair<int64_t, int64_t>, std::string>> extents;  // ((begin, end), name)
  for (const auto& spec : model.table().specs()) {
    DHP_CHECK(header.contains(spec.name), "'{}' has no tensor '{}'", path, spec.name);
    const json& t = header[spec.name];
    std::string dtype;
    std::vector<int64_t> shape, off;
    try {  // a wrong JSON type (a string shape, an entry that is not an object) is the file's fault
      DHP_CHECK(t.is_object(), "'{}': tensor '{}' is not described by a JSON object", path, spec.name);
      // The JSON library would truncate 1.5 to 1; the format says integers.
      for (const char* key : {"shape", "data_offsets"})
        DHP_CHECK(!t.contains(key) || (t[key].is_array() &&
                                       std::all_of(t[key].begin(), t[key].end(),
                                                   [](const json& x) { return x.is_number_integer(); })),
                  "'{}': tensor '{}' has a \"{}\" that is not a list of integers", path,
                  spec.name, key);
      dtype = t.value("dtype", "");
      shape = t.value("shape", std::vector<int64_t>{});
      off = t.value("data_offsets", std::vector<int64_t>{});
    } catch (const json::exception& e) {
      throw Error(fmt::format("'{}': tensor '{}' has a malformed header entry: {}", path, spec.name,
                              e.what()));
    }
    DHP_CHECK(shape == spec.shape, "'{}': tensor '{}' has shape [{}], the model expects [{}]", path,
              spec.name, fmt::join(shape, ", "), fmt::join(spec.shape, ", "));
    const int64_t width = dtype == "F32" ? 4 : (dtype == "F16" || dtype == "BF16") ? 2 : 0;
    DHP_CHECK(width > 0, "'{}': tensor '{}' has dtype {}; F32, F16 and BF16 are supported", path,
              spec.name, dtype);
    // Ordered so that no subtraction can overflow on hostile values.
    DHP_CHECK(off.size() == 2 && off[0] >= 0 && off[1] >= off[0] && off[1] <= data_size &&
                  off[1] - off[0] == spec.numel() * width,
              "'{}': tensor '{}' has data offsets outside the file or of the wrong size "
              "(truncated file?)",
              path, spec.name);
    extents.push_back({{off[0], off[1]}, spec.name});
    std::vector<char> raw(off[1] - off[0]);
    DHP_CHECK(in.read_at(raw.data(), int64_t(raw.size()), data_start + off[0]) == int64_t(raw.size()),
              "'{}': cannot read tensor '{}' (truncated file?)", path, spec.name);
    float* dst = staged.data() + spec.offset;
    for (int64_t i = 0; i < spec.numel(); ++i) {
      if (width == 4) {
        std::memcpy(dst + i, raw.data() + 4 * i, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, raw.data() + 2 * i, 2);
        dst[i] = dtype == "F16" ? half_to_float(h) : bf16_to_float(h);
      }
    }
    // Named here, at load: otherwise the first step fails with a misleading "lower optim.lr".
    DHP_CHECK(std::all_of(dst, dst + spec.numel(), [](float f) { return std::isfinite(f); }),
              "'{}': tensor '{}' holds non-finite values (NaN or infinity); these weights are "
              "unusable",
              path, spec.name);
  }
  // The tensors tile the data exactly, as the format requires: no overlap (two names reading
  // the same bytes), no gap and nothing after the last tensor.
  std::sort(extents.begin(), extents.end());
  int64_t at = 0;
  for (const auto& [range, name] : extents) {
    DHP_CHECK(range.first >= at, "'{}': tensor '{}' overlaps the tensor before it (bytes {} to {})", path,
              name, range.first, range.second);
    DHP_CHECK(range.first == at, "'{}': a gap of {} bytes before tensor '{}'", path, range.first - at, name);
    at = range.second;
  }
  DHP_CHECK(at == data_size, "'{}': {} bytes after the last tensor", path, data_size - at);
  model.upload_params(staged);
}

// An earlier export: a safetensors header whose metadata names dhp as its producer.
bool is_dhp_export(const std::string& path) {
  const std::string len = read_head(path, 8);
  if (len.size() < 8) return false;
  uint64_t n = 0;
  std::memcpy(&n, len.data(), 8);
  if (n > (uint64_t(1) << 27)) return false;  // larger than any header of ours
  const std::string head = read_head(path, 8 + n);
  if (head.size() != 8 + n) return false;
  const json h = json::parse(head.substr(8), nullptr, false);
  return h.is_object() && h.contains("__metadata__") && h["__metadata__"].is_object() &&
         h["__metadata__"].value("producer", "") == kProducer;
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
  json header;
  int64_t offset = 0;
  for (const auto& s : model.table().specs()) {
    header[s.name] = {{"dtype", "F32"}, {"shape", s.shape}, {"data_offsets", {offset, offset + 4 * s.numel()}}};
    offset += 4 * s.numel();
  }
  header["__metadata__"] = {{"format", "pt"}, {"producer", kProducer}};
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the tensor data 8-byte aligned
  DHP_CHECK(!path.empty() && path.back() != '/' && !std::filesystem::is_directory(path),
            "export: '{}' must name a file, not a folder", path);
  const auto parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  DHP_CHECK(!ec, "export: cannot create the folder of '{}': {}", path, ec.message());
  // Written under a temporary name and renamed, so an interrupted export never leaves a
  // truncated file where a reader expects a complete one.
  const std::string tmp = temporary_beside(path);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    DHP_CHECK(out.good(), "cannot write '{}': {}", tmp, std::strerror(errno));
    const uint64_t n = text.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(text.data(), std::streamsize(n));
    const std::vector<float> p = model.download_params();
    for (const auto& s : model.table().specs())
      out.write(reinterpret_cast<const char*>(p.data() + s.offset), std::streamsize(4 * s.numel()));
    out.close();
    if (!out.good()) {
      const int err = errno;
      std::filesystem::remove(tmp, ec);
      throw Error(fmt::format("writing '{}' failed: {}", tmp, std::strerror(err)));
    }
  }
  // Durable before visible, as checkpoints are: the bytes on disk, then the name.
  try {
    fsync_path(tmp, false);
    commit_rename(tmp, path);
  } catch (const Error&) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw;
  }
  write_file_atomic(config_path, model_config_json(cfg).dump(2) + "\n");
}

void load_weights(const std::string& path, Model& model) {
  // A regular file, as every input (core/input.h): a FIFO or a device would block or never end.
  const InputFile file("weights file", path);
  if (std::filesystem::path(path).extension() == ".h5")
    load_checkpoint(path, model, nullptr);
  else
    load_safetensors(file, path, model);
}

}  // namespace dhp
