// Text from outside (file contents, names in headers, configuration values) shown in a
// message: bytes that are not printable ASCII appear as \xNN escapes, so that a NUL does not
// end the message early and binary never reaches the terminal.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace dhp {

// `s` with every byte outside 0x20..0x7e (and the backslash) escaped as \xNN (\n, \t and \0 by
// name), cut to about `max` characters with "..." when longer.
inline std::string printable(std::string_view s, size_t max = 200) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (const char ch : s) {
    if (out.size() >= max) return out + "...";
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == 0) out += "\\0";
    else if (c == '\\') out += "\\\\";
    else if (c >= 0x20 && c < 0x7f) out += ch;
    else out += {'\\', 'x', kHex[c >> 4], kHex[c & 15]};
  }
  return out;
}

}  // namespace dhp
