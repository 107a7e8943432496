// The safetensors format, shared by dhp's own export (trainer/weights.h) and Hugging Face
// checkpoints (trainer/hf_checkpoint.h):
//   8 bytes little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value", ...}}
// then the raw little-endian tensor bytes, offsets relative to the end of the header.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/input.h"

namespace dhp {

class ByteProgress;

// The largest header read: the limit of the format's reference reader.
inline constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

struct SafetensorsEntry {
  std::string name;
  std::string dtype;             // "F32", "BF16", ... as the file says
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;    // bytes, relative to the start of the data
  int64_t numel() const;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;  // in the order of their bytes
  std::map<std::string, std::string> metadata;
  int64_t data_start = 0;                 // file offset of the first data byte
  const SafetensorsEntry* find(const std::string& name) const;
};

// Parses and checks a header: a JSON object without duplicate names, every entry an object
// with a known dtype, integer shape and offsets, sized shape·width, and the entries tiling the
// data exactly (no overlap, no gap, nothing after the last). Errors name `path` and the tensor.
SafetensorsHeader read_safetensors_header(const InputFile& in, const std::string& path);

// Bytes per element of a safetensors dtype; 0 for one this reader does not know.
int safetensors_dtype_width(const std::string& dtype);
// F32, F16 and BF16: the dtypes weights may be read from and written in.
bool is_float_dtype(const std::string& dtype);

// n values of a float dtype at `src` (unaligned little-endian bytes) widened to fp32. The
// conversions are exact: every F16 and BF16 value is an fp32 value.
void widen_to_f32(float* dst, const void* src, const std::string& dtype, int64_t n);
// n fp32 values written in `dtype` (F32 as they are; BF16 and F16 rounded to nearest even).
void narrow_from_f32(void* dst, const float* src, const std::string& dtype, int64_t n);
// The index of the first NaN or infinity among n values of a float dtype, or -1.
int64_t first_non_finite(const void* src, const std::string& dtype, int64_t n);

// A tensor's bytes read `chunk` elements at a time with pread into one reused buffer:
// fn(bytes, first element, elements) for each chunk in order. Reading, not mapping: a file that
// is truncated while being read (a download or save_pretrained still writing it) is an error
// naming it, where a mapped page past the new end would kill the process with SIGBUS; and what
// is held is the buffer, whatever the file's size.
void for_each_chunk(const InputFile& in, const std::string& path, const SafetensorsHeader& h,
                    const SafetensorsEntry& t, int64_t chunk, std::vector<char>& buffer,
                    const std::function<void(const char*, int64_t, int64_t)>& fn);

// One tensor to write: `fill` writes exactly numel·width bytes of `dtype` at `out`.
struct SafetensorsOut {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::function<void(char* out)> fill;
  int64_t bytes() const;
};

// Writes a safetensors file under a temporary name, fsyncs and renames it (core/files.h); the
// caller has checked the path (check_output_path). The header is padded with spaces to a
// multiple of 8 so the data stays 8-byte aligned. One tensor's bytes are held at a time;
// `progress`, when given, counts them as they are written.
void write_safetensors(const std::string& path, const std::vector<SafetensorsOut>& tensors,
                       const std::map<std::string, std::string>& metadata, ByteProgress* progress = nullptr);

// The "__metadata__" of a file's header, or empty when it is not a readable safetensors file;
// for recognising an earlier output of dhp.
std::map<std::string, std::string> safetensors_metadata(const std::string& path);

}  // namespace dhp
