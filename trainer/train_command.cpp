// `dhp train` and `dhp eval`.
#include <CLI/CLI.hpp>

#include "kernels/check.h"
#include "kernels/log.h"
#include "parallel/comm.h"
#include "trainer/cli.h"
#include "trainer/config.h"
#include "trainer/train.h"

namespace dhp {

void add_train_command(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "train",
      "Train a model from a TOML config; any key can be overridden as --section.key=value");
  auto config = std::make_shared<std::string>();
  sub->add_option("-c,--config", *config, "TOML configuration file")->required();
  sub->allow_extras();
  sub->callback([sub, config] {
    Comm comm(nullptr, nullptr);
    Config cfg = load_config(*config, sub->remaining());
    set_up_logging(comm.rank(), comm.size(), cfg.log.level);
    if (comm.rank() == 0) spdlog::info("resolved configuration ({}):\n{}", cfg.source, format_config(cfg));
    train(cfg, comm);
  });
}

void add_eval_command(CLI::App& app) {
  auto* sub = app.add_subcommand("eval", "Evaluate a checkpoint on a held-out dataset");
  sub->allow_extras();
  sub->callback([] {
    throw Error(
        "'dhp eval' needs checkpoints, which are not implemented yet; 'dhp train' runs the "
        "held-out evaluation (with and without images) at the end of training");
  });
}

}  // namespace dhp
