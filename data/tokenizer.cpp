#include "data/tokenizer.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
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

}  // namespace

std::string format_special_ids(const SpecialIds& s) {
  return fmt::format("pad={} unk={} bos={} eos={} image={} img={} /img={}", s.pad, s.unk, s.bos,
                     s.eos, s.image, s.img_begin, s.img_end);
}

SpecialIds parse_special_ids(const std::string& text, const std::string& what) {
  SpecialIds s;
  const std::map<std::string, int32_t*> fields = {
      {"pad", &s.pad}, {"unk", &s.unk},         {"bos", &s.bos},        {"eos", &s.eos},
      {"image", &s.image}, {"img", &s.img_begin}, {"/img", &s.img_end}};
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
  DHP_CHECK(seen.size() == fields.size(), "{}: the special-id record '{}' lacks fields", what,
            text);
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

Tokenizer::Tokenizer(const std::string& model_path, const std::string& added_tokens)
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()), path_(model_path) {
  std::error_code ec;
  if (fs::is_directory(model_path, ec)) {
    path_ = (fs::path(model_path) / "tokenizer.model").string();
    DHP_CHECK(fs::exists(path_, ec),
              "tokenizer '{}' is a folder without tokenizer.model (a Hugging Face checkpoint "
              "folder holds one; else set data.tokenizer to the model file)",
              printable(model_path));
  }
  // Loaded from the bytes it hashes, so the hash describes exactly the model in use.
  const std::string bytes =
      InputFile("tokenizer", path_,
                " (set data.tokenizer, or create one with `dhp data synth`)")
          .read_all(kMaxTokenizerBytes, "the size cap of a tokenizer file");
  const auto st = sp_->LoadFromSerializedProto(bytes);
  DHP_CHECK(st.ok(), "tokenizer '{}' is not a valid SentencePiece model: {}", path_,
            st.ToString());
  sp_size_ = sp_->GetPieceSize();
  DHP_CHECK(sp_->bos_id() >= 0 && sp_->eos_id() >= 0,
            "tokenizer '{}' has no <bos> or no <eos> id (bos_id {}, eos_id {}): the sequence "
            "layout needs both",
            path_, sp_->bos_id(), sp_->eos_id());
  model_has_pad_ = sp_->pad_id() >= 0;

  // The added tokens: listed beside the model, named by the configuration, or what the layout
  // needs.
  const std::string listed = (fs::path(path_).parent_path() / kAddedTokensFile).string();
  std::string source;  // for messages
  if (added_tokens == "auto" && fs::exists(listed, ec)) {
    // Some conversions restate pieces of the model itself ({"</s>": 2}): those add nothing.
    for (AddedToken& t : read_added_tokens_file(listed))
      if (piece_id(*sp_, t.text) != t.id) added_.push_back(std::move(t));
    source = listed;
  } else if (added_tokens == "auto") {
    const bool markers = piece_id(*sp_, "<img>") >= 0 && piece_id(*sp_, "</img>") >= 0;
    int32_t next = sp_size_;
    if (!markers && piece_id(*sp_, "<image>") < 0) added_.push_back({"<image>", next++});
    if (!model_has_pad_ && piece_id(*sp_, "<pad>") < 0) added_.push_back({"<pad>", next++});
    source = "the tokens LLaVA's layout needs";
  } else if (added_tokens != "none") {
    std::istringstream in(added_tokens);
    for (std::string item; std::getline(in, item, ',');) {
      item = trim_spaces(item);
      DHP_CHECK(!item.empty(), "data.added_tokens '{}': an empty entry", added_tokens);
      added_.push_back({item, int32_t(sp_size_ + int32_t(added_.size()))});
    }
    source = "data.added_tokens";
  }
  for (size_t i = 0; i < added_.size(); ++i) {
    const AddedToken& t = added_[i];
    const int32_t want = sp_size_ + int32_t(i);
    DHP_CHECK(t.id == want,
              "added token '{}' has id {} in '{}', but added tokens take the ids after the "
              "SentencePiece vocabulary of {} pieces, in order: expected {}",
              t.text, t.id, source, sp_size_, want);
    DHP_CHECK(piece_id(*sp_, t.text) < 0,
              "added token '{}' (from {}) is already piece {} of tokenizer '{}'", t.text, source,
              piece_id(*sp_, t.text), path_);
    for (size_t k = 0; k < i; ++k)
      DHP_CHECK(added_[k].text != t.text, "added token '{}' is listed twice in {}", t.text,
                source);
  }

  hash_ = fnv1a(bytes.data(), bytes.size());
  for (const auto& t : added_) {
    const std::string line = fmt::format("{}\t{}\n", t.text, t.id);
    hash_ = fnv1a(line.data(), line.size(), hash_);
  }

  auto find = [&](const std::string& text) {
    const int32_t id = piece_id(*sp_, text);
    if (id >= 0) return id;
    for (const auto& t : added_)
      if (t.text == text) return t.id;
    return int32_t(-1);
  };
  ids_.unk = int32_t(sp_->unk_id());
  ids_.bos = int32_t(sp_->bos_id());
  ids_.eos = int32_t(sp_->eos_id());
  // Without a pad of its own or an added <pad>, unk pads, as LLaVA's Vicuna runs do.
  ids_.pad = model_has_pad_ ? int32_t(sp_->pad_id()) : find("<pad>") >= 0 ? find("<pad>") : ids_.unk;
  ids_.image = find("<image>");
  ids_.img_begin = find("<img>");
  ids_.img_end = find("</img>");
  if (ids_.img_begin < 0 || ids_.img_end < 0) ids_.img_begin = ids_.img_end = -1;
}

Tokenizer::~Tokenizer() = default;

void Tokenizer::encode_pieces(const std::string& text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::vector<int> ids;
  const auto st = sp_->Encode(text, &ids);
  DHP_CHECK(st.ok(), "tokenizer '{}': cannot encode text: {}", path_, st.ToString());
  out.insert(out.end(), ids.begin(), ids.end());
}

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
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
    encode_pieces(text.substr(at, best == std::string::npos ? std::string::npos : best - at), out);
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
    const auto st = sp_->Decode(run, &piece);
    DHP_CHECK(st.ok(), "tokenizer '{}': cannot decode ids: {}", path_, st.ToString());
    text += piece;
    run.clear();
  };
  for (int32_t id : ids) {
    if (id >= sp_size_ && id < vocab_size()) {
      flush();
      text += added_[size_t(id - sp_size_)].text;
    } else {
      run.push_back(id >= 0 && id < sp_size_ ? id : ids_.unk);
    }
  }
  flush();
  return text;
}

int Tokenizer::vocab_size() const { return sp_size_ + int(added_.size()); }

int Tokenizer::padded_vocab_size(int multiple) const {
  DHP_CHECK(multiple >= 1, "padded_vocab_size: multiple {} must be positive", multiple);
  return (vocab_size() + multiple - 1) / multiple * multiple;
}

TokenizerFiles Tokenizer::files() const {
  return TokenizerFiles{path_, ids_, added_, sp_size_, model_has_pad_};
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
