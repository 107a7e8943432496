// Normalizers; see normalizers.h. Each names the library's part it follows and the Unicode
// version of that part (unicode.h), where it differs from ICU's.
#include "data/hf/normalizers.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/uniset.h>
#include <unicode/ustring.h>

#include "core/check.h"
#include "core/text.h"
#include "data/hf/regex.h"
#include "data/hf/scratch.h"
#include "data/hf/unicode.h"

namespace dhp::hf {
namespace {

// NFC/NFD/NFKC/NFKD with the library's tables (unicode-normalization-alignments 0.1.12),
// which are Unicode 9.0: ICU's normalizer restricted to code points assigned by 9.0 (the
// others pass through unchanged and, like the unassigned characters they are in those
// tables, block reordering and composition). Checked against the library on every code
// point, its decompositions and every mark in reordering contexts.
class UnicodeNormalizer : public Normalizer {
 public:
  enum Form { kNFC, kNFD, kNFKC, kNFKD };
  explicit UnicodeNormalizer(Form form) : n_(&get(form)) {}
  void apply(std::string& s, Scratch&) const override {
    UErrorCode err = U_ZERO_ERROR;
    const icu::StringPiece piece(s.data(), int32_t(s.size()));
    if (n_->isNormalizedUTF8(piece, err) && U_SUCCESS(err)) return;
    std::string out;
    out.reserve(s.size() + s.size() / 4);
    icu::StringByteSink<std::string> sink(&out);
    err = U_ZERO_ERROR;
    n_->normalizeUTF8(0, piece, sink, nullptr, err);
    DHP_CHECK(U_SUCCESS(err), "Unicode normalization failed: {}", u_errorName(err));
    s.swap(out);
  }

 private:
  static const icu::Normalizer2& get(Form form) {
    struct Forms {
      icu::UnicodeSet unicode9;
      std::vector<std::unique_ptr<icu::FilteredNormalizer2>> n;
      Forms() {
        UErrorCode err = U_ZERO_ERROR;
        unicode9.applyPattern(icu::UnicodeString("[:age=9.0:]"), err);
        unicode9.freeze();
        const icu::Normalizer2* base[] = {icu::Normalizer2::getNFCInstance(err), icu::Normalizer2::getNFDInstance(err),
                                          icu::Normalizer2::getNFKCInstance(err), icu::Normalizer2::getNFKDInstance(err)};
        DHP_CHECK(U_SUCCESS(err), "ICU normalizers unavailable: {}", u_errorName(err));
        for (const auto* b : base) n.push_back(std::make_unique<icu::FilteredNormalizer2>(*b, unicode9));
      }
    };
    static const Forms forms;
    return *forms.n[form];
  }
  const icu::Normalizer2* n_;
};

// Rust's char::to_lowercase (Unicode 17.0), one character at a time (no context, so final
// sigma is σ).
class Lowercase : public Normalizer {
 public:
  void apply(std::string& s, Scratch&) const override {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      size_t n;
      const char32_t c = decode_at(s, i, &n);
      if (c < 0x80) {
        out += char(c >= 'A' && c <= 'Z' ? c + 32 : c);
      } else if (const char32_t lc = lowercase_16_17(c)) {
        append_utf8(out, lc);
      } else {
        UChar in[2], lower[8];
        int32_t in_len = 0;
        U16_APPEND_UNSAFE(in, in_len, UChar32(c));
        UErrorCode err = U_ZERO_ERROR;
        const int32_t len = u_strToLower(lower, 8, in, in_len, "", &err);
        DHP_ASSERT(U_SUCCESS(err));
        for (int32_t k = 0; k < len;) {
          UChar32 lc;
          U16_NEXT(lower, k, len, lc);
          append_utf8(out, char32_t(lc));
        }
      }
      i += n;
    }
    s.swap(out);
  }
};

class Replace : public Normalizer {
 public:
  Replace(const json& j, const Where& w) : pattern_(need(j, "pattern", w), w.at("pattern")), content_(get_string(j, "content", w)) {}
  void apply(std::string& s, Scratch& sc) const override {
    if (s.empty()) return;
    pattern_.find_matches(s, sc.match, sc.replace_regex, sc.replace_matches);
    if (sc.replace_matches.size() == 1 && !sc.replace_matches[0].second) return;  // nothing to replace
    std::string& out = sc.replace_out;
    out.clear();
    for (const auto& [span, m] : sc.replace_matches) {
      if (m) {
        out += content_;
      } else {
        out.append(s, span.begin, span.end - span.begin);
      }
    }
    s.swap(out);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string p) : prepend_(std::move(p)) {}
  void apply(std::string& s, Scratch&) const override {
    if (!s.empty()) s.insert(0, prepend_);
  }

 private:
  std::string prepend_;
};

class Strip : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void apply(std::string& s, Scratch&) const override {
    size_t begin = 0, end = s.size();
    if (left_) {
      while (begin < end) {
        size_t n;
        if (!is_white_space(decode_at(s, begin, &n))) break;
        begin += n;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t k = end - 1;
        while ((static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
        size_t n;
        if (!is_white_space(decode_at(s, k, &n))) break;
        end = k;
      }
    }
    s = s.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

class StripAccents : public Normalizer {
 public:
  void apply(std::string& s, Scratch&) const override {
    std::string out;
    for (size_t i = 0; i < s.size();) {
      size_t n;
      const char32_t c = decode_at(s, i, &n);
      if (!is_mark9(c)) out.append(s, i, n);
      i += n;
    }
    s.swap(out);
  }
};

// SentencePiece's NMT normalization as the library does it.
class Nmt : public Normalizer {
 public:
  void apply(std::string& s, Scratch&) const override {
    std::string out;
    for (size_t i = 0; i < s.size();) {
      size_t n;
      const char32_t c = decode_at(s, i, &n);
      i += n;
      if ((c >= 0x1 && c <= 0x8) || c == 0xB || (c >= 0xE && c <= 0x1F) || c == 0x7F || c == 0x8F || c == 0x9F) continue;
      const bool space = c == 0x9 || c == 0xA || c == 0xC || c == 0xD || c == 0x1680 || (c >= 0x200B && c <= 0x200F) ||
                         c == 0x2028 || c == 0x2029 || c == 0x2581 || c == 0xFEFF || c == 0xFFFD;
      append_utf8(out, space ? U' ' : c);
    }
    s.swap(out);
  }
};

}  // namespace

void parse_normalizer(const json& j, const Where& w, std::vector<std::unique_ptr<Normalizer>>& out) {
  if (j.is_null()) return;
  const std::string type = type_of(j, w);
  if (type == "Sequence") {
    const json& list = need(j, "normalizers", w);
    if (!list.is_array()) w.at("normalizers").fail("expected an array, found {}", describe(list));
    for (size_t i = 0; i < list.size(); ++i) parse_normalizer(list[i], w.at("normalizers").at(i), out);
  } else if (type == "NFC") {
    out.push_back(std::make_unique<UnicodeNormalizer>(UnicodeNormalizer::kNFC));
  } else if (type == "NFD") {
    out.push_back(std::make_unique<UnicodeNormalizer>(UnicodeNormalizer::kNFD));
  } else if (type == "NFKC") {
    out.push_back(std::make_unique<UnicodeNormalizer>(UnicodeNormalizer::kNFKC));
  } else if (type == "NFKD") {
    out.push_back(std::make_unique<UnicodeNormalizer>(UnicodeNormalizer::kNFKD));
  } else if (type == "Lowercase") {
    out.push_back(std::make_unique<Lowercase>());
  } else if (type == "Replace") {
    out.push_back(std::make_unique<Replace>(j, w));
  } else if (type == "Prepend") {
    out.push_back(std::make_unique<Prepend>(get_string(j, "prepend", w)));
  } else if (type == "Strip") {
    out.push_back(std::make_unique<Strip>(get_bool(j, "strip_left", false, w), get_bool(j, "strip_right", false, w)));
  } else if (type == "StripAccents") {
    out.push_back(std::make_unique<StripAccents>());
  } else if (type == "Nmt") {
    out.push_back(std::make_unique<Nmt>());
  } else {
    w.at("type").fail("unsupported normalizer \"{}\" (supported: NFC NFD NFKC NFKD Lowercase Replace Prepend "
                      "Strip StripAccents Nmt Sequence)", printable(type, 60));
  }
}

std::unique_ptr<Normalizer> make_replace(const json& j, const Where& w) { return std::make_unique<Replace>(j, w); }

}  // namespace dhp::hf
