#include "trainer/inference.h"

#include <filesystem>

#include "core/check.h"
#include "core/text.h"

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

std::unique_ptr<Tokenizer> inference_tokenizer(const std::string& checkpoint, const LoadedModel& m) {
  const std::string& path = m.cfg.data.tokenizer;
  namespace fs = std::filesystem;
  std::error_code ec;
  DHP_CHECK(!fs::path(path).is_relative() || fs::exists(path, ec),
            "the checkpoint's data.tokenizer '{}' is relative to the folder its run started in and is "
            "not found from here ({}): run from that folder, or pass --data.tokenizer=PATH",
            printable(path), fs::current_path(ec).string());
  auto tok = std::make_unique<Tokenizer>(path, m.cfg.data.added_tokens);
  check_tokenizer(checkpoint, m.state, *tok);
  return tok;
}

}  // namespace dhp
