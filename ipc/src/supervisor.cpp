#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <zmq_addon.hpp>

#include "supervisor.h"

#include <unistd.h>

#include "slurm_job.h"

#include "tide/engine/io/json_input.h"
#include "tide/ipc/protocol.h"

namespace tide::ipc {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
// A worker asked to end (SIGTERM) gets this long before SIGKILL.
constexpr auto kGrace = std::chrono::seconds(5);

struct Route {
  std::string run;
  int64_t attempt = 0;
  int rank = 0;
};

std::optional<Route> parse_route(std::string_view id) {
  const auto a = id.find(':');
  const auto b = id.rfind(':');
  if (a == std::string_view::npos || a == b) return std::nullopt;
  try {
    return Route{std::string(id.substr(0, a)), std::stoll(std::string(id.substr(a + 1, b - a - 1))),
                 std::stoi(std::string(id.substr(b + 1)))};
  } catch (const std::exception&) {
    return std::nullopt;
  }
}
}  // namespace

Supervisor::Supervisor(const ControllerOptions& opt, zmq::context_t& ctx, RunBook& runs, PolicyHost& policies,
                       EventBus& bus)
    : opt_(opt), runs_(runs), policies_(policies), bus_(bus), workers_(ctx, zmq::socket_type::router) {
  workers_.set(zmq::sockopt::maxmsgsize, kTransportLimit);
  workers_.set(zmq::sockopt::linger, 0);
  workers_.set(zmq::sockopt::router_mandatory, false);
  endpoint_ = "ipc://" + (fs::absolute(opt_.state_dir) / "workers.sock").string();
  workers_.bind(endpoint_);
  if (!opt_.slurm.enabled) return;
  // Ranks on other hosts: CURVE, whatever the address. The socket's key is made here, not
  // the operator's daemon key, so that no file a job can read opens the command socket;
  // each run's ranks get a key pair of their own, which the ZAP handler admits for that run
  // alone (run_of_worker_key), and options set now apply to the binds that follow.
  tcp_key_ = generate_curve_keys();
  workers_.set(zmq::sockopt::curve_server, true);
  workers_.set(zmq::sockopt::curve_secretkey, tcp_key_->secret_key);
  workers_.set(zmq::sockopt::zap_domain, kWorkerZapDomain);
  try {
    workers_.bind(opt_.slurm.worker_endpoint);
  } catch (const zmq::error_t& e) {
    throw std::runtime_error(
        fmt::format("cannot bind the worker endpoint {}: {}", opt_.slurm.worker_endpoint, e.what()));
  }
  tcp_endpoint_ = workers_.get(zmq::sockopt::last_endpoint);
  for (const char* any : {"tcp://0.0.0.0:", "tcp://[::]:"}) {
    if (tcp_endpoint_.rfind(any, 0) != 0) continue;
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    tcp_endpoint_ = fmt::format("tcp://{}:{}", host, tcp_endpoint_.substr(std::string(any).size()));
  }
  spdlog::info("runs go to Slurm; their ranks connect to {}", tcp_endpoint_);
}

std::optional<std::string> Supervisor::run_of_worker_key(const std::string& key) const {
  for (const auto& [id, a] : active_)
    if (!a.worker_key.empty() && a.worker_key == key) return id;
  return std::nullopt;
}

ActiveRun* Supervisor::find(const std::string& run) {
  const auto it = active_.find(run);
  return it == active_.end() ? nullptr : &it->second;
}

void Supervisor::command(const std::string& run, json command) {
  ActiveRun* a = find(run);
  if (!a) return;
  if (command.value("op", "") == "stop") {
    a->stop_requested = true;
    // A job still waiting in the scheduler's queue has trained nothing since its last
    // checkpoint: it leaves the queue rather than wait to be told.
    if (a->rank0.empty() && a->executor && !a->ending && a->executor->live().empty()) {
      a->ending = true;
      a->executor->terminate(kGrace);
      return;
    }
  }
  a->pending.push_back(std::move(command));
  deliver(run);
}

void Supervisor::cancel(const std::string& run) {
  ActiveRun* a = find(run);
  if (!a) return;
  a->cancel_requested = true;
  if (a->executor && !a->ending) {
    a->ending = true;
    a->executor->terminate(kGrace);
  }
}

void Supervisor::describe(const std::string& run, json& status) const {
  const auto a = active_.find(run);
  if (a == active_.end() || !a->second.executor) return;
  a->second.executor->describe(status);
  if (!a->second.gpus.empty()) status["gpus"] = a->second.gpus;
}

int Supervisor::slots_in_use() const {
  if (opt_.slurm.enabled) return 0;  // the ranks run on Slurm's nodes
  int used = 0;
  for (const auto& [id, a] : active_) {
    if (!a.executor || !a.gpus.empty()) continue;
    const RunRecord* r = runs_.registry().find(id);
    used += r ? r->workers : 0;
  }
  return used;
}

std::vector<std::string> Supervisor::free_gpus() const {
  std::vector<std::string> out;
  for (const auto& gpu : opt_.gpus) {
    bool taken = false;
    for (const auto& [id, a] : active_) taken = taken || std::find(a.gpus.begin(), a.gpus.end(), gpu) != a.gpus.end();
    if (!taken) out.push_back(gpu);
  }
  return out;
}

void Supervisor::schedule() {
  // Highest priority first, FIFO within one, per pool (CPU slots, GPUs): the head of a
  // pool's queue waits for enough free slots rather than being overtaken by smaller
  // runs; runs of the other pool go on.
  std::vector<RunRecord*> queue;
  for (auto* r : runs_.registry().all())
    if (r->state == RunState::queued) queue.push_back(r);
  std::stable_sort(queue.begin(), queue.end(), [](const RunRecord* a, const RunRecord* b) { return a->priority > b->priority; });
  bool cpu_blocked = false, gpu_blocked = false;
  for (RunRecord* r : queue) {
    if (opt_.slurm.enabled) {  // Slurm queues it
      launch(*r);
      continue;
    }
    const bool gpu = runs_.config_of(*r).device == "cuda";
    bool& blocked = gpu ? gpu_blocked : cpu_blocked;
    if (blocked) continue;
    const int free = gpu ? static_cast<int>(free_gpus().size()) : opt_.cpu_slots - slots_in_use();
    if (r->workers > free) {
      blocked = true;
      continue;
    }
    launch(*r);
  }
}

void Supervisor::launch(RunRecord& r) {
  const RunConfig& cfg = runs_.config_of(r);
  const fs::path dir = runs_.registry().run_dir(r.id);
  WorkerSpec spec;
  spec.executable = opt_.worker_executable;
  spec.args = {"train", (dir / "recipe.lua").string(), "--run-dir", dir.string(), "--quiet"};
  for (const auto& o : r.overrides) spec.args.insert(spec.args.end(), {"--set", o});
  for (const auto& [path, value] : r.live.items()) spec.args.insert(spec.args.end(), {"--set", path + "=" + value.dump()});
  std::vector<std::string> gpus;
  const bool local = !opt_.slurm.enabled;  // else Slurm gives each rank its GPU and its cores
  if (local && cfg.device == "cuda") {
    // Rank r of the group uses the r-th device it sees (cuda:LOCAL_RANK).
    gpus = free_gpus();
    gpus.resize(static_cast<size_t>(r.workers));
  } else if (local && cfg.threads == 0) {
    // The slots share the machine's cores.
    spec.args.insert(spec.args.end(), {"--set", fmt::format("threads={}", std::max(1, opt_.cores / opt_.cpu_slots))});
  }
  if (r.resume) spec.args.insert(spec.args.end(), {"--resume", "auto"});
  spec.nproc = r.workers;
  spec.working_dir = r.workdir;
  spec.log_dir = dir.string();
  spec.die_with_parent = true;
  r.attempt += 1;
  spec.env = {{"TIDE_CONTROLLER", endpoint_}, {"TIDE_RUN_ID", r.id}, {"TIDE_ATTEMPT", std::to_string(r.attempt)}};
  if (!gpus.empty()) spec.env["CUDA_VISIBLE_DEVICES"] = fmt::format("{}", fmt::join(gpus, ","));
  ActiveRun& a = active_[r.id];
  a = ActiveRun{};
  a.gpus = gpus;
  try {
    a.batch = batch_layout(cfg, r.workers);  // as every worker derives it
    if (local)
      a.executor = std::make_unique<LocalWorkers>(spec);
    else
      a.executor = start_slurm_job(r, spec, a);
  } catch (const std::exception& e) {
    active_.erase(r.id);
    r.error = fmt::format("cannot start the workers: {}", e.what());
    runs_.set_state(r, RunState::failed);
    return;
  }
  a.started = Clock::now();
  if (r.started == 0) r.started = unix_now();
  r.scheduler = a.executor->scheduler();
  r.error.clear();
  json detail = {{"resume", r.resume}};
  if (!gpus.empty()) detail["gpus"] = gpus;
  if (!r.scheduler.is_null()) detail["scheduler"] = r.scheduler;
  runs_.set_state(r, RunState::starting, detail);
  r.resume = true;  // any later start of this run continues from its checkpoints
  runs_.registry().save(r);
}

std::unique_ptr<RunExecutor> Supervisor::start_slurm_job(RunRecord& r, const WorkerSpec& spec, ActiveRun& a) {
  const RunConfig& cfg = runs_.config_of(r);
  const fs::path dir = runs_.registry().run_dir(r.id);
  // A job an earlier controller submitted for this run may outlive it (a crash): one job
  // per run.
  if (r.scheduler.is_object() && r.scheduler.contains("slurm_job") &&
      !slurm_state_is_final(r.scheduler.value("state", "")))
    cancel_slurm_job(r.scheduler.value("slurm_job", ""));
  const CurveKeyPair own = generate_curve_keys();
  const std::string key_file = (dir / "worker-link.key").string();
  write_worker_link_keys({own, tcp_key_->public_key}, key_file);
  a.worker_key = own.public_key;
  SlurmJobSpec job;
  job.name = "tide-" + r.id;
  job.executable = spec.executable;
  job.args = spec.args;
  // Slurm may requeue the job itself (preemption, a node failure): its script must then
  // continue from the checkpoints, as every later start of a run does.
  if (!r.resume) job.args.insert(job.args.end(), {"--resume", "auto"});
  job.env = spec.env;
  job.env["TIDE_CONTROLLER"] = tcp_endpoint_;
  job.env["TIDE_CONTROLLER_KEY_FILE"] = key_file;
  job.ranks = r.workers;
  job.gpus = cfg.device == "cuda";
  job.gpus_per_node = opt_.slurm.gpus_per_node;
  job.cpus_per_task = job.gpus ? 0 : cfg.threads;
  job.working_dir = r.workdir;
  job.run_dir = dir.string();
  job.sbatch_args = opt_.slurm.sbatch_args;
  return std::make_unique<SlurmJob>(job);
}

void Supervisor::deliver(const std::string& run) {
  auto it = active_.find(run);
  if (it == active_.end() || it->second.rank0.empty() || it->second.pending.empty()) return;
  const std::string text = json{{"type", "commands"}, {"commands", it->second.pending}}.dump();
  (void)workers_.send(zmq::buffer(it->second.rank0), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  (void)workers_.send(zmq::buffer(text), zmq::send_flags::dontwait);
  it->second.pending = json::array();
}

void Supervisor::serve_workers() {
  while (true) {
    std::vector<zmq::message_t> parts;
    if (!zmq::recv_multipart(workers_, std::back_inserter(parts), zmq::recv_flags::dontwait)) return;
    if (parts.size() != 2) {  // the link sends [identity][one JSON frame]
      spdlog::warn("worker socket: dropped a message of {} frames", parts.size());
      continue;
    }
    const std::string identity = parts[0].to_string();
    const auto route = parse_route(identity);
    const json msg = parse_json_or_discard(parts[1].to_string_view());
    if (!route || !msg.is_object() || !msg.contains("type") || !msg["type"].is_string() ||
        (msg.contains("body") && !msg["body"].is_object())) {
      spdlog::warn("worker socket: dropped a malformed message from '{}'", identity);
      continue;
    }
    // Over TCP the ZAP handler named the run whose key the sender holds: a run's key
    // speaks for that run alone.
    if (const char* key_run = zmq_msg_gets(parts[1].handle(), "User-Id"); key_run && route->run != key_run) {
      spdlog::warn("worker socket: dropped a message as '{}' sent with the key of run {}", identity, key_run);
      continue;
    }
    RunRecord* r = runs_.registry().find(route->run);
    auto a = active_.find(route->run);
    // A message of an earlier attempt (a group being replaced) changes nothing.
    if (!r || a == active_.end() || !a->second.executor || route->attempt != r->attempt) continue;
    if (route->rank < 0 || route->rank >= r->workers) {
      spdlog::warn("run {}: dropped a message from rank {} of a run of {} workers", r->id, route->rank, r->workers);
      continue;
    }
    // One message that a handler cannot take is dropped alone, naming its sender; the
    // messages after it are still served.
    try {
      serve_worker_message(*r, a->second, identity, route->rank, msg);
    } catch (const std::exception& e) {
      spdlog::warn("run {}: dropped a '{}' message from rank {}: {}", r->id, msg["type"].get<std::string>(),
                   route->rank, e.what());
    }
  }
}

void Supervisor::serve_worker_message(RunRecord& r, ActiveRun& run, const std::string& identity, int rank,
                                      const json& msg) {
  run.last_seen[rank] = Clock::now();
  const std::string type = msg["type"].get<std::string>();
  const json b = msg.value("body", json::object());
  if (type == "hello") {
    if (rank == 0) {
      run.rank0 = identity;
      deliver(r.id);
    }
  } else if (type == "rank") {
    runs_.record_rank(r, rank, b);
  } else if (type == "metrics") {
    runs_.record_metrics(r, b);
    policies_.on_step(r, b);
  } else if (type == "decide") {
    const json decision = policies_.on_anomaly(r, b);
    const std::string text =
        json{{"type", "answer"}, {"query", b.value("query", int64_t{0})}, {"body", decision}}.dump();
    (void)workers_.send(zmq::buffer(identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    (void)workers_.send(zmq::buffer(text), zmq::send_flags::dontwait);
  } else if (type == "event") {
    on_event(r, b);
  } else if (type == "log") {
    bus_.publish(r.id, "log", b);
  } else if (type == "done") {
    run.done = b;
  } else if (type == "error") {
    if (run.worker_error.empty())
      run.worker_error = fmt::format("rank {}: {}", rank, b.value("message", std::string("?")));
  } else if (type != "heartbeat") {
    spdlog::warn("run {}: unknown worker message '{}'", r.id, type);
  }
}

void Supervisor::on_event(RunRecord& r, const json& b) {
  const std::string kind = b.value("kind", "");
  const json detail = b.value("body", json::object());
  if (kind == "paused") {
    runs_.set_state(r, RunState::paused, {{"step", detail.value("step", int64_t{0})}});
  } else if (kind == "resumed") {
    runs_.set_state(r, RunState::running, {{"step", detail.value("step", int64_t{0})}});
  } else if (kind == "stopping") {
    runs_.set_state(r, RunState::stopping, {{"step", detail.value("step", int64_t{0})}});
  } else if (kind == "checkpoint" || kind == "checkpoint_failed") {
    json e = detail;
    e["ok"] = kind == "checkpoint";
    runs_.record_checkpoint(r, e);
    bus_.publish(r.id, "checkpoint", e);
  } else if (kind == "applied" || kind == "rejected") {
    if (kind == "applied") runs_.record_live_change(r, detail.value("values", json::object()));
    json e = detail;
    e["result"] = kind;
    bus_.publish(r.id, "control", e);
  } else if (kind == "anomaly") {
    bus_.publish(r.id, "anomaly", detail);
  } else {
    spdlog::warn("run {}: unknown worker event '{}'", r.id, kind);
  }
}

void Supervisor::supervise() {
  const auto now = Clock::now();
  std::vector<std::string> ended;
  for (auto& [id, a] : active_) {
    if (!a.executor) continue;
    RunRecord* r = runs_.registry().find(id);
    for (const auto& fault : a.executor->reap()) {
      if (a.ending) continue;
      a.fault = fault;
      if (!a.worker_error.empty()) a.fault += ": " + a.worker_error;
    }
    const auto live = a.executor->live();
    if (a.fault.empty() && !a.ending) {
      for (const auto& [rank, running] : live) {
        const double silent = std::chrono::duration<double>(now - std::max(a.last_seen[rank], running.since)).count();
        if (silent > r->heartbeat_timeout_s) {
          a.fault = fmt::format("rank {} ({}) sent no heartbeat for {:.0f} s", rank, running.who, silent);
          break;
        }
      }
    }
    if (json scheduler = a.executor->scheduler(); scheduler != r->scheduler) {
      r->scheduler = std::move(scheduler);
      runs_.registry().save(*r);
      bus_.publish(id, "scheduler", r->scheduler);
    }
    if (!a.fault.empty() && !a.ending) {
      spdlog::error("run {}: {}; ending its {} live workers", id, a.fault, live.size());
      a.ending = true;
      a.executor->terminate(kGrace);
    }
    a.executor->enforce_deadline();
    if (a.executor->all_ended()) ended.push_back(id);
  }
  for (const auto& id : ended) {
    RunRecord* r = runs_.registry().find(id);
    ActiveRun a = std::move(active_[id]);
    active_.erase(id);
    a.executor.reset();
    finish_group(*r, a);
  }
}

void Supervisor::finish_group(RunRecord& r, ActiveRun& a) {
  if (a.cancel_requested) {
    runs_.set_state(r, RunState::cancelled);
    return;
  }
  if (!a.fault.empty()) {
    if (r.restarts < r.max_restarts) {
      r.restarts += 1;
      r.error = a.fault;
      runs_.set_state(r, RunState::restarting, {{"reason", a.fault}});
      r.error.clear();
      launch(r);  // the same slots, from the latest checkpoint
      return;
    }
    r.error = fmt::format("{} (after {} restarts)", a.fault, r.restarts);
    runs_.set_state(r, RunState::failed);
    return;
  }
  if (a.done && a.done->is_object()) {
    if (a.done->contains("final_loss") && (*a.done)["final_loss"].is_number())
      r.final_loss = (*a.done)["final_loss"].get<double>();
    r.last_step = a.done->value("steps", r.last_step);
  }
  const bool stopped = a.stop_requested || (a.done && a.done->value("stopped", false));
  runs_.set_state(r, stopped ? RunState::stopped : RunState::completed,
                  {{"last_step", r.last_step}, {"final_loss", r.final_loss ? json(*r.final_loss) : json(nullptr)}});
}

void Supervisor::shutdown(const std::atomic<bool>& hurry) {
  // The runs' workers end with the controller and the next controller resumes the runs
  // from their latest checkpoints; a run that trains saves one first: a stop reaches
  // every rank at the next step boundary, where they checkpoint and exit. A run whose
  // rank 0 has not said hello yet has done no step since its last checkpoint.
  std::vector<std::string> saving;
  for (auto& [id, a] : active_) {
    if (!a.executor || a.ending) continue;
    if (a.rank0.empty()) {
      a.ending = true;
      a.executor->terminate(kGrace);
      continue;
    }
    spdlog::info("run {}: saving a checkpoint before the controller stops", id);
    a.pending.push_back({{"op", "stop"}, {"id", "shutdown"}});
    deliver(id);
    saving.push_back(id);
  }
  const auto deadline = Clock::now() + std::chrono::seconds(opt_.shutdown_timeout_s);
  auto all_ended = [&] {
    for (auto& [id, a] : active_)
      if (a.executor && !a.executor->all_ended()) return false;
    return true;
  };
  while (!all_ended() && Clock::now() < deadline && !hurry) {
    zmq::pollitem_t item{workers_.handle(), 0, ZMQ_POLLIN, 0};
    try {
      zmq::poll(&item, 1, std::chrono::milliseconds(50));
      if (item.revents & ZMQ_POLLIN) serve_workers();  // checkpoint and log events still go out
    } catch (const std::exception& e) {
      spdlog::error("controller: {}", e.what());
    }
    for (auto& [id, a] : active_) {
      if (!a.executor) continue;
      (void)a.executor->reap();
      a.executor->enforce_deadline();
    }
  }
  for (const auto& id : saving)
    if (auto it = active_.find(id); it != active_.end() && it->second.executor && !it->second.executor->all_ended())
      spdlog::warn("run {}: no checkpoint within {} s of the shutdown; it resumes from its previous one", id,
                   opt_.shutdown_timeout_s);
  for (auto& [id, a] : active_)
    if (a.executor) a.executor->terminate(kGrace);
  for (auto& [id, a] : active_) {
    if (a.executor) a.executor->end(kGrace);
    if (RunRecord* r = runs_.registry().find(id); r && has_workers(r->state)) {
      if (a.executor) r->scheduler = a.executor->scheduler();
      r->state = RunState::queued;
      r->resume = true;
      runs_.registry().save(*r);
      bus_.publish(id, "state", {{"state", "queued"}, {"reason", "the controller is shutting down"}});
    }
  }
  active_.clear();
}

}  // namespace tide::ipc
