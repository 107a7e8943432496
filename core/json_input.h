// JSON from outside (a file or line a user named): parsed with its nesting bounded, and shown
// in messages only as a short excerpt. nlohmann's parser is iterative, but copying, comparing
// or dumping a value recurses once per level, so a file of 200,000 nested brackets that parses
// fine overflows the stack later, wherever the value is used; a bound at parse time makes every
// later use safe.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>
#include <string_view>

namespace dhp {

// Deeper than any configuration, header, index or manifest line dhp reads (Hugging Face
// configs nest three or four levels), far below what recursion can bear.
inline constexpr int kMaxJsonDepth = 64;

// `text` parsed; a discarded value (is_discarded()) when it is not JSON, as
// json::parse(text, nullptr, false) gives, with the byte where parsing stopped in *error_byte
// when given. Throws dhp::Error "<what>: JSON nested deeper than 64 levels" when it nests
// deeper than `max_depth`.
nlohmann::json parse_json_input(std::string_view text, const std::string& what,
                                size_t* error_byte = nullptr, int max_depth = kMaxJsonDepth);

// `v` as compact JSON, cut after `max` characters with "..." (and escaped as printable()):
// what a message may quote of a value from outside.
std::string json_excerpt(const nlohmann::json& v, size_t max = 120);

}  // namespace dhp
