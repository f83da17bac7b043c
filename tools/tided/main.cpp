// tided: the tide engine daemon. Serves the protocol of docs/protocol.md, queues runs
// on its device slots and supervises their worker processes.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/sinks/rotating_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "tide/ipc/client.h"
#include "tide/ipc/controller.h"
#include "tide/ipc/worker_group.h"

namespace fs = std::filesystem;

namespace {
tide::ipc::Controller* g_controller = nullptr;

void on_signal(int) {
  if (g_controller) g_controller->stop();
}

// The tide-worker that belongs with this tided (beside it, or in an installation's bin/).
std::string default_worker() {
  const fs::path self = fs::read_symlink("/proc/self/exe").parent_path();
  const std::string found = tide::ipc::find_tide_worker(self.string());
  return found.empty() ? (self / "tide-worker").string() : found;
}

// Returns in the parent once the detached daemon has bound its sockets (or failed).
void detach(const fs::path& state_dir) {
  const fs::path ready = state_dir / "endpoints.json";
  std::error_code ec;
  fs::remove(ready, ec);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid > 0) {
    for (int i = 0; i < 300; ++i) {
      if (fs::exists(ready)) {
        std::printf("tided running (pid %d); state in %s\n", pid, state_dir.c_str());
        std::exit(0);
      }
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        std::fprintf(stderr, "tided failed to start; see %s\n", (state_dir / "tided.log").c_str());
        std::exit(1);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    std::fprintf(stderr, "tided did not report ready within 30 s; see %s\n", (state_dir / "tided.log").c_str());
    std::exit(1);
  }
  ::setsid();
  // Without its log the daemon could tell nobody anything: it ends, and the parent, which
  // watches for that, says so.
  if (!std::freopen("/dev/null", "r", stdin) || !std::freopen("/dev/null", "w", stdout) ||
      !std::freopen((state_dir / "tided.log").c_str(), "a", stderr))
    std::exit(1);
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tided: the tide engine daemon (queues, runs and supervises training runs; docs/protocol.md)"};
  tide::ipc::ControllerOptions opt;
  opt.state_dir = tide::ipc::default_state_dir();
  bool foreground = false, no_tcp = false;
  int port = 7450;
  std::string level = "info", gpus = "auto";
  app.add_option("--state-dir", opt.state_dir, "Registry, run directories and ipc sockets")->capture_default_str();
  app.add_flag("--foreground", foreground, "Stay attached and log to the terminal (else detach and log to tided.log)");
  app.add_option("--cpu-slots", opt.cpu_slots, "Worker processes that may run at once (CPU training)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--gpus", gpus,
                 "CUDA devices for runs with device = \"cuda\", one per worker: auto (CUDA_VISIBLE_DEVICES, else "
                 "/dev/nvidia*), none, or a list such as 0,1,2,3")
      ->capture_default_str();
  app.add_option("--cores", opt.cores, "Cores the slots share (default: this machine's)")->check(CLI::Range(1, 65536));
  app.add_option("--port", port, "Loopback TCP port for commands; events use the next one (0: any free ports)")
      ->check(CLI::Range(0, 65532))
      ->capture_default_str();
  app.add_flag("--no-tcp", no_tcp, "Serve only the ipc sockets in the state directory (no HTTP either)");
  std::string http;
  bool no_http = false;
  app.add_option("--http", http,
                 "Dashboard and /metrics at ADDRESS:PORT (default 127.0.0.1 and --port + 3; any free port with "
                 "--port 0)");
  app.add_flag("--no-http", no_http, "Serve no HTTP");
  app.add_flag("--http-insecure", opt.http.insecure,
               "Allow --http beyond loopback without TLS (anyone on the network may read the runs)");
  app.add_option("--http-cert", opt.http.tls_cert, "Serve HTTPS with this PEM certificate (chain)")
      ->check(CLI::ExistingFile);
  app.add_option("--http-key", opt.http.tls_key, "... and this PEM private key (owner-only)")->check(CLI::ExistingFile);
  app.add_option("--alert-webhook", opt.alerts.webhooks,
                 "POST alerts (anomaly actions, faults, failures, failed checkpoints, stalls) as JSON to this http(s) "
                 "URL; repeatable");
  app.add_option("--alert-command", opt.alerts.commands,
                 "Run this with /bin/sh for each alert, its JSON as $1; repeatable");
  app.add_flag("!--no-recipe-alerts", opt.alerts.recipe_webhooks,
               "Ignore the alert webhooks that recipes name (alerts.webhooks): only this daemon's own receivers");
  app.add_option("--alert-stall-factor", opt.alerts.stall_factor,
                 "A run is stalled after this many of its median step intervals with no step")
      ->check(CLI::Range(1.0, 1e6))
      ->capture_default_str();
  app.add_option("--alert-stall-min", opt.alerts.stall_min_s, "... and at least this many seconds")
      ->check(CLI::Range(0.1, 1e7))
      ->capture_default_str();
  app.add_option("--bind", opt.command_endpoints, "More command endpoints (ZeroMQ syntax)");
  app.add_option("--publish", opt.event_endpoints, "More event endpoints (ZeroMQ syntax)");
  app.add_option("--curve-key", opt.curve_key_file,
                 "Serve TCP with CURVE: this daemon's key file (tide keygen); required to bind beyond loopback")
      ->check(CLI::ExistingFile);
  app.add_option("--clients", opt.allowlist_file,
                 "With --curve-key: the allowlist, one 'operator|observer <public key> [name]' per line")
      ->check(CLI::ExistingFile);
  app.add_option("--shutdown-timeout", opt.shutdown_timeout_s,
                 "Seconds the runs get to save a checkpoint when the daemon stops (a second SIGTERM: none)")
      ->check(CLI::Range(0, 86400))
      ->capture_default_str();
  app.add_option("--recipe-dir", opt.recipe_dirs,
                 "A directory whose recipes clients may name (recipe_name), besides the bundled ones; repeatable")
      ->check(CLI::ExistingDirectory);
  app.add_option("--worker", opt.worker_executable,
                 "The tide-worker executable each rank and export runs (default: beside tided)");
  app.add_flag("--slurm", opt.slurm.enabled,
               "Hand each run to Slurm as a batch job (sbatch) instead of starting local workers; the state "
               "directory must be on a filesystem the nodes share (docs/multinode.md)");
  app.add_option("--sbatch-arg", opt.slurm.sbatch_args,
                 "With --slurm: an option for every sbatch, such as --sbatch-arg=--partition=gpu; repeatable")
      ->allow_extra_args(false);
  app.add_option("--slurm-gpus-per-node", opt.slurm.gpus_per_node,
                 "With --slurm: ranks of a cuda run per node, one GPU each")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--worker-endpoint", opt.slurm.worker_endpoint,
                 "With --slurm: the TCP endpoint the ranks connect back to (CURVE, a key per run); on 0.0.0.0 they "
                 "connect to this host's name")
      ->capture_default_str();
  app.add_option("--log-level", level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  CLI11_PARSE(app, argc, argv);

  try {
    fs::create_directories(opt.state_dir);
    opt.state_dir = fs::canonical(opt.state_dir).string();
    if (!foreground) detach(opt.state_dir);
    spdlog::set_default_logger(spdlog::stderr_color_mt("tided"));
    spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");
    spdlog::set_level(spdlog::level::from_str(level));
    spdlog::flush_on(spdlog::level::info);
    opt.command_endpoints.insert(opt.command_endpoints.begin(), tide::ipc::default_command_endpoint(opt.state_dir));
    opt.event_endpoints.insert(opt.event_endpoints.begin(), tide::ipc::default_event_endpoint(opt.state_dir));
    if (!no_tcp) {
      opt.command_endpoints.push_back(port == 0 ? "tcp://127.0.0.1:*" : fmt::format("tcp://127.0.0.1:{}", port));
      opt.event_endpoints.push_back(port == 0 ? "tcp://127.0.0.1:*" : fmt::format("tcp://127.0.0.1:{}", port + 1));
    }
    if (!no_http && !no_tcp) {  // HTTP is TCP: --no-tcp serves none
      opt.http.port = port == 0 ? 0 : port + 3;
      if (!http.empty()) {
        const auto colon = http.rfind(':');
        const std::string digits = colon == std::string::npos ? "" : http.substr(colon + 1);
        const bool ok = colon > 0 && !digits.empty() && digits.size() <= 5 &&
                        digits.find_first_not_of("0123456789") == std::string::npos && std::stoi(digits) <= 65535;
        if (!ok) throw std::invalid_argument("--http takes ADDRESS:PORT (port 0-65535), not '" + http + "'");
        opt.http.address = http.substr(0, colon);
        opt.http.port = std::stoi(digits);
      }
    }
    opt.gpus = tide::ipc::resolve_gpus(gpus);
    if (opt.worker_executable.empty()) opt.worker_executable = default_worker();
    if (!fs::exists(opt.worker_executable))
      throw std::invalid_argument("worker executable '" + opt.worker_executable + "' does not exist (--worker)");
    tide::ipc::Controller controller(opt);
    g_controller = &controller;
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);
    ::signal(SIGPIPE, SIG_IGN);
    controller.run();
    g_controller = nullptr;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
  return 0;
}
