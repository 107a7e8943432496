#include "data/tokenizer.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <unordered_map>

#include "core/check.h"
#include "core/hash.h"
#include "core/input.h"
#include "core/json_input.h"
#include "core/text.h"
#include "data/hf_tokenizer.h"

namespace dhp {

namespace {

namespace fs = std::filesystem;

// Feeds the in-memory corpus to the trainer, in order, so no temporary file is needed and the
// result does not depend on file-system state.
class VectorIterator : public sentencepiece::SentenceIterator {
 public:
  explicit VectorIterator(const std::vector<std::string>& texts) : texts_(texts) {}
  bool done() const override { return i_ >= texts_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return texts_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& texts_;
  size_t i_ = 0;
};

// Added-token files are a few hundred bytes; the cap only guards against a wrong file.
constexpr int64_t kMaxAddedTokensBytes = int64_t(1) << 20;

std::string trim_spaces(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

// The id of `piece` in the model, or -1 when the model does not hold it (PieceToId answers
// unk for an unknown piece).
int32_t piece_id(const sentencepiece::SentencePieceProcessor& sp, const std::string& piece) {
  const int id = sp.PieceToId(piece);
  return id >= 0 && sp.IdToPiece(id) == piece ? int32_t(id) : -1;
}

// added_tokens.json as Hugging Face writes it: {"<image>": 32000, "<pad>": 32001}.
std::vector<AddedToken> read_added_tokens_file(const std::string& path) {
  const std::string text =
      InputFile("added tokens", path).read_all(kMaxAddedTokensBytes, "the size cap of " + path);
  const auto j = parse_json_input(text, "'" + path + "'");
  DHP_CHECK(!j.is_discarded() && j.is_object(),
            "'{}' is not a JSON object of added tokens ({{\"<image>\": 32000, ...}})", path);
  std::vector<AddedToken> out;
  for (const auto& [key, value] : j.items()) {
    DHP_CHECK(value.is_number_integer(), "'{}': added token '{}' has a non-integer id {}", path,
              key, json_excerpt(value));
    DHP_CHECK(!key.empty(), "'{}': an added token is the empty string", path);
    const int64_t id = value.get<int64_t>();
    DHP_CHECK(id >= 0 && id < (int64_t(1) << 30), "'{}': added token '{}' has id {}", path, key,
              id);
    out.push_back({key, int32_t(id)});
  }
  std::sort(out.begin(), out.end(), [](const AddedToken& a, const AddedToken& b) {
    return a.id < b.id;
  });
  return out;
}

// tokenizer_config.json files are tens of kB (chat templates included).
constexpr int64_t kMaxTokenizerConfigBytes = int64_t(16) << 20;

// tokenizer_config.json beside a tokenizer.json: an empty object when there is none.
nlohmann::json read_tokenizer_config(const std::string& path) {
  std::error_code ec;
  if (path.empty() || !fs::exists(path, ec)) return nlohmann::json::object();
  const std::string text =
      InputFile("tokenizer config", path).read_all(kMaxTokenizerConfigBytes, "the size cap of " + path);
  auto j = parse_json_input(text, "'" + path + "'");
  DHP_CHECK(!j.is_discarded() && j.is_object(), "'{}' is not a JSON object (a tokenizer_config.json)", path);
  return j;
}

// A special token of tokenizer_config.json ("eos_token": "<|im_end|>" or {"content": ...});
// "" when absent or null.
std::string config_token(const nlohmann::json& cfg, const char* key, const std::string& path) {
  const auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  throw Error(fmt::format("'{}': {} is {}, not a token's text or {{\"content\": text}}", path, key,
                          json_excerpt(*it)));
}

// What a tokenizer path names: the file to read, whether it is a tokenizer.json, and, for a
// folder holding both kinds, which was chosen and why.
struct TokenizerSource {
  std::string file;
  bool json = false;
  std::string note;
};

TokenizerSource resolve_source(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return {path, fs::path(path).extension() == ".json", ""};
  const fs::path dir(path), model = dir / "tokenizer.model", json = dir / "tokenizer.json";
  const bool has_model = fs::exists(model, ec), has_json = fs::exists(json, ec);
  DHP_CHECK(has_model || has_json,
            "tokenizer '{}' is a folder without tokenizer.model or tokenizer.json (a Hugging Face "
            "checkpoint folder holds one; else set data.tokenizer to the file)",
            printable(path));
  if (!has_json) return {model.string(), false, ""};
  if (!has_model) return {json.string(), true, ""};
  // transformers' AutoTokenizer reads tokenizer.json unless the class it is told is a slow one.
  const auto cfg = read_tokenizer_config((dir / "tokenizer_config.json").string());
  const auto cls = cfg.find("tokenizer_class");
  const std::string name = cls != cfg.end() && cls->is_string() ? cls->get<std::string>() : "";
  const bool fast = name.empty() || name == "PreTrainedTokenizerFast" ||
                    (name.size() > 4 && name.compare(name.size() - 4, 4, "Fast") == 0);
  return {(fast ? json : model).string(), fast,
          fmt::format("tokenizer folder '{}' holds tokenizer.json and tokenizer.model: {} is read ({})",
                      printable(path), fast ? "tokenizer.json" : "tokenizer.model",
                      name.empty() ? "tokenizer_config.json names no tokenizer_class; transformers reads "
                                     "tokenizer.json then"
                                   : "tokenizer_config.json's tokenizer_class is " + printable(name))};
}

}  // namespace

std::string format_special_ids(const SpecialIds& s) {
  std::string text = fmt::format("pad={} unk={} bos={} eos={} image={} img={} /img={}", s.pad, s.unk,
                                 s.bos, s.eos, s.image, s.img_begin, s.img_end);
  if (s.image_pad >= 0) text += fmt::format(" image_pad={}", s.image_pad);
  return text;
}

SpecialIds parse_special_ids(const std::string& text, const std::string& what) {
  SpecialIds s;
  const std::map<std::string, int32_t*> fields = {
      {"pad", &s.pad}, {"unk", &s.unk},         {"bos", &s.bos},        {"eos", &s.eos},
      {"image", &s.image}, {"img", &s.img_begin}, {"/img", &s.img_end}, {"image_pad", &s.image_pad}};
  std::map<std::string, bool> seen;
  std::istringstream in(text);
  for (std::string item; in >> item;) {
    const auto eq = item.find('=');
    const auto f = eq == std::string::npos ? fields.end() : fields.find(item.substr(0, eq));
    DHP_CHECK(f != fields.end() && !seen[f->first], "{}: '{}' is not a special-id record ({})",
              what, text, format_special_ids(SpecialIds{}));
    seen[f->first] = true;
    try {
      size_t used = 0;
      const std::string v = item.substr(eq + 1);
      *f->second = int32_t(std::stoi(v, &used));
      DHP_CHECK(used == v.size(), "{}: '{}' in the special-id record", what, item);
    } catch (const std::logic_error&) {
      throw Error(fmt::format("{}: '{}' in the special-id record is not an integer", what, item));
    }
  }
  // image_pad is optional: records written before it existed have none.
  DHP_CHECK(seen.size() + (seen.count("image_pad") ? 0 : 1) == fields.size(),
            "{}: the special-id record '{}' lacks fields", what, text);
  return s;
}

std::string format_added_tokens(const std::vector<AddedToken>& tokens) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& t : tokens) j.push_back({t.text, t.id});
  return j.dump();
}

std::vector<AddedToken> parse_added_tokens(const std::string& text, const std::string& what) {
  const auto j = parse_json_input(text, what);
  DHP_CHECK(!j.is_discarded() && j.is_array(), "{}: '{}' is not a list of added tokens", what,
            printable(text, 120));
  std::vector<AddedToken> out;
  for (const auto& e : j) {
    DHP_CHECK(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_number_integer(),
              "{}: '{}' is not a list of [text, id] pairs", what, text);
    out.push_back({e[0].get<std::string>(), e[1].get<int32_t>()});
  }
  return out;
}

std::vector<std::string> tokenizer_input_files(const std::string& path) {
  const TokenizerSource source = resolve_source(path);
  std::vector<std::string> out = {source.file};
  std::error_code ec;
  const fs::path dir = fs::path(source.file).parent_path();
  // A tokenizer.json's special tokens and a SentencePiece model's `legacy` are read from it.
  if (fs::exists(dir / "tokenizer_config.json", ec)) out.push_back((dir / "tokenizer_config.json").string());
  if (fs::exists(dir / kAddedTokensFile, ec)) out.push_back((dir / kAddedTokensFile).string());
  return out;
}

Tokenizer::Tokenizer(const std::string& model_path, const std::string& added_tokens) : path_(model_path) {
  const TokenizerSource source = resolve_source(model_path);
  path_ = source.file;
  if (!source.note.empty()) spdlog::info("{}", source.note);
  // Loaded from the bytes it hashes, so the hash describes exactly the model in use.
  const std::string bytes =
      InputFile("tokenizer", path_, " (set data.tokenizer, or create one with `dhp data synth`)")
          .read_all(source.json ? kMaxHfTokenizerJsonBytes : kMaxTokenizerBytes,
                    "the size cap of a tokenizer file");
  if (source.json)
    load_hugging_face(bytes);
  else
    load_sentencepiece(bytes);

  // The added tokens: listed beside the model, named by the configuration, or what the layout
  // needs. Tokens the file already holds are not added again.
  std::error_code ec;
  const std::string listed = (fs::path(path_).parent_path() / kAddedTokensFile).string();
  std::string source_name;  // for messages
  // <image> is a token of the folder's own files (llava-hf's tokenizer), or one dhp adds.
  images_in_text_ = token_id("<image>") >= 0;
  if (added_tokens == "auto" && fs::exists(listed, ec)) {
    // Some conversions restate tokens of the model itself ({"</s>": 2}): those add nothing.
    for (AddedToken& t : read_added_tokens_file(listed)) {
      images_in_text_ = images_in_text_ || t.text == "<image>";
      if (token_id(t.text) != t.id) added_.push_back(std::move(t));
    }
    source_name = listed;
  } else if (added_tokens == "auto" && !hf_) {
    const bool markers = token_id("<img>") >= 0 && token_id("</img>") >= 0;
    int32_t next = sp_size_;
    if (!markers && token_id("<image>") < 0) added_.push_back({"<image>", next++});
    if (!model_has_pad_ && token_id("<pad>") < 0) added_.push_back({"<pad>", next++});
    source_name = "the tokens LLaVA's layout needs";
  } else if (added_tokens != "auto" && added_tokens != "none") {
    std::istringstream in(added_tokens);
    for (std::string item; std::getline(in, item, ',');) {
      item = trim_spaces(item);
      DHP_CHECK(!item.empty(), "data.added_tokens '{}': an empty entry", added_tokens);
      if (hf_ && token_id(item) >= 0) continue;  // the file holds it already
      added_.push_back({item, int32_t(sp_size_ + int32_t(added_.size()))});
    }
    source_name = "data.added_tokens";
  }
  for (size_t i = 0; i < added_.size(); ++i) {
    const AddedToken& t = added_[i];
    const int32_t want = sp_size_ + int32_t(i);
    DHP_CHECK(t.id == want,
              "added token '{}' has id {} in '{}', but added tokens take the ids after the "
              "{} of {} {}, in order: expected {}",
              t.text, t.id, source_name, hf_ ? "tokenizer.json's vocabulary" : "SentencePiece vocabulary",
              sp_size_, hf_ ? "ids" : "pieces", want);
    const int32_t own = hf_ ? hf_->token_to_id(t.text) : piece_id(*sp_, t.text);
    DHP_CHECK(own < 0, "added token '{}' (from {}) is already {} {} of tokenizer '{}'", t.text, source_name,
              hf_ ? "token" : "piece", own, path_);
    for (size_t k = 0; k < i; ++k)
      DHP_CHECK(added_[k].text != t.text, "added token '{}' is listed twice in {}", t.text,
                source_name);
  }

  hash_ = fnv1a(bytes.data(), bytes.size());
  if (sp_raw_) hash_ = fnv1a("legacy=false", 12, hash_);  // the same file encodes differently
  for (const auto& t : added_) {
    const std::string line = fmt::format("{}\t{}\n", t.text, t.id);
    hash_ = fnv1a(line.data(), line.size(), hash_);
  }

  if (hf_) {
    // A pad of the file's own, an added <pad>, or else eos (padding never carries loss).
    const int32_t added_pad = token_id("<pad>");
    if (ids_.pad < 0) ids_.pad = added_pad >= 0 ? added_pad : ids_.eos;
    ids_.image = token_id("<image>");
    return;
  }
  ids_.unk = int32_t(sp_->unk_id());
  ids_.bos = int32_t(sp_->bos_id());
  ids_.eos = int32_t(sp_->eos_id());
  // Without a pad of its own or an added <pad>, unk pads, as LLaVA's Vicuna runs do.
  ids_.pad = model_has_pad_ ? int32_t(sp_->pad_id()) : token_id("<pad>") >= 0 ? token_id("<pad>") : ids_.unk;
  ids_.image = token_id("<image>");
  ids_.img_begin = token_id("<img>");
  ids_.img_end = token_id("</img>");
  if (ids_.img_begin < 0 || ids_.img_end < 0) ids_.img_begin = ids_.img_end = -1;
}

void Tokenizer::load_sentencepiece(const std::string& bytes) {
  sp_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto st = sp_->LoadFromSerializedProto(bytes);
  DHP_CHECK(st.ok(), "tokenizer '{}' is not a valid SentencePiece model: {}", path_,
            st.ToString());
  sp_size_ = sp_->GetPieceSize();
  DHP_CHECK(sp_->bos_id() >= 0 && sp_->eos_id() >= 0,
            "tokenizer '{}' has no <bos> or no <eos> id (bos_id {}, eos_id {}): the sequence "
            "layout needs both",
            path_, sp_->bos_id(), sp_->eos_id());
  model_has_pad_ = sp_->pad_id() >= 0;
  // transformers' LlamaTokenizer with legacy=false (tokenizer_config.json; absent means true)
  // encodes the text after a special token without SentencePiece's word-boundary prefix: a
  // second copy of the model with add_dummy_prefix off does that. Protobuf merges a repeated
  // message field into the first, so appending normalizer_spec {add_dummy_prefix: false}
  // (field 3 of ModelProto, field 3 of NormalizerSpec) changes only that flag.
  const std::string config = (fs::path(path_).parent_path() / "tokenizer_config.json").string();
  const auto cfg = read_tokenizer_config(config);
  const auto legacy = cfg.find("legacy");
  DHP_CHECK(legacy == cfg.end() || legacy->is_boolean() || legacy->is_null(), "'{}': legacy is {}, not true or false",
            config, json_excerpt(*legacy));
  if (legacy != cfg.end() && legacy->is_boolean() && !legacy->get<bool>()) {
    sp_raw_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
    const auto raw = sp_raw_->LoadFromSerializedProto(bytes + std::string("\x1a\x02\x18\x00", 4));
    DHP_CHECK(raw.ok(), "tokenizer '{}': cannot load it without its word-boundary prefix: {}", path_, raw.ToString());
    unk_pieces_ = encode_raw(kUnkText).size();
  }
}

void Tokenizer::load_hugging_face(const std::string& bytes) {
  hf_ = HfTokenizer::from_json(bytes, path_);
  sp_size_ = hf_->vocab_size();
  config_path_ = (fs::path(path_).parent_path() / "tokenizer_config.json").string();
  std::error_code ec;
  if (!fs::exists(config_path_, ec)) config_path_.clear();
  const auto cfg = read_tokenizer_config(config_path_);
  const std::string where = config_path_.empty() ? path_ : config_path_;
  auto id_of = [&](const char* key) {
    const std::string text = config_token(cfg, key, where);
    if (text.empty()) return int32_t(-1);
    const int32_t id = hf_->token_to_id(text);
    DHP_CHECK(id >= 0, "'{}': {} '{}' is not a token of '{}'", where, key, printable(text), path_);
    return id;
  };
  // bos is what the post-processor puts first, as transformers' tokenizer(text) does: Llama-3's
  // <|begin_of_text|>; Qwen's adds none, whatever bos_token says.
  const auto& prefix = hf_->special_prefix();
  DHP_CHECK(prefix.size() <= 1, "tokenizer '{}': its post-processor puts {} tokens before a text; "
            "dhp's layout places at most one (a bos)", path_, prefix.size());
  ids_.bos = prefix.empty() ? -1 : prefix[0];
  ids_.eos = id_of("eos_token");
  DHP_CHECK(ids_.eos >= 0,
            "tokenizer '{}' has no eos_token ({}): the sequence layout ends every sample with one",
            path_, config_path_.empty() ? "no tokenizer_config.json beside it" : "none in " + config_path_);
  ids_.unk = id_of("unk_token");
  ids_.pad = id_of("pad_token");
  model_has_pad_ = ids_.pad >= 0;
  // A family with vision tokens lays an image out with them: InternVL's <img> <IMG_CONTEXT>...
  // </img> (its tokenizer, Qwen2.5's plus these, holds Qwen's too), else Qwen2-VL's onwards.
  ids_.img_begin = ids_.img_end = -1;
  for (const auto& [begin, end, pad] : {std::array<const char*, 3>{"<img>", "</img>", "<IMG_CONTEXT>"},
                                        std::array<const char*, 3>{"<|vision_start|>", "<|vision_end|>", "<|image_pad|>"}}) {
    const int32_t vs = hf_->token_to_id(begin), ve = hf_->token_to_id(end), ip = hf_->token_to_id(pad);
    if (vs < 0 || ve < 0 || ip < 0) continue;
    ids_.img_begin = vs, ids_.img_end = ve, ids_.image_pad = ip;
    break;
  }
}

int32_t Tokenizer::token_id(const std::string& text) const {
  const int32_t id = hf_ ? hf_->token_to_id(text) : piece_id(*sp_, text);
  if (id >= 0) return id;
  for (const auto& t : added_)
    if (t.text == text) return t.id;
  return -1;
}

Tokenizer::~Tokenizer() = default;

std::vector<int> Tokenizer::encode_raw(const std::string& text) const {
  std::vector<int> ids;
  const auto st = sp_raw_->Encode(text, &ids);
  DHP_CHECK(st.ok(), "tokenizer '{}': cannot encode text: {}", path_, st.ToString());
  return ids;
}

void Tokenizer::encode_pieces(const std::string& text, bool continues, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  if (hf_) {
    const std::vector<int32_t> ids = hf_->encode(text, /*add_special_tokens=*/false, /*at_start=*/!continues);
    out.insert(out.end(), ids.begin(), ids.end());
    return;
  }
  std::vector<int> ids;
  if (continues && sp_raw_) {
    // LlamaTokenizer._tokenize without legacy: a piece that starts with a space is encoded
    // behind "<unk>" (so the space stays a word boundary) and the unk's pieces dropped; any
    // other piece without a prefix.
    if (text[0] == ' ') {
      ids = encode_raw(std::string(kUnkText) + text);
      ids.erase(ids.begin(), ids.begin() + long(std::min(unk_pieces_, ids.size())));
    } else {
      ids = encode_raw(text);
    }
  } else {
    const auto st = sp_->Encode(text, &ids);
    DHP_CHECK(st.ok(), "tokenizer '{}': cannot encode text: {}", path_, st.ToString());
  }
  out.insert(out.end(), ids.begin(), ids.end());
}

std::vector<int32_t> Tokenizer::encode(const std::string& text, bool continues) const {
  std::vector<int32_t> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t best = std::string::npos;
    const AddedToken* hit = nullptr;
    for (const auto& t : added_) {
      const size_t p = text.find(t.text, at);
      if (p != std::string::npos &&
          (p < best || (p == best && t.text.size() > hit->text.size())))
        best = p, hit = &t;
    }
    encode_pieces(text.substr(at, best == std::string::npos ? std::string::npos : best - at),
                  continues || at > 0, out);
    if (!hit) break;
    out.push_back(hit->id);
    at = best + hit->text.size();
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  std::vector<int> run;
  auto flush = [&] {
    if (run.empty()) return;
    std::string piece;
    if (hf_) {
      text += hf_->decode(std::vector<int32_t>(run.begin(), run.end()), /*skip_special_tokens=*/false);
      run.clear();
      return;
    }
    const auto st = sp_->Decode(run, &piece);
    DHP_CHECK(st.ok(), "tokenizer '{}': cannot decode ids: {}", path_, st.ToString());
    text += piece;
    run.clear();
  };
  for (int32_t id : ids) {
    if (id >= sp_size_ && id < vocab_size()) {
      flush();
      text += added_[size_t(id - sp_size_)].text;
    } else if (hf_) {
      run.push_back(id);  // Hugging Face's decode skips unknown ids
    } else {
      run.push_back(id >= 0 && id < sp_size_ ? id : ids_.unk);
    }
  }
  flush();
  return text;
}

std::string Tokenizer::token_text(int32_t id) const {
  if (id >= sp_size_ && id < vocab_size()) return added_[size_t(id - sp_size_)].text;
  if (id < 0 || id >= sp_size_) return {};
  return hf_ ? hf_->id_to_token(id) : sp_->IdToPiece(id);
}

int Tokenizer::vocab_size() const { return sp_size_ + int(added_.size()); }

int Tokenizer::padded_vocab_size(int multiple) const {
  DHP_CHECK(multiple >= 1, "padded_vocab_size: multiple {} must be positive", multiple);
  return (vocab_size() + multiple - 1) / multiple * multiple;
}

TokenizerFiles Tokenizer::files() const {
  return TokenizerFiles{kind(), path_, config_path_, ids_, added_, sp_size_, model_has_pad_, sp_raw_ == nullptr};
}

void train_tokenizer(const std::vector<std::string>& texts, int vocab_size,
                     const std::string& model_path) {
  DHP_CHECK(!texts.empty(), "train_tokenizer: no texts to train on");
  DHP_CHECK(vocab_size >= 16, "train_tokenizer: vocab_size {} is too small (>= 16)", vocab_size);
  // BPE rather than unigram: on a small closed vocabulary (the demo's captions) unigram
  // pruning keeps letters and fragments and splits common words; BPE merges them whole.
  // A fixed seed and one thread make the model file reproducible.
  sentencepiece::SetRandomGeneratorSeed(1234);
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"hard_vocab_limit", "false"},
      {"character_coverage", "1.0"},
      {"pad_id", "0"},
      {"unk_id", "1"},
      {"bos_id", "2"},
      {"eos_id", "3"},
      {"user_defined_symbols", "<img>,</img>"},
      {"num_threads", "1"},
      {"minloglevel", "2"},
  };
  VectorIterator it(texts);
  std::string proto;
  const auto st = sentencepiece::SentencePieceTrainer::Train(args, &it, &proto);
  DHP_CHECK(st.ok(), "tokenizer training failed: {}", st.ToString());
  {
    std::ofstream out(model_path, std::ios::binary | std::ios::trunc);
    DHP_CHECK(out.good(), "cannot write tokenizer '{}'", model_path);
    out.write(proto.data(), std::streamsize(proto.size()));
    DHP_CHECK(out.good(), "cannot write tokenizer '{}'", model_path);
  }
  // The reserved ids are a contract of the sequence layout: re-read and verify them.
  const Tokenizer check(model_path, "none");
  DHP_CHECK(check.ids() == SpecialIds{},
            "tokenizer '{}' was trained without dhp's reserved ids ({}, got {})", model_path,
            format_special_ids(SpecialIds{}), format_special_ids(check.ids()));
}

}  // namespace dhp
