// Split and Replace patterns of tokenizer.json (data/hf_tokenizer.h) and how a split keeps its
// pieces. The library compiles its regexes with Oniguruma; here they are translated to PCRE2
// with Oniguruma's meaning of \s (Unicode White_Space) and \p{..} (general categories under
// Unicode 16.0), and constructs whose meaning differs between the two engines (\w \b \h, ^ $,
// POSIX brackets, (?m), \p{C} ...) are refused at load.
#pragma once

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/hf/json_fields.h"
#include "data/hf/unicode.h"

namespace dhp::hf {

// A byte range [begin, end) of a text.
struct Span {
  size_t begin, end;
};

// PCRE2's per-call match state: one per concurrent caller (Scratch holds one).
class MatchState {
 public:
  MatchState();
  ~MatchState();
  MatchState(const MatchState&) = delete;
  MatchState& operator=(const MatchState&) = delete;
  pcre2_match_data* data() const { return match_; }
  pcre2_match_context* context() const { return context_; }

 private:
  pcre2_match_data* match_ = nullptr;
  pcre2_match_context* context_ = nullptr;
  pcre2_jit_stack* jit_stack_ = nullptr;
};

// Rewrites an Oniguruma (Ruby syntax) pattern for PCRE2 with the same matches, or refuses it
// (a dhp::Error naming `w`).
std::string translate_pattern(std::string_view p, const Where& w);

class Regex {
 public:
  Regex(std::string_view onig_pattern, const Where& w);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The matches of `s` (valid UTF-8) as Oniguruma's find_iter (rust-onig) yields them:
  // leftmost-first, non-overlapping; an empty match right where the previous match ended is
  // skipped by moving one character on.
  void find_iter(std::string_view s, MatchState& m, std::vector<Span>& out) const;

 private:
  std::string pattern_;
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

// A Split/Replace pattern: {"String": literal} (the library escapes it into a regex, i.e.
// leftmost non-overlapping occurrences) or {"Regex": Oniguruma pattern}.
class Pattern {
 public:
  Pattern(const json& j, const Where& w);
  // The library's Pattern::find_matches: the whole of `s` as (span, is_match) pieces, empty
  // matches included; [((0,0), false)] for an empty `s`. `tmp` is scratch.
  void find_matches(std::string_view s, MatchState& m, std::vector<Span>& tmp,
                    std::vector<std::pair<Span, bool>>& out) const;

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;
};

// The library's Fn(char) -> bool pattern: every matching character is a match of its own.
template <class Pred>
void find_char_matches(std::string_view s, Pred pred, std::vector<std::pair<Span, bool>>& out) {
  out.clear();
  if (s.empty()) {
    out.push_back({{0, 0}, false});
    return;
  }
  size_t last = 0;
  for (size_t i = 0; i < s.size();) {
    size_t n;
    const char32_t c = decode_at(s, i, &n);
    if (pred(c)) {
      if (last < i) out.push_back({{last, i}, false});
      out.push_back({{i, i + n}, true});
      last = i + n;
    }
    i += n;
  }
  if (last < s.size()) out.push_back({{last, s.size()}, false});
}

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// obj[key] as a split behavior; `fallback` when the key is absent and a fallback is given.
Behavior parse_behavior(const json& obj, std::string_view key, const Where& w, std::optional<Behavior> fallback = {});

// NormalizedString::split: the pieces that `behavior` keeps, empty ones dropped.
void apply_behavior(const std::vector<std::pair<Span, bool>>& matches, Behavior behavior, std::vector<Span>& out);

}  // namespace dhp::hf
