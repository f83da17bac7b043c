// Shared pieces of the tide subcommands.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "tide/worker/commands.h"

namespace tide::cli {

void add_data_command(CLI::App& app);
void add_recipe_command(CLI::App& app);
void add_generate_commands(CLI::App& app);  // generate, eval
void add_convert_command(CLI::App& app);
void add_checkpoint_command(CLI::App& app);
void add_plan_command(CLI::App& app);
// submit, runs, status, watch, pause, resume, stop, cancel, checkpoint, set, metrics,
// logs, checkpoints, export, daemon: clients of a running tided.
void add_client_commands(CLI::App& app);

using worker::add_overrides;

// Human-friendly counts: 6,738,415,616.
std::string with_commas(int64_t n);

}  // namespace tide::cli
