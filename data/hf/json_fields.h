// JSON access for reading tokenizer.json (data/hf_tokenizer.h): `Where` names the file and the
// key path of a value, and every getter that finds a missing key or a value of the wrong type
// throws dhp::Error with that name and a short description of what it found.
#pragma once

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "core/check.h"
#include "core/text.h"
#include "data/hf/unicode.h"

namespace dhp::hf {

using json = nlohmann::json;

// Where a value is: the file (by reference: a Where lives only while the file is read) and
// the key path, e.g. pre_tokenizer.pretokenizers[0].pattern.Regex.
struct Where {
  const std::string& file;
  std::string path;
  Where at(std::string_view key) const { return {file, path.empty() ? std::string(key) : path + "." + std::string(key)}; }
  Where at(size_t i) const { return {file, path + "[" + std::to_string(i) + "]"}; }
  template <class... A>
  [[noreturn]] void fail(fmt::format_string<A...> f, A&&... a) const {
    throw Error(fmt::format("{}: {}: {}", file, path.empty() ? "(top level)" : path,
                            fmt::format(f, std::forward<A>(a)...)));
  }
};

// A short description of a JSON value for messages (never the whole of a large subtree).
// (Strings are appended piece by piece: GCC 12 warns, wrongly, of overlapping copies in
// "literal" + std::string.)
inline std::string describe(const json& j) {
  std::string out;
  if (j.is_string()) {
    out += '"';
    out += printable(j.get_ref<const std::string&>(), 80);
    out += '"';
  } else if (j.is_object()) {
    out = "an object";
  } else if (j.is_array()) {
    out = "an array of ";
    out += std::to_string(j.size());
  } else {
    out = printable(j.dump(), 80);
  }
  return out;
}

inline const json* find_key(const json& obj, std::string_view key) {
  const auto it = obj.find(std::string(key));
  return it == obj.end() ? nullptr : &*it;
}

inline const json& need(const json& obj, std::string_view key, const Where& w) {
  const json* v = find_key(obj, key);
  if (!v) w.fail("missing key \"{}\"", key);
  return *v;
}

inline const json& need_object(const json& j, const Where& w) {
  if (!j.is_object()) w.fail("expected an object, found {}", describe(j));
  return j;
}

inline std::string get_string(const json& obj, std::string_view key, const Where& w) {
  const json& v = need(obj, key, w);
  if (!v.is_string()) w.at(key).fail("expected a string, found {}", describe(v));
  return v.get<std::string>();
}

inline std::optional<std::string> get_optional_string(const json& obj, std::string_view key, const Where& w) {
  const json* v = find_key(obj, key);
  if (!v || v->is_null()) return std::nullopt;
  if (!v->is_string()) w.at(key).fail("expected a string or null, found {}", describe(*v));
  return v->get<std::string>();
}

inline bool get_bool(const json& obj, std::string_view key, bool fallback, const Where& w) {
  const json* v = find_key(obj, key);
  if (!v || v->is_null()) return fallback;
  if (!v->is_boolean()) w.at(key).fail("expected true or false, found {}", describe(*v));
  return v->get<bool>();
}

inline int64_t get_uint(const json& v, const Where& w, int64_t max = INT32_MAX) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > max)
    w.fail("expected an integer in [0, {}], found {}", max, describe(v));
  return v.get<int64_t>();
}

// A string holding exactly one character (Metaspace's replacement, Strip's content...).
inline char32_t get_char(const json& obj, std::string_view key, const Where& w) {
  const std::string s = get_string(obj, key, w);
  size_t n = 0;
  if (s.empty() || first_invalid(s) != s.size() || (decode_at(s, 0, &n), n != s.size()))
    w.at(key).fail("expected a string of one character, found \"{}\"", printable(s, 40));
  return decode_at(s, 0, &n);
}

inline std::string type_of(const json& j, const Where& w) {
  need_object(j, w);
  return get_string(j, "type", w);
}

}  // namespace dhp::hf
