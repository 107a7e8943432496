// The one place that knows every data-set format: a new format is a Dataset subclass in its
// own file plus one branch here.
#include <filesystem>

#include "core/check.h"
#include "data/config.h"
#include "data/dataset.h"
#include "data/shard_dataset.h"
#include "data/shard_format.h"

namespace dhp {

namespace fs = std::filesystem;

std::unique_ptr<Dataset> open_dataset(const std::string& path, const DataConfig& d,
                                      const Tokenizer& tokenizer, const ImageGeometry& geometry,
                                      const volatile int* stop) {
  if (fs::is_directory(path)) {
    DHP_CHECK(fs::exists(fs::path(path) / kIndexFile),
              "'{}' is a folder without {}: pass a JSONL manifest, or a folder built by `dhp "
              "data build` (rerunning an interrupted build finishes it)",
              path, kIndexFile);
    return std::make_unique<ShardDataset>(path, tokenizer, geometry, d.max_tokens, d.on_error,
                                          d.max_image_pixels, d.chat_template);
  }
  return std::make_unique<JsonlDataset>(path, d.image_root, tokenizer, geometry, d.max_tokens,
                                        d.on_error, d.max_image_pixels, d.allow_absolute_paths,
                                        stop, d.chat_template, d.video);
}

}  // namespace dhp
