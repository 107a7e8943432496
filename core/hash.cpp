#include "core/hash.h"

#include <vector>

#include "core/check.h"
#include "core/input.h"

namespace dhp {

uint64_t hash_file(const std::string& path) {
  const InputFile in("file", path);
  std::vector<char> buf(1 << 20);
  uint64_t h = kFnvSeed;
  for (int64_t at = 0;;) {
    const int64_t n = in.read_at(buf.data(), int64_t(buf.size()), at);
    if (n == 0) return h;
    h = fnv1a(buf.data(), size_t(n), h);
    at += n;
  }
}

}  // namespace dhp
