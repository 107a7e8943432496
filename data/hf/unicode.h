// UTF-8 and Unicode properties for the Hugging Face tokenizer (data/hf_tokenizer.h): UTF-8
// decoding and the replacement of invalid sequences, general categories under Unicode 16.0,
// White_Space, and the character tests of the library's parts, each under the Unicode
// version that part carries (Oniguruma and the regex crate 16.0, Rust's char methods 17.0,
// unicode-normalization-alignments 9.0, unicode_categories 8.0). ICU 72 (Unicode 15.0)
// supplies the data; the tables in unicode.cpp hold what later versions added.
#pragma once

#include <unicode/uchar.h>

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <iterator>
#include <span>
#include <string>
#include <string_view>

namespace dhp::hf {

// ------------------------------------------------------------------------------------------
// UTF-8

// Byte length of the character whose first byte is `c` in valid UTF-8.
inline size_t char_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

// The code point at s[i] (valid UTF-8); its length in *len.
inline char32_t decode_at(std::string_view s, size_t i, size_t* len) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = char_len(c);
  *len = n;
  if (n == 1) return c;
  char32_t cp = c & (0xFF >> (n + 1));
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}

inline void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xC0 | (c >> 6));
    out += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += char(0xE0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  } else {
    out += char(0xF0 | (c >> 18));
    out += char(0x80 | ((c >> 12) & 0x3F));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  }
}

// Index of the first ill-formed byte, s.size() when all of `s` is valid UTF-8.
size_t first_invalid(std::string_view s);

// `s` with every maximal invalid subsequence replaced by U+FFFD.
std::string replace_invalid(std::string_view s);

// ------------------------------------------------------------------------------------------
// General categories

// A run of code points whose general category Unicode 16.0 assigned or changed relative to
// 15.0 (ICU 72's version).
struct GcRange {
  char32_t lo, hi;
  UCharCategory gc;
};
// All of them, sorted by code point.
std::span<const GcRange> unicode16_ranges();
// The range of unicode16_ranges() that holds `c`, or nullptr.
const GcRange* find_unicode16(char32_t c);

// General category under Unicode 16.0 (code points ICU assigns in later versions count as
// unassigned, as they are to the library).
UCharCategory general_category(char32_t c);

inline bool is_gc(UCharCategory g, std::initializer_list<UCharCategory> set) {
  return std::find(set.begin(), set.end(), g) != set.end();
}
inline bool is_mark(UCharCategory g) { return is_gc(g, {U_NON_SPACING_MARK, U_COMBINING_SPACING_MARK, U_ENCLOSING_MARK}); }
inline bool is_number(UCharCategory g) { return is_gc(g, {U_DECIMAL_DIGIT_NUMBER, U_LETTER_NUMBER, U_OTHER_NUMBER}); }
inline bool is_punct(UCharCategory g) {
  return is_gc(g, {U_CONNECTOR_PUNCTUATION, U_DASH_PUNCTUATION, U_START_PUNCTUATION, U_END_PUNCTUATION,
                   U_INITIAL_PUNCTUATION, U_FINAL_PUNCTUATION, U_OTHER_PUNCTUATION});
}

// ------------------------------------------------------------------------------------------
// The character tests of the library's parts

// Unicode White_Space (Rust's char::is_whitespace, Oniguruma's and the regex crate's \s).
inline constexpr char32_t kWhiteSpace[] = {0x9,    0xA,    0xB,    0xC,    0xD,    0x20,   0x85,
                                           0xA0,   0x1680, 0x2000, 0x2001, 0x2002, 0x2003, 0x2004,
                                           0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200A, 0x2028,
                                           0x2029, 0x202F, 0x205F, 0x3000};
inline bool is_white_space(char32_t c) {
  return std::find(std::begin(kWhiteSpace), std::end(kWhiteSpace), c) != std::end(kWhiteSpace);
}

// The regex crate's Unicode \w: Alphabetic, marks, decimal digits, connector punctuation,
// Join_Control.
bool is_word_char(char32_t c);

// Rust's char::is_numeric (Digits): Unicode 17.0's N, i.e. 16.0's and 13 code points more.
bool is_numeric17(char32_t c);

// Punctuation's test: ASCII punctuation, or the unicode_categories crate's is_punctuation,
// whose tables are Unicode 8.0 (two characters were punctuation then and are not now).
bool is_punctuation8(char32_t c);

// unicode-normalization-alignments' is_combining_mark: a mark in Unicode 9.0 (U+1CF2 and
// U+1CF3 were marks then, U+111C9 was not).
bool is_mark9(char32_t c);

// The lowercase mappings that Unicode 16.0 and 17.0 added: Rust's tables (the library's
// Lowercase) are 17.0, ICU 72's are 15.0. 0 for any other character.
char32_t lowercase_16_17(char32_t c);

}  // namespace dhp::hf
