#include "core/hash.h"

#include <fstream>
#include <vector>

#include "core/check.h"

namespace dhp {

uint64_t hash_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DHP_CHECK(in.good(), "'{}' not found or not readable", path);
  std::vector<char> buf(1 << 20);
  uint64_t h = kFnvSeed;
  while (in) {
    in.read(buf.data(), std::streamsize(buf.size()));
    h = fnv1a(buf.data(), size_t(in.gcount()), h);
  }
  return h;
}

}  // namespace dhp
