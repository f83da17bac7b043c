// Ctrl-C, SIGTERM and SIGUSR1 for `tide train` outside a daemon: the first asks the run
// to stop at the next step boundary with a checkpoint (as `tide stop` does under tided), so
// a scheduler's SIGTERM, Slurm's SIGUSR1 warning before a time limit, or an impatient user
// loses no progress; a second ends the process at once. The command then exits 128 + the
// signal (138 for SIGUSR1), which a batch script reads to requeue the job
// (examples/slurm/).
#pragma once

#include <string>

namespace tide::worker {

// Installs the handlers for SIGINT, SIGTERM and SIGUSR1 (idempotent).
void install_stop_signals();
// The first stop signal received, 0 for none.
int stop_signal();
// The JSON text of live-control commands (docs/protocol.md, worker link) that asks for a
// stop, the first time it is called after a stop signal; "" otherwise.
std::string take_stop_command();

}  // namespace tide::worker
