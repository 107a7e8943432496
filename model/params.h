// The one parameter table (model-spec.md "Parameter names"): every tensor's name, shape, flags
// and initialiser, carved out of one contiguous arena. Gradients and optimizer moments are
// arenas of the same layout, so one offset addresses a parameter in all of them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace dhp {

enum class Init { Normal, Zeros, Ones };

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;  // Linear weights (out_features, in_features)
  Init init = Init::Normal;
  float std = 0.02f;           // for Init::Normal
  bool decay = false;          // AdamW weight decay applies
  int64_t offset = 0;          // elements from the start of the arena
  int64_t numel() const;
};

class ParamTable {
 public:
  explicit ParamTable(const ModelConfig& cfg);
  const std::vector<ParamSpec>& specs() const { return specs_; }
  int64_t total() const { return total_; }
  // Throws dhp::Error for an unknown name.
  const ParamSpec& get(const std::string& name) const;
  const ParamSpec* find(const std::string& name) const;

  // Seeded initialisation of an arena of total() floats. Each parameter draws from a stream
  // keyed by its name, so the weights depend on (seed, name) only: the same on every rank and
  // world size, and unchanged when another parameter is added.
  void initialise(float* arena, uint64_t seed) const;

 private:
  void add(std::string name, std::vector<int64_t> shape, Init init, bool decay, float std = 0.02f);
  std::vector<ParamSpec> specs_;
  int64_t total_ = 0;
};

// Pointers into an arena (parameters or gradients) for one transformer block.
struct BlockParams {
  float* attn_norm;  // (C)
  float* wq;         // (Hq·hd, C)
  float* wk;         // (Hkv·hd, C)
  float* wv;         // (Hkv·hd, C)
  float* wo;         // (C, Hq·hd)
  float* mlp_norm;   // (C)
  float* w1;         // (F, C)
  float* w2;         // (C, F)
  float* w3;         // (F, C)
};

// Every parameter of the model as pointers into one arena.
struct ModelParams {
  float* patch_embed_w;           // (dv, p·p·3)
  float* patch_embed_b;           // (dv)
  std::vector<BlockParams> vision_layers;
  float* vision_norm;             // (dv)
  float* fc1_w;                   // (d, m²·dv)
  float* fc1_b;                   // (d)
  float* fc2_w;                   // (d, d)
  float* fc2_b;                   // (d)
  float* tok_embed;               // (V, d)
  std::vector<BlockParams> layers;
  float* final_norm;              // (d)
  float* lm_head;                 // (V, d); equals tok_embed when tied
};

ModelParams bind_params(const ParamTable& table, const ModelConfig& cfg, float* arena);

}  // namespace dhp
