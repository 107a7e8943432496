#include "data/batch.h"

namespace dhp {

int64_t Batch::n_patches() const {
  int64_t n = 0;
  for (const auto& im : images) n += im.n_patches();
  return n;
}

int64_t Batch::loss_tokens() const {
  int64_t n = 0;
  for (int32_t t : targets) n += t >= 0;
  return n;
}

}  // namespace dhp
