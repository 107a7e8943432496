// The whole run's configuration: one TOML file whose sections mirror the modules.
// Every key has a type, a default and a valid range in one schema (config.cpp); unknown keys,
// wrong types and out-of-range values are errors naming the file, line and key.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "data/config.h"
#include "kernels/backend.h"
#include "parallel/config.h"
#include "types/model_config.h"
#include "types/param_group.h"

namespace dhp {

struct TrainConfig {
  int64_t steps = 200;
  int64_t batch_size = 16;          // samples per global batch
  uint64_t seed = 1234;
  int threads = 0;                  // CPU compute threads; 0 = the cores per local rank
  bool adapt_threads = true;        // CPU: use fewer threads while other processes hold cores
  std::string device = "auto";      // "auto" | "cpu" | "cuda"; auto = cuda when a device is usable
  // kernels/backend.h; auto: bf16 on a CUDA device, fp32 on the CPU (resolve_device_defaults)
  Precision precision = Precision::automatic;
  AttentionImpl attention = AttentionImpl::automatic;  // CUDA: own | cudnn | auto (measured)

};

struct OptimConfig {
  double lr = 3e-3;
  double min_lr = 3e-4;             // cosine floor
  int64_t warmup = 20;              // linear warm-up steps
  double weight_decay = 0.05;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;           // global-norm clipping; 0 = off
  ParamGroups groups;               // [optim.groups.<name>]: trainable, lr_scale
};

struct CheckpointConfig {
  std::string dir = "runs/demo/checkpoints";
  int64_t every = 0;                // steps between checkpoints; 0 = only at the end
  int keep = 2;
  double timeout_s = 0;             // longest wait of the ranks for a save to be written;
                                    // 0 = parallel.timeout_s plus the largest part's bytes
                                    // at 20 MB/s (save_timeout)
  bool async_save = false;          // periodic saves write their files in the background
                                    // while training goes on (the state copied to the host
                                    // first); the last save is always written at once
};

struct EvalConfig {
  int64_t every = 0;                // steps between held-out evaluations; 0 = only at the end
  int64_t max_samples = 0;          // 0 = the whole held-out split
  bool blank_images = true;         // also evaluate with the images blanked
  bool exact_match = true;          // final evaluation also generates every answer (greedy)
  bool at_start = false;            // also evaluate before a fresh run's first step: the
                                    // baseline a stage-1 run (docs/pretrained.md) is read against
};

struct LogConfig {
  std::string level = "info";
  int64_t every = 1;                // steps between log lines
  std::string metrics = "runs/demo/metrics.jsonl";  // "" = no metrics file
  // A folder for TensorBoard's event files (trainer/tensorboard.h); "" = none.
  std::string tensorboard;
  bool progress = true;             // progress bar on a terminal
  // Coloured levels: "auto" (standard output is a terminal and no MPI launcher started the
  // process: Open MPI hands its ranks a pty even when mpirun writes to a file), "always",
  // "never".
  std::string color = "auto";
};

struct Config {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  OptimConfig optim;
  ParallelConfig parallel;
  CheckpointConfig checkpoint;
  EvalConfig eval;
  LogConfig log;
  std::string source;               // file the config came from
};

// Reads `path` (TOML) and applies `overrides` of the form "section.key=value" (a leading "--"
// is accepted), then validates. Throws dhp::Error naming file, line and key.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// Parses TOML text as if it came from `name`; for tests and for configs built in memory. When
// the text alone is valid and the overrides make it invalid, the error names the overrides,
// not the text. `check` false skips validate(): for a stored configuration that is only
// compared with the running one (resume), whose run-time settings may not hold here.
Config parse_config(const std::string& text, const std::string& name,
                    const std::vector<std::string>& overrides = {}, bool check = true);

// Relations between keys that no single range can express (parse_config runs it). A Hugging
// Face folder (model.vision.init, a LLaVA model.init) brings the tower's arch and shape, so
// the tower's checks wait for apply_hf_init, which runs this again with folders_read.
void validate(const Config& c, bool folders_read = false);

// CPU compute threads for this run: train.threads, or when it is 0 the node's cores divided by
// the ranks the launcher started on the node.
int compute_threads(const Config& cfg);
// The backend options of train.device from the [train] section; the device ordinal is the
// launcher's local rank (one GPU per rank).
BackendOptions backend_options(const Config& cfg);

// Whether the command line's `overrides` ("--section.key=value") set `key` ("data.tokenizer").
bool overrides_set(const std::vector<std::string>& overrides, const std::string& key);

// The defaults that depend on the device, made concrete once train.device is known: "auto"
// device (the registry's choice), precision (bf16 on CUDA, fp32 on the CPU) and cost profile
// (the GPU's by its product name, the measured CPU profile on the CPU), each logged with why
// when `say`. Settings the configuration states are kept; a second call changes nothing.
void resolve_device_defaults(Config& cfg, bool say);

// The resolved configuration as an aligned "section.key = value" table.
std::string format_config(const Config& cfg);

// The resolved configuration as TOML text that parse_config() reads back to the same values.
std::string to_toml(const Config& cfg);

// Every key of the schema with its value as TOML writes it ("section.key", "value"), in the
// schema's order.
std::vector<std::pair<std::string, std::string>> config_entries(const Config& cfg);

}  // namespace dhp
