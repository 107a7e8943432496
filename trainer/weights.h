// Model weights outside dhp: safetensors files (the common Python tooling's format) under the
// model-spec.md parameter names, plus a JSON config beside them.
//
// safetensors: 8 bytes little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {...}}
// then the raw little-endian tensor bytes, offsets relative to the end of the header.
#pragma once

#include <string>

#include "model/model.h"
#include "trainer/config.h"

namespace dhp {

// Writes every parameter as F32 to `path` and the model configuration to `config_path`.
// Neither replaces what dhp did not write (core/files.h, check_output_path): an existing file
// at either path must be an earlier dhp export, unless `force`.
void export_safetensors(const Model& model, const Config& cfg, const std::string& path,
                        const std::string& config_path, bool force = false);
// The same checks alone, for a command to make before it loads anything.
void check_export_paths(const std::string& path, const std::string& config_path, bool force);

// Loads weights from a safetensors file (F32, F16 or BF16 tensors) or a dhp checkpoint (.h5).
// Every parameter must be present with the model's shape; unknown names are an error too, so a
// mismatched file is never half-loaded. Nothing is changed when it throws. A Hugging Face
// folder (trainer/hf_checkpoint.h) loads the decoder's tensors and leaves the others as they are.
void load_weights(const std::string& path, Model& model);

}  // namespace dhp
