// Hugging Face checkpoints read and written directly (docs/pretrained.md): a folder with
// config.json and model.safetensors, or shards with model.safetensors.index.json, for
// Llama-family decoders (LlamaForCausalLM with Llama-3.x's RoPE scaling, MistralForCausalLM,
// Qwen2ForCausalLM, Qwen3ForCausalLM), CLIP and
// SigLIP vision towers (CLIPVisionModel, CLIPModel, SiglipVisionModel, SiglipModel) and
// LLaVA-1.5 in its three naming generations. One declarative name map drives both directions.
// model.init names a decoder or LLaVA folder, model.vision.init a tower folder (compose: the
// projector keeps its seeded initialisation).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "data/chat_template.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "trainer/config.h"

namespace dhp {

// What a tensor needs beyond a copy between the two names.
enum class HfTransform {
  None,
  // (V, d) rows indexed by token id: the model may hold more rows than the file (added tokens);
  // the extra rows start at the mean of the file's rows.
  VocabRows,
  // A conv patch embedding: (dv, 3, p, p) in the file, (dv, p·p·3) in (ky, kx, c) order in dhp
  // (the order of a batch's patch rows), permuted on import and back on export; over several
  // frames (a Conv3d, (dv, 3, t, p, p)), dhp's rows hold frame after frame.
  ConvPatch,
  // One file tensor that is several of dhp's stacked along the rows (a fused qkv: the binding's
  // dhp tensor, then its `more`), split on import and concatenated on export.
  RowConcat,
  // The file holds the tensor with leading axes of one (InternVL's class row (1, 1, dv) and
  // position table (1, rows, dv)): the same values, rank 3 there.
  Unsqueezed,
};

// How a folder names its tensors (the model class that saved it).
enum class HfLayout : uint8_t {
  Decoder,        // LlamaForCausalLM & co: model.*, lm_head.weight
  Tower,          // CLIP / SigLIP (vision or dual-encoder) models: vision_model.*
  Qwen3Vl,        // Qwen3VLForConditionalGeneration: model.language_model.*, lm_head.weight,
                  // model.visual.* (the tower, its merger and DeepStack mergers)
  LlavaOriginal,  // haotian-liu/LLaVA LlavaLlamaForCausalLM: model.*, lm_head.weight,
                  // model.mm_projector.{0,2}.*, model.vision_tower.vision_tower.vision_model.*
  LlavaHf,        // llava-hf (transformers < 4.52): language_model.model.*,
                  // language_model.lm_head.weight, vision_tower.vision_model.*,
                  // multi_modal_projector.linear_{1,2}.*
  LlavaNew,       // transformers >= 4.52: model.language_model.*, lm_head.weight,
                  // model.vision_tower.vision_model.*, model.multi_modal_projector.*
  InternVl,       // InternVLForConditionalGeneration: model.language_model.*, lm_head.weight,
                  // model.vision_tower.*, model.multi_modal_projector.{layer_norm,linear_1,linear_2}.*
  InternVlOriginal,  // OpenGVLab's InternVLChatModel (remote code): language_model.model.*,
                     // language_model.lm_head.weight, vision_model.* (fused qkv), mlp1.{0,1,3}.*
};
const char* hf_layout_name(HfLayout layout);
// A conv patch embedding (rows, 3, frames, p, p) to dhp's (rows, frames·p·p·3), each frame in
// (ky, kx, c) order, or back with to_conv (HfTransform::ConvPatch).
void hf_permute_patch(float* dst, const float* src, int64_t rows, int64_t p, int64_t frames, bool to_conv);

// One row of the name map, expanded for a model's layers.
struct HfBinding {
  std::string hf;   // "model.layers.3.self_attn.q_proj.weight"
  std::string dhp;  // "layers.3.attn.wq.weight"
  HfTransform transform = HfTransform::None;
  std::vector<std::string> more;  // RowConcat: the tensors after dhp's in the file's rows
};

// The layout an export of a model of `cfg` writes: its tower's own vision-language model
// (Qwen3Vl), LLaVA (LlavaHf) for a tower LLaVA composes, the decoder alone (Decoder) otherwise.
// remote_code: a tower's vision-language model in its authors' layout where it has one
// (InternVLChatModel), transformers' otherwise.
HfLayout hf_export_layout(const ModelConfig& cfg, bool remote_code = false);
// The layout of a tower's own vision-language model (TowerTraits::hf_model_class), or of its
// remote-code class; and whether a layout is one of those.
HfLayout composite_layout(const TowerTraits& tower, bool remote_code);
bool is_composite_layout(HfLayout layout);

// dhp's tensors a binding reads or writes: its own, then `more`'s.
std::vector<std::string> binding_tensors(const HfBinding& b);
// The shape the tensor has in the file (a vocabulary tensor: the model's rows).
std::vector<int64_t> hf_file_shape(const HfBinding& b, const ParamTable& table, const ModelConfig& cfg);

// Every tensor of `cfg` a folder of `layout` holds, with its name there, in the order of the
// parameter table: the decoder's (lm_head absent when tied, q/k/v biases only with
// attention_bias, o_proj's with attention_out_bias, q_norm/k_norm with qk_norm) for Decoder
// and the LLaVA layouts; the tower's (clip / siglip towers only)
// for Tower and the LLaVA layouts; the projector's for the LLaVA layouts.
std::vector<HfBinding> hf_name_map(const ModelConfig& cfg, HfLayout layout = HfLayout::Decoder);

// True when `path` is a folder holding a config.json (a Hugging Face checkpoint).
bool is_hf_folder(const std::string& path);
// True when the folder `dir` holds its tokenizer (tokenizer.model or tokenizer.json).
bool holds_tokenizer(const std::string& dir);

// What a folder is, from its config.json.
// Composite: a vision-language model class of a tower's row (TowerTraits::hf_model_class,
// Qwen3VLForConditionalGeneration), decoder, tower and mergers in one folder.
enum class HfKind : uint8_t { Decoder, Tower, Llava, Composite };

struct HfConfig {
  ModelConfig model;          // `base` with the folder's keys (below)
  HfKind kind = HfKind::Decoder;
  std::string architecture;   // "LlamaForCausalLM", "LlavaForConditionalGeneration", ...
  int file_vocab = 0;         // the decoder's vocab_size: the rows the file holds
  bool original_llava = false;  // LlavaLlamaForCausalLM: the tower's shape is not in the folder
  // An original LLaVA's tower rule: the tower it names ("openai/clip-vit-large-patch14-336"),
  // and whether its config asks for the copy saved inside the checkpoint (LLaVA's
  // CLIPVisionTower loads that copy only with unfreeze_mm_vision_tower, else mm_vision_tower).
  std::string mm_vision_tower;
  bool unfreeze_tower = false;
  // A Composite in its authors' remote-code layout (TowerTraits::hf_remote_class).
  bool remote_code = false;
  int32_t image_token = -1;   // a Composite's image_token_id (-1: none given)
  int32_t image_begin = -1;   // its vision_start_token_id (-1: none given)
};

// Reads DIR/config.json over `base`. A decoder folder sets the decoder's shape and keeps the
// vision keys of `base`; a LLaVA folder sets the decoder's shape (its text_config, or the
// top-level Llama keys of the original layout) and, when its config holds the tower's
// (vision_config), the tower's shape and LLaVA's settings (feature layer, projector
// activation, merge 1, pad_square for image_aspect_ratio "pad", the pixel constants of its
// preprocessor_config.json). Keys a nested config leaves out take transformers' defaults of
// that config class (llava-hf saves only the keys that differ). The model's vocab_size becomes
// `vocab_size` (the tokenizer's, added tokens included; 0 = the file's); one smaller than the
// file's is an error. A Qwen3 config sets qk_norm (and head_dim, 128 when absent); Llama's
// and Qwen3's attention_bias set attention_bias and attention_out_bias; rope_scaling (or
// transformers 5's rope_parameters) of type llama3 sets model.rope_scaling and its
// parameters. Keys dhp does not implement are refused by name: another rope type or a key of
// the RoPE block dhp does not apply, a sliding_window below `max_tokens` (the run's longest
// sequence; 0 = not checked) and any sliding window of Qwen3 (use_sliding_window, layer_types),
// an activation other than silu, mlp_bias, attention_bias in a Mistral config,
// quantization_config, another architecture, a feature select strategy that keeps
// CLIP's class row or drops a SigLIP patch, a projector other than mlp2x_gelu.
HfConfig read_hf_config(const std::string& dir, const ModelConfig& base, int64_t max_tokens,
                        int vocab_size = 0);

// The vision keys of a CLIP or SigLIP folder (CLIPVisionModel, CLIPModel, SiglipVisionModel,
// SiglipModel) over `base`: arch, dim, layers, heads, ffn, patch, image_size, norm_eps, act,
// and the pixel constants of its preprocessor_config.json (the arch's when it has none).
VisionConfig read_hf_tower_config(const std::string& dir, const VisionConfig& base);

// When cfg.model.init or cfg.model.vision.init names a folder: cfg.model's keys from their
// config.json files (read_hf_config, read_hf_tower_config; a decoder and a tower folder
// compose, an original LLaVA folder takes its tower's shape from model.vision.init).
// vocab_size becomes the larger of the file's and cfg.model.vocab_size (set it first to the
// tokenizer's size with its added tokens to grow the vocabulary), so applying it twice changes
// nothing. sliding_window is checked against data.max_tokens. No-op when both are empty.
void apply_hf_init(Config& cfg);

// apply_hf_init for a command that only reads the model's shape (data stats/build, plan): the
// folders' keys when they are here; when a named folder is not, the configuration's keys are
// kept and a warning says so. Returns whether the folders were read.
bool apply_hf_init_if_here(Config& cfg);

// apply_hf_init for a training run that may resume (`resume` as --resume): when a folder that
// model.init or model.vision.init names is not here (moved, or on another machine) and
// --resume finds a checkpoint, the model's keys come from that checkpoint, whose weights the
// run continues from anyway; the log says so. Otherwise apply_hf_init.
void apply_hf_init_for_run(Config& cfg, const std::string& resume);

// Sets cfg.vision.post_norm and pool_head to whether the folder the tower comes from
// (cfg.init or cfg.vision.init) holds post_layernorm and SigLIP's pooling head: the model then
// holds them, frozen and never run, and an export writes them back. Reads tensor names only.
void find_held_tensors(ModelConfig& cfg);

// The checks of import_hf_weights that read no tensor data (plan_sources, then every name,
// shape and dtype against the name map of `cfg`, whose keys apply_hf_init has read from
// cfg.init and cfg.vision.init): run before the model is built, so a config.json whose sizes
// its tensors do not have (a vocab_size of 2^24 over 160 rows, a default tower the folder does
// not hold) is refused by tensor and file before memory of that size is allocated.
void check_hf_weights(const ModelConfig& cfg);

struct HfImport {
  std::vector<std::string> imported;     // dhp names read from the folders
  std::vector<std::string> initialised;  // dhp names no folder holds (left as they were)
  // Tensors of the folders the model does not use, by reason: ("the tower's post_layernorm
  // (LLaVA reads the features before it)", 2).
  std::vector<std::pair<std::string, int>> ignored;
  std::vector<std::string> sources;      // "DIR (llava-hf layout): 80 tensors", one per folder
  std::string dtype;                     // the first folder's tensors' dtype ("BF16", ...)
  int file_vocab = 0;                    // rows of tok_embed in the file
  int grown_rows = 0;                    // rows added at the mean (vocab growth)
  // Choices a folder left open, and what was read: a folder holding both model.safetensors and
  // an index is read from model.safetensors, as transformers reads it.
  std::vector<std::string> notes;
};

// Reads the tensors of `dir` (a decoder or LLaVA folder; "" = none) and of cfg.vision.init (a
// tower folder, when set) into the fp32 arena `arena` (a device pointer of `backend`, laid out
// by `table`) of a model of `cfg`, which must have their config.json's shape (apply_hf_init).
// The layout of each folder follows from its config and tensor names. An original LLaVA
// folder without tower tensors takes them from model.vision.init. Every check — the set of
// names against the map (with an ignore list: rotary_emb.inv_freq, position_ids buffers, the
// tower's post_layernorm and SigLIP's head, a dual encoder's text side and projections),
// shapes, dtypes, the index against its shards, finite values — comes before any byte is
// written: when it throws, the arena is unchanged. Files are read and converted in chunks, so
// it holds the arena plus one chunk.
// `report` shows the bytes read as they go (core/progress.h): on one rank of many.
// Where imported values go: write(offset, values, count) stores `count` fp32 values at arena
// offset `offset`; `in_place`, where set, is the arena itself in host memory, converted into
// directly.
struct WeightWriter {
  std::function<void(int64_t offset, const float* values, int64_t count)> write;
  float* in_place = nullptr;
};
// An arena of the table's total floats in host memory.
WeightWriter host_arena_writer(float* arena);
HfImport import_hf_weights(const std::string& dir, const ModelConfig& cfg, const ParamTable& table,
                           const WeightWriter& out, bool report = true);
// The same into a model's weights (Model::write_params).
HfImport import_hf_checkpoint(const std::string& dir, Model& model, bool report = true);
// The log lines of an import: what was imported from where, what kept its initialisation, what
// was ignored and why, the vocabulary's growth.
void log_hf_import(const HfImport& r, const ModelConfig& cfg);

// The dtype ("F32", "BF16", "F16") of the decoder tensors of a Hugging Face folder, for an
// export's default; "" when the folder is gone or unreadable.
std::string hf_checkpoint_dtype(const std::string& dir);

// The tokenizer files of an export. Filled by the caller from the run's tokenizer.
struct HfSpecialToken {
  std::string text;  // "<s>"
  int32_t id = -1;   // -1 = the tokenizer has none
};
struct HfTokenizerFiles {
  std::string sentencepiece_model;  // the run's tokenizer.model, copied as it is
  // A run on a tokenizer.json: its files (tokenizer.json, the tokenizer_config.json and
  // special_tokens_map.json beside it), copied byte for byte instead of the files above; the
  // special tokens below then only give config.json's and generation_config.json's ids.
  std::vector<std::string> copied;
  HfSpecialToken unk, bos, eos, pad;
  // Tokens appended after the SentencePiece vocabulary, as (text, id): ("<image>", 32000).
  std::vector<std::pair<std::string, int32_t>> added;
  // The id an image's positions hold when the family's vocabulary has one (Qwen's
  // <|image_pad|>): LLaVA's image_token_index. -1: LLaVA's convention, the added <image>.
  int32_t image_pad = -1;
  // The tokens around an image's positions (Qwen's <|vision_start|>, <|vision_end|>; -1: none),
  // which a Qwen3-VL config names (vision_start_token_id: get_rope_index counts images by it).
  int32_t image_begin = -1, image_end = -1;
  bool add_bos = true;              // the tokenizer starts every text with bos
  int64_t model_max_length = 4096;  // the run's data.max_tokens
  bool legacy = true;               // LlamaTokenizer's legacy flag, as the run's tokenizer had it
  int32_t vocab = 0;                // ids the tokenizer has, added tokens included
  std::string chat_template;        // the run's template as Jinja (jinja_chat_template); "" = none
};

// The files of a run's tokenizer (data/tokenizer.h, Tokenizer::files) in that form, with the
// chat_template of the run's data.template. A
// tokenizer.json is copied with its configuration (and an added_tokens.json for the tokens the
// run added). For a SentencePiece model, special
// tokens take SentencePiece's default pieces (<unk>, <s>, </s>, and <pad> when the model holds
// a pad piece: dhp's trainer and Llama's tokenizers both use them); a pad that is an added
// token takes its text; no pad stays none.
HfTokenizerFiles hf_tokenizer_files(const TokenizerFiles& files, int64_t model_max_length,
                                    ChatTemplate chat = ChatTemplate::Dhp);

struct HfExportOptions {
  std::string dir;                                // the output folder
  std::string dtype = "F32";                      // "F32", "BF16" or "F16"
  int64_t max_shard_bytes = int64_t(2) << 30;     // larger exports are sharded, with an index
  // config.json's when the model's source folder named none (model.max_position_embeddings):
  // the run's data.max_tokens.
  int64_t max_position_embeddings = 4096;
  // LLaVA exports (clip / siglip towers): image_token_index, the tokenizer's <image> id; -1 =
  // the <image> among the tokenizer's added tokens.
  int64_t image_token_index = -1;
  bool force = false;                             // replace files dhp did not write
  // A model published under its authors' remote code too (InternVL) in that layout
  // (InternVLChatModel) rather than transformers'.
  bool remote_code = false;
  const HfTokenizerFiles* tokenizer = nullptr;    // null: weights and config only
};

// Refuses, before any work, an export whose folder holds files dhp did not write (core/files.h,
// check_output_path; dhp's exports list their files in DIR/dhp_export.json), unless force.
void check_hf_export_paths(const HfExportOptions& opt);

// Writes config.json (every key transformers' LlamaConfig / Qwen2Config / Qwen3Config needs:
// Qwen3 for a model with qk_norm, Qwen2 for q/k/v biases alone, Llama otherwise), the decoder's
// tensors as model.safetensors or shards of at most max_shard_bytes with
// model.safetensors.index.json, generation_config.json and, with `tokenizer`,
// tokenizer.model, tokenizer_config.json, special_tokens_map.json and added_tokens.json.
// Every file is written under a temporary name and renamed. A model with the native tower
// exports its decoder only (the tower has no Hugging Face counterpart); one with a clip or
// siglip tower (merge 1) exports as llava-hf's LlavaForConditionalGeneration: the decoder,
// tower and projector under the LlavaHf layout's names, config.json with text_config and
// vision_config, and preprocessor_config.json.
void export_hf_checkpoint(const Model& model, const HfExportOptions& opt);

// The weights an export reads, one tensor at a time: `spec.numel()` floats into `out`.
using TensorSource = std::function<void(const ParamSpec& spec, float* out)>;
// The same from a model of `cfg` whose parameter table is `table`, its tensors read one at a time
// from `weights` as they are written (a checkpoint's file: CheckpointWeights), so that no process
// holds the whole model.
void export_hf_checkpoint(const ModelConfig& cfg, const ParamTable& table, const TensorSource& weights,
                          const HfExportOptions& opt);

}  // namespace dhp
