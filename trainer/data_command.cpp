// `dhp data ...`: preparing data sets. `synth` writes the demo data set; `build` (HDF5 shards
// with a length index) and `stats` come with a later issue.
#include <CLI/CLI.hpp>

#include <memory>

#include "data/synth.h"
#include "kernels/check.h"
#include "kernels/log.h"
#include "trainer/cli.h"

namespace dhp {

void add_data_command(CLI::App& app) {
  auto* data = app.add_subcommand("data", "Prepare data sets");
  data->require_subcommand(1);

  auto opt = std::make_shared<SynthOptions>();
  auto* synth = data->add_subcommand(
      "synth", "Write the synthetic shapes-captioning demo data set (JSONL + images + tokenizer)");
  synth->add_option("--out", opt->out_dir, "Output folder")->capture_default_str();
  synth->add_option("--train", opt->train, "Training samples")->capture_default_str();
  synth->add_option("--val", opt->val, "Validation samples")->capture_default_str();
  synth->add_option("--seed", opt->seed, "Seed; the same options give identical files")
      ->capture_default_str();
  synth->add_option("--vocab-size", opt->vocab_size, "Tokenizer vocabulary upper bound")
      ->capture_default_str();
  synth->add_option("--min-side", opt->min_side, "Smallest image side in pixels")
      ->capture_default_str();
  synth->add_option("--max-side", opt->max_side, "Largest image side in pixels")
      ->capture_default_str();
  synth->callback([opt] {
    set_up_logging(0, 1, "info");
    synthesize(*opt);
  });

  auto* build = data->add_subcommand("build", "Pack a JSONL manifest into HDF5 shards");
  build->allow_extras();
  build->callback(
      [] { throw Error("`dhp data build` is not implemented yet (planned: HDF5 shards)"); });
  auto* stats = data->add_subcommand("stats", "Print length statistics of a data set");
  stats->allow_extras();
  stats->callback([] { throw Error("`dhp data stats` is not implemented yet"); });
}

}  // namespace dhp
