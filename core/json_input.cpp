#include "core/json_input.h"

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/text.h"

namespace dhp {

namespace {
// Thrown from the parser's callback to stop at the first level too deep; caught below.
struct TooDeep {};
}  // namespace

nlohmann::json parse_json_input(std::string_view text, const std::string& what, size_t* error_byte,
                                int max_depth) {
  using json = nlohmann::json;
  // The callback sees each opening bracket at the depth of its container: `depth` counts the
  // containers already open around it.
  const auto bounded = [max_depth](int depth, json::parse_event_t event, json&) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth >= max_depth)
      throw TooDeep{};
    return true;
  };
  try {
    return json::parse(text, bounded);
  } catch (const json::parse_error& e) {
    if (error_byte) *error_byte = e.byte;
    return json(json::value_t::discarded);
  } catch (const TooDeep&) {
    throw Error(fmt::format("{}: JSON nested deeper than {} levels; no file dhp reads nests so deep",
                            what, max_depth));
  }
}

std::string json_excerpt(const nlohmann::json& v, size_t max) {
  return printable(v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), max);
}

}  // namespace dhp
