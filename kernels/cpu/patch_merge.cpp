#include "kernels/cpu/patch_merge.h"

#include <cstring>

namespace dhp::cpu {
namespace {

// Calls f(merged_row, slot, patch_row) for every (merged token, position in the block).
template <class F>
void for_each_slot(const MergeImage* images, int n_images, int m, F f) {
  int64_t merged = 0;
  for (int i = 0; i < n_images; ++i) {
    const MergeImage& im = images[i];
    int mh = im.grid_h / m, mw = im.grid_w / m;
    for (int r = 0; r < mh; ++r)
      for (int c = 0; c < mw; ++c, ++merged)
        for (int dy = 0; dy < m; ++dy)
          for (int dx = 0; dx < m; ++dx) {
            int64_t patch = im.patch_offset + int64_t(r * m + dy) * im.grid_w + (c * m + dx);
            f(merged, dy * m + dx, patch);
          }
  }
}

}  // namespace

void patch_merge_forward(float* out, const float* in, const MergeImage* images, int n_images,
                         int64_t C, int m) {
  const int64_t row = int64_t(m) * m * C;
  for_each_slot(images, n_images, m, [&](int64_t merged, int slot, int64_t patch) {
    std::memcpy(out + merged * row + slot * C, in + patch * C, sizeof(float) * C);
  });
}

void patch_merge_backward(float* din, const float* dout, const MergeImage* images, int n_images,
                          int64_t C, int m) {
  const int64_t row = int64_t(m) * m * C;
  for_each_slot(images, n_images, m, [&](int64_t merged, int slot, int64_t patch) {
    std::memcpy(din + patch * C, dout + merged * row + slot * C, sizeof(float) * C);
  });
}

}  // namespace dhp::cpu
