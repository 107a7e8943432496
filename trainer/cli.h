// `dhp <subcommand>`: the command-line front end. Each subcommand registers itself on the
// CLI11 app with an add_*_command() function that lives beside the code it drives.
#pragma once

namespace CLI {
class App;
}

namespace dhp {

int run_cli(int argc, char** argv);

// Registration hooks, one per subcommand family (each in its own file of trainer/).
void add_train_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_data_command(CLI::App& app);
void add_plan_command(CLI::App& app);

}  // namespace dhp
