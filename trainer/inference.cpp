#include "trainer/inference.h"

namespace dhp {

Config inference_config(const std::string& checkpoint, const std::vector<std::string>& overrides) {
  Config cfg = checkpoint_config(checkpoint);
  if (!overrides.empty()) cfg = parse_config(to_toml(cfg), checkpoint + ":/config", overrides);
  return cfg;
}

LoadedModel load_for_inference(const std::string& checkpoint, const Config& cfg) {
  LoadedModel m;
  m.cfg = cfg;
  m.backend = make_backend(m.cfg.train.device, backend_options(m.cfg));
  m.model = std::make_unique<Model>(m.cfg.model, *m.backend);
  m.state = load_checkpoint(checkpoint, *m.model, nullptr);
  return m;
}

}  // namespace dhp
