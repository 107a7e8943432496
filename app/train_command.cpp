// `dhp train`, `dhp eval` and `dhp export`.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "app/cli.h"
#include "core/check.h"
#include "core/files.h"
#include "core/log.h"
#include "data/tokenizer.h"
#include "kernels/backend.h"
#include "parallel/mpi_comm.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"
#include "trainer/evaluate.h"
#include "trainer/hf_checkpoint.h"
#include "trainer/inference.h"
#include "trainer/online_planner.h"
#include "trainer/train.h"
#include "trainer/weights.h"

namespace dhp {
namespace {

// Set by SIGTERM/SIGINT; the training loop saves a checkpoint after the current step and
// returns. A signal handler can only reach static storage, hence this one file-level flag.
volatile std::sig_atomic_t g_stop_requested = 0;

void request_stop(int) { g_stop_requested = 1; }

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = request_stop;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}


// An earlier `dhp eval --json` result, which a later evaluation may replace.
bool is_eval_json(const std::string& path) {
  const nlohmann::json j = nlohmann::json::parse(read_head(path, 1 << 20), nullptr, false);
  return j.is_object() && j.contains("checkpoint") && j.contains("real") && j.contains("blanked");
}

}  // namespace

std::unique_ptr<Communicator> communicator_for(std::unique_ptr<Communicator> world,
                                               std::string& device, const CliHooks& hooks) {
  if (device == "auto") {
    const bool here = backend_registry().resolve(device) == "cuda";
    int32_t cpu = here ? 0 : 1;
    world->all_reduce(&cpu, 1, DataType::I32, ReduceOp::Max);
    if (cpu && here)
      spdlog::info("device auto: cpu after all (another rank has no usable CUDA device)");
    device = cpu ? "cpu" : "cuda";
  }
  if (device != "cuda" || world->size() == 1) return world;
  DHP_CHECK(hooks.device_communicator, "train.device = \"cuda\" with {} ranks needs a build "
            "with the CUDA backend (NCCL)", world->size());
  return hooks.device_communicator(std::move(world));
}

void add_train_command(CLI::App& app, const CliHooks& hooks) {
  auto* sub = app.add_subcommand(
      "train",
      "Train a model from a TOML config; any key can be overridden as --section.key=value");
  auto config = std::make_shared<std::string>();
  auto opt = std::make_shared<TrainOptions>();
  sub->add_option("-c,--config", *config, "TOML configuration file")->required();
  sub->add_option("--resume", opt->resume,
                  "Continue from a checkpoint: 'auto' (newest in checkpoint.dir) or a path");
  sub->add_option("--init", opt->init,
                  "Start from existing weights: a safetensors export, a checkpoint, or a Hugging "
                  "Face folder (its config.json sets the decoder's shape; same as model.init)");
  sub->add_option("--stop-after", opt->stop_after,
                  "Save a checkpoint and stop after this step (for time-limited allocations)");
  sub->allow_extras();
  sub->callback([sub, config, opt, &hooks] {
    auto world = start_world(nullptr, nullptr);
    Config cfg = load_config(*config, sub->remaining());
    TrainOptions o = *opt;
    if (is_hf_folder(o.init)) {
      DHP_CHECK(cfg.model.init.empty() || cfg.model.init == o.init,
                "--init {} and model.init {} both name weights to start from", o.init, cfg.model.init);
      cfg.model.init = o.init;
      o.init.clear();
    }
    // Before the table is printed: the decoder's shape is config.json's.
    apply_hf_init_for_run(cfg, o.resume);
    world = communicator_for(std::move(world), cfg.train.device, hooks);
    Communicator& comm = *world;
    set_up_logging(comm.rank(), comm.size(), cfg.log.level, cfg.log.color, started_by_an_mpi_launcher());
    resolve_device_defaults(cfg, comm.rank() == 0);
    if (comm.rank() == 0) spdlog::info("resolved configuration ({}):\n{}", cfg.source, format_config(cfg));
    // A Hugging Face --init is model.init, part of the configuration a resume rebuilds the
    // model from: it goes with --resume. Other weights would be replaced by the checkpoint's.
    DHP_CHECK(opt->resume.empty() || o.init.empty(), "--resume and --init exclude each other "
              "(except for a Hugging Face folder, which sets the model's shape)");
    DHP_CHECK(sub->count("--stop-after") == 0 || opt->stop_after >= 1,
              "--stop-after {}: the step to stop after must be 1 or more", opt->stop_after);
    install_stop_handlers();
    o.stop_flag = &g_stop_requested;
    try {
      train(cfg, comm, o);
    } catch (const std::exception& e) {
      // The other ranks would wait for this one until their timeout and then for ever in
      // MPI_Finalize: say why, then take the whole job down.
      if (comm.size() == 1) throw;
      const std::string what = e.what();
      if (what.rfind("rank ", 0) == 0)
        std::fprintf(stderr, "dhp: error: %s\n", what.c_str());
      else
        std::fprintf(stderr, "dhp: error: rank %d: %s\n", comm.rank(), what.c_str());
      comm.abort(e.what());
    }
  });
}

void add_eval_command(CLI::App& app, const CliHooks& hooks) {
  auto* sub = app.add_subcommand(
      "eval", "Held-out loss, perplexity and caption token accuracy of a checkpoint, with and "
              "without images");
  auto checkpoint = std::make_shared<std::string>("auto");
  auto dir = std::make_shared<std::string>("runs/demo/checkpoints");
  auto data = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  sub->add_option("--checkpoint", *checkpoint, "Checkpoint file, directory, or 'auto'")
      ->capture_default_str();
  sub->add_option("--dir", *dir, "Where 'auto' looks")->capture_default_str();
  sub->add_option("--data", *data, "JSONL manifest (default: the checkpoint's data.val)");
  sub->add_option("--json", *out, "Also write the results to this JSON file");
  auto force = std::make_shared<bool>(false);
  sub->add_flag("--force", *force, "Replace a --json file that is not an earlier result of dhp eval");
  sub->allow_extras();
  sub->callback([sub, checkpoint, dir, data, out, force, &hooks] {
    auto world = start_world(nullptr, nullptr);
    set_up_logging(world->rank(), world->size(), "info", "auto", started_by_an_mpi_launcher());
    // Refused up front, so nothing is computed for a result that cannot be written.
    if (!out->empty()) check_output_path(*out, "--json", is_eval_json, *force);
    const std::string path = resolve_checkpoint(*checkpoint, *dir);
    Config cfg = inference_config(path, sub->remaining());
    world = communicator_for(std::move(world), cfg.train.device, hooks);
    Communicator& comm = *world;
    LoadedModel m = load_for_inference(path, cfg);
    comm.follow(*m.backend);
    const std::string manifest = data->empty() ? m.cfg.data.val : *data;
    DHP_CHECK(!manifest.empty(), "no data to evaluate: pass --data or set data.val");
    const std::unique_ptr<Tokenizer> tokenizer = inference_tokenizer(path, m);
    const Tokenizer& tok = *tokenizer;
    const std::unique_ptr<Dataset> data = open_dataset(manifest, m.cfg.data, tok, data_geometry(m.cfg.model.vision));
    const Dataset& ds = *data;
    EvalOptions eo{m.cfg.train.batch_size, m.cfg.eval.max_samples, false, m.cfg.data.workers,
                   m.cfg.eval.exact_match, tok.ids().eos};
    const Planner planner(m.cfg.model, m.cfg.parallel, comm.size(), {}, engine_layout(m.cfg));
    EvalResult real = evaluate(*m.model, ds, eo, comm, planner);
    eo.blank_images = true;
    EvalResult blank = evaluate(*m.model, ds, eo, comm, planner);
    if (comm.rank() != 0) return;
    fmt::print("checkpoint   {}\ndata         {} ({} samples, {} caption tokens)\n", path, manifest,
               real.samples, real.targets);
    fmt::print("{:<10} {:>10} {:>12} {:>16} {:>13}\n", "images", "loss", "perplexity",
               "token accuracy", "exact match");
    for (const auto& [name, r] : {std::pair{"real", real}, std::pair{"blanked", blank}}) {
      const std::string em = r.exact_match >= 0 ? fmt::format("{:.1f}%", 100 * r.exact_match) : "-";
      fmt::print("{:<10} {:>10.4f} {:>12.3f} {:>15.2f}% {:>13}\n", name, r.loss, r.perplexity,
                 100 * r.accuracy, em);
    }
    if (!out->empty()) {
      nlohmann::json j = {{"checkpoint", path}, {"data", manifest}, {"samples", real.samples},
                          {"targets", real.targets},
                          {"real", {{"loss", real.loss}, {"perplexity", real.perplexity},
                                    {"accuracy", real.accuracy}, {"exact_match", real.exact_match}}},
                          {"blanked", {{"loss", blank.loss}, {"perplexity", blank.perplexity},
                                       {"accuracy", blank.accuracy}, {"exact_match", blank.exact_match}}}};
      check_output_path(*out, "--json", is_eval_json, *force);
      try {
        write_file_atomic(*out, j.dump(2) + "\n");
      } catch (const Error& e) {
        throw Error(fmt::format("--json: {}", e.what()));
      }
    }
  });
}

void add_export_command(CLI::App& app) {
  auto* sub = app.add_subcommand("export", "Write a checkpoint's weights for other tools");
  auto checkpoint = std::make_shared<std::string>("auto");
  auto dir = std::make_shared<std::string>("runs/demo/checkpoints");
  auto format = std::make_shared<std::string>("safetensors");
  auto out = std::make_shared<std::string>("runs/demo/export/model.safetensors");
  auto dtype = std::make_shared<std::string>();
  auto shard = std::make_shared<int64_t>(int64_t(2) << 30);
  sub->add_option("--checkpoint", *checkpoint,
                  "Checkpoint file, directory, 'auto', or a Hugging Face folder")
      ->capture_default_str();
  sub->add_option("--dir", *dir, "Where 'auto' looks")->capture_default_str();
  sub->add_option("--format", *format,
                  "safetensors: every tensor under dhp's names, one file; hf: a Hugging Face folder, "
                  "the decoder (LLaVA-1.5 in llava-hf's layout with a clip or siglip tower; "
                  "docs/pretrained.md)")
      ->check(CLI::IsMember({"safetensors", "hf"}))
      ->capture_default_str();
  sub->add_option("-o,--out", *out,
                  "Output file (safetensors; config.json is written beside it) or folder (hf)")
      ->capture_default_str();
  sub->add_option("--dtype", *dtype,
                  "hf: f32, bf16 or f16 (default: the dtype of the Hugging Face folder the run "
                  "started from, else f32)")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  // Checked in the callback: CLI11's PositiveNumber message names its range as
  // 0.000000 to 1797693134862315708...368.000000, which 0 appears to be inside.
  sub->add_option("--max-shard-bytes", *shard, "hf: larger exports are cut into shards of at most this")
      ->capture_default_str();
  auto force = std::make_shared<bool>(false);
  sub->add_flag("--force",
                *force, "Replace files at -o (and its config.json) that dhp did not write");
  auto remote = std::make_shared<bool>(false);
  sub->add_flag("--remote-code", *remote,
                "hf: an InternVL model in OpenGVLab's remote-code layout (InternVLChatModel) instead of "
                "transformers' (InternVLForConditionalGeneration)");
  sub->allow_extras();  // --section.key=value overrides of the checkpoint's configuration
  sub->callback([sub, checkpoint, dir, format, out, dtype, shard, force, remote] {
    set_up_logging(0, 1, "info");
    DHP_CHECK(*shard >= 1, "--max-shard-bytes must be at least 1, got {}", *shard);
    if (*format == "hf") {
      HfExportOptions o;
      o.dir = sub->count("--out") ? *out : std::string("runs/demo/export/hf");
      o.max_shard_bytes = *shard;
      o.force = *force;
      o.remote_code = *remote;
      if (!dtype->empty()) o.dtype = *dtype == "f32" ? "F32" : *dtype == "bf16" ? "BF16" : "F16";
      check_hf_export_paths(o);
      const std::string path = resolve_checkpoint(*checkpoint, *dir);
      const Config cfg = inference_config(path, sub->remaining());
      if (dtype->empty() && !cfg.model.init.empty()) {
        const std::string from = hf_checkpoint_dtype(cfg.model.init);
        if (!from.empty()) o.dtype = from;
      }
      o.max_position_embeddings = cfg.data.max_tokens;
      // The run's tokenizer: its SentencePiece model, special ids and added tokens.
      HfTokenizerFiles tok;
      std::error_code ec;
      if (std::filesystem::exists(cfg.data.tokenizer, ec)) {
        const Tokenizer t(cfg.data.tokenizer, cfg.data.added_tokens);
        tok = hf_tokenizer_files(t.files(), cfg.data.max_tokens, cfg.data.chat_template);
        o.tokenizer = &tok;
      } else {
        spdlog::warn("the run's tokenizer '{}' is not found from here: the export has no tokenizer "
                     "files (pass --data.tokenizer=PATH)", cfg.data.tokenizer);
      }
      if (is_hf_folder(path)) {
        // A Hugging Face folder (with model.vision.init's tower) is imported into a model first.
        LoadedModel m = load_for_inference(path, cfg);
        export_hf_checkpoint(*m.model, o);
      } else {
        // A checkpoint's weights stream from its file, one tensor at a time.
        const CheckpointWeights weights(path);
        export_hf_checkpoint(cfg.model, ParamTable(cfg.model),
                             [&](const ParamSpec& s, float* out) { weights.read(s, out); }, o);
      }
      const HfLayout layout = hf_export_layout(cfg.model, o.remote_code);
      spdlog::info("exported {} of {} to {} as {} ({} tensors)",
                   is_composite_layout(layout) ? fmt::format("the {} model", hf_layout_name(layout))
                   : layout == HfLayout::LlavaHf ? std::string("the LLaVA model (llava-hf layout)")
                                                 : std::string("the decoder"),
                   path, o.dir, o.dtype, hf_name_map(cfg.model, layout).size());
      return;
    }
    const std::string config_path = (std::filesystem::path(*out).parent_path() / "config.json").string();
    check_export_paths(*out, config_path, *force);
    const std::string path = resolve_checkpoint(*checkpoint, *dir);
    LoadedModel m = load_for_inference(path, inference_config(path, sub->remaining()));
    export_safetensors(*m.model, m.cfg, *out, config_path, *force);
    spdlog::info("exported {} tensors from {} to {} (+ {})", m.model->table().specs().size(), path,
                 *out, config_path);
  });
}

}  // namespace dhp
