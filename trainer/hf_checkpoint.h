// Hugging Face Llama-family decoders read and written directly (docs/pretrained.md): a folder
// with config.json and model.safetensors, or shards with model.safetensors.index.json, for
// LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM. One declarative name map drives
// both directions; the vision tower and projector are not in such a folder and keep their
// seeded initialisation.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

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
};

// One row of the name map, expanded for a model's layers.
struct HfBinding {
  std::string hf;   // "model.layers.3.self_attn.q_proj.weight"
  std::string dhp;  // "layers.3.attn.wq.weight"
  HfTransform transform = HfTransform::None;
};

// Every decoder tensor of `cfg` with its Hugging Face name, in the order of the parameter
// table (lm_head absent when tied, q/k/v biases only with attention_bias).
std::vector<HfBinding> hf_name_map(const ModelConfig& cfg);

// True when `path` is a folder holding a config.json (a Hugging Face checkpoint).
bool is_hf_folder(const std::string& path);

struct HfConfig {
  ModelConfig model;          // `base` with the decoder's keys from config.json
  std::string architecture;   // "LlamaForCausalLM", "MistralForCausalLM" or "Qwen2ForCausalLM"
  int file_vocab = 0;         // config.json's vocab_size: the rows the file holds
};

// Reads DIR/config.json over `base`: the decoder's shape from the file, the vision keys from
// `base`. The model's vocab_size becomes `vocab_size` (the tokenizer's, added tokens included;
// 0 = the file's); one smaller than the file's is an error. Keys dhp does not implement are
// refused by name: rope_scaling, a sliding_window below `max_tokens` (the run's longest
// sequence; 0 = not checked), an activation other than silu, mlp_bias, attention_bias in a
// Llama config (it biases o_proj too), quantization_config, another architecture.
HfConfig read_hf_config(const std::string& dir, const ModelConfig& base, int64_t max_tokens,
                        int vocab_size = 0);

// When cfg.model.init names a folder: cfg.model's decoder keys from its config.json; the vision
// keys stay. vocab_size becomes the larger of the file's and cfg.model.vocab_size (set it first
// to the tokenizer's size with its added tokens to grow the vocabulary), so applying it twice
// changes nothing. sliding_window is checked against data.max_tokens. No-op when model.init is
// empty.
void apply_hf_init(Config& cfg);

struct HfImport {
  std::vector<std::string> imported;     // dhp names read from the folder
  std::vector<std::string> initialised;  // dhp names the folder does not hold (left as they were)
  std::string dtype;                     // the decoder tensors' dtype in the files ("BF16", ...)
  int file_vocab = 0;                    // rows of tok_embed in the file
  int grown_rows = 0;                    // rows added at the mean (vocab growth)
};

// Reads the folder's decoder tensors into the fp32 arena `arena` (a device pointer of
// `backend`, laid out by `table`) of a model of `cfg`, which must have config.json's shape
// (read_hf_config). Every check — the set of names against the map (a short ignore list:
// rotary_emb.inv_freq), shapes, dtypes, the index against its shards, finite values — comes
// before any byte is written: when it throws, the arena is unchanged. Files are memory-mapped
// and converted in chunks, so it holds the arena plus one chunk.
HfImport import_hf_weights(const std::string& dir, const ModelConfig& cfg, const ParamTable& table,
                           Backend& backend, float* arena);
// The same into a model's master weights.
HfImport import_hf_checkpoint(const std::string& dir, Model& model);

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
  HfSpecialToken unk, bos, eos, pad;
  // Tokens appended after the SentencePiece vocabulary, as (text, id): ("<image>", 32000).
  std::vector<std::pair<std::string, int32_t>> added;
  bool add_bos = true;              // the tokenizer starts every text with bos
  int64_t model_max_length = 4096;  // the run's data.max_tokens
};

// The files of a run's tokenizer (data/tokenizer.h, Tokenizer::files) in that form. Special
// tokens take SentencePiece's default pieces (<unk>, <s>, </s>, and <pad> when the model holds
// a pad piece: dhp's trainer and Llama's tokenizers both use them); a pad that is an added
// token takes its text; no pad stays none.
HfTokenizerFiles hf_tokenizer_files(const TokenizerFiles& files, int64_t model_max_length);

struct HfExportOptions {
  std::string dir;                                // the output folder
  std::string dtype = "F32";                      // "F32", "BF16" or "F16"
  int64_t max_shard_bytes = int64_t(2) << 30;     // larger exports are sharded, with an index
  int64_t max_position_embeddings = 4096;         // config.json's; the run's data.max_tokens
  bool force = false;                             // replace files dhp did not write
  const HfTokenizerFiles* tokenizer = nullptr;    // null: weights and config only
};

// Refuses, before any work, an export whose folder holds files dhp did not write (core/files.h,
// check_output_path; dhp's exports list their files in DIR/dhp_export.json), unless force.
void check_hf_export_paths(const HfExportOptions& opt);

// Writes config.json (every key transformers' LlamaConfig / Qwen2Config needs), the decoder's
// tensors as model.safetensors or shards of at most max_shard_bytes with
// model.safetensors.index.json, generation_config.json and, with `tokenizer`,
// tokenizer.model, tokenizer_config.json, special_tokens_map.json and added_tokens.json.
// Every file is written under a temporary name and renamed. The vision tower and projector
// are not part of a decoder checkpoint and are not written.
void export_hf_checkpoint(const Model& model, const HfExportOptions& opt);

}  // namespace dhp
