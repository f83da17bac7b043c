// tide: train, evaluate and sample LLaMA / BLOOM models described by Lua recipes.
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "cli_common.h"
#include "stop_signals.h"

int main(int argc, char** argv) {
  // Logs and errors go to stderr; stdout carries results (JSON, generated text).
  spdlog::set_default_logger(spdlog::stderr_color_mt("tide"));
  spdlog::set_pattern("[%H:%M:%S] [%^%l%$] %v");

  CLI::App app{"tide: train LLaMA and BLOOM models from Lua recipes"};
  app.require_subcommand(1);
  std::string level = "info";
  app.add_option("--log-level", level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
  app.parse_complete_callback([&] { spdlog::set_level(spdlog::level::from_str(level)); });

  tide::cli::add_train_command(app);
  tide::cli::add_data_command(app);
  tide::cli::add_recipe_command(app);
  tide::cli::add_generate_commands(app);
  tide::cli::add_convert_command(app);
  tide::cli::add_checkpoint_command(app);
  tide::cli::add_client_commands(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
  // Stopped by SIGINT / SIGTERM after saving its work: the shell's convention for a
  // command a signal ended.
  if (const int sig = tide::cli::stop_signal(); sig != 0) return 128 + sig;
  return 0;
}
