// `dhp <subcommand>`: the command-line front end. Each subcommand registers itself on the
// CLI11 app with an add_*_command() function that lives beside the code it drives.
#pragma once

#include <functional>
#include <memory>
#include <string>

namespace CLI {
class App;
}

namespace dhp {

class Communicator;

// What the executable knows that the libraries below it do not: the CUDA backend lives in a
// library only the executable links, so it reports on itself through this hook.
struct CliHooks {
  std::function<std::string()> cuda_report;  // empty when built without CUDA
  // Wraps the job's world (MPI) in the communicator for the CUDA backend's device buffers
  // (NCCL, which the CUDA build links); used by runs on train.device = "cuda" with more than
  // one rank. Empty when built without CUDA.
  std::function<std::unique_ptr<Communicator>(std::unique_ptr<Communicator>)> device_communicator;
};

int run_cli(int argc, char** argv, const CliHooks& hooks = {});

// The communicator of a run on `device`: on the CUDA backend with several ranks, the world
// wrapped for device buffers (NCCL) before the backend picks its device, so that both use the
// device the wrapper chose for this rank. "auto" is resolved here, the same on every rank (CUDA
// only where every rank has a usable device), and `device` receives the answer.
std::unique_ptr<Communicator> communicator_for(std::unique_ptr<Communicator> world, std::string& device,
                                               const CliHooks& hooks);

// Registration hooks, one per subcommand family (each in its own file of trainer/).
void add_train_command(CLI::App& app, const CliHooks& hooks);
void add_eval_command(CLI::App& app, const CliHooks& hooks);
void add_export_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_data_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_profile_command(CLI::App& app, const CliHooks& hooks);
void add_tokenize_command(CLI::App& app);

}  // namespace dhp
