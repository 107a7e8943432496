// Text from outside (file contents, names in headers, paths, configuration values) shown in a
// message: bytes that are neither printable ASCII nor part of valid UTF-8 appear as \xNN
// escapes, so that a NUL does not end the message early and binary never reaches the
// terminal.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace dhp {

// Length of the valid UTF-8 sequence starting at s[i], 0 when there is none.
inline size_t utf8_length(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
  if (n == 0 || c == 0xC0 || c == 0xC1 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 0;
  return n;
}

// `s` with every other byte escaped as \xNN, cut after about `max`
// characters with "..." when longer.
inline std::string printable(std::string_view s, size_t max = std::string::npos) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (out.size() >= max) return out + "...";
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7F) {
      out += char(c);
      ++i;
    } else if (const size_t n = c >= 0x80 ? utf8_length(s, i) : 0; n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += {'\\', 'x', kHex[c >> 4], kHex[c & 15]};
      ++i;
    }
  }
  return out;
}

}  // namespace dhp
