// Ctrl-C and SIGTERM for `tide train` outside a daemon: the first asks the run to stop at
// the next step boundary with a checkpoint (as `tide stop` does under tided), so a
// scheduler's SIGTERM or an impatient user loses no progress; a second ends the process
// at once.
#pragma once

#include <string>

namespace tide::worker {

// Installs the handlers for SIGINT and SIGTERM (idempotent).
void install_stop_signals();
// The first stop signal received (SIGINT or SIGTERM), 0 for none.
int stop_signal();
// The JSON text of live-control commands (docs/protocol.md, worker link) that asks for a
// stop, the first time it is called after a stop signal; "" otherwise.
std::string take_stop_command();

}  // namespace tide::worker
