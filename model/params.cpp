#include "model/params.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/rng.h"
#include "model/layer_window.h"

namespace dhp {
namespace {

// FNV-1a: a name hash fixed by this file (std::hash differs between standard libraries).
uint64_t name_hash(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

}  // namespace

int64_t ParamSpec::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::optional<ParamGroup> group_of(const std::string& name) {
  auto starts = [&](std::string_view prefix) { return name.rfind(prefix, 0) == 0; };
  if (starts("vision.")) return ParamGroup::Vision;
  if (starts("projector.")) return ParamGroup::Projector;
  if (starts("tok_embed.") || starts("lm_head.")) return ParamGroup::Embeddings;
  if (starts("layers.") || starts("final_norm.")) return ParamGroup::Language;
  return std::nullopt;
}

void ParamTable::add(std::string name, std::vector<int64_t> shape, Init init, bool decay,
                     float std) {
  const std::optional<ParamGroup> group = group_of(name);
  DHP_CHECK(group, "parameter '{}' belongs to no parameter group (model/params.cpp group_of)",
            name);
  ParamSpec p{std::move(name), std::move(shape), init, std, decay, total_};
  p.group = *group;
  p.trainable = groups_.trainable(*group);
  total_ += p.padded();
  specs_.push_back(std::move(p));
}

ParamTable::ParamTable(const ModelConfig& c, const ParamGroups& groups) : groups_(groups) {
  const auto& v = c.vision;
  const int64_t dv = v.dim, d = c.dim;
  // One transformer block of the row's kind (types/architecture.h). The biases of q/k/v
  // follow the three weights in a decoder and each its own weight in a tower with biases, the
  // order every earlier checkpoint's layout records.
  struct Kind {
    NormKind norm;
    MlpKind mlp;
    bool qkv_bias, o_bias, mlp_bias, biases_follow;
    int64_t qk_norm_hd;  // the head dimension of Qwen3's q/k norms (model.qk_norm), 0 for none
    bool layer_scale;    // LayerScale's two vectors after the block's other tensors
  };
  auto block = [&](const std::string& pre, const Kind& k, int64_t C, int64_t qd, int64_t kvd, int64_t F,
                   int n_layers) {
    // Output projections are scaled by 1/sqrt(2·layers) so the residual stream's variance
    // does not grow with depth (model-spec.md "Initialisation").
    const float out_std = 0.02f / std::sqrt(2.0f * float(std::max(1, n_layers)));
    auto norm = [&](const std::string& name) {
      add(pre + name + ".weight", {C}, Init::Ones, false);
      if (k.norm == NormKind::layer) add(pre + name + ".bias", {C}, Init::Zeros, false);
    };
    norm("attn_norm");
    const std::pair<const char*, int64_t> qkv[] = {{"wq", qd}, {"wk", kvd}, {"wv", kvd}};
    for (const auto& [w, rows] : qkv) {
      add(pre + "attn." + w + ".weight", {rows, C}, Init::Normal, true);
      if (k.qkv_bias && k.biases_follow) add(pre + "attn." + w + ".bias", {rows}, Init::Zeros, false);
    }
    if (k.qkv_bias && !k.biases_follow)
      for (const auto& [w, rows] : qkv) add(pre + "attn." + w + ".bias", {rows}, Init::Zeros, false);
    add(pre + "attn.wo.weight", {C, qd}, Init::Normal, true, out_std);
    if (k.o_bias) add(pre + "attn.wo.bias", {C}, Init::Zeros, false);
    if (k.qk_norm_hd > 0) {
      add(pre + "attn.q_norm.weight", {k.qk_norm_hd}, Init::Ones, false);
      add(pre + "attn.k_norm.weight", {k.qk_norm_hd}, Init::Ones, false);
    }
    norm("mlp_norm");
    if (k.mlp == MlpKind::swiglu) {
      add(pre + "mlp.w1.weight", {F, C}, Init::Normal, true);
      add(pre + "mlp.w2.weight", {C, F}, Init::Normal, true, out_std);
      add(pre + "mlp.w3.weight", {F, C}, Init::Normal, true);
    } else {
      add(pre + "mlp.fc1.weight", {F, C}, Init::Normal, true);
      if (k.mlp_bias) add(pre + "mlp.fc1.bias", {F}, Init::Zeros, false);
      add(pre + "mlp.fc2.weight", {C, F}, Init::Normal, true, out_std);
      if (k.mlp_bias) add(pre + "mlp.fc2.bias", {C}, Init::Zeros, false);
    }
    if (k.layer_scale) {
      add(pre + "attn.ls.weight", {C}, Init::Ones, false);
      add(pre + "mlp.ls.weight", {C}, Init::Ones, false);
    }
  };
  const TowerTraits& tower = v.traits();
  const Kind tower_kind{tower.norm, tower.mlp, tower.block_biases && tower.qkv_bias, tower.block_biases,
                        tower.block_biases, true, tower.qk_norm ? dv : 0, tower.layer_scale};
  const Kind decoder_kind{NormKind::rms, MlpKind::swiglu, c.attention_bias, c.attention_out_bias, false,
                          false, c.qk_norm ? c.hd() : 0, false};
  auto layer_norm_pair = [&](const std::string& name) {
    add(name + ".weight", {dv}, Init::Ones, false);
    add(name + ".bias", {dv}, Init::Zeros, false);
  };
  add("vision.patch_embed.weight", {dv, v.embed_numel()}, Init::Normal, true);
  if (tower.patch_bias) add("vision.patch_embed.bias", {dv}, Init::Zeros, false);
  if (tower.class_row) add("vision.class_embed", {dv}, Init::Normal, false);
  if (tower.learned_positions)
    add("vision.pos_embed.weight", {v.pos_rows(), dv}, Init::Normal, false);
  if (tower.pre_norm) layer_norm_pair("vision.pre_norm");
  for (int i = 0; i < v.layers; ++i)
    block("vision.layers." + std::to_string(i) + ".", tower_kind, dv, dv, dv, v.ffn, v.layers);
  if (tower.feature_layer && v.post_norm) layer_norm_pair("vision.post_norm");
  if (tower.pool_head && v.pool_head) {
    // nn.MultiheadAttention's packed q/k/v, a LayerNorm and a GELU MLP behind one probe row.
    add("vision.head.probe", {1, 1, dv}, Init::Normal, false);
    add("vision.head.attn.in_proj.weight", {3 * dv, dv}, Init::Normal, true);
    add("vision.head.attn.in_proj.bias", {3 * dv}, Init::Zeros, false);
    add("vision.head.attn.out_proj.weight", {dv, dv}, Init::Normal, true);
    add("vision.head.attn.out_proj.bias", {dv}, Init::Zeros, false);
    layer_norm_pair("vision.head.norm");
    add("vision.head.mlp.fc1.weight", {v.ffn, dv}, Init::Normal, true);
    add("vision.head.mlp.fc1.bias", {v.ffn}, Init::Zeros, false);
    add("vision.head.mlp.fc2.weight", {dv, v.ffn}, Init::Normal, true);
    add("vision.head.mlp.fc2.bias", {dv}, Init::Zeros, false);
  }
  if (tower.final_norm) {
    add("vision.norm.weight", {dv}, Init::Ones, false);
    if (tower.norm == NormKind::layer) add("vision.norm.bias", {dv}, Init::Zeros, false);
  }
  // The projector: Linear, GELU, Linear from the merged features to the decoder's width; each
  // DeepStack merger the same behind a LayerNorm of the merged features.
  const int64_t md = v.merged_dim(), ph = v.projector_hidden(d);
  if (tower.projector_norm) {
    add("projector.norm.weight", {md}, Init::Ones, false);
    add("projector.norm.bias", {md}, Init::Zeros, false);
  }
  auto projector = [&](const std::string& pre) {
    add(pre + "fc1.weight", {ph, md}, Init::Normal, true);
    add(pre + "fc1.bias", {ph}, Init::Zeros, false);
    add(pre + "fc2.weight", {d, ph}, Init::Normal, true);
    add(pre + "fc2.bias", {d}, Init::Zeros, false);
  };
  projector("projector.");
  for (size_t j = 0; j < v.deepstack.size(); ++j) {
    const std::string pre = "projector.deepstack." + std::to_string(j) + ".";
    add(pre + "norm.weight", {md}, Init::Ones, false);
    add(pre + "norm.bias", {md}, Init::Zeros, false);
    projector(pre);
  }
  add("tok_embed.weight", {c.vocab_size, d}, Init::Normal, true);
  for (int i = 0; i < c.layers; ++i)
    block("layers." + std::to_string(i) + ".", decoder_kind, d, c.q_dim(), c.kv_dim(), c.ffn, c.layers);
  add("final_norm.weight", {d}, Init::Ones, false);
  if (!c.tie_embeddings) add("lm_head.weight", {c.vocab_size, d}, Init::Normal, true);
  // A pretrained tower's layers after feature_layer, its post_layernorm and pooling head
  // never run: they are held (a checkpoint's own, exported as they came) but take no gradient,
  // moments or weight decay, as PyTorch's AdamW leaves a parameter without a gradient untouched.
  if (tower.feature_layer) {
    std::vector<std::string> unused = {"vision.post_norm.", "vision.head."};
    for (int i = v.layers_run(); i < v.layers; ++i) unused.push_back("vision.layers." + std::to_string(i) + ".");
    for (const std::string& pre : unused)
      for (auto& p : specs_)
        if (p.name.rfind(pre, 0) == 0) p.trainable = false;
  }
  // The gradient layout: trainable parameters in table order, aligned as in the arena, so
  // that with nothing frozen it is the arena's own layout.
  for (auto& p : specs_) {
    p.grad_offset = trainable_total_;
    if (p.trainable) trainable_total_ += p.padded();
  }
}

int64_t ParamTable::group_numel(ParamGroup g) const {
  int64_t n = 0;
  for (const auto& p : specs_)
    if (p.group == g) n += p.numel();
  return n;
}

const ParamSpec* ParamTable::find(const std::string& name) const {
  for (const auto& p : specs_)
    if (p.name == name) return &p;
  return nullptr;
}

const ParamSpec& ParamTable::get(const std::string& name) const {
  const ParamSpec* p = find(name);
  DHP_CHECK(p, "unknown parameter '{}'", name);
  return *p;
}

void ParamTable::initialise(float* arena, uint64_t seed) const {
  for (const auto& p : specs_) {
    float* x = arena + p.offset;
    const int64_t n = p.numel();
    if (p.init != Init::Normal) {
      std::fill_n(x, n, p.init == Init::Ones ? 1.0f : 0.0f);
      continue;
    }
    Rng rng(mix_seed(seed, name_hash(p.name)));
    // Box-Muller from our own uniform draws: std::normal_distribution differs between
    // standard libraries, and the weights must not.
    for (int64_t i = 0; i < n; i += 2) {
      double u1 = 1.0 - rng.uniform(), u2 = rng.uniform();
      double r = std::sqrt(-2.0 * std::log(u1)), a = 2.0 * M_PI * u2;
      x[i] = float(p.std * r * std::cos(a));
      if (i + 1 < n) x[i + 1] = float(p.std * r * std::sin(a));
    }
  }
}

namespace {

// Every parameter's pointer as at(name) gives it; the optional tensors (q/k/v biases of
// model.attention_bias, the output bias of model.attention_out_bias, the q/k norms of
// model.qk_norm, the pretrained towers' own) null where the table has none.
template <class P, class At>
ModelParamsOf<P> bind_with(const ParamTable& t, const ModelConfig& c, const At& at) {
  auto maybe = [&](const std::string& name) { return t.find(name) ? at(name) : P(nullptr); };
  auto block = [&](const std::string& pre) {
    BlockParamsOf<P> b{};
    b.attn_norm = at(pre + "attn_norm.weight");
    b.wq = at(pre + "attn.wq.weight");
    b.wk = at(pre + "attn.wk.weight");
    b.wv = at(pre + "attn.wv.weight");
    b.wo = at(pre + "attn.wo.weight");
    b.mlp_norm = at(pre + "mlp_norm.weight");
    b.bq = maybe(pre + "attn.wq.bias");
    b.bk = maybe(pre + "attn.wk.bias");
    b.bv = maybe(pre + "attn.wv.bias");
    b.bo = maybe(pre + "attn.wo.bias");
    b.q_norm = maybe(pre + "attn.q_norm.weight");
    b.ls1 = maybe(pre + "attn.ls.weight");
    b.ls2 = maybe(pre + "mlp.ls.weight");
    b.k_norm = maybe(pre + "attn.k_norm.weight");
    b.attn_norm_b = maybe(pre + "attn_norm.bias");
    b.mlp_norm_b = maybe(pre + "mlp_norm.bias");
    if (t.find(pre + "mlp.fc1.weight")) {
      b.w1 = at(pre + "mlp.fc1.weight");
      b.w2 = at(pre + "mlp.fc2.weight");
      b.b1 = maybe(pre + "mlp.fc1.bias");
      b.b2 = maybe(pre + "mlp.fc2.bias");
    } else {
      b.w1 = at(pre + "mlp.w1.weight");
      b.w2 = at(pre + "mlp.w2.weight");
      b.w3 = at(pre + "mlp.w3.weight");
    }
    return b;
  };
  ModelParamsOf<P> p;
  p.patch_embed_w = at("vision.patch_embed.weight");
  p.patch_embed_b = maybe("vision.patch_embed.bias");
  p.class_embed = maybe("vision.class_embed");
  p.pos_embed = maybe("vision.pos_embed.weight");
  p.pre_norm_w = maybe("vision.pre_norm.weight");
  p.pre_norm_b = maybe("vision.pre_norm.bias");
  for (int i = 0; i < c.vision.layers; ++i)
    p.vision_layers.push_back(block("vision.layers." + std::to_string(i) + "."));
  p.vision_norm = maybe("vision.norm.weight");
  p.vision_norm_b = maybe("vision.norm.bias");
  p.proj_norm_w = maybe("projector.norm.weight");
  p.proj_norm_b = maybe("projector.norm.bias");
  p.fc1_w = at("projector.fc1.weight");
  p.fc1_b = at("projector.fc1.bias");
  p.fc2_w = at("projector.fc2.weight");
  p.fc2_b = at("projector.fc2.bias");
  for (size_t j = 0; j < c.vision.deepstack.size(); ++j) {
    const std::string pre = "projector.deepstack." + std::to_string(j) + ".";
    p.deepstack.push_back({at(pre + "norm.weight"), at(pre + "norm.bias"), at(pre + "fc1.weight"),
                           at(pre + "fc1.bias"), at(pre + "fc2.weight"), at(pre + "fc2.bias")});
  }
  p.tok_embed = at("tok_embed.weight");
  for (int i = 0; i < c.layers; ++i) p.layers.push_back(block("layers." + std::to_string(i) + "."));
  p.final_norm = at("final_norm.weight");
  p.lm_head = c.tie_embeddings ? p.tok_embed : at("lm_head.weight");
  return p;
}

}  // namespace

template <class P>
ModelParamsOf<P> bind_params(const ParamTable& t, const ModelConfig& c, P arena) {
  return bind_with<P>(t, c, [&](const std::string& name) { return arena + t.get(name).offset; });
}

ModelParams bind_grads(const ParamTable& t, const ModelConfig& c, float* buffer, const LayerWindow& window) {
  return bind_with<float*>(t, c, [&](const std::string& name) -> float* {
    const ParamSpec& s = t.get(name);
    return s.trainable ? buffer + window.at(s.grad_offset) : nullptr;
  });
}

ModelWeights bind_weights(const ParamTable& t, const ModelConfig& c, Act buffer, const LayerWindow& window) {
  return bind_with<Act>(t, c, [&](const std::string& name) { return buffer + window.at(t.get(name).offset); });
}

template ModelParams bind_params(const ParamTable&, const ModelConfig&, float*);
template ModelWeights bind_params(const ParamTable&, const ModelConfig&, Act);

}  // namespace dhp
