// Decoders; see decoders.h.
#include "data/hf/decoders.h"

#include "core/text.h"
#include "data/hf/normalizers.h"
#include "data/hf/pre_tokenizers.h"
#include "data/hf/unicode.h"

namespace dhp::hf {
namespace {

class ByteLevelDec : public Decoder {
 public:
  void apply(std::vector<std::string>& tokens, Scratch&) const override {
    const ByteAlphabet& a = ByteAlphabet::get();
    std::string bytes;
    for (const std::string& t : tokens) {
      const size_t at = bytes.size();
      bool all = true;
      for (size_t i = 0; i < t.size() && all;) {
        size_t n;
        const char32_t c = decode_at(t, i, &n);
        if (c < a.char_to_byte.size() && a.char_to_byte[c] >= 0) {
          bytes += char(a.char_to_byte[c]);
        } else {
          all = false;
        }
        i += n;
      }
      if (!all) {  // a token outside the alphabet stands for its own bytes
        bytes.resize(at);
        bytes += t;
      }
    }
    tokens.assign(1, replace_invalid(bytes));
  }
};

class MetaspaceDec : public Decoder {
 public:
  MetaspaceDec(const json& j, const Where& w) : replacement_(get_char(j, "replacement", w)), scheme_(parse_prepend_scheme(j, w)) {}
  void apply(std::vector<std::string>& tokens, Scratch&) const override {
    for (size_t k = 0; k < tokens.size(); ++k) {
      std::string out;
      const std::string& t = tokens[k];
      for (size_t i = 0; i < t.size();) {
        size_t n;
        const char32_t c = decode_at(t, i, &n);
        if (c != replacement_) {
          out.append(t, i, n);
        } else if (!(k == 0 && scheme_ != PrependScheme::kNever)) {
          out += ' ';
        }
        i += n;
      }
      tokens[k].swap(out);
    }
  }

 private:
  char32_t replacement_;
  PrependScheme scheme_;
};

class ByteFallbackDec : public Decoder {
 public:
  void apply(std::vector<std::string>& tokens, Scratch&) const override {
    std::vector<std::string> out;
    std::string pending;
    const auto flush = [&] {
      if (pending.empty()) return;
      if (first_invalid(pending) == pending.size()) {
        out.push_back(pending);
      } else {
        for (size_t i = 0; i < pending.size(); ++i) out.push_back("\xEF\xBF\xBD");  // one U+FFFD per byte
      }
      pending.clear();
    };
    for (std::string& t : tokens) {
      int byte = -1;
      if (t.size() == 6 && t.starts_with("<0x") && t.back() == '>') byte = parse_hex_byte(t.substr(3, 2));
      if (byte >= 0) {
        pending += char(byte);
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens.swap(out);
  }

 private:
  // u8::from_str_radix(s, 16): two hex digits, or '+' and one.
  static int parse_hex_byte(std::string_view s) {
    const auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; };
    if (s[0] == '+') return hex(s[1]);
    const int hi = hex(s[0]), lo = hex(s[1]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
  }
};

class FuseDec : public Decoder {
 public:
  void apply(std::vector<std::string>& tokens, Scratch&) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

class StripDec : public Decoder {
 public:
  StripDec(const json& j, const Where& w)
      : content_(get_char(j, "content", w)), start_(size_t(get_uint(need(j, "start", w), w.at("start")))),
        stop_(size_t(get_uint(need(j, "stop", w), w.at("stop")))) {}
  void apply(std::vector<std::string>& tokens, Scratch&) const override {
    for (std::string& t : tokens) {
      std::vector<std::pair<size_t, size_t>> chars;  // (offset, length)
      for (size_t i = 0; i < t.size();) {
        size_t n;
        decode_at(t, i, &n);
        chars.emplace_back(i, n);
        i += n;
      }
      const auto is = [&](size_t k) { size_t n; return decode_at(t, chars[k].first, &n) == content_; };
      size_t begin = 0, end = chars.size();
      for (size_t k = 0; k < start_ && k < chars.size() && is(k); ++k) begin = k + 1;
      for (size_t k = 0; k < stop_ && k < chars.size() && is(chars.size() - 1 - k); ++k) end = chars.size() - 1 - k;
      if (end < begin) end = begin;
      const size_t from = begin < chars.size() ? chars[begin].first : t.size();
      const size_t to = end < chars.size() ? chars[end].first : t.size();
      t = t.substr(from, to - from);
    }
  }

 private:
  char32_t content_;
  size_t start_, stop_;
};

class ReplaceDec : public Decoder {
 public:
  ReplaceDec(const json& j, const Where& w) : replace_(make_replace(j, w)) {}
  void apply(std::vector<std::string>& tokens, Scratch& sc) const override {
    for (std::string& t : tokens) replace_->apply(t, sc);
  }

 private:
  std::unique_ptr<Normalizer> replace_;
};

class BpeDec : public Decoder {
 public:
  explicit BpeDec(std::string suffix) : suffix_(std::move(suffix)) {}
  void apply(std::vector<std::string>& tokens, Scratch&) const override {
    if (suffix_.empty()) return;
    for (size_t k = 0; k < tokens.size(); ++k) {
      const std::string with = k + 1 == tokens.size() ? "" : " ";
      std::string& t = tokens[k];
      std::string out;
      size_t at = 0;
      for (size_t f = t.find(suffix_); f != std::string::npos; f = t.find(suffix_, at)) {
        out.append(t, at, f - at);
        out += with;
        at = f + suffix_.size();
      }
      out.append(t, at, std::string::npos);
      t.swap(out);
    }
  }

 private:
  std::string suffix_;
};

}  // namespace

void parse_decoder(const json& j, const Where& w, std::vector<std::unique_ptr<Decoder>>& out) {
  const std::string type = type_of(j, w);
  if (type == "Sequence") {
    const json& list = need(j, "decoders", w);
    if (!list.is_array()) w.at("decoders").fail("expected an array, found {}", describe(list));
    for (size_t i = 0; i < list.size(); ++i) parse_decoder(list[i], w.at("decoders").at(i), out);
  } else if (type == "ByteLevel") {
    out.push_back(std::make_unique<ByteLevelDec>());
  } else if (type == "Metaspace") {
    out.push_back(std::make_unique<MetaspaceDec>(j, w));
  } else if (type == "ByteFallback") {
    out.push_back(std::make_unique<ByteFallbackDec>());
  } else if (type == "Fuse") {
    out.push_back(std::make_unique<FuseDec>());
  } else if (type == "Strip") {
    out.push_back(std::make_unique<StripDec>(j, w));
  } else if (type == "Replace") {
    out.push_back(std::make_unique<ReplaceDec>(j, w));
  } else if (type == "BPEDecoder") {
    out.push_back(std::make_unique<BpeDec>(get_optional_string(j, "suffix", w).value_or("</w>")));
  } else {
    w.at("type").fail("unsupported decoder \"{}\" (supported: ByteLevel Metaspace ByteFallback Fuse Strip Replace "
                      "BPEDecoder Sequence)", printable(type, 60));
  }
}

}  // namespace dhp::hf
