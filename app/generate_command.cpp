// `dhp generate`: continue a prompt (with one or more images) from a checkpoint, greedily or
// by temperature / top-p sampling, with the model's KV cache.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cmath>

#include "app/cli.h"
#include "core/check.h"
#include "core/log.h"
#include "core/text.h"
#include "data/image.h"
#include "data/layout.h"
#include "data/manifest.h"
#include "data/pack.h"
#include "data/tokenizer.h"
#include "trainer/checkpoint.h"
#include "trainer/inference.h"
#include "trainer/limits.h"

namespace dhp {
namespace {

const std::string kMarker = "<image>";

struct GenerateOptions {
  std::string checkpoint = "auto";
  std::string dir = "runs/demo/checkpoints";
  std::vector<std::string> images;
  std::string prompt = "Describe the image.";
  int max_tokens = 64;
  double temperature = 0.0;
  double top_p = 1.0;
  int64_t seed = 0;  // signed so that a negative seed is refused, not wrapped to 2^64 - 1
};

// The KV cache generate() holds: keys and values of every layer for the prompt and every new
// token, plus per-token metadata (model/attention.h, KvCacheAttention).
int64_t kv_cache_bytes(const ModelConfig& m, DType t, int64_t tokens) {
  return tokens * (2 * int64_t(m.layers) * m.kv_dim() * int64_t(dtype_size(t)) + 3 * int64_t(sizeof(int32_t)));
}

// The prompt in the training layout of data.template: <bos>, text pieces, an image's tokens
// wherever the text says <image> (or all images first when it never does, as LLaVA prompts
// read), up to where the answer starts.
Batch build_prompt(const GenerateOptions& o, const Tokenizer& tok, ChatTemplate chat,
                   const VisionConfig& v, int64_t max_image_pixels) {
  std::string text = o.prompt;
  if (text.find(kMarker) == std::string::npos)
    for (size_t i = 0; i < o.images.size(); ++i) text = kMarker + "\n" + text;
  std::vector<int32_t> layout;
  std::vector<uint8_t> loss;
  int64_t markers = 0;
  try {
    markers = layout_prompt(chat, text, tok, layout, loss);
  } catch (const LineError& e) {  // a <video> marker: generation takes images only
    throw Error(fmt::format("--prompt: {}", e.detail));
  }
  DHP_CHECK(markers == int64_t(o.images.size()),
            "the prompt has {} <image> markers for {} --image files", markers, o.images.size());
  std::vector<PreparedImage> images;
  StoredLayout s;
  for (const auto& path : o.images) {
    images.push_back(load_image(path, data_geometry(v).for_images(int64_t(o.images.size())), max_image_pixels));
    s.image_grids.push_back({images.back().grid_h / v.merge, images.back().grid_w / v.merge});
  }
  s.layout = layout.data();
  s.loss = loss.data();
  s.n = int64_t(layout.size());
  s.ids = tok.ids();
  // Everything but the closing <eos>: the model writes the rest.
  Sample prompt = expand_layout(s, 0, full_length(s) - 1,
                                [&](int64_t i) { return images[size_t(i)]; }, v.merge,
                                ImageLoad::Decode);
  return pack({&prompt}, v);
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto* sub = app.add_subcommand("generate", "Generate text for images and a prompt from a checkpoint");
  auto o = std::make_shared<GenerateOptions>();
  sub->add_option("--checkpoint", o->checkpoint, "Checkpoint file, directory, or 'auto'")->capture_default_str();
  sub->add_option("--dir", o->dir, "Where 'auto' looks")->capture_default_str();
  sub->add_option("--image", o->images, "Image file (repeat for several)");
  sub->add_option("--prompt", o->prompt, "Prompt text; <image> marks where each image goes")
      ->capture_default_str();
  sub->add_option("--max-tokens", o->max_tokens, "Most tokens to generate")->capture_default_str();
  sub->add_option("--temperature", o->temperature, "0 = greedy")->capture_default_str();
  sub->add_option("--top-p", o->top_p, "Nucleus sampling mass (with temperature > 0)")
      ->capture_default_str();
  sub->add_option("--seed", o->seed, "Sampling seed")->capture_default_str();
  // Any key of the checkpoint's configuration can be overridden (--data.tokenizer=PATH when
  // the run's relative path does not hold from here).
  sub->allow_extras();
  sub->callback([sub, o] {
    set_up_logging(0, 1, "warn");
    // NaN passes every comparison, so a range check alone would let it through to sampling.
    DHP_CHECK(std::isfinite(o->temperature) && o->temperature >= 0,
              "--temperature {}: must be a finite number >= 0 (0 = greedy)", o->temperature);
    DHP_CHECK(std::isfinite(o->top_p) && o->top_p > 0 && o->top_p <= 1,
              "--top-p {}: must be in (0, 1]", o->top_p);
    DHP_CHECK(o->max_tokens >= 1, "--max-tokens {}: must be 1 or more", o->max_tokens);
    DHP_CHECK(o->seed >= 0, "--seed {}: must be 0 or more", o->seed);
    // The data path refuses such text too; the tokenizer would turn it into unknown pieces.
    DHP_CHECK(valid_utf8(o->prompt), "--prompt is not valid UTF-8: \"{}\"", printable(o->prompt));
    const std::string path = resolve_checkpoint(o->checkpoint, o->dir);
    const LoadedModel m = load_for_inference(path, inference_config(path, sub->remaining()));
    const std::unique_ptr<Tokenizer> tokenizer = inference_tokenizer(path, m);
    const Tokenizer& tok = *tokenizer;
    Batch prompt = build_prompt(*o, tok, m.cfg.data.chat_template, m.cfg.model.vision,
                                m.cfg.data.max_image_pixels);
    // "dynamic" RoPE is plain only within the folder's positions (model_config.h).
    DHP_CHECK(m.cfg.model.rope_scaling != RopeScaling::dynamic || prompt.T + o->max_tokens <= m.cfg.model.max_positions,
              "the prompt ({} tokens) and --max-tokens {} reach past max_position_embeddings ({}), beyond which "
              "rope_scaling \"dynamic\" would rescale RoPE as dhp does not", prompt.T, o->max_tokens,
              m.cfg.model.max_positions);
    const DType storage = m.backend->ops().dtype();
    const int64_t memory = available_memory_bytes();
    const int64_t need = kv_cache_bytes(m.cfg.model, storage, prompt.T + o->max_tokens);
    if (memory > 0 && need > memory / 2) {
      const int64_t fit = memory / 2 / kv_cache_bytes(m.cfg.model, storage, 1) - prompt.T;
      throw Error(fmt::format("--max-tokens {} needs a KV cache of {:.1f} GiB with this prompt of {} tokens; at "
                              "most {} new tokens fit in half of this machine's {:.1f} GiB",
                              o->max_tokens, double(need) / (1 << 30), prompt.T, std::max<int64_t>(fit, 0),
                              double(memory) / (1 << 30)));
    }
    SamplingOptions so;
    so.max_new_tokens = o->max_tokens;
    so.temperature = o->temperature;
    so.top_p = o->top_p;
    so.seed = uint64_t(o->seed);
    fmt::print("{}\n", tok.decode(m.model->generate(prompt, tok.ids().eos, so)));
  });
}

}  // namespace dhp
