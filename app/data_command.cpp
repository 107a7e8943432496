// `dhp data ...`: preparing data sets. `synth` writes the demo data set or a preset-shaped
// synthetic one; `build` packs a JSONL manifest into HDF5 shards with a length index; `stats`
// prints the length distribution of a manifest or a built folder.
#include <CLI/CLI.hpp>

#include <filesystem>
#include <memory>

#include "app/cli.h"
#include "core/check.h"
#include "core/files.h"
#include "core/log.h"
#include "data/build.h"
#include "data/dataset.h"
#include "data/shard_format.h"
#include "data/stats.h"
#include "data/synth.h"
#include "data/tokenizer.h"
#include "trainer/config.h"
#include "trainer/hf_checkpoint.h"

namespace dhp {

namespace {

// The run configuration a data command reads its [model.vision] and [data] settings from:
// --config, or the defaults, with --section.key=value overrides either way; a tower named by
// model.init or model.vision.init gives its geometry (patch, image size, resize) as a run's would.
Config data_config(const std::string& path, const std::vector<std::string>& overrides) {
  Config cfg = path.empty() ? parse_config("", "defaults", overrides) : load_config(path, overrides);
  apply_hf_init_if_here(cfg);
  return cfg;
}

void add_synth(CLI::App* data) {
  auto opt = std::make_shared<SynthOptions>();
  auto* synth = data->add_subcommand(
      "synth", "Write a synthetic data set (JSONL + images + tokenizer): the shapes-captioning "
               "demo, or with --preset one whose lengths follow a preset");
  synth->add_option("--out", opt->out_dir, "Output folder")->capture_default_str();
  synth->add_option("--train,--samples", opt->train, "Training samples")->capture_default_str();
  synth->add_option("--val", opt->val, "Validation samples")->capture_default_str();
  synth->add_option("--seed", opt->seed, "Seed; the same options give identical files")
      ->capture_default_str();
  synth->add_option("--vocab-size", opt->vocab_size, "Tokenizer vocabulary upper bound")
      ->capture_default_str();
  synth->add_option("--min-side", opt->min_side, "Smallest image side in pixels (demo)")
      ->capture_default_str();
  synth->add_option("--max-side", opt->max_side, "Largest image side in pixels (demo)")
      ->capture_default_str();
  synth->add_option("--preset", opt->preset, "Length preset: captions | mixed | video-longtail");
  synth->add_option("--scale", opt->scale, "Preset image sides times this")->capture_default_str();
  synth->add_option("--factor", opt->factor, "Preset sizes snap to multiples of this (patch * merge)")
      ->capture_default_str();
  synth->add_flag("--force", opt->force,
                  "Write over the files of a folder that is not empty (an earlier synth)");
  synth->callback([opt] {
    set_up_logging(0, 1, "info");
    synthesize(*opt);
  });
}

void add_build(CLI::App* data) {
  auto opt = std::make_shared<BuildOptions>();
  auto config = std::make_shared<std::string>();
  auto shard_mb = std::make_shared<double>(256);
  auto* build = data->add_subcommand("build", "Pack a JSONL manifest into HDF5 shards with a "
                                              "length index (resumable: rerun to continue)");
  build->add_option("--manifest", opt->manifest, "JSONL manifest (default: data.train)");
  build->add_option("--image-root", opt->image_root,
                    "Folder relative image paths start from (default: data.image_root, else "
                    "the manifest's folder)");
  build->add_option("--out", opt->out_dir, "Output folder")->required();
  build->add_option("--tokenizer", opt->tokenizer, "SentencePiece model (default: data.tokenizer)");
  build->add_option("-c,--config", *config,
                    "Run configuration for [model.vision], data.max_tokens, "
                    "data.max_image_pixels, data.on_error and the video keys (video_fps, "
                    "min_frames, max_frames, video_max_pixels) (default: built-in defaults)");
  build->add_option("--workers", opt->workers, "Decode / tokenize threads")->capture_default_str();
  build->add_option("--shard-mb", *shard_mb, "Shard size bound in MiB")->capture_default_str();
  build->add_option("--reencode", opt->reencode, "Image bytes: none (as they came) | png | jpeg")
      ->capture_default_str();
  build->add_option("--max-shards", opt->max_new_shards,
                    "Stop after committing this many new shards (build in slices; rerun to "
                    "continue)");
  build->allow_extras();
  build->callback([build, opt, config, shard_mb] {
    set_up_logging(0, 1, "info");
    const Config cfg = data_config(*config, build->remaining());
    BuildOptions o = *opt;
    if (o.manifest.empty()) o.manifest = cfg.data.train;
    if (o.image_root.empty()) o.image_root = cfg.data.image_root;
    if (o.tokenizer.empty()) o.tokenizer = cfg.data.tokenizer;
    o.added_tokens = cfg.data.added_tokens;
    o.chat = cfg.data.chat_template;
    o.vision = data_geometry(cfg.model.vision);
    o.max_tokens = cfg.data.max_tokens;
    o.max_image_pixels = cfg.data.max_image_pixels;
    o.on_error = cfg.data.on_error;
    o.allow_absolute_paths = cfg.data.allow_absolute_paths;
    o.video = cfg.data.video;
    DHP_CHECK(*shard_mb > 0, "--shard-mb must be positive");
    // -1 is the library's "no limit", which only leaving the option out may ask for.
    DHP_CHECK(build->count("--max-shards") == 0 || o.max_new_shards >= 1,
              "--max-shards must be >= 1, not {}", o.max_new_shards);
    o.shard_bytes = std::max<int64_t>(1, int64_t(*shard_mb * 1024 * 1024));
    const BuildSummary s = build_dataset(o);
    if (!s.complete) {
      spdlog::info("build: stopped after {} shard(s) ({} new) at manifest line {}; rerun the "
                   "same command to continue",
                   s.shards, s.shards - s.resumed_shards, s.lines);
      return;
    }
    int64_t skipped = 0;
    for (const auto& [reason, n] : s.skipped) skipped += n;
    spdlog::info("build: {} samples from {} lines in {} shard(s), {:.1f} MB of images; {} "
                 "skipped{}{} (see {}/{})",
                 s.samples, s.lines, s.shards, double(s.image_bytes) / 1e6, skipped,
                 s.skipped.empty() ? "" : ": ", format_counts(s.skipped), o.out_dir, kReportFile);
    if (s.processed_lines > 0)
      spdlog::info("build: {:.0f} lines/s, {:.1f} MB/s read, {} worker(s), {:.1f} s",
                   double(s.processed_lines) / s.seconds, double(s.input_bytes) / 1e6 / s.seconds,
                   o.workers, s.seconds);
  });
}

void add_stats(CLI::App* data) {
  auto path = std::make_shared<std::string>();
  auto csv = std::make_shared<std::string>();
  auto config = std::make_shared<std::string>();
  auto* stats = data->add_subcommand(
      "stats", "Length distribution (vision / text / total tokens) of a built folder or a "
               "JSONL manifest");
  stats->add_option("--data", *path, "Built folder, or JSONL manifest")->required();
  stats->add_option("--csv", *csv, "Also write every sample's lengths to this CSV file");
  auto force = std::make_shared<bool>(false);
  stats->add_flag("--force", *force, "Replace a --csv file that is not an earlier lengths CSV");
  stats->add_option("-c,--config", *config,
                    "For a manifest: run configuration (tokenizer, [model.vision], limits)");
  stats->allow_extras();
  stats->callback([stats, path, csv, config, force] {
    set_up_logging(0, 1, "info");
    if (!csv->empty()) check_output_path(*csv, "--csv", is_lengths_csv, *force);
    LengthTable t;
    if (std::filesystem::is_directory(*path)) {
      t = lengths_of(read_index(*path));  // lengths as built: no tokenizer or model needed
    } else {
      const Config cfg = data_config(*config, stats->remaining());
      Tokenizer tok(cfg.data.tokenizer, cfg.data.added_tokens);
      t = lengths_of(*open_dataset(*path, cfg.data, tok, data_geometry(cfg.model.vision)));
    }
    fmt::print("{}: {} samples\n\n{}", *path, t.size(), describe_lengths(t));
    if (!csv->empty()) {
      write_lengths_csv(t, *csv, *force);
      fmt::print("\nwrote {}\n", *csv);
    }
  });
}

}  // namespace

void add_data_command(CLI::App& app) {
  auto* data = app.add_subcommand("data", "Prepare data sets");
  data->require_subcommand(1);
  add_synth(data);
  add_build(data);
  add_stats(data);
}

}  // namespace dhp
