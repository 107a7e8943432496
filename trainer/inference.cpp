#include "trainer/inference.h"

#include <algorithm>
#include <filesystem>

#include "core/check.h"
#include "core/log.h"
#include "core/text.h"
#include "trainer/hf_checkpoint.h"

namespace dhp {

Config inference_config(const std::string& checkpoint, const std::vector<std::string>& overrides) {
  if (is_hf_folder(checkpoint)) {
    // The defaults with the overrides, the decoder from the folder's config.json.
    Config cfg = parse_config("", checkpoint, overrides);
    cfg.model.init = checkpoint;
    // The folder's own tokenizer, unless the command line names another.
    if (!overrides_set(overrides, "data.tokenizer") && holds_tokenizer(checkpoint)) cfg.data.tokenizer = checkpoint;
    // A decoder's folder computes what it computes: evaluated and sampled with its own
    // vocabulary. LLaVA's <image> and <pad>, which data.added_tokens = "auto" adds for image
    // data, would grow it by mean-initialised rows that enter every softmax (0.2-1.1% on the
    // loss of the test fixtures) for tokens a text model never sees.
    if (!overrides_set(overrides, "data.added_tokens") && read_hf_config(checkpoint, cfg.model, 0).kind == HfKind::Decoder)
      cfg.data.added_tokens = "none";
    apply_hf_init(cfg);
    return cfg;
  }
  return checkpoint_config(checkpoint, overrides);
}

LoadedModel load_for_inference(const std::string& checkpoint, const Config& cfg) {
  LoadedModel m;
  m.cfg = cfg;
  m.backend = make_backend(m.cfg.train.device, backend_options(m.cfg));
  m.model = std::make_unique<Model>(m.cfg.model, *m.backend);
  if (is_hf_folder(checkpoint)) {
    // The folder's tensors (and model.vision.init's); what they do not hold is seeded.
    m.model->initialise(m.cfg.train.seed);
    log_hf_import(import_hf_checkpoint(checkpoint, *m.model), m.cfg.model);
    return m;
  }
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
  // A Hugging Face folder records no tokenizer to compare with.
  if (!is_hf_folder(checkpoint)) check_tokenizer(checkpoint, m.state, *tok);
  return tok;
}

}  // namespace dhp
