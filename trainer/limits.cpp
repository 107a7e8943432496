#include "trainer/limits.h"

#include <unistd.h>

#include "core/check.h"
#include "data/dataset.h"

namespace dhp {

int64_t available_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? int64_t(pages) * page : 0;
}

void check_batch_fits(const Config& cfg, const Dataset& train_set, int64_t memory_bytes) {
  const int64_t n = train_set.size(), batch = cfg.train.batch_size;
  DHP_CHECK(batch <= n,
            "{}: train.batch_size = {} exceeds the {} samples of data.train '{}'; a step would "
            "use the same sample more than once: lower train.batch_size",
            cfg.source, batch, n, cfg.data.train);
  if (memory_bytes <= 0 || n == 0) return;
  // A decoded sample holds per token an id, a loss flag and an image index, and per merged
  // image token merge^2 patches of patch^2 * 3 floats.
  const auto& v = cfg.model.vision;
  double tokens = 0, vision = 0;
  for (int64_t i = 0; i < n; ++i) tokens += double(train_set.length(i)), vision += double(train_set.vision_tokens(i));
  const double per_sample = (tokens * (sizeof(int32_t) * 2 + 1) +
                             vision * double(v.merge * v.merge) * double(v.patch_numel()) * sizeof(float)) /
                            double(n);
  const double need = 2.0 * double(batch) * per_sample;
  DHP_CHECK(need <= double(memory_bytes),
            "{}: train.batch_size = {} needs about {:.1f} GB for its decoded samples (two steps "
            "are held at once, {:.2f} MB per sample on average), more than this machine's {:.1f} "
            "GB: lower train.batch_size",
            cfg.source, batch, need / 1e9, per_sample / 1e6, double(memory_bytes) / 1e9);
}

}  // namespace dhp
