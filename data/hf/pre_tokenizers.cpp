// Pre-tokenizers; see pre_tokenizers.h.
#include "data/hf/pre_tokenizers.h"

#include <algorithm>

#include "core/text.h"
#include "data/hf/regex.h"
#include "data/hf/scratch.h"
#include "data/hf/unicode.h"

namespace dhp::hf {
namespace {

// GPT-2's pattern, which ByteLevel's use_regex applies.
constexpr std::string_view kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Emits the spans of `piece` that `matches` and `behavior` keep.
void emit_split(std::string_view piece, bool at_origin, size_t stage, Pipeline& p, Behavior behavior) {
  Scratch& sc = p.scratch();
  std::vector<Span>& spans = sc.stage_spans[stage];
  apply_behavior(sc.stage_matches[stage], behavior, spans);
  for (const Span s : spans)  // deeper stages use their own vectors: this one stays as it is
    p.emit(stage + 1, piece.substr(s.begin, s.end - s.begin), at_origin && s.begin == 0);
}

class SplitPre : public PreTokenizer {
 public:
  SplitPre(const json& j, const Where& w)
      : pattern_(need(j, "pattern", w), w.at("pattern")),
        behavior_(parse_behavior(j, "behavior", w)),
        invert_(get_bool(j, "invert", false, w)) {}
  void run(std::string_view piece, bool at_origin, size_t stage, Pipeline& p) const override {
    Scratch& sc = p.scratch();
    pattern_.find_matches(piece, sc.match, sc.stage_regex[stage], sc.stage_matches[stage]);
    if (invert_)
      for (auto& m : sc.stage_matches[stage]) m.second = !m.second;
    emit_split(piece, at_origin, stage, p, behavior_);
  }

 private:
  Pattern pattern_;
  Behavior behavior_;
  bool invert_;
};

class ByteLevelPre : public PreTokenizer {
 public:
  ByteLevelPre(const json& j, const Where& w)
      : add_prefix_space_(get_bool(j, "add_prefix_space", true, w)), use_regex_(get_bool(j, "use_regex", true, w)) {
    if (use_regex_) regex_ = std::make_unique<Regex>(kGpt2Pattern, w);
  }
  bool transforms() const override { return true; }
  void run(std::string_view piece, bool at_origin, size_t stage, Pipeline& p) const override {
    Scratch& sc = p.scratch();
    std::string_view text = piece;
    std::string prefixed;
    if (add_prefix_space_ && piece[0] != ' ') {
      prefixed += ' ';  // (not " " + std::string: GCC 12 warns of overlapping copies there)
      prefixed += piece;
      text = prefixed;
    }
    if (!use_regex_) {
      map_and_emit(text, at_origin, stage, p);
      return;
    }
    std::vector<Span>& matches = sc.stage_regex[stage];
    regex_->find_iter(text, sc.match, matches);
    // Isolated: matches and the gaps between them, in order.
    size_t prev = 0;
    for (const Span& m : matches) {
      if (prev < m.begin) map_and_emit(text.substr(prev, m.begin - prev), at_origin && prev == 0, stage, p);
      if (m.begin < m.end) map_and_emit(text.substr(m.begin, m.end - m.begin), at_origin && m.begin == 0, stage, p);
      prev = m.end;
    }
    if (prev < text.size()) map_and_emit(text.substr(prev), at_origin && prev == 0, stage, p);
  }

 private:
  static void map_and_emit(std::string_view s, bool at_origin, size_t stage, Pipeline& p) {
    const ByteAlphabet& a = ByteAlphabet::get();
    std::string& out = p.scratch().stage_text[stage];
    out.clear();
    for (unsigned char b : s) out += a.byte_to_utf8[b];
    p.emit(stage + 1, out, at_origin);
  }
  bool add_prefix_space_, use_regex_;
  std::unique_ptr<Regex> regex_;
};

class MetaspacePre : public PreTokenizer {
 public:
  MetaspacePre(const json& j, const Where& w)
      : replacement_(get_char(j, "replacement", w)), scheme_(parse_prepend_scheme(j, w)), split_(get_bool(j, "split", true, w)) {
    append_utf8(rep_, replacement_);
  }
  bool transforms() const override { return true; }
  PrependScheme scheme() const { return scheme_; }
  void run(std::string_view piece, bool at_origin, size_t stage, Pipeline& p) const override {
    Scratch& sc = p.scratch();
    std::string& text = sc.stage_text[stage];
    text.clear();
    for (char c : piece) {
      if (c == ' ') {
        text += rep_;
      } else {
        text += c;
      }
    }
    const bool starts = text.compare(0, rep_.size(), rep_) == 0;
    if (!starts && (scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && at_origin))) text.insert(0, rep_);
    if (!split_) {
      p.emit(stage + 1, text, at_origin);
      return;
    }
    find_char_matches(text, [&](char32_t c) { return c == replacement_; }, sc.stage_matches[stage]);
    emit_split(text, at_origin, stage, p, Behavior::kMergedWithNext);
  }

 private:
  char32_t replacement_;
  std::string rep_;
  PrependScheme scheme_;
  bool split_;
};

// Splits on characters: Digits, WhitespaceSplit, Punctuation, CharDelimiterSplit, and the
// two halves of BertPreTokenizer.
class CharSplitPre : public PreTokenizer {
 public:
  CharSplitPre(std::function<bool(char32_t)> pred, Behavior behavior) : pred_(std::move(pred)), behavior_(behavior) {}
  void run(std::string_view piece, bool at_origin, size_t stage, Pipeline& p) const override {
    find_char_matches(piece, pred_, p.scratch().stage_matches[stage]);
    emit_split(piece, at_origin, stage, p, behavior_);
  }

 private:
  std::function<bool(char32_t)> pred_;
  Behavior behavior_;
};

// The Whitespace pre-tokenizer: the regex crate's `\w+|[^\w\s]+`, everything else removed.
class WhitespacePre : public PreTokenizer {
 public:
  void run(std::string_view piece, bool at_origin, size_t stage, Pipeline& p) const override {
    size_t i = 0;
    while (i < piece.size()) {
      size_t n;
      const char32_t c = decode_at(piece, i, &n);
      const int kind = is_word_char(c) ? 0 : is_white_space(c) ? 1 : 2;
      if (kind == 1) {
        i += n;
        continue;
      }
      size_t j = i + n;
      while (j < piece.size()) {
        size_t m;
        const char32_t d = decode_at(piece, j, &m);
        const int k = is_word_char(d) ? 0 : is_white_space(d) ? 1 : 2;
        if (k != kind) break;
        j += m;
      }
      p.emit(stage + 1, piece.substr(i, j - i), at_origin && i == 0);
      i = j;
    }
  }
};

}  // namespace

ByteAlphabet::ByteAlphabet() {
  char_to_byte.fill(-1);
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable_byte = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const char32_t c = printable_byte ? char32_t(b) : char32_t(256 + n++);
    append_utf8(byte_to_utf8[b], c);
    char_to_byte[c] = int16_t(b);
  }
}

const ByteAlphabet& ByteAlphabet::get() {
  static const ByteAlphabet a;
  return a;
}

Pipeline::Pipeline(const std::vector<std::unique_ptr<PreTokenizer>>& stages, Scratch& sc,
                   const std::function<void(std::string_view)>& word)
    : stages_(stages), sc_(sc), word_(word) {
  if (sc.stage_text.size() < stages.size()) {
    sc.stage_text.resize(stages.size());
    sc.stage_spans.resize(stages.size());
    sc.stage_matches.resize(stages.size());
    sc.stage_regex.resize(stages.size());
  }
}

PrependScheme parse_prepend_scheme(const json& j, const Where& w) {
  PrependScheme scheme = PrependScheme::kAlways;
  if (const json* v = find_key(j, "prepend_scheme"); v && !v->is_null()) {
    const std::string s = get_string(j, "prepend_scheme", w);
    if (s == "first") {
      scheme = PrependScheme::kFirst;
    } else if (s == "never") {
      scheme = PrependScheme::kNever;
    } else if (s == "always") {
      scheme = PrependScheme::kAlways;
    } else {
      w.at("prepend_scheme").fail("expected \"first\", \"never\" or \"always\", found \"{}\"", printable(s, 40));
    }
  }
  if (const json* v = find_key(j, "add_prefix_space"); v && v->is_boolean() && !v->get<bool>()) {
    if (scheme != PrependScheme::kNever) w.at("add_prefix_space").fail("false does not match prepend_scheme");
    scheme = PrependScheme::kNever;
  }
  return scheme;
}

bool is_metaspace_first(const PreTokenizer& p) {
  const auto* m = dynamic_cast<const MetaspacePre*>(&p);
  return m && m->scheme() == PrependScheme::kFirst;
}

void parse_pre_tokenizer(const json& j, const Where& w, std::vector<std::unique_ptr<PreTokenizer>>& out) {
  if (j.is_null()) return;
  const std::string type = type_of(j, w);
  if (type == "Sequence") {
    const json& list = need(j, "pretokenizers", w);
    if (!list.is_array()) w.at("pretokenizers").fail("expected an array, found {}", describe(list));
    for (size_t i = 0; i < list.size(); ++i) parse_pre_tokenizer(list[i], w.at("pretokenizers").at(i), out);
  } else if (type == "Split") {
    out.push_back(std::make_unique<SplitPre>(j, w));
  } else if (type == "ByteLevel") {
    out.push_back(std::make_unique<ByteLevelPre>(j, w));
  } else if (type == "Metaspace") {
    auto m = std::make_unique<MetaspacePre>(j, w);
    if (m->scheme() == PrependScheme::kFirst &&
        std::any_of(out.begin(), out.end(), [](const auto& s) { return s->transforms(); }))
      w.fail("Metaspace with prepend_scheme \"first\" after a pre-tokenizer that rewrites the text is not supported");
    out.push_back(std::move(m));
  } else if (type == "Digits") {
    const bool individual = get_bool(j, "individual_digits", false, w);
    out.push_back(std::make_unique<CharSplitPre>(is_numeric17, individual ? Behavior::kIsolated : Behavior::kContiguous));
  } else if (type == "Whitespace") {
    out.push_back(std::make_unique<WhitespacePre>());
  } else if (type == "WhitespaceSplit") {
    out.push_back(std::make_unique<CharSplitPre>(is_white_space, Behavior::kRemoved));
  } else if (type == "Punctuation") {
    out.push_back(std::make_unique<CharSplitPre>(is_punctuation8, parse_behavior(j, "behavior", w, Behavior::kIsolated)));
  } else if (type == "BertPreTokenizer") {
    out.push_back(std::make_unique<CharSplitPre>(is_white_space, Behavior::kRemoved));
    out.push_back(std::make_unique<CharSplitPre>(is_punctuation8, Behavior::kIsolated));
  } else if (type == "CharDelimiterSplit") {
    const char32_t d = get_char(j, "delimiter", w);
    out.push_back(std::make_unique<CharSplitPre>([d](char32_t c) { return c == d; }, Behavior::kRemoved));
  } else {
    w.at("type").fail("unsupported pre-tokenizer \"{}\" (supported: Split ByteLevel Metaspace Digits Whitespace "
                      "WhitespaceSplit Punctuation BertPreTokenizer CharDelimiterSplit Sequence)", printable(type, 60));
  }
}

}  // namespace dhp::hf
