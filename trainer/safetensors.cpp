#include "trainer/safetensors.h"

#include <fmt/format.h>

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
#include "core/progress.h"
#include "core/json_input.h"
#include "core/text.h"

namespace dhp {
namespace {

using nlohmann::json;

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

// Round to nearest even, overflow to infinity, subnormals kept (IEEE binary16).
uint16_t half_from_float(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000);
  const uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return uint16_t(sign | 0x7c00 | (a > 0x7f800000u ? 0x200 : 0));
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00);  // rounds past 65504
  if (a < 0x38800000u) {                                  // below 2^-14: subnormal or zero
    if (a < 0x33000000u) return sign;                     // below half the smallest subnormal
    const uint32_t man = (a & 0x7fffff) | 0x800000;
    // value = man·2^(E-150) = (man >> s)·2^-24 units of the smallest subnormal, s = 126 - E.
    const int s = 126 - int(a >> 23);                     // 14..24
    const uint32_t half = man >> s, rem = man & ((1u << s) - 1), mid = 1u << (s - 1);
    return uint16_t(sign | (half + (rem > mid || (rem == mid && (half & 1)))));
  }
  const uint32_t e = (a >> 23) - 127 + 15, man = a & 0x7fffff;
  uint32_t h = (e << 10) | (man >> 13);
  const uint32_t rem = man & 0x1fff;
  h += rem > 0x1000 || (rem == 0x1000 && (h & 1));  // a carry into the exponent is right
  return uint16_t(sign | h);
}

template <class T>
T load(const void* p, int64_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(p) + i * int64_t(sizeof(T)), sizeof(T));
  return v;
}

}  // namespace

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

const SafetensorsEntry* SafetensorsHeader::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

int64_t SafetensorsOut::bytes() const {
  int64_t n = safetensors_dtype_width(dtype);
  for (int64_t s : shape) n *= s;
  return n;
}

int safetensors_dtype_width(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

bool is_float_dtype(const std::string& d) { return d == "F32" || d == "F16" || d == "BF16"; }

void widen_to_f32(float* dst, const void* src, const std::string& dtype, int64_t n) {
  if (dtype == "F32") {
    std::memcpy(dst, src, size_t(n) * 4);
  } else if (dtype == "BF16") {
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(load<uint16_t>(src, i));
  } else {
    DHP_ASSERT(dtype == "F16");
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) dst[i] = half_to_float(load<uint16_t>(src, i));
  }
}

void narrow_from_f32(void* dst, const float* src, const std::string& dtype, int64_t n) {
  char* out = static_cast<char*>(dst);
  if (dtype == "F32") {
    std::memcpy(out, src, size_t(n) * 4);
    return;
  }
  DHP_ASSERT(dtype == "BF16" || dtype == "F16");
  const bool bf = dtype == "BF16";
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = bf ? bf16_from_float(src[i]) : half_from_float(src[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

namespace {
// Whether any of n words has an all-ones exponent under `mask`: an OR over the block, which
// vectorises, unlike a search for the first index.
template <class W>
bool any_exponent_full(const void* src, int64_t n, W mask) {
  W hit = 0;
  for (int64_t i = 0; i < n; ++i) {
    const W w = load<W>(src, i);
    hit |= W((w & mask) == mask);
  }
  return hit != 0;
}
template <class W>
int64_t first_full(const void* src, int64_t n, W mask) {
  constexpr int64_t kBlock = int64_t(1) << 16;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  int64_t first_block = blocks;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i0 = b * kBlock;
    if (any_exponent_full(static_cast<const char*>(src) + i0 * int64_t(sizeof(W)), std::min(kBlock, n - i0), mask))
      first_block = std::min(first_block, b);
  }
  if (first_block == blocks) return -1;
  for (int64_t i = first_block * kBlock;; ++i)
    if ((load<W>(src, i) & mask) == mask) return i;
}
}  // namespace

int64_t first_non_finite(const void* src, const std::string& dtype, int64_t n) {
  // An all-ones exponent is NaN or infinity in every one of the three formats.
  if (dtype == "F32") return first_full<uint32_t>(src, n, 0x7f800000u);
  return first_full<uint16_t>(src, n, dtype == "BF16" ? 0x7f80 : 0x7c00);
}

SafetensorsHeader read_safetensors_header(const InputFile& in, const std::string& path) {
  const int64_t file_size = in.size();
  uint64_t n = 0;
  DHP_CHECK(in.read_at(&n, 8, 0) == 8 && n > 1,
            "'{}' is not a safetensors file (bad header length: the file has {} bytes)", path, file_size);
  // Compared unsigned: a length near 2^64 must not wrap to a small or negative size.
  DHP_CHECK(n <= uint64_t(file_size - 8),
            "'{}' is not a safetensors file (bad header length: {} exceeds the file's {} bytes; truncated?)",
            path, n, file_size);
  // The format's own readers stop at 100 MB: a real header lists a few thousand tensors in a
  // few hundred kB. Checked before the header is read, so a claimed length is never allocated.
  DHP_CHECK(n <= kMaxSafetensorsHeader,
            "'{}': a safetensors header of {} bytes is larger than any real one (at most {}); "
            "the file is damaged or not safetensors", path, n, kMaxSafetensorsHeader);
  std::string text(n, '\0');
  in.read_at(text.data(), int64_t(n), 8);
  // Duplicate names are refused (as the reference loader does): the JSON library would keep
  // the last one silently, loading whichever bytes it points at.
  std::set<std::string> names;
  std::string duplicate;
  const auto once = [&](int depth, json::parse_event_t event, json& parsed) {
    // A header nests three levels; deeper would make later copies recurse (core/json_input.h).
    DHP_CHECK(!((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
                depth >= kMaxJsonDepth),
              "'{}': the safetensors header nests deeper than {} levels", path, kMaxJsonDepth);
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
  SafetensorsHeader h;
  h.data_start = 8 + int64_t(n);
  const int64_t data_size = file_size - h.data_start;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const json& t = it.value();
    const std::string name = printable(it.key());
    if (it.key() == "__metadata__") {
      DHP_CHECK(t.is_object(), "'{}': __metadata__ is not a JSON object", path);
      for (auto m = t.begin(); m != t.end(); ++m)
        if (m.value().is_string()) h.metadata[m.key()] = m.value().get<std::string>();
      continue;
    }
    SafetensorsEntry e;
    e.name = it.key();
    std::vector<int64_t> off;
    try {  // a wrong JSON type (a string shape, an entry that is not an object) is the file's fault
      DHP_CHECK(t.is_object(), "'{}': tensor '{}' is not described by a JSON object", path, name);
      // The JSON library would truncate 1.5 to 1; the format says integers.
      for (const char* key : {"shape", "data_offsets"})
        DHP_CHECK(!t.contains(key) || (t[key].is_array() &&
                                       std::all_of(t[key].begin(), t[key].end(),
                                                   [](const json& x) { return x.is_number_integer(); })),
                  "'{}': tensor '{}' has a \"{}\" that is not a list of integers", path, name, key);
      e.dtype = t.value("dtype", "");
      e.shape = t.value("shape", std::vector<int64_t>{});
      off = t.value("data_offsets", std::vector<int64_t>{});
    } catch (const json::exception& ex) {
      throw Error(fmt::format("'{}': tensor '{}' has a malformed header entry: {}", path, name,
                              ex.what()));
    }
    const int width = safetensors_dtype_width(e.dtype);
    DHP_CHECK(width > 0, "'{}': tensor '{}' has an unknown dtype '{}'", path, name, printable(e.dtype));
    int64_t numel = 1;
    for (int64_t s : e.shape) {
      DHP_CHECK(s >= 0 && (s == 0 || numel <= (int64_t(1) << 50) / s),
                "'{}': tensor '{}' has an impossible shape", path, name);
      numel *= s;
    }
    // Ordered so that no subtraction can overflow on hostile values.
    DHP_CHECK(off.size() == 2 && off[0] >= 0 && off[1] >= off[0] && off[1] <= data_size &&
                  off[1] - off[0] == numel * width,
              "'{}': tensor '{}' has data offsets outside the file or of the wrong size "
              "(truncated file?)",
              path, name);
    e.begin = off[0];
    e.end = off[1];
    h.tensors.push_back(std::move(e));
  }
  // The tensors tile the data exactly, as the format requires: no overlap (two names reading
  // the same bytes), no gap and nothing after the last tensor.
  std::sort(h.tensors.begin(), h.tensors.end(), [](const auto& a, const auto& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  int64_t at = 0;
  for (const auto& t : h.tensors) {
    DHP_CHECK(t.begin >= at, "'{}': tensor '{}' overlaps the tensor before it (bytes {} to {})", path,
              printable(t.name), t.begin, t.end);
    DHP_CHECK(t.begin == at, "'{}': a gap of {} bytes before tensor '{}'", path, t.begin - at,
              printable(t.name));
    at = t.end;
  }
  DHP_CHECK(at == data_size, "'{}': {} bytes after the last tensor", path, data_size - at);
  return h;
}

void for_each_chunk(const InputFile& in, const std::string& path, const SafetensorsHeader& h,
                    const SafetensorsEntry& t, int64_t chunk, std::vector<char>& buffer,
                    const std::function<void(const char*, int64_t, int64_t)>& fn) {
  const int64_t width = safetensors_dtype_width(t.dtype), n = t.numel();
  const int64_t first_byte = h.data_start + t.begin;
  // The kernel reads the tensor ahead while the first chunks convert.
  in.prefetch(first_byte, t.end - t.begin);
  for (int64_t i0 = 0; i0 < n; i0 += chunk) {
    const int64_t c = std::min(chunk, n - i0), bytes = c * width;
    buffer.resize(size_t(bytes));
    DHP_CHECK(in.read_at(buffer.data(), bytes, first_byte + i0 * width) == bytes,
              "'{}' shrank while being read (tensor '{}' ends past the file's end now); was it being "
              "written? Read it again once the writer is done",
              path, printable(t.name));
    fn(buffer.data(), i0, c);
  }
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsOut>& tensors,
                       const std::map<std::string, std::string>& metadata, ByteProgress* progress) {
  json header;
  int64_t offset = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes()}}};
    offset += t.bytes();
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the tensor data 8-byte aligned
  // Written under a temporary name and renamed, so an interrupted write never leaves a
  // truncated file where a reader expects a complete one.
  const std::string tmp = temporary_beside(path);
  std::error_code ec;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    DHP_CHECK(out.good(), "cannot write '{}': {}", tmp, std::strerror(errno));
    const uint64_t n = text.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(text.data(), std::streamsize(n));
    std::vector<char> bytes;
    for (const auto& t : tensors) {
      bytes.resize(size_t(t.bytes()));
      t.fill(bytes.data());
      out.write(bytes.data(), std::streamsize(bytes.size()));
      if (progress) progress->add(int64_t(bytes.size()));
    }
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
    std::filesystem::remove(tmp, ec);
    throw;
  }
}

std::map<std::string, std::string> safetensors_metadata(const std::string& path) {
  std::map<std::string, std::string> out;
  const std::string len = read_head(path, 8);
  if (len.size() < 8) return out;
  uint64_t n = 0;
  std::memcpy(&n, len.data(), 8);
  if (n > (uint64_t(1) << 27)) return out;  // larger than any header of ours
  const std::string head = read_head(path, 8 + n);
  if (head.size() != 8 + n) return out;
  const json h = json::parse(head.substr(8), nullptr, false);
  if (!h.is_object() || !h.contains("__metadata__") || !h["__metadata__"].is_object()) return out;
  for (const auto& [k, v] : h["__metadata__"].items())
    if (v.is_string()) out[k] = v.get<std::string>();
  return out;
}

}  // namespace dhp
