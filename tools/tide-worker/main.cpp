// tide-worker: the program a daemon, an embedded engine (C API) and `tide train --nproc`
// start: one rank of a training run (`train`), or a checkpoint's export (`export`) or
// verification (`verify`). Users run `tide`; this is its worker side, with the same
// `train` options.
#include <CLI/CLI.hpp>

#include "tide/worker/commands.h"

int main(int argc, char** argv) {
  CLI::App app{
      "tide-worker: one rank of a tide run, or a checkpoint's export or verification (started by tided, libtide, "
      "tide train)"};
  app.require_subcommand(1);
  tide::worker::add_train_command(app);
  tide::worker::add_export_command(app, "export");
  tide::worker::add_verify_command(app, "verify");
  return tide::worker::run_command_line(app, argc, argv);
}
