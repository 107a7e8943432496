// A test's whole-file reads and writes, bytes as they are.
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace dhp::testing {

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void write_text(const std::filesystem::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
}

}  // namespace dhp::testing
