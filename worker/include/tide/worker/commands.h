// The worker runtime's commands, shared by the two executables that run training: the
// `tide` CLI (`tide train` by hand, in this process or in launched ranks) and
// `tide-worker`, the program a daemon, an embedded engine (C API) and the launcher start
// for each rank (and for a daemon's exports).
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace tide::worker {

// `train RECIPE [--run-dir ...] [--nproc N ...]`: one rank, a launcher of nproc ranks
// (each a tide-worker), or a rank of a controller's run (TIDE_CONTROLLER set).
void add_train_command(CLI::App& app);
// `export STEP_DIR -o OUT [--dtype F32|BF16|F16]`: a checkpoint as Hugging Face files.
void add_export_command(CLI::App& app, const std::string& name);
// `verify DIR`: every file of a checkpoint (a step directory, or a run's newest) against
// its manifest's sizes and hashes; an error naming each problem when one is not sound.
void add_verify_command(CLI::App& app, const std::string& name);

// "--set key=value" (repeatable) on a subcommand.
void add_overrides(CLI::App& cmd, std::vector<std::string>& overrides);

// What both executables' main does once their subcommands are added: logs to stderr
// (stdout carries results), --log-level, parsing and running the subcommand. Returns
// the exit status: 1 after an error (logged), 128 + the signal when a stop signal ended
// the work (saved first), else 0.
int run_command_line(CLI::App& app, int argc, char** argv);

// The tide-worker of this program's build or installation (ipc::find_tide_worker):
// what the launcher starts for each rank.
std::string worker_beside_self();

}  // namespace tide::worker
