// Oniguruma patterns run by PCRE2, and split behaviours; see regex.h.
#include "data/hf/regex.h"

#include <fmt/format.h>
#include <unicode/uversion.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <tuple>

#include "core/check.h"
#include "core/text.h"

namespace dhp::hf {
namespace {

// Code points that Unicode 15.0 and 16.0 assigned, by general category: PCRE2 10.42 knows
// Unicode 14.0 only, so each \p{X} becomes the class [\p{X}<these of X>]; and the few whose
// category 16.0 changed, which \p{X} must not match (U+1171E, Mn before, Mc now). Computed once.
class NewCodePoints {
 public:
  static const NewCodePoints& get() {
    static const NewCodePoints instance;
    return instance;
  }
  // The class items (ranges as \x{..}-\x{..}) of the new code points of `gcs`.
  std::string items(const std::vector<UCharCategory>& gcs) const { return format(gcs, by_gc_); }
  // Those that PCRE2's \p of `gcs` matches wrongly: their category before 16.0 is in `gcs`,
  // their 16.0 one is not.
  std::string excess(const std::vector<UCharCategory>& gcs) const {
    const auto in = [&](UCharCategory g) { return std::find(gcs.begin(), gcs.end(), g) != gcs.end(); };
    std::string out;
    for (const auto& [c, before, now] : changed_)
      if (in(before) && !in(now)) out += fmt::format("\\x{{{:X}}}", uint32_t(c));
    return out;
  }

 private:
  using Ranges = std::array<std::vector<std::pair<char32_t, char32_t>>, U_CHAR_CATEGORY_COUNT>;
  static std::string format(const std::vector<UCharCategory>& gcs, const Ranges& by) {
    std::vector<std::pair<char32_t, char32_t>> r;
    for (UCharCategory g : gcs) r.insert(r.end(), by[g].begin(), by[g].end());
    std::sort(r.begin(), r.end());
    std::string out;
    for (const auto& [lo, hi] : r)
      out += lo == hi ? fmt::format("\\x{{{:X}}}", uint32_t(lo)) : fmt::format("\\x{{{:X}}}-\\x{{{:X}}}", uint32_t(lo), uint32_t(hi));
    return out;
  }
  static void add(std::vector<std::pair<char32_t, char32_t>>& v, char32_t c) {
    if (!v.empty() && v.back().second + 1 == c) {
      v.back().second = c;
    } else {
      v.emplace_back(c, c);
    }
  }
  NewCodePoints() {
    for (const GcRange& r : unicode16_ranges()) {
      for (char32_t c = r.lo; c <= r.hi; ++c) {
        const auto before = static_cast<UCharCategory>(u_charType(UChar32(c)));
        UVersionInfo age;
        u_charAge(UChar32(c), age);
        if (age[0] < 15 && before != U_UNASSIGNED && before != r.gc) changed_.emplace_back(c, before, r.gc);
      }
    }
    for (char32_t c = 0x300; c < 0x110000; ++c) {
      if (c >= 0xD800 && c <= 0xDFFF) continue;
      UVersionInfo age;
      u_charAge(UChar32(c), age);
      const UCharCategory g = general_category(c);
      if (g == U_UNASSIGNED) continue;
      if (!find_unicode16(c) && age[0] < 15) continue;
      add(by_gc_[g], c);
    }
  }
  Ranges by_gc_;
  std::vector<std::tuple<char32_t, UCharCategory, UCharCategory>> changed_;
};

// \p{..} names accepted, with the general categories each stands for. \p{C} and \p{Cn}
// are refused: they contain the unassigned code points, which differ between versions in a
// way a union cannot express.
const std::vector<std::pair<std::string, std::vector<UCharCategory>>>& property_names() {
  static const std::vector<std::pair<std::string, std::vector<UCharCategory>>> names = {
      {"L", {U_UPPERCASE_LETTER, U_LOWERCASE_LETTER, U_TITLECASE_LETTER, U_MODIFIER_LETTER, U_OTHER_LETTER}},
      {"Lu", {U_UPPERCASE_LETTER}}, {"Ll", {U_LOWERCASE_LETTER}}, {"Lt", {U_TITLECASE_LETTER}},
      {"Lm", {U_MODIFIER_LETTER}}, {"Lo", {U_OTHER_LETTER}},
      {"M", {U_NON_SPACING_MARK, U_COMBINING_SPACING_MARK, U_ENCLOSING_MARK}},
      {"Mn", {U_NON_SPACING_MARK}}, {"Mc", {U_COMBINING_SPACING_MARK}}, {"Me", {U_ENCLOSING_MARK}},
      {"N", {U_DECIMAL_DIGIT_NUMBER, U_LETTER_NUMBER, U_OTHER_NUMBER}},
      {"Nd", {U_DECIMAL_DIGIT_NUMBER}}, {"Nl", {U_LETTER_NUMBER}}, {"No", {U_OTHER_NUMBER}},
      {"P", {U_CONNECTOR_PUNCTUATION, U_DASH_PUNCTUATION, U_START_PUNCTUATION, U_END_PUNCTUATION,
             U_INITIAL_PUNCTUATION, U_FINAL_PUNCTUATION, U_OTHER_PUNCTUATION}},
      {"Pc", {U_CONNECTOR_PUNCTUATION}}, {"Pd", {U_DASH_PUNCTUATION}}, {"Ps", {U_START_PUNCTUATION}},
      {"Pe", {U_END_PUNCTUATION}}, {"Pi", {U_INITIAL_PUNCTUATION}}, {"Pf", {U_FINAL_PUNCTUATION}},
      {"Po", {U_OTHER_PUNCTUATION}},
      {"S", {U_MATH_SYMBOL, U_CURRENCY_SYMBOL, U_MODIFIER_SYMBOL, U_OTHER_SYMBOL}},
      {"Sm", {U_MATH_SYMBOL}}, {"Sc", {U_CURRENCY_SYMBOL}}, {"Sk", {U_MODIFIER_SYMBOL}}, {"So", {U_OTHER_SYMBOL}},
      {"Z", {U_SPACE_SEPARATOR, U_LINE_SEPARATOR, U_PARAGRAPH_SEPARATOR}},
      {"Zs", {U_SPACE_SEPARATOR}}, {"Zl", {U_LINE_SEPARATOR}}, {"Zp", {U_PARAGRAPH_SEPARATOR}},
      {"Cc", {U_CONTROL_CHAR}}, {"Cf", {U_FORMAT_CHAR}}, {"Co", {U_PRIVATE_USE_CHAR}}, {"Cs", {U_SURROGATE}},
  };
  return names;
}

std::string white_space_items() {
  std::string out;
  for (char32_t c : kWhiteSpace) out += fmt::format("\\x{{{:X}}}", uint32_t(c));
  return out;
}

bool is_hex(char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; }
bool is_alnum_ascii(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }

}  // namespace

std::string translate_pattern(std::string_view p, const Where& w) {
  const auto refuse = [&](std::string_view what) {
    w.fail("regex \"{}\": {} is not supported (Oniguruma, which Hugging Face uses, and PCRE2 "
           "give it different meanings)", printable(p, 200), what);
  };
  const std::string ws = white_space_items();
  std::string out;
  bool in_class = false;
  size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\') {
      if (i + 1 >= p.size()) w.fail("regex \"{}\" ends with a backslash", printable(p, 200));
      const char e = p[i + 1];
      i += 2;
      switch (e) {
        case 's':
          out += in_class ? ws : "[" + ws + "]";
          break;
        case 'S':
          if (in_class) refuse("\\S inside a character class");
          out += "[^" + ws + "]";
          break;
        case 'd':
        case 'D':
        case 'p':
        case 'P': {
          bool negated = e == 'D' || e == 'P';
          std::string name = "Nd";
          if (e == 'p' || e == 'P') {
            if (i >= p.size() || p[i] != '{') refuse("\\p without braces");
            const size_t close = p.find('}', i);
            if (close == std::string_view::npos) w.fail("regex \"{}\": unterminated \\p{{", printable(p, 200));
            name = std::string(p.substr(i + 1, close - i - 1));
            i = close + 1;
            if (!name.empty() && name[0] == '^') {
              negated = !negated;
              name.erase(0, 1);
            }
          }
          const auto& names = property_names();
          const auto it = std::find_if(names.begin(), names.end(), [&](const auto& n) { return n.first == name; });
          if (it == names.end()) refuse("the property \\p{" + printable(name, 40) + "} (general categories only, such as \\p{L}, \\p{Nd})");
          if (negated && in_class) refuse("a negated property inside a character class");
          const std::string items = "\\p{" + name + "}" + NewCodePoints::get().items(it->second);
          const std::string excess = NewCodePoints::get().excess(it->second);
          if (excess.empty()) {
            out += in_class ? items : (negated ? "[^" : "[") + items + "]";
          } else if (in_class) {
            refuse("\\p{" + name + "} inside a character class (Unicode 16.0 moved a character out of it)");
          } else {
            out += negated ? "(?:[" + excess + "]|[^" + items + "])" : "(?:(?![" + excess + "])[" + items + "])";
          }
          break;
        }
        case 'u': {
          if (i + 4 > p.size() || !std::all_of(p.begin() + i, p.begin() + i + 4, is_hex))
            w.fail("regex \"{}\": \\u needs four hex digits", printable(p, 200));
          out += "\\x{" + std::string(p.substr(i, 4)) + "}";
          i += 4;
          break;
        }
        case 'x': {
          if (i < p.size() && p[i] == '{') {
            const size_t close = p.find('}', i);
            if (close == std::string_view::npos) w.fail("regex \"{}\": unterminated \\x{{", printable(p, 200));
            out += "\\x" + std::string(p.substr(i, close + 1 - i));
            i = close + 1;
          } else {
            size_t n = 0;
            while (n < 2 && i + n < p.size() && is_hex(p[i + n])) ++n;
            const std::string hex(p.substr(i, n));
            if (n == 0 || std::stoi(hex, nullptr, 16) >= 0x80) refuse("\\x without braces above \\x7F (a byte in Oniguruma)");
            out += "\\x{" + hex + "}";
            i += n;
          }
          break;
        }
        case 't': case 'n': case 'r': case 'f': case 'a': case 'e':
          out += '\\';
          out += e;
          break;
        case 'v':
          out += "\\x{B}";
          break;
        case 'b':
          if (!in_class) refuse("\\b");
          out += "\\x{8}";
          break;
        case 'A': case 'z': case 'Z':
          if (in_class) refuse(std::string("\\") + e + " inside a character class");
          out += '\\';
          out += e;
          break;
        default:
          if (is_alnum_ascii(e)) refuse(std::string("\\") + e);
          out += '\\';
          out += e;
          // a non-ASCII escaped character: copy the rest of its bytes
          if (static_cast<unsigned char>(e) >= 0x80) {
            const size_t n = char_len(static_cast<unsigned char>(e)) - 1;
            out.append(p.substr(i, n));
            i += n;
          }
      }
      continue;
    }
    if (in_class) {
      if (c == '[') refuse("'[' inside a character class (nested classes, POSIX brackets)");
      if (c == '&' && i + 1 < p.size() && p[i + 1] == '&') refuse("'&&' (class intersection)");
      if (c == ']') in_class = false;
      out += c;
      ++i;
      continue;
    }
    switch (c) {
      case '[':
        in_class = true;
        out += '[';
        ++i;
        if (i < p.size() && p[i] == '^') {
          out += '^';
          ++i;
        }
        if (i < p.size() && p[i] == ']') refuse("']' first in a character class");
        break;
      case '(':
        out += '(';
        ++i;
        if (i < p.size() && p[i] == '?') {
          const std::string_view rest = p.substr(i + 1);
          size_t n = 0;
          if (rest.starts_with(':') || rest.starts_with('=') || rest.starts_with('!') || rest.starts_with('>')) {
            n = 1;
          } else if (rest.starts_with("<=") || rest.starts_with("<!")) {
            n = 2;
          } else if (rest.starts_with('<')) {  // named group
            n = rest.find('>');
            if (n == std::string_view::npos) w.fail("regex \"{}\": unterminated group name", printable(p, 200));
            ++n;
          } else {
            while (n < rest.size() && (rest[n] == 'i' || rest[n] == '-')) ++n;
            if (n == 0 || n >= rest.size() || (rest[n] != ':' && rest[n] != ')'))
              refuse("the group \"(?" + printable(rest.substr(0, 4)) + "\" (only (?: (?= (?! (?<= (?<! (?> (?<name> and the i option)");
            ++n;
          }
          out += '?';
          out.append(rest.substr(0, n));
          i += 1 + n;
        }
        break;
      case '^':
      case '$':
        refuse(std::string("'") + c + "' (a line anchor in Oniguruma)");
        break;
      case '{': {
        // Oniguruma's {,n} is {0,n}; PCRE2 10.42 would read it as literal text.
        size_t j = i + 1;
        const bool open_low = j < p.size() && p[j] == ',';
        while (j < p.size() && (std::isdigit(static_cast<unsigned char>(p[j])) || p[j] == ',')) ++j;
        const bool interval = j < p.size() && p[j] == '}' && j > i + 1;
        if (interval && j + 1 < p.size() && p[j + 1] == '+') refuse("'{n,m}+' (not possessive in Oniguruma)");
        if (interval && open_low) {
          out += "{0";
          out.append(p.substr(i + 1, j - i));
        } else {
          out.append(p.substr(i, interval ? j + 1 - i : 1));
        }
        i = interval ? j + 1 : i + 1;
        break;
      }
      default:
        out += c;
        ++i;
    }
  }
  return out;
}

MatchState::MatchState() {
  match_ = pcre2_match_data_create(1, nullptr);
  context_ = pcre2_match_context_create(nullptr);
  // JIT stack: starts small, may grow to 64 MiB (address space, committed on use) for
  // backtracking over multi-megabyte runs.
  jit_stack_ = pcre2_jit_stack_create(32 << 10, 64 << 20, nullptr);
  DHP_ASSERT(match_ && context_ && jit_stack_);
  pcre2_jit_stack_assign(context_, nullptr, jit_stack_);
  pcre2_set_match_limit(context_, UINT32_MAX);
  pcre2_set_depth_limit(context_, UINT32_MAX);
}

MatchState::~MatchState() {
  pcre2_jit_stack_free(jit_stack_);
  pcre2_match_context_free(context_);
  pcre2_match_data_free(match_);
}

Regex::Regex(std::string_view onig_pattern, const Where& w) : pattern_(onig_pattern) {
  if (first_invalid(onig_pattern) != onig_pattern.size()) w.fail("the regex is not valid UTF-8");
  const std::string translated = translate_pattern(onig_pattern, w);
  pcre2_compile_context* cc = pcre2_compile_context_create(nullptr);
  pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
  int err = 0;
  PCRE2_SIZE offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                        PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &offset, cc);
  pcre2_compile_context_free(cc);
  if (!code_) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    w.fail("regex \"{}\" does not compile: {}", printable(onig_pattern, 200), reinterpret_cast<const char*>(msg));
  }
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() { pcre2_code_free(code_); }

void Regex::find_iter(std::string_view s, MatchState& m, std::vector<Span>& out) const {
  out.clear();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t last_end = 0;
  std::optional<size_t> last_match_end;
  while (last_end <= s.size()) {
    const int rc = jit_ ? pcre2_jit_match(code_, subject, s.size(), last_end, 0, m.data(), m.context())
                        : pcre2_match(code_, subject, s.size(), last_end, PCRE2_NO_UTF_CHECK, m.data(), m.context());
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw Error(fmt::format("tokenizer regex \"{}\" failed on a text of {} bytes: {}", printable(pattern_, 200),
                              s.size(), reinterpret_cast<const char*>(msg)));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.data());
    const size_t start = ov[0], end = ov[1];
    if (start == end && last_match_end == end) {
      last_end += last_end < s.size() ? char_len(static_cast<unsigned char>(s[last_end])) : 1;
      continue;
    }
    last_end = end;
    last_match_end = end;
    out.push_back({start, end});
  }
}

Pattern::Pattern(const json& j, const Where& w) {
  need_object(j, w);
  if (j.size() != 1) w.fail("expected {{\"String\": ...}} or {{\"Regex\": ...}}, found {}", describe(j));
  if (const json* s = find_key(j, "String")) {
    if (!s->is_string() || s->get_ref<const std::string&>().empty())
      w.at("String").fail("expected a non-empty string, found {}", describe(*s));
    literal_ = s->get<std::string>();
    if (first_invalid(literal_) != literal_.size()) w.at("String").fail("not valid UTF-8");
  } else if (const json* r = find_key(j, "Regex")) {
    if (!r->is_string()) w.at("Regex").fail("expected a string, found {}", describe(*r));
    regex_ = std::make_unique<Regex>(r->get_ref<const std::string&>(), w.at("Regex"));
  } else {
    w.fail("expected {{\"String\": ...}} or {{\"Regex\": ...}}, found {}", describe(j));
  }
}

void Pattern::find_matches(std::string_view s, MatchState& m, std::vector<Span>& tmp,
                           std::vector<std::pair<Span, bool>>& out) const {
  out.clear();
  if (s.empty()) {
    out.push_back({{0, 0}, false});
    return;
  }
  tmp.clear();
  if (regex_) {
    regex_->find_iter(s, m, tmp);
  } else {
    for (size_t at = s.find(literal_); at != std::string_view::npos; at = s.find(literal_, at + literal_.size()))
      tmp.push_back({at, at + literal_.size()});
  }
  size_t prev = 0;
  for (const Span& t : tmp) {
    if (prev != t.begin) out.push_back({{prev, t.begin}, false});
    out.push_back({t, true});
    prev = t.end;
  }
  if (prev != s.size()) out.push_back({{prev, s.size()}, false});
}

Behavior parse_behavior(const json& obj, std::string_view key, const Where& w, std::optional<Behavior> fallback) {
  const json* v = find_key(obj, key);
  if (!v && fallback) return *fallback;
  const std::string s = get_string(obj, key, w);
  if (s == "Removed") return Behavior::kRemoved;
  if (s == "Isolated") return Behavior::kIsolated;
  if (s == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return Behavior::kMergedWithNext;
  if (s == "Contiguous") return Behavior::kContiguous;
  w.at(key).fail("unknown split behavior \"{}\" (Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous)",
                 printable(s, 40));
}

void apply_behavior(const std::vector<std::pair<Span, bool>>& matches, Behavior behavior, std::vector<Span>& out) {
  out.clear();
  switch (behavior) {
    case Behavior::kIsolated:
      for (const auto& [s, m] : matches) out.push_back(s);
      break;
    case Behavior::kRemoved:
      for (const auto& [s, m] : matches)
        if (!m) out.push_back(s);
      break;
    case Behavior::kContiguous: {
      bool previous = false;
      for (const auto& [s, m] : matches) {
        if (m == previous && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back(s);
        }
        previous = m;
      }
      break;
    }
    case Behavior::kMergedWithPrevious: {
      bool previous = false;
      for (const auto& [s, m] : matches) {
        if (m && !previous && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back(s);
        }
        previous = m;
      }
      break;
    }
    case Behavior::kMergedWithNext: {
      bool previous = false;
      for (auto it = matches.rbegin(); it != matches.rend(); ++it) {
        const auto& [s, m] = *it;
        if (m && !previous && !out.empty()) {
          out.back().begin = s.begin;
        } else {
          out.push_back(s);
        }
        previous = m;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
  }
  out.erase(std::remove_if(out.begin(), out.end(), [](const Span& s) { return s.begin == s.end; }), out.end());
}

}  // namespace dhp::hf
