// Hugging Face Llama-family checkpoints (trainer/hf_checkpoint.h) against an independent
// PyTorch implementation of HF's semantics (tests/reference/hf_llama_ref.py) on tiny random
// checkpoints in HF's exact layout (tests/reference/make_hf_fixture.py): logits, loss and every
// gradient; negative controls that must fail; the import's refusals; export round trips.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "core/input.h"
#include "data/chat_template.h"
#include "data/layout.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "tests/error_of.h"
#include "tests/hf_fixture.h"
#include "parallel/mpi_comm.h"
#include "tests/model_fixtures.h"
#include "tests/run_dhp.h"
#include "tests/train_fixture.h"
#include "trainer/checkpoint.h"
#include "trainer/train.h"
#include "trainer/hf_checkpoint.h"
#include "trainer/inference.h"
#include "trainer/safetensors.h"

namespace dhp {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::error_of;
using testing::tensor_bytes;
const auto read_all = testing::safetensors_f32;

const fs::path& root() { return testing::hf_fixture_root(); }
std::string py() { return testing::reference_py(); }
fs::path fixture(const std::string& name, const std::string& args) {
  return testing::hf_fixture("make_hf_fixture.py", name, args);
}

const std::vector<int32_t> kTokens = {1, 5, 9, 33, 200, 17, 3, 99, 250, 7, 64, 12, 301, 45, 2};

struct Result {
  double loss = 0;
  std::vector<float> last_logits;                    // (V) at the last position
  std::map<std::string, std::vector<float>> grads;   // by Hugging Face name
};

Result reference(const fs::path& ckpt, const std::string& flags = "") {
  static int n = 0;
  const fs::path out = root() / ("ref" + std::to_string(n++));
  fs::create_directories(out);
  std::ofstream(out / "tokens.json") << json(kTokens).dump();
  const std::string cmd = py() + "hf_llama_ref.py " + ckpt.string() + " " + (out / "tokens.json").string() +
                          " " + out.string() + " " + flags;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  Result r;
  r.loss = json::parse(std::ifstream(out / "loss.json"))["loss"].get<double>();
  const json cfg = json::parse(std::ifstream(ckpt / "config.json"));
  const int64_t V = cfg["vocab_size"].get<int64_t>(), T = int64_t(kTokens.size());
  std::vector<float> logits(size_t(T * V));
  std::ifstream(out / "logits.bin", std::ios::binary).read(reinterpret_cast<char*>(logits.data()),
                                                           std::streamsize(logits.size() * 4));
  r.last_logits.assign(logits.end() - V, logits.end());
  r.grads = read_all(out / "grads.safetensors");
  return r;
}

ModelConfig config_of(const fs::path& ckpt) {
  return read_hf_config(ckpt.string(), testing::tiny_config(), 0).model;
}

// Every [model] key of a config as TOML writes it: what compares two model configs.
std::string to_toml_model(const ModelConfig& m) {
  Config c;
  c.model = m;
  std::string out;
  for (const auto& [key, value] : config_entries(c))
    if (key.rfind("model.", 0) == 0) out += key + " = " + value + "\n";
  return out;
}

Result run_dhp(const fs::path& ckpt, const fs::path& weights_from = {}) {
  const ModelConfig cfg = config_of(ckpt);
  auto backend = make_cpu_backend({1});
  Model m(cfg, *backend);
  m.initialise(3);
  import_hf_checkpoint((weights_from.empty() ? ckpt : weights_from).string(), m);
  Batch b;
  b.T = int64_t(kTokens.size());
  b.tokens = kTokens;
  for (int64_t t = 0; t < b.T; ++t) {
    b.targets.push_back(t + 1 < b.T ? kTokens[size_t(t + 1)] : -1);
    b.doc.push_back(0);
    b.pos.push_back(int32_t(t));
    b.image_slot.push_back(-1);
  }
  Result r;
  m.zero_grads();
  const float scale = 1.0f / float(b.loss_tokens());
  r.loss = m.step(b, scale, true).loss_sum * scale;
  for (const auto& bind : hf_name_map(cfg)) {
    const ParamSpec& s = m.table().get(bind.dhp);
    r.grads[bind.hf].assign(m.grads() + s.offset, m.grads() + s.offset + s.numel());
  }
  Batch prompt = b;
  prompt.targets.assign(size_t(b.T), -1);
  SamplingOptions opt;
  opt.max_new_tokens = 0;  // the logits of the last prompt position only
  m.generate(prompt, -1, opt, &r.last_logits);
  return r;
}

// How far dhp is from the reference, each relative to its scale.
struct Distance {
  double loss = 0, logits = 0, grads = 0;
  std::string worst;  // the tensor with the largest gradient distance
};

// `control`: the reference is a negative control, which may leave a tensor without a gradient
// (--no-qk-norm); its distance is then infinite.
Distance distance(const Result& ref, const Result& got, bool control = false) {
  Distance d;
  d.loss = std::abs(ref.loss - got.loss) / std::abs(ref.loss);
  double lmax = 0, lerr = 0;
  for (size_t i = 0; i < ref.last_logits.size() && i < got.last_logits.size(); ++i) {
    lmax = std::max(lmax, double(std::abs(ref.last_logits[i])));
    lerr = std::max(lerr, double(std::abs(ref.last_logits[i] - got.last_logits[i])));
  }
  d.logits = ref.last_logits.size() == got.last_logits.size() ? lerr / lmax : INFINITY;
  EXPECT_EQ(ref.grads.size(), got.grads.size());
  for (const auto& [name, g] : got.grads) {
    const auto it = ref.grads.find(name);
    if (it == ref.grads.end() || it->second.size() != g.size()) {
      ADD_FAILURE() << name << " has no gradient of its size in the reference";
      continue;
    }
    double mref = 0, err = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      mref = std::max(mref, double(std::abs(it->second[i])));
      err = std::max(err, double(std::abs(it->second[i] - g[i])));
    }
    if (!control) {
      EXPECT_GT(mref, 0.0) << name << " got no gradient in the reference";
    }
    if (err / mref > d.grads) d.grads = err / mref, d.worst = name;
  }
  return d;
}

// fp32 on both sides with different summation orders: the loss to ~1e-6 relative, each
// tensor's gradient to 1e-4 of its largest entry (sums over ~100 terms, then a softmax).
constexpr double kLossTol = 2e-5, kLogitsTol = 1e-4, kGradTol = 1e-4;

void expect_matches(const fs::path& ckpt, double loss_tol = kLossTol) {
  const Distance d = distance(reference(ckpt), run_dhp(ckpt));
  EXPECT_LT(d.loss, loss_tol) << ckpt;
  EXPECT_LT(d.logits, kLogitsTol) << ckpt;
  EXPECT_LT(d.grads, kGradTol) << ckpt << ": worst " << d.worst;
  std::printf("[ distance ] %s: loss %.2e, last logits %.2e, gradients %.2e (%s)\n",
              ckpt.filename().c_str(), d.loss, d.logits, d.grads, d.worst.c_str());
}

// A control that must fail: far outside the tolerances, not just at their edge.
void expect_differs(const Distance& d, const std::string& what) {
  EXPECT_TRUE(d.loss > 10 * kLossTol || d.grads > 10 * kGradTol)
      << what << " went unnoticed: loss " << d.loss << ", gradients " << d.grads;
}

TEST(HfReference, LlamaMhaUntiedF32) { expect_matches(fixture("mha", "--heads 4 --kv 4")); }
TEST(HfReference, LlamaGqaTiedBf16) { expect_matches(fixture("gqa_tied_bf16", "--kv 2 --tied --dtype bf16")); }
TEST(HfReference, Qwen2WithQkvBiases) { expect_matches(fixture("qwen2", "--arch qwen2 --kv 2")); }
TEST(HfReference, ShardedF16) { expect_matches(fixture("sharded", "--kv 2 --shards 3 --dtype f16")); }
TEST(HfReference, MistralMqa) { expect_matches(fixture("mistral", "--arch mistral --kv 1 --layers 3")); }

// Qwen3 and Llama-3.x (tests/reference/check_hf_decoder_refs.py checks these fixtures'
// negative controls on the reference itself): a std above 0.02 where the logits would
// otherwise be too small for a wrong model to show in the loss. The loss to 1e-5 relative.
constexpr double kNewLossTol = 1e-5;
const char* const kQwen3Hd16Tied = "--arch qwen3 --head-dim 16 --tied --std 0.05";
const char* const kQwen3GqaBf16 = "--arch qwen3 --kv 1 --layers 3 --dtype bf16 --theta 1000000";
const char* const kQwen3BiasHd12 = "--arch qwen3 --attention-bias --head-dim 12 --kv 2 --std 0.08";
const char* const kLlama31 = "--rope-scaling llama3 --std 0.1";
const char* const kLlama32TiedBf16 =
    "--rope-scaling llama3 --rope-factor 32 --std 0.15 --tied --dtype bf16 --hidden 64 --heads 4 --ffn 96";

// Qwen3-0.6B's shape in small: head_dim 16 against hidden/heads 8, tied embeddings.
TEST(HfReference, Qwen3HeadDimTied) {
  const fs::path ck = fixture("qwen3_hd16_tied", kQwen3Hd16Tied);
  const ModelConfig c = config_of(ck);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.hd(), 16);
  EXPECT_FALSE(c.attention_bias || c.attention_out_bias);
  expect_matches(ck, kNewLossTol);
}
TEST(HfReference, Qwen3MqaBf16Theta1e6) { expect_matches(fixture("qwen3_gqa_bf16", kQwen3GqaBf16), kNewLossTol); }
// attention_bias: q, k, v and o_proj biased.
TEST(HfReference, Qwen3AttentionBias) {
  const fs::path ck = fixture("qwen3_bias_hd12", kQwen3BiasHd12);
  EXPECT_TRUE(config_of(ck).attention_out_bias);
  expect_matches(ck, kNewLossTol);
}
TEST(HfReference, Llama31RopeScaling) {
  const fs::path ck = fixture("llama31", kLlama31);
  EXPECT_EQ(config_of(ck).rope_scaling, RopeScaling::llama3);
  expect_matches(ck, kNewLossTol);
}
// Llama-3.2 1B/3B: scaling factor 32 with tied embeddings, bf16.
TEST(HfReference, Llama32RopeScalingTiedBf16) {
  expect_matches(fixture("llama32_tied_bf16", kLlama32TiedBf16), kNewLossTol);
}
// Llama's attention_bias (q, k, v and o_proj), now that the decoder has an output bias.
TEST(HfReference, LlamaAttentionBias) {
  expect_matches(fixture("llama_bias", "--attention-bias --kv 2 --std 0.05"), kNewLossTol);
}
// transformers 5's config.json (one rope_parameters object): the same model as the older form.
TEST(HfReference, RopeParametersOfTransformers5) {
  for (const auto& [name, args] : {std::pair{"qwen3_hd16_tied", kQwen3Hd16Tied}, std::pair{"llama31", kLlama31}}) {
    const fs::path v4 = fixture(name, args), v5 = fixture(std::string(name) + "_v5", std::string(args) + " --rope-parameters");
    const json c = json::parse(std::ifstream(v5 / "config.json"));
    ASSERT_TRUE(c.contains("rope_parameters") && !c.contains("rope_theta")) << c.dump();
    EXPECT_EQ(to_toml_model(config_of(v4)), to_toml_model(config_of(v5))) << name;
    expect_matches(v5, kNewLossTol);
  }
}

// The controls dhp must miss by far (loss and last-position logits both beyond 10x their
// tolerances): the reference without Qwen3's q/k norms, with them after RoPE instead of before,
// and without Llama-3.x's scaling.
void expect_misses(const fs::path& ck, const std::string& flags) {
  const Distance d = distance(reference(ck, flags), run_dhp(ck), true);
  std::printf("[ control  ] %s %s: loss %.2e, last logits %.2e, gradients %.2e\n", ck.filename().c_str(),
              flags.c_str(), d.loss, d.logits, d.grads);
  EXPECT_GT(d.loss, 10 * kNewLossTol) << ck << " " << flags;
  EXPECT_GT(d.logits, 10 * kLogitsTol) << ck << " " << flags;
}

TEST(HfNegative, Qwen3WithoutQkNormFails) {
  expect_misses(fixture("qwen3_hd16_tied", kQwen3Hd16Tied), "--no-qk-norm");
  expect_misses(fixture("qwen3_bias_hd12", kQwen3BiasHd12), "--no-qk-norm");
}
TEST(HfNegative, Qwen3QkNormAfterRopeFails) {
  expect_misses(fixture("qwen3_hd16_tied", kQwen3Hd16Tied), "--qk-norm-after-rope");
  expect_misses(fixture("qwen3_gqa_bf16", kQwen3GqaBf16), "--qk-norm-after-rope");
}
TEST(HfNegative, Llama3WithoutRopeScalingFails) {
  expect_misses(fixture("llama31", kLlama31), "--no-rope-scaling");
  expect_misses(fixture("llama32_tied_bf16", kLlama32TiedBf16), "--no-rope-scaling");
}

// HF's RoPE pairs (x[i], x[i + hd/2]); the interleaved pairing (x[2i], x[2i+1]) must be told
// apart, or the comparison above would not prove the convention.
TEST(HfNegative, InterleavedRopeFails) {
  const fs::path ck = fixture("gqa_tied_bf16", "--kv 2 --tied --dtype bf16");
  expect_differs(distance(reference(ck, "--interleaved-rope"), run_dhp(ck)), "interleaved RoPE");
}

TEST(HfNegative, WrongEpsFails) {
  const fs::path ck = fixture("mha", "--heads 4 --kv 4");  // rms_norm_eps 1e-5
  expect_differs(distance(reference(ck, "--eps 1e-6"), run_dhp(ck)), "rms_norm_eps 1e-6 for 1e-5");
}

// A square q_proj stored transposed passes every shape check; only the numbers catch it.
TEST(HfNegative, TransposedSquareWeightFailsNumerically) {
  const fs::path good = fixture("mha", "--heads 4 --kv 4");
  const fs::path bad = fixture("mha_transposed", "--heads 4 --kv 4 --transpose model.layers.0.self_attn.q_proj.weight");
  ASSERT_EQ(config_of(good).dim, config_of(good).q_dim());
  expect_differs(distance(reference(good), run_dhp(good, bad)), "a transposed q_proj");
}

// A refused folder names what is wrong and leaves the model as it was.
std::string refused(const fs::path& ckpt, const ModelConfig& cfg) {
  auto backend = make_cpu_backend({1});
  Model m(cfg, *backend);
  m.initialise(9);
  const std::vector<float> before = m.download_params();
  const std::string msg = error_of([&] { import_hf_checkpoint(ckpt.string(), m); });
  EXPECT_EQ(before, m.download_params()) << "the model changed: " << msg;
  return msg;
}

TEST(HfImport, RefusesMissingExtraTransposedAndWrongDtype) {
  const ModelConfig cfg = config_of(fixture("mha", "--heads 4 --kv 4"));
  const std::string up = "model.layers.1.mlp.up_proj.weight";
  std::string msg = refused(fixture("missing", "--heads 4 --kv 4 --drop " + up), cfg);
  EXPECT_NE(msg.find("has no tensor '" + up + "'"), std::string::npos) << msg;
  msg = refused(fixture("extra", "--heads 4 --kv 4 --extra model.layers.0.mlp.extra.weight"), cfg);
  EXPECT_NE(msg.find("'model.layers.0.mlp.extra.weight'"), std::string::npos) << msg;
  const std::string gate = "model.layers.0.mlp.gate_proj.weight";
  msg = refused(fixture("transposed", "--heads 4 --kv 4 --transpose " + gate), cfg);
  EXPECT_NE(msg.find(gate + "' has shape [32, 48]"), std::string::npos) << msg;
  const std::string k = "model.layers.1.self_attn.k_proj.weight";
  msg = refused(fixture("int", "--heads 4 --kv 4 --wrong-dtype " + k), cfg);
  EXPECT_NE(msg.find(k + "' has dtype I32"), std::string::npos) << msg;
  // lm_head in a tied checkpoint.
  const fs::path tied = fixture("tied_extra_head", "--heads 4 --kv 4 --tied --extra lm_head.weight");
  msg = refused(tied, config_of(tied));
  EXPECT_NE(msg.find("tie_word_embeddings"), std::string::npos) << msg;
  // A config.json of another shape than the model's.
  ModelConfig other = cfg;
  other.ffn = 64;
  msg = refused(fixture("mha", "--heads 4 --kv 4"), other);
  EXPECT_NE(msg.find("model.ffn is 64 here, 48 in the checkpoint"), std::string::npos) << msg;
}

// The ignore list: RoPE's saved inverse frequencies load as if absent.
TEST(HfImport, IgnoresRotaryInverseFrequencies) {
  const fs::path ck = fixture("inv_freq", "--heads 4 --kv 4 --extra model.layers.0.self_attn.rotary_emb.inv_freq");
  auto backend = make_cpu_backend({1});
  Model m(config_of(ck), *backend);
  const HfImport r = import_hf_checkpoint(ck.string(), m);
  EXPECT_EQ(r.imported.size(), hf_name_map(m.config()).size());
}

TEST(HfImport, ShardIndexMustAgreeWithItsShards) {
  const fs::path src = fixture("sharded", "--kv 2 --shards 3 --dtype f16");
  const fs::path ck = root() / "bad_index";
  fs::remove_all(ck);
  fs::copy(src, ck);
  json index = json::parse(std::ifstream(ck / "model.safetensors.index.json"));
  index["weight_map"]["model.norm.weight"] = "model-00001-of-00003.safetensors";
  std::ofstream(ck / "model.safetensors.index.json") << index.dump();
  const std::string msg = refused(ck, config_of(ck));
  EXPECT_NE(msg.find("model.norm.weight"), std::string::npos) << msg;
  index["weight_map"]["model.norm.weight"] = "../escape.safetensors";
  std::ofstream(ck / "model.safetensors.index.json") << index.dump();
  EXPECT_NE(refused(ck, config_of(ck)).find("not a file name in the folder"), std::string::npos);
}

// Added tokens grow tok_embed and lm_head; the new rows start at the mean of the file's rows.
TEST(HfImport, VocabularyGrowsWithRowsAtTheMean) {
  const fs::path ck = fixture("mha", "--heads 4 --kv 4");
  ModelConfig cfg = config_of(ck);
  const int64_t V0 = cfg.vocab_size, d = cfg.dim;
  cfg.vocab_size = int(V0 + 64);
  auto backend = make_cpu_backend({1});
  Model m(cfg, *backend);
  const HfImport r = import_hf_checkpoint(ck.string(), m);
  EXPECT_EQ(r.grown_rows, 64);
  const auto file = read_all(ck / "model.safetensors");
  for (const auto& [hf, dhp] : {std::pair{"model.embed_tokens.weight", "tok_embed.weight"},
                                std::pair{"lm_head.weight", "lm_head.weight"}}) {
    const std::vector<float>& w = file.at(hf);
    const float* p = m.params() + m.table().get(dhp).offset;
    EXPECT_EQ(0, std::memcmp(p, w.data(), w.size() * 4)) << dhp;
    for (int64_t c = 0; c < d; ++c) {
      double mean = 0;
      for (int64_t v = 0; v < V0; ++v) mean += w[size_t(v * d + c)];
      mean /= double(V0);
      for (int64_t v = V0; v < V0 + 64; ++v) ASSERT_FLOAT_EQ(p[v * d + c], float(mean)) << dhp << " row " << v;
    }
  }
  // A vocabulary smaller than the file's is refused.
  EXPECT_NE(error_of([&] { read_hf_config(ck.string(), cfg, 0, int(V0 - 1)); }).find("never shrink"),
            std::string::npos);
}

// config.json keys dhp does not implement are refused by name, with the file.
TEST(HfConfig, RefusesWhatDhpDoesNotImplement) {
  const fs::path src = fixture("mha", "--heads 4 --kv 4");
  const json base = json::parse(std::ifstream(src / "config.json"));
  auto with = [&](const std::string& name, const json& patch, int64_t max_tokens = 4096) {
    const fs::path dir = root() / ("cfg_" + name);
    fs::create_directories(dir);
    json c = base;
    c.merge_patch(patch);
    std::ofstream(dir / "config.json") << c.dump();
    return error_of([&] { read_hf_config(dir.string(), testing::tiny_config(), max_tokens); });
  };
  EXPECT_EQ(with("same", json::object()), "");
  for (const auto& [key, patch] :
       std::vector<std::pair<std::string, json>>{
           {"rope_scaling", {{"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}}}},
           {"hidden_act", {{"hidden_act", "gelu"}}},
           {"mlp_bias", {{"mlp_bias", true}}},
           {"rope_scaling", {{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}}}},
           {"rope_scaling", {{"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                                               {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64},
                                               {"attention_factor", 2.0}}}}},
           {"rope_parameters", {{"rope_parameters", {{"rope_type", "dynamic"}, {"rope_theta", 500.0}, {"factor", 2.0}}}}},
           {"quantization_config", {{"quantization_config", {{"bits", 4}}}}},
           {"architectures", {{"architectures", {"GPTNeoXForCausalLM"}}}},
           {"sliding_window", {{"sliding_window", 1024}}},
           {"num_key_value_heads", {{"num_key_value_heads", 3}}}}) {
    const std::string msg = with(key, patch);
    EXPECT_NE(msg.find("\"" + key + "\""), std::string::npos) << key << ": " << msg;
    EXPECT_NE(msg.find("config.json"), std::string::npos) << key << ": " << msg;
  }
  // "dynamic" is plain RoPE within max_position_embeddings (2048 here): accepted for sequences
  // that stay within it.
  EXPECT_EQ(with("dynamic_ok", {{"rope_scaling", {{"rope_type", "dynamic"}, {"factor", 2.0}}}}, 2048), "");
  // A window as long as every sequence is full attention.
  EXPECT_EQ(with("window_ok", {{"sliding_window", 1024}}, 1024), "");
  // Llama's attention_bias biases q, k, v and o_proj, as dhp's decoder can.
  EXPECT_EQ(with("llama_bias", {{"attention_bias", true}}), "");
  // Qwen3: any sliding window, whatever its length; Mistral: attention biases.
  const json qwen3 = json::parse(std::ifstream(fixture("qwen3_hd16_tied", kQwen3Hd16Tied) / "config.json"));
  auto with_qwen3 = [&](const std::string& name, const json& patch) {
    const fs::path dir = root() / ("cfg_qwen3_" + name);
    fs::create_directories(dir);
    json c = qwen3;
    c.merge_patch(patch);
    std::ofstream(dir / "config.json") << c.dump();
    return error_of([&] { read_hf_config(dir.string(), testing::tiny_config(), 64); });
  };
  EXPECT_EQ(with_qwen3("same", json::object()), "");
  for (const auto& [key, patch] : std::vector<std::pair<std::string, json>>{
           {"use_sliding_window", {{"use_sliding_window", true}, {"sliding_window", 100000}}},
           {"layer_types", {{"layer_types", {"full_attention", "sliding_attention"}}}},
           {"rope_scaling", {{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}}}}}) {
    const std::string msg = with_qwen3(key, patch);
    EXPECT_NE(msg.find("\"" + key + "\""), std::string::npos) << key << ": " << msg;
    EXPECT_NE(msg.find("config.json"), std::string::npos) << key << ": " << msg;
  }
  EXPECT_EQ(with_qwen3("full_layers", {{"layer_types", {"full_attention", "full_attention"}}}), "");
  // Qwen3Config's head_dim defaults to 128, not hidden / heads.
  json no_head_dim = qwen3;
  no_head_dim.erase("head_dim");
  const fs::path dir = root() / "cfg_qwen3_no_head_dim";
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << no_head_dim.dump();
  EXPECT_EQ(read_hf_config(dir.string(), testing::tiny_config(), 0).model.hd(), 128);
  const std::string msg = with("mistral_bias", {{"architectures", {"MistralForCausalLM"}}, {"attention_bias", true}});
  EXPECT_NE(msg.find("\"attention_bias\""), std::string::npos) << msg;
  // Harmless keys dhp does not read are accepted.
  EXPECT_EQ(with("harmless", {{"torch_dtype", "float16"}, {"bos_token_id", 7}, {"something_new", 1}}), "");
}

// Import then export gives the file's bytes back, tensor by tensor.
void expect_round_trip(const fs::path& ck, const std::string& dtype, int64_t shard_bytes,
                       const std::string& name) {
  auto backend = make_cpu_backend({1});
  Model m(config_of(ck), *backend);
  const HfImport r = import_hf_checkpoint(ck.string(), m);
  EXPECT_EQ(r.dtype, dtype);
  HfExportOptions o;
  o.dir = (root() / name).string();
  o.dtype = dtype;
  o.max_shard_bytes = shard_bytes;
  export_hf_checkpoint(m, o);
  EXPECT_EQ(tensor_bytes(ck), tensor_bytes(o.dir)) << name;
  // And it reads back.
  Model again(config_of(o.dir), *backend);
  import_hf_checkpoint(o.dir, again);
  EXPECT_EQ(m.download_params(), again.download_params());
}

TEST(HfExport, ImportExportIsByteIdentical) {
  expect_round_trip(fixture("mha", "--heads 4 --kv 4"), "F32", int64_t(1) << 30, "rt_f32");
  expect_round_trip(fixture("gqa_tied_bf16", "--kv 2 --tied --dtype bf16"), "BF16", int64_t(1) << 30, "rt_bf16");
  expect_round_trip(fixture("qwen2", "--arch qwen2 --kv 2"), "F32", int64_t(1) << 30, "rt_qwen2");
  const json c = json::parse(std::ifstream(root() / "rt_qwen2" / "config.json"));
  EXPECT_EQ(c["model_type"], "qwen2");
  EXPECT_EQ(c["architectures"][0], "Qwen2ForCausalLM");
}

// Qwen3 and Llama-3.x: import then export gives the file's tensors back; a second export of
// that export's import is the same files byte for byte; config.json names the family and
// carries its keys (transformers 5's rope_parameters come out in the older form).
void expect_second_export_identical(const fs::path& first, const std::string& dtype, const std::string& name) {
  auto backend = make_cpu_backend({1});
  Model m(config_of(first), *backend);
  import_hf_checkpoint(first.string(), m);
  HfExportOptions o;
  o.dir = (root() / name).string();
  o.dtype = dtype;
  export_hf_checkpoint(m, o);
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors"}) {
    std::ifstream a(first / f, std::ios::binary), b(fs::path(o.dir) / f, std::ios::binary);
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(a), {}), std::string(std::istreambuf_iterator<char>(b), {}))
        << name << ": " << f;
  }
}

TEST(HfExport, Qwen3AndLlama3RoundTripsAreByteIdentical) {
  expect_round_trip(fixture("qwen3_hd16_tied", kQwen3Hd16Tied), "F32", int64_t(1) << 30, "rt_qwen3");
  expect_round_trip(fixture("qwen3_bias_hd12", kQwen3BiasHd12), "F32", int64_t(1) << 30, "rt_qwen3_bias");
  expect_round_trip(fixture("qwen3_gqa_bf16", kQwen3GqaBf16), "BF16", int64_t(1) << 30, "rt_qwen3_bf16");
  expect_round_trip(fixture("llama31", kLlama31), "F32", int64_t(1) << 30, "rt_llama31");
  expect_round_trip(fixture("llama32_tied_bf16", kLlama32TiedBf16), "BF16", int64_t(1) << 30, "rt_llama32");
  expect_round_trip(fixture("llama31_v5", std::string(kLlama31) + " --rope-parameters"), "F32", int64_t(1) << 30,
                    "rt_llama31_v5");
  expect_round_trip(fixture("llama_bias", "--attention-bias --kv 2 --std 0.05"), "F32", int64_t(1) << 30, "rt_llama_bias");
  for (const auto& [name, dtype] : {std::pair{"rt_qwen3", "F32"}, std::pair{"rt_qwen3_bias", "F32"},
                                    std::pair{"rt_qwen3_bf16", "BF16"}, std::pair{"rt_llama31", "F32"},
                                    std::pair{"rt_llama32", "BF16"}, std::pair{"rt_llama31_v5", "F32"},
                                    std::pair{"rt_llama_bias", "F32"}})
    expect_second_export_identical(root() / name, dtype, std::string(name) + "_again");
  const json q = json::parse(std::ifstream(root() / "rt_qwen3_bias" / "config.json"));
  EXPECT_EQ(q["architectures"][0], "Qwen3ForCausalLM");
  EXPECT_EQ(q["model_type"], "qwen3");
  EXPECT_EQ(q["head_dim"], 12);
  EXPECT_EQ(q["attention_bias"], true);
  EXPECT_EQ(q["use_sliding_window"], false);
  EXPECT_TRUE(q["rope_scaling"].is_null());
  const json fixture_l = json::parse(std::ifstream(fixture("llama31", kLlama31) / "config.json"));
  for (const char* name : {"rt_llama31", "rt_llama31_v5"}) {
    const json l = json::parse(std::ifstream(root() / name / "config.json"));
    EXPECT_EQ(l["architectures"][0], "LlamaForCausalLM");
    EXPECT_EQ(l["rope_scaling"], fixture_l["rope_scaling"]) << name;
    EXPECT_EQ(l["rope_theta"], fixture_l["rope_theta"]) << name;
  }
  EXPECT_EQ(json::parse(std::ifstream(root() / "rt_llama_bias" / "config.json"))["attention_bias"], true);
  EXPECT_EQ(json::parse(std::ifstream(root() / "rt_llama32" / "config.json"))["tie_word_embeddings"], true);
}

// Biases no Hugging Face class has (q/k/v without o_proj in Qwen3, o_proj alone) are refused
// before any file is written.
TEST(HfExport, RefusesBiasesNoClassHolds) {
  auto backend = make_cpu_backend({1});
  for (const auto& [qk_norm, qkv, out] : {std::tuple{true, true, false}, std::tuple{false, false, true}}) {
    ModelConfig cfg = config_of(fixture("qwen3_hd16_tied", kQwen3Hd16Tied));
    cfg.qk_norm = qk_norm;
    cfg.attention_bias = qkv;
    cfg.attention_out_bias = out;
    Model m(cfg, *backend);
    m.initialise(1);
    HfExportOptions o;
    o.dir = (root() / "refused_biases").string();
    const std::string msg = error_of([&] { export_hf_checkpoint(m, o); });
    EXPECT_NE(msg.find("o_proj"), std::string::npos) << msg;
    EXPECT_FALSE(fs::exists(fs::path(o.dir) / "model.safetensors"));
    EXPECT_FALSE(fs::exists(fs::path(o.dir) / "config.json"));
  }
}

TEST(HfExport, ShardsWithAnExactIndex) {
  const fs::path ck = fixture("mha", "--heads 4 --kv 4");
  expect_round_trip(ck, "F32", 20000, "shards");
  const fs::path out = root() / "shards";
  const json index = json::parse(std::ifstream(out / "model.safetensors.index.json"));
  int64_t total = 0;
  std::set<std::string> files;
  for (const auto& [name, file] : index["weight_map"].items()) files.insert(file.get<std::string>());
  for (const auto& f : files) {
    const InputFile in("shard", (out / f).string());
    const SafetensorsHeader h = read_safetensors_header(in, f);
    for (const auto& t : h.tensors) {
      EXPECT_EQ(index["weight_map"][t.name], f) << t.name;
      total += t.end - t.begin;
    }
  }
  EXPECT_GT(files.size(), 2u);
  EXPECT_EQ(index["weight_map"].size(), hf_name_map(config_of(ck)).size());
  EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), total);
  EXPECT_FALSE(fs::exists(out / "model.safetensors"));
  // One file again: the earlier shards and index go with the new export.
  expect_round_trip(ck, "F32", int64_t(1) << 30, "shards");
  EXPECT_TRUE(fs::exists(out / "model.safetensors"));
  EXPECT_FALSE(fs::exists(out / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(out / "model-00001-of-00003.safetensors"));
}

// `dhp eval` and `dhp generate` of a decoder's folder use its vocabulary as it is, with no
// flag: the rows, and so the softmax, of the file (what transformers computes). Asked for,
// data.added_tokens = "auto" still adds LLaVA's <image> and <pad> and grows the rows.
TEST(HfEval, AFolderIsEvaluatedWithItsOwnVocabulary) {
  // The file's rows exactly the tokenizer's 300 pieces, as a real Llama's 32000 are.
  const fs::path ck = fixture("llama_tok300", "--kv 2 --tokenizer --vocab 300");
  const int64_t file_vocab = json::parse(std::ifstream(ck / "config.json"))["vocab_size"].get<int64_t>();
  const Config plain = inference_config(ck.string(), {});
  EXPECT_EQ(plain.data.added_tokens, "none");
  EXPECT_EQ(plain.model.vocab_size, file_vocab);
  EXPECT_EQ(plain.data.tokenizer, ck.string());
  const Config grown = inference_config(ck.string(), {"--data.added_tokens=auto"});
  EXPECT_GT(grown.model.vocab_size, file_vocab) << "the negative control: auto grows a Llama folder's rows";
}

// `dhp eval --checkpoint FOLDER` with no other flag gives the loss transformers computes: the
// mean next-token loss over the answer's tokens from the logits of the reference
// (hf_llama_ref.py, written from modeling_llama.py) on the ids dhp lays the sample out as.
// Negative control: data.added_tokens = "auto" (the rows LLaVA's layout would add) moves it.
TEST(HfEval, EvalOfAFolderIsTheReferenceLoss) {
  const fs::path ck = fixture("llama_tok300", "--kv 2 --tokenizer --vocab 300");
  const fs::path dir = root() / "eval_ref";
  fs::create_directories(dir);
  const std::vector<Turn> turns = {{"human", "What color is the circle at the top left?"},
                                   {"gpt", "It is red, and the square is blue."}};
  std::ofstream(dir / "m.jsonl") << json{{"id", "a"}, {"conversations", {{{"from", "human"}, {"value", turns[0].value}},
                                                                          {{"from", "gpt"}, {"value", turns[1].value}}}}}
                                        .dump()
                                 << "\n";
  auto eval_loss = [&](const std::string& extra) {
    fs::remove(dir / "eval.json");
    const testing::Outcome e = testing::run_dhp("eval --checkpoint " + ck.string() + " --data " + (dir / "m.jsonl").string() +
                                                    " --json " + (dir / "eval.json").string() + extra, dir);
    EXPECT_EQ(e.status, 0) << e.output;
    return json::parse(std::ifstream(dir / "eval.json"))["real"]["loss"].get<double>();
  };
  // The ids dhp trains and evaluates on: the folder's tokenizer, the default template.
  const Tokenizer tok(ck.string(), "none");
  std::vector<int32_t> layout;
  std::vector<uint8_t> mask;
  layout_conversation(ChatTemplate::Dhp, turns, tok, layout, mask);
  const StoredLayout stored{layout.data(), mask.data(), int64_t(layout.size()), {}, tok.ids()};
  const Sample sample = expand_layout(stored, 0, full_length(stored), nullptr, 2, ImageLoad::Skip);
  std::ofstream(dir / "tokens.json") << json(sample.tokens).dump();
  const std::string cmd = py() + "hf_llama_ref.py " + ck.string() + " " + (dir / "tokens.json").string() + " " + dir.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const int64_t V = 300, T = int64_t(sample.tokens.size());
  std::vector<float> logits(size_t(T * V));
  std::ifstream(dir / "logits.bin", std::ios::binary).read(reinterpret_cast<char*>(logits.data()), std::streamsize(logits.size() * 4));
  double sum = 0;
  int targets = 0;
  for (int64_t t = 1; t < T; ++t) {
    if (!sample.loss_mask[size_t(t)]) continue;
    const float* row = logits.data() + (t - 1) * V;
    double mx = row[0], z = 0;
    for (int64_t v = 1; v < V; ++v) mx = std::max(mx, double(row[v]));
    for (int64_t v = 0; v < V; ++v) z += std::exp(double(row[v]) - mx);
    sum += mx + std::log(z) - double(row[sample.tokens[size_t(t)]]);
    ++targets;
  }
  ASSERT_GT(targets, 5);
  const double want = sum / targets;
  EXPECT_NEAR(eval_loss(""), want, 1e-5 * want);
  EXPECT_GT(std::abs(eval_loss(" --data.added_tokens=auto") - want), 1e-3 * want) << "the negative control";
}

TEST(HfExport, TokenizerFilesAndOutputRules) {
  const fs::path ck = fixture("llama_tok", "--kv 2 --tokenizer");
  auto backend = make_cpu_backend({1});
  ModelConfig cfg = config_of(ck);
  cfg.vocab_size += 64;  // room for the added tokens
  Model m(cfg, *backend);
  import_hf_checkpoint(ck.string(), m);
  HfTokenizerFiles tok;
  tok.sentencepiece_model = (ck / "tokenizer.model").string();
  tok.unk = {"<unk>", 0};
  tok.bos = {"<s>", 1};
  tok.eos = {"</s>", 2};
  tok.pad = {"<pad>", 321};
  tok.added = {{"<image>", 320}, {"<pad>", 321}};
  HfExportOptions o;
  o.dir = (root() / "tok_out").string();
  o.dtype = "BF16";
  o.tokenizer = &tok;
  // A folder holding another program's config.json is refused before anything is written.
  fs::create_directories(o.dir);
  std::ofstream(fs::path(o.dir) / "config.json") << "{\"mine\": 1}";
  std::string msg = error_of([&] { export_hf_checkpoint(m, o); });
  EXPECT_NE(msg.find("config.json"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(fs::path(o.dir) / "model.safetensors"));
  o.force = true;
  export_hf_checkpoint(m, o);
  o.force = false;
  export_hf_checkpoint(m, o);  // its own earlier export is replaced without --force
  const fs::path out = o.dir;
  EXPECT_EQ(json::parse(std::ifstream(out / "added_tokens.json")), json({{"<image>", 320}, {"<pad>", 321}}));
  const json tc = json::parse(std::ifstream(out / "tokenizer_config.json"));
  EXPECT_EQ(tc["bos_token"], "<s>");
  EXPECT_EQ(tc["pad_token"], "<pad>");
  EXPECT_EQ(tc["added_tokens_decoder"]["320"]["content"], "<image>");
  const json c = json::parse(std::ifstream(out / "config.json"));
  EXPECT_EQ(c["vocab_size"], cfg.vocab_size);
  EXPECT_EQ(c["torch_dtype"], "bfloat16");
  EXPECT_EQ(c["pad_token_id"], 321);
  std::ifstream a(ck / "tokenizer.model", std::ios::binary), b(out / "tokenizer.model", std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(a), {}), std::string(std::istreambuf_iterator<char>(b), {}));
  // An added token outside the vocabulary is refused before a file is touched.
  tok.added.push_back({"<video>", cfg.vocab_size});
  msg = error_of([&] { export_hf_checkpoint(m, o); });
  EXPECT_NE(msg.find("<video>"), std::string::npos) << msg;
}

// model.init: the decoder's shape and weights from the folder (the vocabulary the file's, the
// run's tokenizer being smaller), the vision tower and projector seeded as in a fresh run; the run's
// checkpoint records it, so a resume and an export see the same model.
TEST(HfTrain, StartsFromTheFolder) {
  auto world = start_world(nullptr, nullptr);
  const fs::path ck = fixture("train", "--hidden 64 --heads 4 --kv 2 --ffn 128 --dtype bf16 --vocab 320");
  const fs::path dir = testing::run_dir("hf_init");
  // Zero steps: the run saves the weights it started from.
  const Config cfg = testing::small_config(0, dir, {"--model.init=" + ck.string(), "--model.dim=16"});
  const TrainResult r = train(cfg, *world);
  const Config saved = checkpoint_config(r.checkpoint);
  EXPECT_EQ(saved.model.dim, 64);
  EXPECT_EQ(saved.model.vocab_size, 320);
  EXPECT_DOUBLE_EQ(saved.model.rms_norm_eps, 1e-5);
  EXPECT_EQ(saved.model.vision.dim, cfg.model.vision.dim);
  auto backend = make_cpu_backend({1});
  Model m(saved.model, *backend);
  load_checkpoint(r.checkpoint, m, nullptr);
  const auto file = read_all(ck / "model.safetensors");
  for (const auto& b : hf_name_map(saved.model)) {
    const ParamSpec& s = m.table().get(b.dhp);
    EXPECT_EQ(0, std::memcmp(m.params() + s.offset, file.at(b.hf).data(), size_t(s.numel()) * 4)) << b.dhp;
  }
  std::vector<float> seeded(size_t(m.n_params()));
  m.table().initialise(seeded.data(), cfg.train.seed);
  const ParamSpec& pe = m.table().get("vision.patch_embed.weight");
  EXPECT_EQ(0, std::memcmp(m.params() + pe.offset, seeded.data() + pe.offset, size_t(pe.numel()) * 4));
  // `dhp export --format hf` of that checkpoint: by default in the dtype the run started from,
  // so the decoder's bytes are the folder's; a foreign file in the folder is refused by name.
  const fs::path out = dir / "hf";
  testing::Outcome e = testing::run_dhp("export --format hf --checkpoint " + r.checkpoint + " -o " + out.string(), dir);
  ASSERT_EQ(e.status, 0) << e.output;
  EXPECT_EQ(json::parse(std::ifstream(out / "config.json"))["torch_dtype"], "bfloat16");
  EXPECT_EQ(tensor_bytes(ck), tensor_bytes(out));
  EXPECT_TRUE(fs::exists(out / "tokenizer.model") && fs::exists(out / "tokenizer_config.json"));
  const fs::path foreign = dir / "foreign";
  fs::create_directories(foreign);
  std::ofstream(foreign / "tokenizer_config.json") << "{}";
  e = testing::run_dhp("export --format hf --checkpoint " + r.checkpoint + " -o " + foreign.string(), dir);
  EXPECT_NE(e.status, 0);
  EXPECT_TRUE(testing::contains(e.output, "tokenizer_config.json")) << e.output;
  EXPECT_FALSE(fs::exists(foreign / "model.safetensors"));
  // And it trains.
  const fs::path dir2 = testing::run_dir("hf_init2");
  const TrainResult two = train(testing::small_config(2, dir2, {"--model.init=" + ck.string()}), *world);
  ASSERT_EQ(two.steps.size(), 2u);
  EXPECT_TRUE(std::isfinite(two.steps.back().loss));
  fs::remove_all(dir);
  fs::remove_all(dir2);
}

// A Qwen3 and a Llama-3.2-like folder through a run: the run's checkpoint (.h5) records the
// new model keys and reads back to the same model, and `dhp export --format hf` of it gives
// the folder's tensors back.
TEST(HfTrain, Qwen3AndLlama3KeysRoundTripThroughACheckpoint) {
  auto world = start_world(nullptr, nullptr);
  for (const auto& [name, args] : {std::pair{"qwen3_hd16_tied", kQwen3Hd16Tied},
                                   std::pair{"llama32_tied_bf16", kLlama32TiedBf16}}) {
    const fs::path ck = fixture(name, args);
    const fs::path dir = testing::run_dir(std::string("hf_ckpt_") + name);
    const Config cfg = testing::small_config(0, dir, {"--model.init=" + ck.string()});
    const TrainResult r = train(cfg, *world);
    const Config saved = checkpoint_config(r.checkpoint);
    ModelConfig want = config_of(ck);
    want.vision = saved.model.vision;
    want.init = saved.model.init;
    want.vocab_size = saved.model.vocab_size;
    EXPECT_EQ(to_toml_model(saved.model), to_toml_model(want)) << name;
    auto backend = make_cpu_backend({1});
    Model m(saved.model, *backend);
    load_checkpoint(r.checkpoint, m, nullptr);
    const auto file = testing::folder_f32(ck);
    for (const auto& b : hf_name_map(saved.model)) {
      const ParamSpec& s = m.table().get(b.dhp);
      EXPECT_EQ(0, std::memcmp(m.params() + s.offset, file.at(b.hf).data(), size_t(s.numel()) * 4)) << b.dhp;
    }
    const fs::path out = dir / "hf";
    const testing::Outcome e =
        testing::run_dhp("export --format hf --checkpoint " + r.checkpoint + " -o " + out.string(), dir);
    ASSERT_EQ(e.status, 0) << e.output;
    EXPECT_EQ(tensor_bytes(ck), tensor_bytes(out)) << name;
    const json c = json::parse(std::ifstream(out / "config.json"));
    EXPECT_EQ(c["model_type"], std::string(name).rfind("qwen3", 0) == 0 ? "qwen3" : "llama") << name;
    fs::remove_all(dir);
  }
}

// A real checkpoint, when one is at hand: DHP_HF_CHECKPOINT=/path/to/TinyLlama-1.1B.
TEST(HfSmoke, RealCheckpointLoadsAndPredicts) {
  const char* path = std::getenv("DHP_HF_CHECKPOINT");
  if (!path || !*path) GTEST_SKIP() << "DHP_HF_CHECKPOINT names no Hugging Face folder";
  const ModelConfig cfg = read_hf_config(path, testing::tiny_config(), 0).model;
  auto backend = make_cpu_backend({2});
  Model m(cfg, *backend);
  m.initialise(1);
  const HfImport r = import_hf_checkpoint(path, m);
  EXPECT_EQ(r.imported.size(), hf_name_map(cfg).size());
  Batch b;
  b.T = 8;
  for (int t = 0; t < 8; ++t) {
    b.tokens.push_back(int32_t(1 + 37 * t % (cfg.vocab_size - 1)));
    b.targets.push_back(t + 1 < 8 ? int32_t(1 + 37 * (t + 1) % (cfg.vocab_size - 1)) : -1);
    b.doc.push_back(0);
    b.pos.push_back(t);
    b.image_slot.push_back(-1);
  }
  const StepStats s = m.step(b, 1.0f / 7, false);
  EXPECT_TRUE(std::isfinite(s.loss_sum)) << s.loss_sum;
}

}  // namespace
}  // namespace dhp
