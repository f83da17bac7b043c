// The controller: owns the run registry, the queue and the device slots, serves
// requests on a command socket (ROUTER), publishes events (XPUB), starts each run as a
// group of worker processes and supervises them (heartbeats, exits, restarts from the
// latest checkpoint). tided runs it on its main thread; an embedded engine on a thread
// of the host process. It never touches tensors.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace tide::ipc {

struct ControllerOptions {
  std::string state_dir;                       // registry, run directories, ipc sockets
  std::vector<std::string> command_endpoints;  // bound; "tcp://127.0.0.1:*" picks a port
  std::vector<std::string> event_endpoints;
  std::string worker_executable;  // tide-worker: what each rank and each export runs
  // Where `recipe_name` may find recipes besides the bundled ones (recipes_dir()).
  std::vector<std::string> recipe_dirs;
  int cpu_slots = 1;              // CPU runs share these (one slot per worker process)
  // CUDA devices handed to runs whose recipe says device = "cuda", one per worker, as
  // CUDA_VISIBLE_DEVICES names them (indices or UUIDs). Empty: cuda runs are refused.
  std::vector<std::string> gpus;
  int cores = 0;                  // cores shared by the slots; 0: this machine's
  // CURVE on every TCP endpoint (required to bind beyond loopback): the server's key file
  // (tide keygen) and the allowlist of client public keys with their roles
  // (docs/protocol.md, Security). ipc endpoints stay local and need no key.
  std::string curve_key_file, allowlist_file;
  // On the way out, each training run first saves a checkpoint at its next step
  // boundary; runs that have not saved within this long are ended without one (and
  // resume from their previous checkpoint).
  int shutdown_timeout_s = 120;
  // Runs handed to Slurm (sbatch) instead of started as local workers (docs/multinode.md,
  // "tided on Slurm"): each run is one batch job whose srun tasks are its ranks; they
  // connect back to the worker endpoint over TCP with CURVE, a key per run.
  struct Slurm {
    bool enabled = false;
    std::vector<std::string> sbatch_args;  // given to every sbatch (partition, account, time limit)
    int gpus_per_node = 8;                 // a cuda run's ranks per node, one GPU each
    // Bound for the ranks; they connect to its address, or to this host's name where it
    // binds every interface (0.0.0.0), as the cluster's nodes resolve it.
    std::string worker_endpoint = "tcp://0.0.0.0:7452";
  } slurm;
  // The HTTP server: Prometheus /metrics and the runs' JSON API and controls
  // (docs/dashboard.md). port -1: none; 0: any free port.
  struct Http {
    std::string address = "127.0.0.1";
    int port = -1;
    bool insecure = false;  // beyond loopback without TLS
    std::string tls_cert, tls_key;  // PEM certificate and private key: HTTPS
  } http;
  // Alerts (docs/dashboard.md): anomaly actions, faults, failures, failed checkpoints and
  // stalls, posted to webhooks and given to commands.
  struct Alerting {
    std::vector<std::string> webhooks, commands;
    double stall_factor = 10;  // stalled: no step for this many median step intervals,
    double stall_min_s = 60;   // and at least this long
    bool recipe_webhooks = true;  // also to the webhooks a run's recipe names (alerts.webhooks)
  } alerts;
};

// The CUDA devices a controller hands out. "auto": CUDA_VISIBLE_DEVICES when it is set,
// else one per /dev/nvidia<N> the driver created (the controller links no CUDA runtime to
// ask); "none"; or a comma-separated list of indices or UUIDs, as CUDA_VISIBLE_DEVICES
// takes them.
std::vector<std::string> resolve_gpus(const std::string& spec);

class Controller {
 public:
  // Loads the registry (runs that were training when the last controller ended are
  // queued again, to resume from their checkpoints) and binds the sockets; throws when
  // an endpoint cannot be bound.
  explicit Controller(ControllerOptions options);
  ~Controller();
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;

  // The endpoints actually bound (wildcard ports resolved).
  std::vector<std::string> command_endpoints() const;
  std::vector<std::string> event_endpoints() const;
  // http://address:port/ of the HTTP server; empty without one.
  std::string http_url() const;

  // Serves until stop(). On the way out, every run with workers saves a checkpoint
  // (bounded by shutdown_timeout_s), its workers end, and it is queued again to resume
  // from that checkpoint under the next controller.
  void run();
  // Thread-safe and async-signal-safe. A second call ends the runs at once, without the
  // checkpoints they were saving.
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tide::ipc
