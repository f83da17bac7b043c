// tide: train, evaluate and sample LLaMA / BLOOM models described by Lua recipes.
#include <CLI/CLI.hpp>

#include "cli_common.h"

int main(int argc, char** argv) {
  CLI::App app{"tide: train LLaMA and BLOOM models from Lua recipes"};
  app.require_subcommand(1);
  tide::worker::add_train_command(app);
  tide::cli::add_data_command(app);
  tide::cli::add_recipe_command(app);
  tide::cli::add_generate_commands(app);
  tide::cli::add_convert_command(app);
  tide::cli::add_checkpoint_command(app);
  tide::cli::add_plan_command(app);
  tide::cli::add_client_commands(app);
  return tide::worker::run_command_line(app, argc, argv);
}
