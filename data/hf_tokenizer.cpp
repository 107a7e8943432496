// Hugging Face tokenizer.json BPE tokenizers; see hf_tokenizer.h. The semantics follow the
// Rust `tokenizers` crate 0.22 (tokenizer/added_vocabulary.rs, normalizers/*, pre_tokenizers/*,
// models/bpe/{model,word}.rs, processors/template.rs, decoders/*); comments name the places
// where its behaviour is unusual and kept on purpose.
//
// This file holds the tokenizer itself: loading the file, the added tokens and how they are
// cut out of the text, the post-processor, encode and decode. The components live in data/hf/:
//   unicode       UTF-8, general categories, the character tests under each Unicode version
//   json_fields   JSON access with messages naming the file and the key
//   regex         Oniguruma patterns run by PCRE2, split behaviours
//   normalizers   pre_tokenizers   bpe (the model)   decoders
//   scratch       the per-call buffers, pooled
#include "data/hf_tokenizer.h"

#include <unicode/uversion.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "core/check.h"
#include "core/text.h"
#include "data/hf/bpe.h"
#include "data/hf/decoders.h"
#include "data/hf/json_fields.h"
#include "data/hf/normalizers.h"
#include "data/hf/pre_tokenizers.h"
#include "data/hf/scratch.h"
#include "data/hf/unicode.h"

namespace dhp {

// The components (data/hf/) are used throughout this file.
using namespace hf;

namespace {

struct TransparentHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, int32_t, TransparentHash, std::equal_to<>>;

// ------------------------------------------------------------------------------------------
// Added tokens (tokenizer/added_vocabulary.rs).

// Leftmost-longest, non-overlapping occurrences of a set of strings (aho-corasick's
// MatchKind::LeftmostLongest, by a byte trie walked from each candidate position).
class TokenTrie {
 public:
  TokenTrie() : node_token_(1, -1) { first_.fill(false); }
  bool empty() const { return node_token_.size() == 1; }
  void add(std::string_view s, int32_t token) {
    int32_t node = 0;
    for (unsigned char b : s) {
      const uint64_t key = (uint64_t(node) << 8) | b;
      auto it = edges_.find(key);
      if (it == edges_.end()) {
        it = edges_.emplace(key, int32_t(node_token_.size())).first;
        node_token_.push_back(-1);
      }
      node = it->second;
    }
    node_token_[node] = token;
    first_[static_cast<unsigned char>(s[0])] = true;
  }
  void find_all(std::string_view s, std::vector<AddedMatch>& out) const {
    out.clear();
    size_t i = 0;
    while (i < s.size()) {
      if (!first_[static_cast<unsigned char>(s[i])]) {
        ++i;
        continue;
      }
      int32_t node = 0, best = -1;
      size_t best_end = 0;
      for (size_t j = i; j < s.size(); ++j) {
        const auto it = edges_.find((uint64_t(node) << 8) | static_cast<unsigned char>(s[j]));
        if (it == edges_.end()) break;
        node = it->second;
        if (node_token_[node] >= 0) {
          best = node_token_[node];
          best_end = j + 1;
        }
      }
      if (best >= 0) {
        out.push_back({i, best_end, best});
        i = best_end;
      } else {
        ++i;
      }
    }
  }

 private:
  std::vector<int32_t> node_token_;
  std::unordered_map<uint64_t, int32_t> edges_;
  std::array<bool, 256> first_;
};

bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t k = s.size() - 1;
  while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
  size_t n;
  return is_word_char(decode_at(s, k, &n));
}
bool starts_with_word(std::string_view s) {
  size_t n;
  return !s.empty() && is_word_char(decode_at(s, 0, &n));
}

// AddedVocabulary::find_matches: cuts the matches of `trie` out of `s`, applying the matched
// token's single_word, lstrip and rstrip.
void split_added(std::string_view s, const TokenTrie& trie, const std::vector<HfAddedToken>& tokens,
                 std::vector<AddedMatch>& matches, std::vector<Piece>& out) {
  out.clear();
  trie.find_all(s, matches);
  size_t start_offset = 0;
  for (const auto& m : matches) {
    const HfAddedToken& t = tokens[m.token];
    size_t start = m.begin, stop = m.end;
    if (t.single_word) {
      const bool start_space = start == 0 || !ends_with_word(s.substr(0, start));
      const bool stop_space = stop == s.size() || !starts_with_word(s.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) {
      size_t k = start;  // the start of the run of white space that ends at `start`
      while (k > 0) {
        size_t p = k - 1;
        while (p > 0 && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
        size_t n;
        if (!is_white_space(decode_at(s, p, &n))) break;
        k = p;
      }
      start = std::max(k, start_offset);
    }
    if (t.rstrip) {
      while (stop < s.size()) {
        size_t n;
        if (!is_white_space(decode_at(s, stop, &n))) break;
        stop += n;
      }
    }
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, t.id});
    start_offset = stop;
  }
  if (start_offset != s.size()) out.push_back({start_offset, s.size(), -1});
}

}  // namespace

// ------------------------------------------------------------------------------------------

struct HfTokenizer::Impl {
  std::string name;
  std::vector<std::unique_ptr<Normalizer>> normalizers;
  std::vector<std::unique_ptr<PreTokenizer>> pre_tokenizers;
  std::unique_ptr<Bpe> model;
  std::vector<std::unique_ptr<Decoder>> decoders;
  bool has_decoder = false;
  std::vector<int32_t> prefix, suffix;

  std::vector<HfAddedToken> added;           // file order
  std::unordered_map<int32_t, size_t> added_by_id;
  Vocab added_by_content;
  std::unordered_set<std::string, TransparentHash, std::equal_to<>> special_contents;
  TokenTrie raw_trie, normalized_trie;       // values index `added`
  int32_t vocab_size = 0;
  mutable ScratchPool pool;

  void normalize(std::string& s, Scratch& sc) const {
    for (const auto& n : normalizers) n->apply(s, sc);
  }
  void parse_post_processor(const json& j, const Where& w);
  void parse_added_tokens(const json& j, const Where& w);
};

namespace {

// TemplateProcessing's "single" as the ids before and after $A.
void parse_template(const json& j, const Where& w, std::vector<int32_t>& prefix, std::vector<int32_t>& suffix) {
  const json& special = need(j, "special_tokens", w);
  need_object(special, w.at("special_tokens"));
  const json& single = need(j, "single", w);
  if (!single.is_array()) w.at("single").fail("expected an array of pieces, found {}", describe(single));
  std::vector<int32_t> before, after;
  int sequences = 0;
  for (size_t i = 0; i < single.size(); ++i) {
    const Where wp = w.at("single").at(i);
    const json& piece = need_object(single[i], wp);
    if (const json* seq = find_key(piece, "Sequence")) {
      const std::string id = get_string(need_object(*seq, wp.at("Sequence")), "id", wp.at("Sequence"));
      if (id != "A") wp.at("Sequence").fail("a single-sequence template can only hold $A, found ${}", printable(id, 20));
      ++sequences;
    } else if (const json* tok = find_key(piece, "SpecialToken")) {
      const std::string id = get_string(need_object(*tok, wp.at("SpecialToken")), "id", wp.at("SpecialToken"));
      const json* entry = find_key(special, id);
      if (!entry) wp.fail("special token \"{}\" is not in special_tokens", printable(id, 60));
      const Where we = w.at("special_tokens").at(printable(id, 60));
      const json& ids = need(need_object(*entry, we), "ids", we);
      if (!ids.is_array()) we.at("ids").fail("expected an array, found {}", describe(ids));
      for (size_t k = 0; k < ids.size(); ++k)
        (sequences == 0 ? before : after).push_back(int32_t(get_uint(ids[k], we.at("ids").at(k))));
    } else {
      wp.fail("expected {{\"Sequence\": ...}} or {{\"SpecialToken\": ...}}, found {}", describe(piece));
    }
  }
  if (sequences != 1) w.at("single").fail("expected exactly one $A, found {}", sequences);
  // A later processor wraps what earlier ones produced.
  prefix.insert(prefix.begin(), before.begin(), before.end());
  suffix.insert(suffix.end(), after.begin(), after.end());
}

}  // namespace

void HfTokenizer::Impl::parse_post_processor(const json& j, const Where& w) {
  if (j.is_null()) return;
  const std::string type = type_of(j, w);
  if (type == "Sequence") {
    const json& list = need(j, "processors", w);
    if (!list.is_array()) w.at("processors").fail("expected an array, found {}", describe(list));
    for (size_t i = 0; i < list.size(); ++i) parse_post_processor(list[i], w.at("processors").at(i));
  } else if (type == "TemplateProcessing") {
    parse_template(j, w, prefix, suffix);
  } else if (type != "ByteLevel") {  // ByteLevel only trims offsets
    w.at("type").fail("unsupported post-processor \"{}\" (supported: TemplateProcessing ByteLevel Sequence)",
                      printable(type, 60));
  }
}

// Ids as the library gives them when it loads the file (AddedVocabulary::add_tokens): the
// id of an equal string in the model's vocabulary, else the next after the vocabulary, in
// file order. A file whose ids say otherwise is refused rather than silently renumbered.
void HfTokenizer::Impl::parse_added_tokens(const json& j, const Where& w) {
  if (j.is_null()) return;
  if (!j.is_array()) w.fail("expected an array, found {}", describe(j));
  int32_t next_id = int32_t(model->size());
  for (size_t i = 0; i < j.size(); ++i) {
    const Where wt = w.at(i);
    const json& o = need_object(j[i], wt);
    HfAddedToken t;
    t.content = get_string(o, "content", wt);
    t.id = int32_t(get_uint(need(o, "id", wt), wt.at("id")));
    t.special = get_bool(o, "special", false, wt);
    t.lstrip = get_bool(o, "lstrip", false, wt);
    t.rstrip = get_bool(o, "rstrip", false, wt);
    t.single_word = get_bool(o, "single_word", false, wt);
    t.normalized = get_bool(o, "normalized", !t.special, wt);
    if (t.content.empty()) continue;  // ignored by the library
    if (first_invalid(t.content) != t.content.size()) wt.at("content").fail("not valid UTF-8");
    if (added_by_content.count(t.content))
      wt.at("content").fail("\"{}\" is listed twice", printable(t.content, 60));
    int32_t expected = model->token_to_id(t.content);
    if (expected < 0) expected = next_id++;
    if (t.id != expected)
      wt.at("id").fail("\"{}\" has id {} but Hugging Face tokenizers gives it {} (the id of the same string in the "
                       "model's vocab, else the next id after the vocab, in file order)",
                       printable(t.content, 60), t.id, expected);
    if (added_by_id.count(t.id)) wt.at("id").fail("id {} is used by two added tokens", t.id);
    added_by_id.emplace(t.id, added.size());
    added_by_content.emplace(t.content, t.id);
    if (t.special) special_contents.insert(t.content);
    added.push_back(t);
  }
  for (size_t k = 0; k < added.size(); ++k) {
    const HfAddedToken& t = added[k];
    if (!t.normalized) {
      raw_trie.add(t.content, int32_t(k));
    } else {
      std::string s = t.content;
      auto lease = pool.get();
      normalize(s, *lease);
      if (s.empty()) w.fail("added token \"{}\" normalizes to an empty string", printable(t.content, 60));
      normalized_trie.add(s, int32_t(k));
    }
  }
}

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::~HfTokenizer() = default;

std::unique_ptr<HfTokenizer> HfTokenizer::load(const std::string& json_path) {
  std::ifstream f(json_path, std::ios::binary | std::ios::ate);
  DHP_CHECK(f.good(), "{}: cannot open the tokenizer file", json_path);
  const std::streamoff size = f.tellg();
  DHP_CHECK(size >= 0 && size <= kMaxHfTokenizerJsonBytes,
            "{}: {} bytes is over the {} MiB that a tokenizer.json may have (is it the right file?)", json_path,
            int64_t(size), kMaxHfTokenizerJsonBytes >> 20);
  std::string text(size_t(size), '\0');
  f.seekg(0);
  f.read(text.data(), size);
  DHP_CHECK(f.good(), "{}: read error", json_path);
  return from_json(text, json_path);
}

std::unique_ptr<HfTokenizer> HfTokenizer::from_json(std::string_view json_text, const std::string& name) {
  DHP_CHECK(int64_t(json_text.size()) <= kMaxHfTokenizerJsonBytes, "{}: {} bytes is over the {} MiB limit", name,
            json_text.size(), kMaxHfTokenizerJsonBytes >> 20);
  UVersionInfo unicode;
  u_getUnicodeVersion(unicode);
  DHP_CHECK(unicode[0] >= 15, "{}: ICU with Unicode 15 or later is needed (this ICU has Unicode {})", name, int(unicode[0]));
  json root;
  try {
    root = json::parse(json_text, [&](int depth, json::parse_event_t, json&) {
      if (depth > kMaxHfTokenizerJsonDepth)
        throw Error(fmt::format("{}: JSON nested deeper than {} levels", name, kMaxHfTokenizerJsonDepth));
      return true;
    });
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: not valid JSON: {}", name, printable(e.what(), 300)));
  }
  const Where top{name, ""};
  need_object(root, top);
  if (const json* v = find_key(root, "version"); v && !(v->is_string() && v->get<std::string>() == "1.0"))
    top.at("version").fail("unknown tokenizer.json version {} (1.0 is supported)", describe(*v));
  for (const char* key : {"truncation", "padding"})
    if (const json* v = find_key(root, key); v && !v->is_null())
      top.at(key).fail("must be null: dhp does its own truncation and padding");

  auto impl = std::make_unique<Impl>();
  impl->name = name;
  const auto part = [&](const char* key) -> const json& {
    static const json null_value;
    const json* v = find_key(root, key);
    return v ? *v : null_value;
  };
  parse_normalizer(part("normalizer"), top.at("normalizer"), impl->normalizers);
  parse_pre_tokenizer(part("pre_tokenizer"), top.at("pre_tokenizer"), impl->pre_tokenizers);
  if (!impl->normalizers.empty())
    for (const auto& p : impl->pre_tokenizers)
      if (is_metaspace_first(*p))
        top.at("pre_tokenizer").fail("Metaspace with prepend_scheme \"first\" together with a normalizer is not supported");
  impl->model = std::make_unique<Bpe>(need(root, "model", top), top.at("model"));
  impl->parse_added_tokens(part("added_tokens"), top.at("added_tokens"));
  impl->parse_post_processor(part("post_processor"), top.at("post_processor"));
  if (!part("decoder").is_null()) {
    parse_decoder(part("decoder"), top.at("decoder"), impl->decoders);
    impl->has_decoder = true;
  }
  int32_t max_id = impl->model->max_id();
  for (const auto& t : impl->added) max_id = std::max(max_id, t.id);
  impl->vocab_size = max_id + 1;
  for (const auto* list : {&impl->prefix, &impl->suffix})
    for (int32_t id : *list)
      if (id >= impl->vocab_size)
        top.at("post_processor").fail("special token id {} is outside the vocabulary ({} ids)", id, impl->vocab_size);
  return std::unique_ptr<HfTokenizer>(new HfTokenizer(std::move(impl)));
}

std::vector<int32_t> HfTokenizer::encode(std::string_view text, bool add_special_tokens, bool at_start) const {
  const Impl& t = *impl_;
  // Symbols and merge-queue entries hold 32-bit positions.
  DHP_CHECK(text.size() < (size_t(1) << 31), "{}: a text of {} bytes is over the 2 GiB that encode takes", t.name, text.size());
  std::string clean;
  if (first_invalid(text) != text.size()) {
    clean = replace_invalid(text);
    text = clean;
  }
  auto lease = t.pool.get();
  Scratch& sc = *lease;
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = t.prefix;
  const std::function<void(std::string_view)> word = [&](std::string_view w) { t.model->tokenize(w, sc.bpe, ids); };
  Pipeline pipeline(t.pre_tokenizers, sc, word);

  std::vector<AddedMatch>& matches = sc.added_matches;
  std::vector<Piece>& raw_pieces = sc.raw_pieces;
  std::vector<Piece>& norm_pieces = sc.norm_pieces;
  std::string& normalized = sc.normalized;
  raw_pieces.clear();
  if (t.raw_trie.empty()) {
    raw_pieces.push_back({0, text.size(), -1});
  } else {
    split_added(text, t.raw_trie, t.added, matches, raw_pieces);
  }
  for (const Piece& rp : raw_pieces) {
    if (rp.id >= 0) {
      ids.push_back(rp.id);
      continue;
    }
    std::string_view piece = text.substr(rp.begin, rp.end - rp.begin);
    if (!t.normalizers.empty()) {
      normalized.assign(piece);
      t.normalize(normalized, sc);
      piece = normalized;
    }
    if (piece.empty()) continue;
    if (t.normalized_trie.empty()) {
      pipeline.emit(0, piece, at_start && rp.begin == 0);
      continue;
    }
    split_added(piece, t.normalized_trie, t.added, matches, norm_pieces);
    for (const Piece& np : norm_pieces) {
      if (np.id >= 0) {
        ids.push_back(np.id);
      } else {
        pipeline.emit(0, piece.substr(np.begin, np.end - np.begin), at_start && rp.begin == 0 && np.begin == 0);
      }
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), t.suffix.begin(), t.suffix.end());
  return ids;
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const Impl& t = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    std::optional<std::string_view> token;
    if (const auto it = t.added_by_id.find(id); it != t.added_by_id.end()) {
      token = t.added[it->second].content;
    } else {
      token = t.model->id_to_token(id);
    }
    if (!token) continue;  // unknown ids are skipped, as the library does
    if (skip_special_tokens && t.special_contents.count(*token)) continue;
    tokens.emplace_back(*token);
  }
  if (!t.has_decoder) {
    std::string out;
    for (size_t k = 0; k < tokens.size(); ++k) out += (k ? " " : "") + tokens[k];
    return out;
  }
  auto lease = t.pool.get();
  for (const auto& d : t.decoders) d->apply(tokens, *lease);
  std::string out;
  for (const auto& s : tokens) out += s;
  return out;
}

std::string HfTokenizer::id_to_token(int32_t id) const {
  if (const auto it = impl_->added_by_id.find(id); it != impl_->added_by_id.end()) return impl_->added[it->second].content;
  const auto s = impl_->model->id_to_token(id);
  return s ? std::string(*s) : std::string();
}

int32_t HfTokenizer::token_to_id(std::string_view token) const {
  if (const auto it = impl_->added_by_content.find(token); it != impl_->added_by_content.end()) return it->second;
  return impl_->model->token_to_id(token);
}

int32_t HfTokenizer::vocab_size() const { return impl_->vocab_size; }
const std::vector<HfAddedToken>& HfTokenizer::added_tokens() const { return impl_->added; }
const std::vector<int32_t>& HfTokenizer::special_prefix() const { return impl_->prefix; }
const std::vector<int32_t>& HfTokenizer::special_suffix() const { return impl_->suffix; }

}  // namespace dhp
