// A trained model outside training: rebuilt from a checkpoint for evaluation, generation and
// export, configured from the checkpoint itself, so that none of them needs a config file.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "model/model.h"
#include "trainer/checkpoint_file.h"
#include "trainer/config.h"

namespace dhp {

struct LoadedModel {
  Config cfg;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  TrainState state;
};

// The checkpoint's configuration with `overrides` ("section.key=value") applied.
Config inference_config(const std::string& checkpoint, const std::vector<std::string>& overrides);

// The checkpoint's weights in a model of `cfg` on the backend cfg.train.device names.
LoadedModel load_for_inference(const std::string& checkpoint, const Config& cfg);

}  // namespace dhp
