// A trained model outside training: rebuilt from a checkpoint for evaluation, generation and
// export, configured from the checkpoint itself, so that none of them needs a config file.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "data/tokenizer.h"
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

// The checkpoint's configuration with `overrides` ("section.key=value") applied. For a Hugging
// Face folder: the defaults with the overrides, and the decoder's keys from its config.json.
Config inference_config(const std::string& checkpoint, const std::vector<std::string>& overrides);

// The checkpoint's weights in a model of `cfg` on the backend cfg.train.device names.
LoadedModel load_for_inference(const std::string& checkpoint, const Config& cfg);

// The tokenizer of m.cfg.data.tokenizer, checked against the one the checkpoint recorded. A
// relative path in a checkpoint is relative to the folder its run started in: when it is not
// found from here, the message says so and how to point at it (--data.tokenizer=PATH).
std::unique_ptr<Tokenizer> inference_tokenizer(const std::string& checkpoint, const LoadedModel& m);

}  // namespace dhp
