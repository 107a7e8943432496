// One checkpoint file: HDF5 holding everything an exact resume needs.
//
// Layout (format_version 1):
//   /                 attributes format = "dhp-checkpoint", format_version
//   /config           the resolved configuration as TOML text
//   /params/<name>    every parameter under its model-spec name, full (unsharded) shape
//                     (format_version 3: the frozen ones alone; below)
//   /optim/m/<name>   AdamW first moments     /optim/v/<name>  second moments
//   /state            attributes step, seed, batch_size, sampler_epoch, sampler_position,
//                     dataset_size, tokenizer_hash (Tokenizer::hash()), special_ids
//                     (format_special_ids), added_tokens (format_added_tokens; absent: none)
//   /cost_model       the online refit's state as JSON text (parallel/cost_model.h CostState);
//                     absent when the run did not refit
// Every dataset carries a 64-bit checksum attribute verified on load, so a file damaged on
// disk is refused rather than loaded.
//
// A checkpoint saved by several ranks (format_version 2) keeps the moments out of the main
// file, so that every rank writes its own part at once: part r, the compact moments (the
// trainable parameters' in the gradient layout) of AdamW::save_part(n, r, W), goes to
// NAME.optim-RRRRR-of-WWWWW.h5 beside NAME.h5 (datasets m and v; attributes step, rank, world,
// begin). The main file's /optim then holds, instead of m and v, the attributes parts (W) and
// trainable (one '0' or '1' per parameter in table order: the layout the parts follow) and
// the dataset part_checksums (m and v of each part), so that a part of another save is
// refused. A resume on any number of ranks re-slices the parts.
//
// Since format_version 3 the parts hold the trainable weights too: part r's dataset w is the
// fp32 master of the same compact range (what rank r holds of it under ZeRO, exactly), so no
// rank gathers the whole weights to save them. The main file's /params keeps the frozen
// parameters alone; /optim adds weight_names (the trainable parameters' names and shapes, one
// "name d0,d1" per line, in table order) and weight_offsets (each one's compact offset, then
// the layout's end), and part_checksums holds m, v and w of each part. A load (resume, eval,
// generate, --init) streams them a part at a time into the model, export a tensor at a time
// (CheckpointWeights), one part in memory either way. Files of versions 1 and 2 (weights whole
// in the main file) still load.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "data/sampler.h"
#include "model/model.h"
#include "trainer/config.h"
#include "trainer/optimizer.h"

namespace dhp {

struct TrainState {
  int64_t step = 0;        // optimizer steps completed
  uint64_t seed = 0;       // the run's seed (weights, sampler)
  int64_t batch_size = 0;  // global batch size of the steps so far
  SamplerState sampler;    // where the next global batch starts in the sample stream
  int64_t dataset_size = 0;  // samples the sampler shuffled (a different set changes the stream)
  uint64_t tokenizer_hash = 0;  // hash of the tokenizer file's bytes; 0 = not recorded
  std::string cost_state;       // CostState JSON; "" = none
  std::string special_ids;      // format_special_ids of the tokenizer; "" = not recorded
                                // (then dhp's own table, which every earlier run used)
  std::string added_tokens;     // format_added_tokens; "" = not recorded (none)
};

// The moments of a checkpoint kept in parts (format_version 2), and its trainable weights
// (format_version 3): their number and checksums.
struct MomentParts {
  int world = 0;                    // 0: the moments are in the main file (format_version 1)
  bool weights = false;             // the trainable weights in the parts too (format_version 3)
  std::vector<uint64_t> checksums;  // m, v (and w) of each part: (2 or 3) · world
  int per_part() const { return weights ? 3 : 2; }
};

// What a checkpoint's main file holds besides its configuration and state, copied to the host:
// a background save (checkpoint.async_save) writes it while training goes on.
struct SaveSnapshot {
  // The whole fp32 weights, arena layout; with MomentParts::weights the frozen parameters
  // alone, one after the other in table order.
  std::vector<float> weights;
  bool optimizer = false;      // a training checkpoint: the optimizer's step and moments
  int64_t optimizer_step = 0;
  std::vector<float> m, v;     // the moments, arena layout, when the file holds them (no parts)
};
// The snapshot of a model and optimizer (null: weights only): with parts.weights the frozen
// weights alone, otherwise the model's whole download (one rank: its weights are whole).
SaveSnapshot snapshot_for_save(const Model& model, const AdamW* opt, const MomentParts& parts);

// Writes and flushes a whole checkpoint at `path`, its moments in the file or, when
// parts.world > 0, recorded as parts written by write_moment_part. A failure throws
// dhp::Error with the operating system's reason and may leave a partial file for the caller
// to remove. `progress`: show the bytes as they go (core/progress.h); a background save does
// not, so as not to draw over the training's own line.
void write_checkpoint_file(const std::filesystem::path& path, const Config& cfg, const ParamTable& table,
                           const SaveSnapshot& snapshot, const TrainState& state, const MomentParts& parts = {},
                           bool progress = true);
// The same from the model and optimizer themselves.
void write_checkpoint_file(const std::filesystem::path& path, const Config& cfg, const Model& model,
                           const AdamW* opt, const TrainState& state, const MomentParts& parts = {});

// Where part `rank` of `world` of the checkpoint `main` (NAME.h5) lives.
std::filesystem::path moment_part_path(const std::filesystem::path& main, int rank, int world);
// The step of a checkpoint's main file or moment part named as save_checkpoint names them,
// with or without the temporary's ".tmp"; -1 for any other name.
int64_t checkpoint_file_step(const std::filesystem::path& p);

// Writes and flushes part `rank` of `world` at `path`: the compact moments m and v from
// compact offset `begin`, and, when `w` is given, the compact weights of the same range.
// The main file records their moment_checksum. `progress` as write_checkpoint_file's.
void write_moment_part(const std::filesystem::path& path, int64_t step, int rank, int world,
                       int64_t begin, const std::vector<float>& m, const std::vector<float>& v,
                       const std::vector<float>* w, bool progress = true);
uint64_t moment_checksum(const std::vector<float>& x);

// The step a checkpoint file records in /state, or -1 when it cannot be read.
int64_t recorded_step(const std::string& path);

// The configuration stored in a checkpoint (to rebuild the model it was saved from), with the
// command line's `overrides` applied before it is validated (so a stored setting this machine
// cannot run is corrected by them); `check` as parse_config's.
Config checkpoint_config(const std::string& path, const std::vector<std::string>& overrides = {},
                         bool check = true);

// Loads weights (and, when opt is given, moments and step) after checking the format, every
// name and shape, and every checksum. Throws dhp::Error naming the file and the problem.
TrainState load_checkpoint(const std::string& path, Model& model, AdamW* opt);

// A checkpoint's weights read one tensor at a time, each checked as load_checkpoint checks it
// (name, shape, checksum, finite values): `dhp export` streams a model that no process holds
// whole. Opening checks the format.
struct OpenCheckpoint;
class CheckpointWeights {
 public:
  explicit CheckpointWeights(const std::string& path);
  ~CheckpointWeights();
  CheckpointWeights(const CheckpointWeights&) = delete;
  CheckpointWeights& operator=(const CheckpointWeights&) = delete;
  void read(const ParamSpec& spec, float* out) const;

 private:
  std::unique_ptr<OpenCheckpoint> open_;  // the file load_checkpoint opens the same way
  // Format 3: the part last read (-1: none) and its weights, verified whole.
  mutable int part_ = -1;
  mutable std::vector<float> part_w_;
};

// The weights a checkpoint holds that `table` has no parameter for (a model of another
// configuration: a tower part it does not hold, biases it lacks), in the file's order: what
// --init of that checkpoint leaves out.
std::vector<std::string> checkpoint_params_not_in(const std::string& path, const ParamTable& table);

class Tokenizer;
// Refuses a tokenizer whose special ids, added tokens or file differ from those the checkpoint
// was trained with (a replaced file at the same path would silently change what every token
// id means), naming what differs.
void check_tokenizer(const std::string& checkpoint, const TrainState& st, const Tokenizer& tok);

// Refuses a resume whose configuration changed the model's shape, naming the key.
void check_same_model(const Config& saved, const Config& now, const std::string& path);

}  // namespace dhp
