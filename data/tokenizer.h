// The tokenizer of a run: a SentencePiece model (tokenizer.model) or a Hugging Face
// tokenizer.json (byte-level BPE of Qwen, Llama-3, DeepSeek; SentencePiece-style BPE of
// Llama-2, Mistral, Gemma: data/hf_tokenizer.h), behind one interface, with a table of special
// ids and tokens added after its vocabulary.
//
// Three kinds of load:
//   - dhp's own (train_tokenizer, `dhp data synth`): pad 0, unk 1, bos 2, eos 3, <img> 4,
//     </img> 5 reserved in the model; model-spec.md's layout with image markers.
//   - a pretrained SentencePiece model (Llama-2 style: unk 0, bos 1, eos 2, no pad, byte
//     fallback): its own ids, no image markers (an image's tokens stand where its <image> was),
//     and added tokens appended after the SentencePiece vocabulary as LLaVA does (<image> = n,
//     <pad> = n + 1 for an n-piece model), from an added_tokens.json beside the model or
//     data.added_tokens.
//   - a tokenizer.json: the special ids from the tokenizer_config.json beside it (eos_token,
//     pad_token, unk_token) and from its post-processor (the bos it puts first, if any: Qwen's
//     puts none); a family whose vocabulary holds vision tokens lays an image out with them
//     (Qwen: <|vision_start|> + N x <|image_pad|> + <|vision_end|>). Nothing is added unless
//     named (data.added_tokens, or an added_tokens.json holding tokens the file lacks).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace dhp {

class HfTokenizer;

// Largest tokenizer file read: SentencePiece models are a few MB; the cap keeps a wrong path
// (a disk image, a log) from being read whole into memory.
inline constexpr int64_t kMaxTokenizerBytes = int64_t(256) << 20;

// The ids the sequence layout and generation use. The defaults are dhp's own table, which
// checkpoints and shards written before the table was recorded were made with.
struct SpecialIds {
  int32_t pad = 0;        // padding and image-token placeholders
  int32_t unk = 1;
  int32_t bos = 2;
  int32_t eos = 3;
  int32_t image = -1;     // the <image> token of LLaVA's convention (-1: none)
  int32_t img_begin = 4;  // <img> / </img> around an image's tokens (-1: no markers)
  int32_t img_end = 5;
  int32_t image_pad = -1; // the id each of an image's tokens holds (-1: pad's)
  bool markers() const { return img_begin >= 0; }
  bool has_bos() const { return bos >= 0; }
  int32_t image_token() const { return image_pad >= 0 ? image_pad : pad; }
  bool operator==(const SpecialIds&) const = default;
};

// "pad=0 unk=1 bos=2 eos=3 image=-1 img=4 /img=5", plus " image_pad=N" when set: what
// checkpoints record (records without image_pad, written before it existed, read as -1).
std::string format_special_ids(const SpecialIds& ids);
// The inverse; throws dhp::Error naming `what` for text that is not such a record.
SpecialIds parse_special_ids(const std::string& text, const std::string& what);

// A token matched as a whole string in text before SentencePiece runs, with an id after the
// SentencePiece vocabulary.
struct AddedToken {
  std::string text;
  int32_t id = 0;
  bool operator==(const AddedToken&) const = default;
};

// JSON list [["<image>", 32000], ...]: what checkpoints record.
std::string format_added_tokens(const std::vector<AddedToken>& tokens);
std::vector<AddedToken> parse_added_tokens(const std::string& json, const std::string& what);

enum class TokenizerKind { SentencePiece, HuggingFace };

// What an export needs to write Hugging Face's tokenizer files.
struct TokenizerFiles {
  TokenizerKind kind = TokenizerKind::SentencePiece;
  std::string model_path;            // the file read: tokenizer.model or tokenizer.json
  std::string config_path;           // tokenizer.json's tokenizer_config.json ("" when none)
  SpecialIds ids;
  std::vector<AddedToken> added;     // in id order, consecutive from sentencepiece_size
  int sentencepiece_size = 0;        // ids of the file itself (SentencePiece pieces, or a
                                     // tokenizer.json's largest id + 1)
  bool model_has_pad = false;        // pad is one of the model's pieces (else an added token
                                     // or, with neither, unk)
  bool legacy = true;                // a SentencePiece model's tokenizer_config.json "legacy"
};

// The file beside a tokenizer model that lists its added tokens ({"<image>": 32000, ...}).
inline constexpr const char* kAddedTokensFile = "added_tokens.json";

// The files a Tokenizer(path) reads, the tokenizer file first: tokenizer.model or
// tokenizer.json (for a folder, the one it would choose), then the tokenizer_config.json and
// added_tokens.json beside it where they exist. Throws dhp::Error as the constructor does for a
// folder holding neither.
std::vector<std::string> tokenizer_input_files(const std::string& path);

class Tokenizer {
 public:
  // model_path: a SentencePiece model file, a tokenizer.json, or a folder holding either (a
  // Hugging Face checkpoint folder; holding both, the class its tokenizer_config.json names
  // decides: a "...Fast" class or none reads tokenizer.json, as transformers' AutoTokenizer
  // does, a slow class tokenizer.model; the log says which). added_tokens: "auto" = the folder's added_tokens.json when
  // present, else what LLaVA's layout needs (<image>, then <pad> when the model has no pad;
  // nothing for a model with dhp's reserved ids); "none"; or a comma-separated list appended
  // in order. Throws dhp::Error when a file is missing, not a regular file, over
  // kMaxTokenizerBytes, not a SentencePiece model, has no bos or eos, or lists an added token
  // whose id does not follow the vocabulary (naming the token, the id and the file).
  explicit Tokenizer(const std::string& model_path, const std::string& added_tokens = "auto");
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Added tokens are cut out of the text first (leftmost, longest first), each becoming its
  // id; the text between them is encoded by the model (a tokenizer.json's own special tokens,
  // such as <|im_start|>, are recognised in the text as Hugging Face's encode does; no bos or
  // eos is added: the layout places them). Thread-safe.
  // continues: the text follows a special token or an image in the same document (the
  // templates' pieces after an <eos>, and after an <image> that is a token of the folder's own
  // tokenizer): it is encoded as the tokenizer encodes text in that place (a tokenizer.json by
  // its pre-tokenizer's rule, e.g. Metaspace's prepend_scheme "first"; a SentencePiece model
  // whose tokenizer_config.json says legacy=false without the word-boundary prefix, as
  // transformers' LlamaTokenizer does); else as a text of its own. An added token inside the
  // text is such a place for what follows it.
  std::vector<int32_t> encode(const std::string& text, bool continues = false) const;
  // Added tokens decode to their text; ids outside the vocabulary (a model may have a larger
  // output layer) decode as <unk> (SentencePiece) or nothing (tokenizer.json, as Hugging Face
  // decodes them).
  std::string decode(const std::vector<int32_t>& ids) const;
  // The token an id stands for, as the file writes it (a SentencePiece piece with its U+2581
  // word mark, a byte-level token in GPT-2's byte alphabet, an added token's text); "" for an
  // id the tokenizer does not know.
  std::string token_text(int32_t id) const;
  // The id of a token given as its text (a piece, a special or added token); -1 when none.
  int32_t token_id(const std::string& text) const;
  // The file's own ids plus added tokens.
  int vocab_size() const;
  // vocab_size() rounded up to a multiple of `multiple`: the rows an embedding needs.
  int padded_vocab_size(int multiple = 64) const;
  const SpecialIds& ids() const { return ids_; }
  const std::vector<AddedToken>& added_tokens() const { return added_; }
  // <image> is a token of the folder's own files (llava-hf's tokenizer, which its processor
  // tokenizes in place in the text), not one dhp added for LLaVA's layout (whose training code
  // encodes the text between images piece by piece, tokenizer_image_token).
  bool images_in_text() const { return images_in_text_; }
  TokenizerFiles files() const;
  TokenizerKind kind() const { return hf_ ? TokenizerKind::HuggingFace : TokenizerKind::SentencePiece; }
  // Ids of the file itself, without the tokens added after them.
  int base_size() const { return sp_size_; }
  // The file actually read (for a folder: its tokenizer.model or tokenizer.json).
  const std::string& path() const { return path_; }
  // FNV-1a of the model file's bytes, continued over the added tokens when there are any:
  // checkpoints and shards record it to detect a replaced tokenizer.
  uint64_t hash() const { return hash_; }

 private:
  void encode_pieces(const std::string& text, bool continues, std::vector<int32_t>& out) const;
  std::vector<int> encode_raw(const std::string& text) const;
  static constexpr const char* kUnkText = "<unk>";
  void load_sentencepiece(const std::string& bytes);
  void load_hugging_face(const std::string& bytes);
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_raw_;  // legacy=false: no dummy prefix
  size_t unk_pieces_ = 0;                                            // pieces of kUnkText in sp_raw_
  std::unique_ptr<HfTokenizer> hf_;
  std::string path_;
  std::string config_path_;
  uint64_t hash_ = 0;
  SpecialIds ids_;
  std::vector<AddedToken> added_;
  int sp_size_ = 0;  // ids of the file itself
  bool model_has_pad_ = false;
  bool images_in_text_ = false;
};

// Trains a BPE model on `texts` and writes it to model_path, reserving the ids above (a
// small corpus still works: hard_vocab_limit is off). Deterministic for the same inputs.
void train_tokenizer(const std::vector<std::string>& texts, int vocab_size,
                     const std::string& model_path);

}  // namespace dhp
