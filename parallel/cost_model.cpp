#include "parallel/cost_model.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/check.h"

namespace dhp {

void validate_shape(const SeqShape& s) {
  DHP_CHECK(s.text_tokens >= 0 && s.vision_tokens >= 0,
            "sample {} has {} text and {} vision tokens: counts cannot be negative", s.id, s.text_tokens,
            s.vision_tokens);
  DHP_CHECK(s.text_tokens <= kMaxSampleTokens && s.vision_tokens <= kMaxSampleTokens &&
                s.text_tokens + s.vision_tokens <= kMaxSampleTokens,
            "sample {} has {} text + {} vision tokens: the planner accepts at most {} tokens per sample", s.id,
            s.text_tokens, s.vision_tokens, kMaxSampleTokens);
  DHP_CHECK(s.tokens() > 0, "sample {} has no tokens: a sequence needs at least one", s.id);
  DHP_CHECK(s.images >= 0 && s.images <= s.vision_tokens && (s.vision_tokens == 0) == (s.images == 0),
            "sample {} has {} images for {} vision tokens: a sample with vision tokens needs at least one "
            "image and no more images than vision tokens, one without vision tokens none",
            s.id, s.images, s.vision_tokens);
  DHP_CHECK(s.tiles == 0 || (s.tiles >= s.images && s.tiles <= s.vision_tokens),
            "sample {} has {} tower images (tiles) for {} images and {} vision tokens: at least one an image, "
            "at most one a vision token", s.id, s.tiles, s.images, s.vision_tokens);
}

double& CostCoeffs::operator[](int i) {
  double* f[kCount] = {&sec_per_flop,       &sec_per_att_flop, &sec_per_byte_intra,  &sec_per_byte_inter,
                       &sec_per_step,       &sec_per_seq,      &sec_per_weight_byte};
  DHP_ASSERT(i >= 0 && i < kCount);
  return *f[i];
}

double CostCoeffs::operator[](int i) const { return const_cast<CostCoeffs&>(*this)[i]; }

const char* CostCoeffs::name(int i) {
  static const char* names[kCount] = {"sec_per_flop", "sec_per_att_flop", "sec_per_byte_intra",
                                      "sec_per_byte_inter", "sec_per_step", "sec_per_seq",
                                      "sec_per_weight_byte"};
  DHP_ASSERT(i >= 0 && i < kCount);
  return names[i];
}

nlohmann::json CostCoeffs::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (int i = 0; i < kCount; ++i) j[name(i)] = (*this)[i];
  return j;
}

nlohmann::json CostState::to_json() const {
  nlohmann::json obs = nlohmann::json::array();
  for (const TimingObservation& o : window) {
    nlohmann::json seqs = nlohmann::json::array();
    for (const SeqShape& s : o.seqs) {
      nlohmann::json q = {s.id, s.text_tokens, s.vision_tokens, s.images};
      if (s.tiles > 0) q.push_back(s.tiles);  // written only where an image is several tower images
      seqs.push_back(std::move(q));
    }
    obs.push_back({{"degree", o.degree}, {"seconds", o.seconds}, {"inter", o.inter}, {"seqs", seqs}});
  }
  return {{"device", device}, {"coeffs", coeffs.to_json()}, {"window", obs}};
}

CostState CostState::from_json(const nlohmann::json& j) {
  DHP_CHECK(j.is_object() && j.contains("device") && j["device"].is_string() &&
                j.contains("coeffs") && j.contains("window") && j["window"].is_array(),
            "cost state: expected an object with device, coeffs and window");
  CostState st;
  st.device = j["device"].get<std::string>();
  st.coeffs = CostCoeffs::from_json(j["coeffs"]);
  for (const auto& o : j["window"]) {
    DHP_CHECK(o.is_object() && o.contains("degree") && o["degree"].is_number_integer() &&
                  o.contains("seconds") && o["seconds"].is_number() && o.contains("inter") &&
                  o["inter"].is_boolean() && o.contains("seqs") && o["seqs"].is_array(),
              "cost state: a window entry needs degree, seconds, inter and seqs");
    TimingObservation t;
    t.degree = o["degree"].get<int>();
    t.seconds = o["seconds"].get<double>();
    t.inter = o["inter"].get<bool>();
    DHP_CHECK(t.degree >= 1 && std::isfinite(t.seconds) && t.seconds > 0,
              "cost state: degree {} and seconds {} must be positive", t.degree, t.seconds);
    for (const auto& s : o["seqs"]) {
      DHP_CHECK(s.is_array() && (s.size() == 4 || s.size() == 5),
                "cost state: a sequence is [id, text, vision, images] or [id, text, vision, images, tiles]");
      for (const auto& v : s) DHP_CHECK(v.is_number_integer(), "cost state: sequence fields are integers");
      SeqShape q;
      q.id = s[0].get<int64_t>();
      q.text_tokens = s[1].get<int64_t>();
      q.vision_tokens = s[2].get<int64_t>();
      q.images = s[3].get<int32_t>();
      if (s.size() == 5) q.tiles = s[4].get<int32_t>();
      validate_shape(q);
      t.seqs.push_back(q);
    }
    st.window.push_back(std::move(t));
  }
  return st;
}

CostCoeffs CostCoeffs::from_json(const nlohmann::json& j) {
  DHP_CHECK(j.is_object(), "cost coefficients: expected a JSON object with {} and the other rates", name(0));
  CostCoeffs c;
  for (int i = 0; i < kCount; ++i) {
    DHP_CHECK(j.contains(name(i)) && j[name(i)].is_number(), "cost coefficients: '{}' is missing or not a number",
              name(i));
    const double v = j[name(i)].get<double>();
    DHP_CHECK(std::isfinite(v) && v > 0 && v < 1, "cost coefficients: '{}' = {} must be a positive number of "
              "seconds below 1", name(i), v);
    c[i] = v;
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool known = false;
    for (int i = 0; i < kCount; ++i) known |= it.key() == name(i);
    DHP_CHECK(known, "cost coefficients: unknown key '{}'", it.key());
  }
  return c;
}

DeviceProfile device_profile(const std::string& name) {
  if (name == "auto") return device_profile("cpu");
  DeviceProfile p;
  p.name = name;
  CostCoeffs& c = p.coeffs;
  if (name == "cpu") {
    // Measured on the development machine (one core of a 2-core AVX-512 VM, OpenBLAS, fp32)
    // with the profiling pass:
    //   OPENBLAS_NUM_THREADS=1 dhp profile --config configs/longtail.toml --threads 1
    // which times forward + backward of the demo model (thread CPU time, median of 3) on 27
    // micro-batches: 64..4096 text tokens, 4 and 16 packed documents, 1..8 images of 64..1024
    // patches; the fit reproduces them within 3.8% on average (docs/planner.md, "CPU
    // profile"). GEMMs run at 63 GFLOP/s and the tiled attention kernel at 164 GFLOP/s of
    // kept (query, key) pairs (the kernel before it ran at 12: the earlier profile priced a
    // 4096-token sample 8x too slow); a sequence's fixed cost and the weight streaming come out
    // negligible (the model sits in cache and a step allocates nothing). Ring transfer and
    // latency cannot be measured on one rank: they are shared-memory estimates (a copy at
    // ~5 GB/s, ~20 µs per exchange) until the online refit replaces them.
    c.sec_per_flop = 1.0 / 62.9e9;
    p.peak_flops = 62.9e9, p.peak_measured = true;
    c.sec_per_att_flop = 1.0 / 164.2e9;
    c.sec_per_byte_intra = 1.0 / 5e9;
    c.sec_per_byte_inter = 1.0 / 1e9;
    c.sec_per_step = 20e-6;
    c.sec_per_seq = 30.2e-9;
    c.sec_per_weight_byte = 1.0 / 23.7e12;
    // One thread computes, copies the ring's blocks and merges the partial outputs.
    p.ring_overlap = false;
    p.act_bytes = 4, p.weight_bytes = 4;
    // Workspace: every buffer the CPU ops use is carved from an arena the memory model counts;
    // what is left is each arena's rounding to 64 KiB (model, batch, ring metadata and work,
    // image exchange: kernels/backend.cpp).
    p.workspace_bytes = int64_t(5 * 64) << 10, p.logits_chunk = 1024;
    return p;
  }
  // GPUs: bf16 storage and compute, fp32 master weights, gradients and Adam moments.
  //  - peak: dense BF16 tensor-core FLOP/s from NVIDIA's datasheets (A100 SXM 312 T; H100
  //    SXM5 and H200 SXM 989.4 T — the same GH100 SMs).
  //  - GEMM efficiency 0.5 of peak: the end-to-end MFU Megatron-LM reports for large dense
  //    transformers (Narayanan et al., SC'21: 52% of A100 peak).
  //  - attention efficiency 0.4: FlashAttention-2 (Dao 2023) reaches 50-73% of A100 peak
  //    forward and less backward on long blocks; ring blocks are shorter. An assumption.
  //  - sec_per_weight_byte = 1 / HBM bandwidth (datasheets: A100 80 GB SXM 2.039 TB/s,
  //    H100 SXM 3.35 TB/s, H200 4.8 TB/s): every GEMM streams its weights once per pass.
  //  - intra-node: NVLink per direction (A100 NVLink3 600 GB/s total = 300 each way; H100 /
  //    H200 NVLink4 900 GB/s = 450), of which point-to-point send/recv gets an assumed 70%.
  //  - inter-node: one InfiniBand NIC per GPU as in DGX systems (A100: HDR 200 Gb/s = 25 GB/s;
  //    H100/H200: NDR 400 Gb/s = 50 GB/s), an assumed 80% achieved.
  //  - ring step latency 15 µs and 20 µs per sequence: assumptions of the order of NCCL's
  //    small-message latency and of per-document bookkeeping.
  double peak = 0, hbm = 0, nvlink = 0, ib = 0;
  if (name == "a100") peak = 312e12, hbm = 2.039e12, nvlink = 300e9, ib = 25e9;
  else if (name == "h100") peak = 989.4e12, hbm = 3.35e12, nvlink = 450e9, ib = 50e9;
  else if (name == "h200") peak = 989.4e12, hbm = 4.8e12, nvlink = 450e9, ib = 50e9;
  DHP_CHECK(peak > 0, "unknown device profile '{}' (parallel.cost_profile): use one of cpu, a100, h100, h200",
            name);
  p.peak_flops = peak;
  c.sec_per_flop = 1.0 / (peak * 0.5);
  c.sec_per_att_flop = 1.0 / (peak * 0.4);
  c.sec_per_byte_intra = 1.0 / (nvlink * 0.7);
  c.sec_per_byte_inter = 1.0 / (ib * 0.8);
  c.sec_per_step = 15e-6;
  c.sec_per_seq = 20e-6;
  c.sec_per_weight_byte = 1.0 / hbm;
  p.act_bytes = 2, p.weight_bytes = 2;
  p.workspace_bytes = int64_t(3) << 30, p.logits_chunk = 4096;
  return p;
}

std::vector<std::string> device_profile_names() { return {"cpu", "a100", "h100", "h200"}; }

std::string profile_for_device(const std::string& device_name, std::string* why) {
  std::string upper;
  for (char c : device_name) upper.push_back(char(std::toupper(uint8_t(c))));
  // The chip in the product name: an H200's and a GH200's GPU is an H100's with faster memory;
  // the H800 and A800 are the export parts of the H100 and A100 (the same SMs, less NVLink).
  const struct {
    const char* part;
    const char* profile;
  } chips[] = {{"H200", "h200"}, {"H100", "h100"}, {"H800", "h100"}, {"A100", "a100"}, {"A800", "a100"}};
  for (const auto& c : chips)
    if (upper.find(c.part) != std::string::npos) {
      *why = fmt::format("the device is an {} ({})", c.part, device_name);
      return c.profile;
    }
  *why = fmt::format("no profile names the device ({}); h100's datasheet figures until the online "
                     "refit (parallel.refit) measures it, or `dhp profile` fits it",
                     device_name.empty() ? "its name is unknown" : device_name);
  return "h100";
}

ModelConfig model_profile(const std::string& name) {
  ModelConfig m;
  if (name == "tiny") return m;
  if (name == "internvl3-8b") {
    // OpenGVLab/InternVL3-8B's config.json: InternViT-300M-448px-V2.5 (every layer read) in 448
    // px tiles, InternVL's dynamic tiling up to 12 tiles and a thumbnail, the pixel shuffle,
    // and Qwen2.5-7B.
    m.dim = 3584, m.layers = 28, m.heads = 28, m.kv_heads = 4, m.head_dim = 128, m.ffn = 18944;
    m.vocab_size = 151674, m.rope_theta = 1e6, m.attention_bias = true;
    VisionConfig& v = m.vision;
    v.arch = VisionArch::intern_vit;
    v.patch = 14, v.dim = 1024, v.layers = 24, v.heads = 16, v.ffn = 4096, v.merge = 2;
    v.image_size = 448, v.feature_layer = -1, v.resize = ImageFit::siglip;
    v.min_tiles = 1, v.max_tiles = 12, v.thumbnail = true;
    std::tie(v.pixel_mean, v.pixel_std) = default_pixel_norm(v.arch);
    return m;
  }
  // Decoders of published vision-language models, from their config.json: 7b Qwen2-VL-7B's
  // (Qwen2-7B), 13b LLaVA-1.5-13B's (Vicuna-13B, Llama-2-13B's shape), 34b LLaVA-NeXT-34B's
  // (Nous-Hermes-2-Yi-34B), 72b Qwen2-VL-72B's (Qwen2-72B); every one behind Qwen2-VL's
  // 675M-parameter vision tower, so that they differ in the decoder alone.
  struct Shape {
    const char* name;
    int dim, layers, heads, kv_heads, head_dim, ffn, vocab;
    double rope_theta;
  };
  static constexpr Shape kShapes[] = {{"7b", 3584, 28, 28, 4, 128, 18944, 152064, 1e6},
                                      {"13b", 5120, 40, 40, 40, 128, 13824, 32000, 1e4},
                                      {"34b", 7168, 60, 56, 8, 128, 20480, 64000, 5e6},
                                      {"72b", 8192, 80, 64, 8, 128, 29568, 152064, 1e6}};
  const Shape* s = nullptr;
  for (const Shape& x : kShapes)
    if (name == x.name) s = &x;
  DHP_CHECK(s, "unknown model profile '{}': use one of {}", name, fmt::join(model_profile_names(), ", "));
  m.dim = s->dim, m.layers = s->layers, m.heads = s->heads, m.kv_heads = s->kv_heads, m.head_dim = s->head_dim;
  m.ffn = s->ffn, m.vocab_size = s->vocab, m.rope_theta = s->rope_theta;
  m.vision.patch = 14, m.vision.dim = 1280, m.vision.layers = 32, m.vision.heads = 16;
  m.vision.ffn = 3420, m.vision.merge = 2;
  m.vision.min_pixels = 56 * 56, m.vision.max_pixels = 28 * 28 * 4096;
  return m;
}

std::vector<std::string> model_profile_names() { return {"tiny", "7b", "13b", "34b", "72b", "internvl3-8b"}; }

void balance_images(std::span<const ImageClass> classes, int d, std::vector<ImageLevel>& levels, int64_t* work) {
  DHP_ASSERT(d >= 1);
  levels.clear();
  levels.push_back({0, 0.0, 0, d});
  int64_t steps = 0;
  auto insert = [&](const ImageLevel& x) {
    if (x.ranks <= 0) return;
    auto it = std::lower_bound(levels.begin(), levels.end(), x, [](const ImageLevel& a, const ImageLevel& b) {
      return a.patches != b.patches ? a.patches < b.patches : a.squares < b.squares;
    });
    if (it != levels.end() && it->patches == x.patches && it->squares == x.squares && it->images == x.images)
      it->ranks += x.ranks;
    else
      levels.insert(it, x);
  };
  for (const ImageClass& cls : classes) {
    DHP_ASSERT(cls.patches > 0);
    const int64_t p = cls.patches;
    const double p2 = cls.squares();
    int64_t c = cls.count;
    while (c > 0) {
      ++steps;
      const ImageLevel low = levels.front();
      const int64_t m = low.ranks;
      int64_t take = c;
      if (levels.size() > 1) {
        // The least loaded ranks take one image each per round until they pass the next
        // level (LPT: each image goes to a least loaded rank).
        const int64_t gap = levels[1].patches - low.patches;
        const int64_t rounds = std::max<int64_t>(1, (gap + p - 1) / p);
        if (rounds < (c + m - 1) / m) take = m * rounds;
      }
      const int64_t full = take / m, rem = take % m;
      levels.erase(levels.begin());
      insert({low.patches + full * p, low.squares + double(full) * p2, low.images + full, m - rem});
      insert({low.patches + (full + 1) * p, low.squares + double(full + 1) * p2, low.images + full + 1, rem});
      c -= take;
    }
  }
  if (work) *work += steps;
}

CostModel::CostModel(const ModelConfig& m, const DeviceProfile& dev, int ranks_per_node,
                     Recompute mode)
    : model_(m), device_(dev), coeffs_(dev.coeffs), ranks_per_node_(std::max(1, ranks_per_node)),
      recompute_(mode) {
  const bool recompute = mode == Recompute::full;
  const double d = m.dim, q = m.q_dim(), kv = m.kv_dim(), L = m.layers;
  const auto& v = m.vision;
  const double dv = v.dim;
  m2_ = v.merge * v.merge;
  extra_rows_ = extra_image_rows(m);
  // A GEMM costs 2 FLOPs per multiply-add forward and twice that backward (dX and dW);
  // recompute adds a second forward. Each of those passes streams the weights once.
  passes_ = recompute ? 4 : 3;
  const double layer_params = d * q + 2 * d * kv + q * d + 3 * d * m.ffn;
  // SwiGLU has three matrices, the GELU MLP two; a pretrained tower runs only the layers up to
  // feature_layer (the image rows the cost counts are encoder rows: class rows included).
  const double vis_layer_params = 4 * dv * dv + (v.traits().mlp == MlpKind::swiglu ? 3 : 2) * dv * v.ffn;
  const double vis_layers = v.layers_run();
  // The projector's two Linears, and each DeepStack merger's (its LayerNorm is noise here).
  const double ph = double(v.projector_hidden(m.dim));
  const double proj_params = v.image_sets() * (double(v.merged_dim()) * ph + ph * d);
  dec_flops_per_token_ = passes_ * 2.0 * (L * layer_params + d * m.vocab_size);
  fwd_per_token_ = 2.0 * (L * layer_params + d * m.vocab_size);
  fwd_per_pair_ = 2.0 * 2.0 * q * L;  // Q K^T and P V
  fwd_per_patch_ = 2.0 * (vis_layers * vis_layer_params + double(v.embed_numel()) * dv);
  fwd_per_patch_pair_ = 2.0 * 2.0 * dv * vis_layers;
  fwd_per_merged_ = 2.0 * proj_params;
  // LayerScale's backward rebuilds the attention's and the MLP's outputs: one GEMM each.
  const double ls_rebuild = v.traits().layer_scale ? 2.0 * vis_layers * (dv * dv + dv * v.ffn) : 0.0;
  vis_flops_per_patch_ = passes_ * 2.0 * (vis_layers * vis_layer_params + double(v.embed_numel()) * dv) + ls_rebuild;
  proj_flops_per_token_ = passes_ * 2.0 * proj_params;
  dec_weight_bytes_ = passes_ * double(dev.weight_bytes) * (L * layer_params + d * m.vocab_size);
  // RMSNorms do few FLOPs per element and stream their activations instead: forward reads x
  // and writes y; backward reads x and dy for dx, writes dx, and reads x and dy again for the
  // weight's gradient: 7 widths per element. A recompute forward adds 2: full recompute for
  // every norm of a layer, selective for the two d-wide ones (the q/k norms' outputs are
  // kept). Per token, each layer normalises its input twice (d wide) and, with qk_norm
  // (Qwen3), every query and key head (q_dim + kv_dim); then the final norm. Priced at
  // sec_per_weight_byte, the device's memory bandwidth.
  const double again = mode == Recompute::off ? 0.0 : 2.0;
  const double layer_norms = 2 * d * (7.0 + again) + (m.qk_norm ? q + kv : 0.0) * (recompute ? 9.0 : 7.0);
  dec_norm_bytes_per_token_ = double(dev.act_bytes) * (L * layer_norms + 7.0 * d);
  vis_weight_bytes_ =
      passes_ * double(dev.weight_bytes) * (vis_layers * vis_layer_params + double(v.embed_numel()) * dv + proj_params);
  // Flash-style attention: 2 matmuls forward, 5 backward (scores recomputed), 2 more under
  // recompute; each 2·heads·head_dim FLOPs per kept pair.
  const double att_mm = recompute ? 9.0 : 7.0;
  dec_att_per_pair_ = att_mm * 2.0 * q;
  vis_att_per_pair_ = att_mm * 2.0 * dv * vis_layers;  // every encoder layer, per (query, key) pair
  // The ring moves K and V forward and K, V, dK, dV backward (and K, V again on recompute).
  dec_bytes_per_token_ = (recompute ? 8.0 : 6.0) * kv * dev.act_bytes;
  // Merged image tokens go to their decoder ranks; their gradients come back.
  xfer_bytes_per_token_ = 2.0 * v.image_sets() * d * dev.act_bytes;
  ring_passes_ = recompute ? 3 : 2;
}

int image_classes(const SeqShape& s, int m2, ImageClass out[2], int extra) {
  out[0] = out[1] = ImageClass{};
  if (s.vision_tokens <= 0) return 0;
  const int64_t n = std::max<int64_t>(1, s.images), t = s.tiles_per_image();
  const int64_t q = s.vision_tokens / n, r = s.vision_tokens % n;
  int k = 0;
  // Each of an image's tiles has its own extra rows (a class row).
  if (r > 0) out[k++] = {(q + 1) * m2 + extra * t, r, t};
  if (q > 0) out[k++] = {q * m2 + extra * t, n - r, t};
  return k;
}

double CostModel::model_flops(const SeqShape& s) const {
  const SeqCost c = prepare(s);
  double f = fwd_per_token_ * double(c.tokens) + fwd_per_pair_ * double(c.pairs) +
             fwd_per_merged_ * double(c.vision_tokens);
  for (const auto& im : c.img)
    f += double(im.count) * (fwd_per_patch_ * double(im.patches) + fwd_per_patch_pair_ * double(im.patches) * double(im.patches));
  return 3.0 * f;
}

double CostModel::decoder_pairs(const SeqShape& s) {
  const double L = double(s.tokens());
  return L * (L + 1) / 2;
}

double CostModel::vision_pairs(const SeqShape& s) const {
  if (s.vision_tokens <= 0) return 0;
  const SeqCost c = prepare(s);
  double pairs = 0;
  for (const auto& im : c.img) pairs += double(im.count) * double(im.patches) * double(im.patches);
  return pairs;
}

SeqCost CostModel::prepare(const SeqShape& s) const {
  SeqCost c;
  c.tokens = s.tokens();
  c.pairs = c.tokens * (c.tokens + 1) / 2;
  c.vision_tokens = s.vision_tokens;
  image_classes(s, m2_, c.img, extra_rows_);
  return c;
}

void GroupCost::add(const SeqCost& c) {
  tokens_ += c.tokens, pairs_ += c.pairs, vision_tokens_ += c.vision_tokens, ++seqs_;
  for (const auto& im : c.img)
    if (im.count > 0) {
      patches_ += im.patches * im.count;
      squares_ += double(im.count) * im.squares();
      classes_.push_back(im);
    }
}

void GroupCost::clear() {
  tokens_ = pairs_ = vision_tokens_ = seqs_ = patches_ = 0;
  squares_ = 0;
  classes_.clear();
}

double CostModel::image_lin(int64_t patches) const {
  return (vis_flops_per_patch_ + proj_flops_per_token_ / m2_) * double(patches);
}

double CostModel::image_att(const ImageClass& im) const { return vis_att_per_pair_ * im.squares(); }

void merge_image_classes(std::vector<ImageClass>& classes) {
  if (classes.size() < 2) return;
  std::sort(classes.begin(), classes.end(),
            [](const ImageClass& a, const ImageClass& b) { return a.patches > b.patches; });
  size_t w = 0;
  for (size_t i = 1; i < classes.size(); ++i) {
    if (classes[i].patches == classes[w].patches && classes[i].tiles == classes[w].tiles)
      classes[w].count += classes[i].count;
    else classes[++w] = classes[i];
  }
  classes.resize(w + 1);
}

CostModel::Vision CostModel::vision(const GroupCost& g, int d, int64_t* work) const {
  Vision v;
  v.images = g.patches_ > 0;
  if (!v.images) return v;
  if (d == 1 || (g.classes_.size() == 1 && g.classes_[0].count == 1)) {
    v.patches = g.patches_, v.squares = g.squares_;  // one rank encodes everything
    return v;
  }
  // Image classes of the group, largest first, equal patch counts merged.
  thread_local std::vector<ImageClass> classes;
  classes.assign(g.classes_.begin(), g.classes_.end());
  if (classes.size() > 1) {
    merge_image_classes(classes);
    if (work) *work += int64_t(classes.size());
  }
  thread_local std::vector<ImageLevel> levels;
  balance_images(classes, d, levels, work);
  // The slowest rank under the current coefficients (levels hold ascending patch counts,
  // but attention grows with the square of an image's size, so every level is looked at).
  const double a = coeffs_.sec_per_flop * (vis_flops_per_patch_ + proj_flops_per_token_ / m2_);
  const double k = coeffs_.sec_per_att_flop * vis_att_per_pair_;
  double best = -1;
  for (const ImageLevel& l : levels) {
    const double t = a * double(l.patches) + k * l.squares;
    if (t > best) best = t, v.patches = l.patches, v.squares = l.squares;
  }
  return v;
}

double CostModel::evaluate(const GroupCost& g, const Vision& v, int d, bool inter, double* f) const {
  const CostCoeffs& k = coeffs_;
  const double dd = d, layers = model_.layers;
  const double dec_att = dec_att_per_pair_ * double(g.pairs_), dec_bytes = dec_bytes_per_token_ * double(g.tokens_);
  double fl[CostCoeffs::kCount] = {0, 0, 0, 0, 0, 0, 0};
  const int byte_slot = inter ? 3 : 2;
  const double byte_rate = inter ? k.sec_per_byte_inter : k.sec_per_byte_intra;
  // Vision stage: its slowest rank, then the exchange of merged image tokens.
  fl[0] += (vis_flops_per_patch_ + proj_flops_per_token_ / m2_) * double(v.patches);
  fl[1] += vis_att_per_pair_ * v.squares;
  if (v.images) fl[6] += vis_weight_bytes_;
  if (v.images && d > 1) {
    fl[byte_slot] += xfer_bytes_per_token_ * double(g.vision_tokens_) * (dd - 1) / (dd * dd);
    fl[4] += 2;
  }
  // Decoder: token-linear work split evenly (zigzag), weights streamed once per pass.
  fl[0] += dec_flops_per_token_ * double(g.tokens_) / dd;
  fl[6] += dec_weight_bytes_ + dec_norm_bytes_per_token_ * double(g.tokens_) / dd;
  fl[5] += double(g.seqs_);
  if (d == 1) {
    fl[1] += layers * dec_att;
  } else {
    // Per layer: the local block, then d-1 ring steps of max(compute, transfer).
    const double step_compute = k.sec_per_att_flop * dec_att / (dd * dd);
    const double step_xfer = ring_passes_ * k.sec_per_step + byte_rate * dec_bytes / dd;
    fl[1] += layers * dec_att / (dd * dd);
    if (!device_.ring_overlap) {
      fl[1] += layers * (dd - 1) * dec_att / (dd * dd);
      fl[byte_slot] += layers * (dd - 1) * dec_bytes / dd;
      fl[4] += layers * (dd - 1) * ring_passes_;
    } else if (step_xfer > step_compute) {
      fl[byte_slot] += layers * (dd - 1) * dec_bytes / dd;
      fl[4] += layers * (dd - 1) * ring_passes_;
    } else {
      fl[1] += layers * (dd - 1) * dec_att / (dd * dd);
    }
  }
  if (gather_moved_ > 0) {
    // ZeRO-3: a layer's gather runs beside the layer before it. Where it is the longer, that
    // window costs the gather instead of the GEMMs (L forward windows, L - 2 backward ones).
    const double fwd_flops = dec_flops_per_token_ / passes_ * double(g.tokens_) / dd / layers;
    const int slot = gather_inter_ ? 3 : 2;
    for (const auto [windows, flops] : {std::pair{layers, fwd_flops}, std::pair{layers - 2, fwd_flops * (passes_ - 1)}}) {
      if (windows <= 0 || gather_seconds() <= k.sec_per_flop * flops) continue;
      fl[0] -= windows * flops;
      fl[slot] += windows * gather_moved_;
      fl[4] += windows;
    }
  }
  double t = 0;
  for (int i = 0; i < CostCoeffs::kCount; ++i) {
    t += fl[i] * k[i];
    if (f) f[i] = fl[i];
  }
  return t;
}

void CostModel::price_layer_gathers(int64_t layer_bytes, int world) {
  // Each rank receives the (W - 1) / W of the layer it does not own (broadcasts from the
  // owners, what an all-gather moves).
  gather_moved_ = world > 1 ? double(layer_bytes) * double(world - 1) / double(world) : 0.0;
  gather_inter_ = world > ranks_per_node_;
}

double CostModel::gather_seconds() const {
  return gather_moved_ * (gather_inter_ ? coeffs_.sec_per_byte_inter : coeffs_.sec_per_byte_intra) + coeffs_.sec_per_step;
}

double CostModel::seconds(const GroupCost& g, int d, bool inter, int64_t* work) const {
  DHP_ASSERT(d >= 1);
  return evaluate(g, vision(g, d, work), d, inter, nullptr);
}

int64_t CostModel::ticks(const GroupCost& g, int d, bool inter, int64_t* work) const {
  return std::max<int64_t>(1, std::llround(seconds(g, d, inter, work) * 1e9));
}

double CostModel::group_seconds(std::span<const SeqCost* const> g, int d, bool inter, int64_t* work) const {
  thread_local GroupCost acc;
  acc.clear();
  for (const SeqCost* c : g) acc.add(*c);
  return seconds(acc, d, inter, work);
}

int64_t CostModel::group_ticks(std::span<const SeqCost* const> g, int d, bool inter, int64_t* work) const {
  return std::max<int64_t>(1, std::llround(group_seconds(g, d, inter, work) * 1e9));
}

double CostModel::seconds(const SeqCost& c, int d) const {
  const SeqCost* p = &c;
  return group_seconds({&p, 1}, d, inter(d));
}

int64_t CostModel::ticks(const SeqCost& c, int d) const {
  const SeqCost* p = &c;
  return group_ticks({&p, 1}, d, inter(d));
}

std::vector<double> CostModel::features(const GroupCost& g, int d, bool inter) const {
  std::vector<double> f(CostCoeffs::kCount, 0.0);
  evaluate(g, vision(g, d, nullptr), d, inter, f.data());
  return f;
}

std::vector<double> CostModel::features(const SeqCost& c, int d) const {
  GroupCost g;
  g.add(c);
  return features(g, d, inter(d));
}

double CostModel::area_lower_bound(const SeqCost& c, int d, double lambda) const {
  const CostCoeffs& k = coeffs_;
  const double dd = d, layers = model_.layers;
  const double byte_rate = inter(d) ? k.sec_per_byte_inter : k.sec_per_byte_intra;
  double t = (k.sec_per_flop * dec_flops_per_token_ + k.sec_per_weight_byte * dec_norm_bytes_per_token_) *
                 double(c.tokens) +
             k.sec_per_seq * dd;
  for (const auto& im : c.img)
    t += double(im.count) * (k.sec_per_flop * image_lin(im.patches) + k.sec_per_att_flop * image_att(im));
  // d x [A/d² + (d-1)·max(A/d², x)] >= A/d + (d-1)·(lambda·A/d + (1-lambda)·bytes·rate)
  const double A = k.sec_per_att_flop * dec_att_per_pair_ * double(c.pairs);
  const double B = dec_bytes_per_token_ * double(c.tokens);
  t += layers * (A / dd + (dd - 1) * (lambda * A / dd + (1 - lambda) * byte_rate * B));
  t += byte_rate * xfer_bytes_per_token_ * double(c.vision_tokens) * (dd - 1) / dd;
  return t;
}

double CostModel::min_area_lower_bound(const SeqCost& c, int lo, int hi, double lambda) const {
  DHP_ASSERT(lo >= 1 && lo <= hi);
  const CostCoeffs& k = coeffs_;
  const double layers = model_.layers;
  const double A = k.sec_per_att_flop * dec_att_per_pair_ * double(c.pairs);
  const double B = dec_bytes_per_token_ * double(c.tokens);
  const double X = xfer_bytes_per_token_ * double(c.vision_tokens);
  double best = std::numeric_limits<double>::infinity();
  auto segment = [&](int a, int b, double rate) {
    if (a > b) return;
    best = std::min({best, area_lower_bound(c, a, lambda), area_lower_bound(c, b, lambda)});
    const double alpha = layers * A * (1 - lambda) - rate * X, beta = layers * (1 - lambda) * rate * B + k.sec_per_seq;
    if (alpha <= 0 || beta <= 0) return;
    const double x = std::sqrt(alpha / beta);
    for (double y : {std::floor(x), std::ceil(x)}) {
      if (y <= a || y >= b) continue;
      best = std::min(best, area_lower_bound(c, int(y), lambda));
    }
  };
  segment(lo, std::min(hi, ranks_per_node_), k.sec_per_byte_intra);
  segment(std::max(lo, ranks_per_node_ + 1), hi, k.sec_per_byte_inter);
  return best;
}

double CostModel::time_lower_bound(const SeqCost& c, int d) const {
  const CostCoeffs& k = coeffs_;
  const double dd = d;
  GroupCost g;
  SeqCost text = c;
  text.img[0] = text.img[1] = ImageClass{};
  text.vision_tokens = 0;
  g.add(text);
  double t = evaluate(g, Vision{}, d, inter(d), nullptr);
  double total = 0, largest = 0;
  for (const auto& im : c.img) {
    if (im.count == 0) continue;
    const double w = k.sec_per_flop * image_lin(im.patches) + k.sec_per_att_flop * image_att(im);
    total += double(im.count) * w, largest = std::max(largest, w);
  }
  if (total > 0) {
    t += std::max(largest, total / dd) + k.sec_per_weight_byte * vis_weight_bytes_;
    if (d > 1)
      t += (inter(d) ? k.sec_per_byte_inter : k.sec_per_byte_intra) * xfer_bytes_per_token_ *
               double(c.vision_tokens) * (dd - 1) / (dd * dd) +
           2 * k.sec_per_step;
  }
  return t;
}

namespace {

// Solves the n x n system a·x = b in place by Gaussian elimination with partial pivoting.
std::vector<double> solve_linear(std::vector<double> a, std::vector<double> b, int n) {
  for (int col = 0; col < n; ++col) {
    int piv = col;
    for (int r = col + 1; r < n; ++r)
      if (std::fabs(a[r * n + col]) > std::fabs(a[piv * n + col])) piv = r;
    for (int j = 0; j < n; ++j) std::swap(a[col * n + j], a[piv * n + j]);
    std::swap(b[col], b[piv]);
    const double p = a[col * n + col];
    DHP_ASSERT(p != 0);
    for (int r = 0; r < n; ++r) {
      if (r == col) continue;
      const double f = a[r * n + col] / p;
      for (int j = col; j < n; ++j) a[r * n + j] -= f * a[col * n + j];
      b[r] -= f * b[col];
    }
  }
  for (int i = 0; i < n; ++i) b[i] /= a[i * n + i];
  return b;
}

std::vector<std::vector<SeqCost>> prepare_all(const CostModel& model, const std::vector<TimingObservation>& obs) {
  std::vector<std::vector<SeqCost>> costs;
  for (const auto& o : obs) {
    DHP_CHECK(std::isfinite(o.seconds) && o.seconds > 0 && o.degree >= 1 && !o.seqs.empty(),
              "refit: an observation needs sequences, seconds > 0 and degree >= 1");
    costs.emplace_back();
    for (const auto& s : o.seqs) {
      validate_shape(s);
      costs.back().push_back(model.prepare(s));
    }
  }
  return costs;
}

GroupCost group_of(const std::vector<SeqCost>& v) {
  GroupCost g;
  for (const auto& c : v) g.add(c);
  return g;
}

}  // namespace

CostCoeffs refit(const CostModel& model, const std::vector<TimingObservation>& obs, double prior_weight) {
  constexpr int n = CostCoeffs::kCount;
  const CostCoeffs prior = model.coeffs();
  for (int i = 0; i < n; ++i)
    DHP_CHECK(prior[i] > 0, "refit: the prior cost coefficients must be positive ({} = {})", CostCoeffs::name(i),
              prior[i]);
  const auto costs = prepare_all(model, obs);
  std::vector<GroupCost> groups;
  for (const auto& c : costs) groups.push_back(group_of(c));
  CostModel work = model;
  CostCoeffs cur = prior;
  // Unknowns are x_i = c_i / prior_i so every column has the scale of the prior's prediction.
  for (int iter = 0; iter < 12; ++iter) {
    work.set_coeffs(cur);
    std::vector<double> ata(n * n, 0.0), atb(n, 0.0);
    for (size_t o = 0; o < obs.size(); ++o) {
      auto f = work.features(groups[o], obs[o].degree, obs[o].inter);
      std::vector<double> row(n, 0.0);
      for (int i = 0; i < n; ++i) row[i] = f[i] * prior[i] / obs[o].seconds;
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < n; ++j) ata[i * n + j] += row[i] * row[j];
        atb[i] += row[i];
      }
    }
    for (int i = 0; i < n; ++i) ata[i * n + i] += prior_weight, atb[i] += prior_weight;
    auto x = solve_linear(ata, atb, n);
    CostCoeffs next = prior;
    bool moved = false;
    for (int i = 0; i < n; ++i) {
      // Negative rates are meaningless; keep a small positive floor instead.
      const double v = prior[i] * std::max(x[i], 1e-3);
      moved |= std::fabs(v - cur[i]) > 1e-9 * std::fabs(cur[i]);
      next[i] = v;
    }
    cur = next;
    if (!moved) break;
  }
  return cur;
}

double mean_relative_error(const CostModel& model, const std::vector<TimingObservation>& obs) {
  if (obs.empty()) return 0;
  const auto costs = prepare_all(model, obs);
  double sum = 0;
  for (size_t o = 0; o < obs.size(); ++o) {
    const double t = model.seconds(group_of(costs[o]), obs[o].degree, obs[o].inter);
    sum += std::fabs(t - obs[o].seconds) / obs[o].seconds;
  }
  return sum / double(obs.size());
}

std::vector<double> measured_error(const CostModel& model, const std::vector<TimingObservation>& obs,
                                   int min_count) {
  if (obs.empty()) return {};
  const auto costs = prepare_all(model, obs);
  std::vector<std::vector<double>> by;
  for (size_t o = 0; o < obs.size(); ++o) {
    const double t = model.seconds(group_of(costs[o]), obs[o].degree, obs[o].inter);
    if (size_t(obs[o].degree) >= by.size()) by.resize(size_t(obs[o].degree) + 1);
    by[size_t(obs[o].degree)].push_back(std::fabs(t - obs[o].seconds) / obs[o].seconds);
  }
  std::vector<double> out(by.size(), 0.0);
  for (size_t d = 1; d < by.size(); ++d) {
    auto& e = by[d];
    if (int(e.size()) < std::max(1, min_count)) continue;
    const size_t mid = e.size() / 2;
    std::nth_element(e.begin(), e.begin() + mid, e.end());
    double m = e[mid];
    if (e.size() % 2 == 0) m = 0.5 * (m + *std::max_element(e.begin(), e.begin() + mid));
    out[d] = m;
  }
  return out;
}

double CostModel::relative_error(int d) const {
  if (d >= 1 && size_t(d) < error_.size() && error_[size_t(d)] > 0) return error_[size_t(d)];
  double worst = 0;
  for (double e : error_) worst = std::max(worst, e);
  return worst;
}

}  // namespace dhp
