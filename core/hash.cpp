#include "core/hash.h"

#include <vector>

#include "core/check.h"
#include "core/input.h"

namespace dhp {

uint64_t hash_from(const InputFile& in, int64_t offset) {
  std::vector<char> buf(1 << 20);
  uint64_t h = kFnvSeed;
  for (int64_t at = offset;;) {
    const int64_t n = in.read_at(buf.data(), int64_t(buf.size()), at);
    if (n == 0) return h;
    h = fnv1a(buf.data(), size_t(n), h);
    at += n;
  }
}

uint64_t hash_file(const std::string& path) { return hash_from(InputFile("file", path), 0); }

}  // namespace dhp
