#include "app/cli.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <hdf5.h>

#include <csignal>
#include <cstdio>
#include <exception>

#include "core/check.h"
#include "core/log.h"
#include "parallel/mpi_comm.h"

namespace dhp {

int run_cli(int argc, char** argv, const CliHooks& hooks) {
  // HDF5's exit-time cleanup retries closing a file whose write failed (a full disk) and
  // crashes doing it. Every file we open is closed by its owner before exit, so there is
  // nothing for that cleanup to do; it must be switched off before the library starts. (Only
  // the C library is linked: the C++ one would register the same cleanup on its own.)
  H5dont_atexit();
  // A write past the file size limit (ulimit -f) then fails with EFBIG, which is reported
  // like any failed write, instead of killing the process without a word.
  std::signal(SIGXFSZ, SIG_IGN);
  // Lines logged before a command sets its own level and log.color (device choice, config
  // reading) take dhp's pattern and log.color's default, not spdlog's coloured one.
  set_up_logging(0, 1, "info", "auto", started_by_an_mpi_launcher());
  CLI::App app{"dhp: a trainer for vision-language models with dynamic hybrid parallelism"};
  app.require_subcommand(1);
  app.set_version_flag("--version", DHP_VERSION);

  auto* version = app.add_subcommand("version", "Print the version and build options");
  version->callback([&hooks] {
    fmt::print("dhp {}\n", DHP_VERSION);
    fmt::print("cuda backend: {}\n", hooks.cuda_report ? hooks.cuda_report() : "not compiled");
#ifdef DHP_MPI
    fmt::print("mpi: yes\n");
#else
    fmt::print("mpi: no\n");
#endif
  });
  add_train_command(app, hooks);
  add_eval_command(app, hooks);
  add_export_command(app);
  add_generate_command(app);
  add_data_command(app);
  add_plan_command(app);
  add_profile_command(app, hooks);
  add_tokenize_command(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const Error& e) {
    std::fprintf(stderr, "dhp: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    // Anything else (a filesystem or library exception) is still the user's to read, never
    // an abort.
    std::fprintf(stderr, "dhp: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace dhp
