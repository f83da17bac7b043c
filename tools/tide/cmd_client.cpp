// The CLI as a client of tided: every command is one or two requests of
// docs/protocol.md, so what it does any ZeroMQ client can do.
#include <spawn.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "tide/engine/io/json_input.h"
#include "tide/ipc/client.h"
#include "tide/ipc/curve.h"
#include "tide/worker/progress_report.h"

namespace tide::cli {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct Connection {
  std::string endpoint, state_dir, server_key, key;
  double timeout_s = 10;
  bool json_out = false;

  ipc::CurveClient curve() const {
    ipc::CurveClient c;
    if (server_key.empty() != key.empty())
      throw std::invalid_argument("CURVE needs both --server-key and --client-key");
    if (server_key.empty()) return c;
    c.server_public_key = ipc::read_public_key(server_key);
    const auto mine = ipc::read_curve_keys(key);
    c.public_key = mine.public_key;
    c.secret_key = mine.secret_key;
    return c;
  }
  ipc::Client client() const {
    const std::string sd = state_dir.empty() ? ipc::default_state_dir() : state_dir;
    const std::string ep = endpoint.empty() ? ipc::default_command_endpoint(sd) : endpoint;
    // A local daemon that is not running has no socket file: say so rather than time out.
    if (ep.rfind("ipc://", 0) == 0 && !fs::exists(ep.substr(6)))
      throw std::runtime_error(fmt::format("no daemon at {} (start one with `tided --state-dir {}`)", ep, sd));
    return ipc::Client(ep, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)), curve());
  }
};

void add_connection(CLI::App& cmd, Connection& c) {
  cmd.add_option("--endpoint", c.endpoint, "The daemon's command endpoint (default: the ipc socket in the state dir)");
  cmd.add_option("--state-dir", c.state_dir, "The local daemon's state directory (default: $TIDE_STATE_DIR, else "
                                             "~/.local/state/tide)");
  cmd.add_option("--timeout", c.timeout_s, "Seconds to wait for a reply")->check(CLI::Range(0.1, 3600.0));
  cmd.add_flag("--json", c.json_out, "Print the reply as JSON");
  cmd.add_option("--server-key", c.server_key, "A CURVE daemon's public key (Z85, or its .pub file)");
  cmd.add_option("--client-key", c.key, "This client's key file (tide keygen), for a CURVE daemon");
}

std::string fmt_loss(const json& v) { return v.is_number() ? fmt::format("{:.4f}", v.get<double>()) : "-"; }

void print_run_line(const json& r) {
  const json m = r.value("metrics", json::object());
  const json job = r.value("scheduler", json());
  const std::string slurm = job.is_object() && job.contains("slurm_job")
                                ? fmt::format("  slurm job {} {}{}", job.value("slurm_job", ""), job.value("state", ""),
                                              job.contains("reason") ? " (" + job.value("reason", "") + ")" : "")
                                : "";
  std::printf("%-28s %-10s step %6lld/%-6lld loss %-8s workers %d attempt %lld%s%s\n", r.value("id", "").c_str(),
              r.value("state", "").c_str(), static_cast<long long>(r.value("last_step", int64_t{0})),
              static_cast<long long>(r.value("total_steps", int64_t{0})),
              fmt_loss(m.value("loss", r.value("final_loss", json()))).c_str(), r.value("workers", 1),
              static_cast<long long>(r.value("attempt", int64_t{0})), slurm.c_str(),
              r.value("error", "").empty() ? "" : ("  " + r.value("error", "")).c_str());
}

std::string metrics_line(const json& m) {
  std::string line = fmt::format("step {}/{}", m.value("step", int64_t{0}), m.value("total_steps", int64_t{0}));
  line += fmt::format(" loss {}", fmt_loss(m.value("loss", json())));
  if (m.contains("val_loss")) line += fmt::format(" val {}", fmt_loss(m["val_loss"]));
  line += fmt::format(" lr {:.3g}", m.value("lr", 0.0));
  line += fmt::format(" {:.0f} tok/s", m.value("tokens_per_second", 0.0));
  if (m.contains("changes")) line += " changed " + m["changes"].dump();
  return line;
}

// Follows a run's events until it finishes; returns 0 when it completed or stopped.
int watch(ipc::Client& client, const std::string& run, const ipc::CurveClient& curve) {
  ipc::Subscriber sub(client.event_endpoint(), {"run." + run + "."}, curve);
  bool tty = ::isatty(STDOUT_FILENO);
  auto last_check = std::chrono::steady_clock::now();
  while (true) {
    const auto e = sub.next(std::chrono::milliseconds(500));
    if (e) {
      const json& msg = e->message;
      const std::string kind = msg.value("kind", "");
      const json body = msg.value("body", json::object());
      if (kind == "metrics") {
        std::printf(tty ? "\r\033[K%s" : "%s\n", metrics_line(body).c_str());
      } else if (kind == "state") {
        std::printf("%s%s: %s%s\n", tty ? "\r\033[K" : "", run.c_str(), body.value("state", "").c_str(),
                    body.contains("reason") ? (" (" + body["reason"].get<std::string>() + ")").c_str() : "");
      } else if (kind == "checkpoint") {
        std::printf("%scheckpoint step %lld %s\n", tty ? "\r\033[K" : "",
                    static_cast<long long>(body.value("step", int64_t{0})), body.value("ok", false) ? "saved" : "FAILED");
      } else if (kind == "control") {
        std::printf("%s%s at step %lld: %s\n", tty ? "\r\033[K" : "", body.value("result", "").c_str(),
                    static_cast<long long>(body.value("step", int64_t{0})), body.dump().c_str());
      }
      std::fflush(stdout);
    }
    // Events may be missed (a dropped subscriber); the status request is the truth.
    if (std::chrono::steady_clock::now() - last_check > std::chrono::seconds(2) ||
        (e && e->message.value("kind", "") == "state")) {
      last_check = std::chrono::steady_clock::now();
      const json r = client.request("status", {{"run", run}}).at("run");
      const std::string state = r.value("state", "");
      if (state == "completed" || state == "stopped") {
        if (tty) std::printf("\n");
        std::printf("%s %s: final loss %s\n", run.c_str(), state.c_str(), fmt_loss(r.value("final_loss", json())).c_str());
        return 0;
      }
      if (state == "failed" || state == "cancelled") {
        if (tty) std::printf("\n");
        std::fprintf(stderr, "%s %s%s\n", run.c_str(), state.c_str(),
                     r.value("error", "").empty() ? "" : (": " + r.value("error", "")).c_str());
        return 1;
      }
    }
  }
}

// Runs `body` and turns a daemon's refusal into an error on stderr and exit status 1.
template <class F>
void guarded(F body) {
  try {
    body();
  } catch (const ipc::ClientError& e) {
    throw std::runtime_error(fmt::format("{} ({})", e.what(), e.code()));
  }
}

void add_submit_command(CLI::App& app) {
  auto c = std::make_shared<Connection>();
  struct Submit {
    std::string recipe, key;
    std::vector<std::string> overrides;
    int workers = 0, priority = 0;
    bool watch = false;
  };
  auto s = std::make_shared<Submit>();
  auto* cmd = app.add_subcommand("submit", "Queue a run on the daemon; prints its id");
  cmd->add_option("recipe", s->recipe, "Recipe file (sent as text), or a bundled name such as llama/llama-tiny")
      ->required();
  add_overrides(*cmd, s->overrides);
  cmd->add_option("--workers", s->workers, "Worker processes (default: the recipe's dp x cp x tp x pp)");
  cmd->add_option("--priority", s->priority, "Higher runs first (-1000..1000)");
  cmd->add_option("--key", s->key, "Idempotency key: submitting the same key again returns the same run");
  cmd->add_flag("--watch", s->watch, "Follow the run until it ends");
  add_connection(*cmd, *c);
  cmd->callback([c, s] {
    guarded([&] {
      json body = {{"overrides", s->overrides}, {"workdir", fs::current_path().string()}, {"priority", s->priority}};
      if (fs::is_regular_file(s->recipe)) {
        std::ifstream in(s->recipe);
        std::stringstream text;
        text << in.rdbuf();
        body["recipe"] = text.str();
      } else {
        body["recipe_name"] = s->recipe;
      }
      if (s->workers > 0) body["workers"] = s->workers;
      if (!s->key.empty()) body["idempotency_key"] = s->key;
      auto client = c->client();
      const json reply = client.request("submit", body);
      const std::string id = reply.at("run").at("id");
      if (c->json_out)
        std::printf("%s\n", reply.dump(2).c_str());
      else
        std::printf("%s\n", id.c_str());
      std::fflush(stdout);
      if (s->watch && watch(client, id, c->curve()) != 0) throw std::runtime_error("run " + id + " did not complete");
    });
  });
}

void add_runs_command(CLI::App& app) {
  auto c = std::make_shared<Connection>();
  auto state = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("runs", "List the daemon's runs");
  cmd->add_option("--state", *state, "Only runs in this state (queued, running, completed, ...)");
  add_connection(*cmd, *c);
  cmd->callback([c, state] {
    guarded([&] {
      json body = json::object();
      if (!state->empty()) body["state"] = *state;
      const json reply = c->client().request("list", body);
      if (c->json_out) return (void)std::printf("%s\n", reply.dump(2).c_str());
      for (const auto& r : reply.at("runs")) print_run_line(r);
    });
  });
}

void add_status_command(CLI::App& app) {
  auto c = std::make_shared<Connection>();
  auto run = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("status", "One run's state, progress and latest metrics");
  cmd->add_option("run", *run, "Run id")->required();
  add_connection(*cmd, *c);
  cmd->callback([c, run] {
    guarded([&] {
      const json r = c->client().request("status", {{"run", *run}}).at("run");
      if (c->json_out) return (void)std::printf("%s\n", r.dump(2).c_str());
      print_run_line(r);
      if (r.contains("metrics")) std::printf("  %s\n", metrics_line(r["metrics"]).c_str());
      std::printf("  run directory: %s\n", r.value("run_dir", "").c_str());
    });
  });
}

void add_watch_command(CLI::App& app) {
  auto c = std::make_shared<Connection>();
  auto run = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("watch", "Follow a run's metrics and events until it ends");
  cmd->add_option("run", *run, "Run id")->required();
  add_connection(*cmd, *c);
  cmd->callback([c, run] {
    guarded([&] {
      auto client = c->client();
      if (watch(client, *run, c->curve()) != 0) throw std::runtime_error("run " + *run + " did not complete");
    });
  });
}

void add_run_control_commands(CLI::App& app) {
  for (const char* op : {"pause", "resume", "stop", "cancel", "checkpoint"}) {
    static const std::map<std::string, std::string> help = {
        {"pause", "Pause a run at the next step boundary (every rank)"},
        {"resume", "Resume a paused run, or queue a stopped or failed one to continue from its checkpoint"},
        {"stop", "Checkpoint a run at the next step boundary and end it"},
        {"cancel", "End a run now, without a checkpoint"},
        {"checkpoint", "Save a checkpoint at the next step boundary"}};
    auto c = std::make_shared<Connection>();
    auto run = std::make_shared<std::string>();
    auto* cmd = app.add_subcommand(op, help.at(op));
    cmd->add_option("run", *run, "Run id")->required();
    add_connection(*cmd, *c);
    cmd->callback([c, run, type = std::string(op)] {
      guarded([&] {
        const json reply = c->client().request(type, {{"run", *run}});
        std::printf("%s\n", c->json_out ? reply.dump(2).c_str() : fmt::format("{}: {} requested", *run, type).c_str());
      });
    });
  }
}

void add_set_command(CLI::App& app) {
  auto c = std::make_shared<Connection>();
  auto run = std::make_shared<std::string>();
  auto values = std::make_shared<std::vector<std::string>>();
  auto* cmd = app.add_subcommand("set", "Change live recipe fields of a run (applied by every rank at one step)");
  cmd->add_option("run", *run, "Run id")->required();
  cmd->add_option("values", *values, "field=value, e.g. optimizer.lr=1e-4 (see `tide recipe fields`, live column)")
      ->required();
  add_connection(*cmd, *c);
  cmd->callback([c, run, values] {
    guarded([&] {
      json v = json::object();
      for (const auto& a : *values) {
        const auto eq = a.find('=');
        if (eq == std::string::npos || eq == 0) throw std::invalid_argument("'" + a + "' is not field=value");
        const std::string text = a.substr(eq + 1);
        const json parsed = parse_json_or_discard(text);
        v[a.substr(0, eq)] = parsed.is_discarded() ? json(text) : parsed;
      }
      const json reply = c->client().request("set", {{"run", *run}, {"values", v}});
      std::printf("%s\n", c->json_out ? reply.dump(2).c_str() : fmt::format("{}: set {}", *run, v.dump()).c_str());
    });
  });
}

void add_metrics_command(CLI::App& app) {
  auto c = std::make_shared<Connection>();
  auto run = std::make_shared<std::string>();
  auto since = std::make_shared<int64_t>(0);
  auto ranks = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand("metrics", "A run's metrics history (JSON lines)");
  cmd->add_option("run", *run, "Run id")->required();
  cmd->add_option("--since", *since, "Only steps after this one");
  cmd->add_flag("--ranks", *ranks, "Every rank's figures of each step (columns by rank), not rank 0's rows");
  add_connection(*cmd, *c);
  cmd->callback([c, run, since, ranks] {
    guarded([&] {
      const json reply = c->client().request(
          "metrics",
          {{"run", *run}, {"since_step", *since}, {"limit", 100000}, {"source", *ranks ? "ranks" : "train"}});
      for (const auto& row : reply.at("metrics")) std::printf("%s\n", row.dump().c_str());
    });
  });
}

void add_logs_command(CLI::App& app) {
  auto c = std::make_shared<Connection>();
  struct Logs {
    std::string run, source = "train";
    int lines = 100, rank = 0;
  };
  auto l = std::make_shared<Logs>();
  auto* cmd = app.add_subcommand("logs", "The last lines of a run's log");
  cmd->add_option("run", l->run, "Run id")->required();
  cmd->add_option("--lines,-n", l->lines, "How many lines")->check(CLI::Range(1, 100000));
  cmd->add_option("--source", l->source, "train (the run log) or worker (a worker's output)")
      ->check(CLI::IsMember({"train", "worker"}));
  cmd->add_option("--rank", l->rank, "The worker's rank, for --source worker");
  add_connection(*cmd, *c);
  cmd->callback([c, l] {
    guarded([&] {
      const json reply = c->client().request(
          "logs", {{"run", l->run}, {"lines", l->lines}, {"source", l->source}, {"rank", l->rank}});
      for (const auto& line : reply.at("lines")) std::printf("%s\n", line.get<std::string>().c_str());
    });
  });
}

void add_checkpoints_command(CLI::App& app) {
  auto c = std::make_shared<Connection>();
  auto run = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("checkpoints", "A run's committed checkpoints on the daemon, oldest first");
  cmd->add_option("run", *run, "Run id")->required();
  add_connection(*cmd, *c);
  cmd->callback([c, run] {
    guarded([&] {
      const json reply = c->client().request("checkpoints", {{"run", *run}});
      if (c->json_out) {
        std::printf("%s\n", reply.dump(2).c_str());
        return;
      }
      for (const auto& k : reply.at("checkpoints")) {
        const json l = k.value("layout", json::object());
        const int cp = l.value("cp", 1);
        std::printf("step %-8lld %s  tokens %lld  dp%d%s x tp%d x pp%d ZeRO-%d  %lld bytes%s\n",
                    static_cast<long long>(k.value("step", int64_t{0})), k.value("dir", "").c_str(),
                    static_cast<long long>(k.value("tokens_seen", int64_t{0})), l.value("dp", 0),
                    cp > 1 ? (" x cp" + std::to_string(cp)).c_str() : "", l.value("tp", 0), l.value("pp", 0),
                    l.value("zero", 0), static_cast<long long>(k.value("bytes", int64_t{0})),
                    k.contains("error") ? ("  " + k["error"].get<std::string>()).c_str() : "");
      }
    });
  });
}

namespace {
// Follows a daemon's export or verify job (`job`, as its request answered) until it ends;
// throws naming it, its error and its log when it failed. Returns the ended job.
json wait_for_job(ipc::Client& client, const std::string& run, json job, const char* doing) {
  const std::string id = job.value("id", ""), kind = job.value("kind", "export");
  const auto begun = std::chrono::steady_clock::now();
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  std::string stage;
  while (job.value("state", "") == "running") {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    job = client.request("exports", {{"run", run}, {"export", id}}).at(kind);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - begun).count();
    // The child's progress once it reports one (docs/protocol.md); a line per stage when
    // stderr is not a terminal.
    const json p = job.value("progress", json());
    const std::string where = p.is_object()
                                  ? worker::describe_byte_progress(p.value("stage", ""), p.value("done", int64_t{0}),
                                                                   p.value("total", int64_t{0}))
                                  : doing;
    if (tty)
      std::fprintf(stderr, "\r\033[2K%s: %s, %.0f s", id.c_str(), where.c_str(), s);
    else if (p.is_object() && p.value("stage", "") != stage)
      std::fprintf(stderr, "%s: %s\n", id.c_str(), where.c_str());
    if (p.is_object()) stage = p.value("stage", "");
  }
  if (tty) std::fprintf(stderr, "\n");
  if (job.value("state", "") != "done")
    throw std::runtime_error(fmt::format("{} failed: {} (log: {})", id, job.value("error", "?"), job.value("log", "")));
  return job;
}
}  // namespace

void add_export_command(CLI::App& app) {
  auto c = std::make_shared<Connection>();
  struct Export {
    std::string run, out, dtype = "F32";
    int64_t step = -1;
    bool adapter = false, no_wait = false;
  };
  auto x = std::make_shared<Export>();
  auto* cmd = app.add_subcommand(
      "export", "Have the daemon write a run's checkpoint as Hugging Face safetensors + config.json");
  cmd->add_option("run", x->run, "Run id")->required();
  cmd->add_option("-o,--out", x->out, "Directory to write, on the daemon's machine (relative: in the run directory)")
      ->required();
  cmd->add_option("--step", x->step, "The checkpoint's step (default: the newest)");
  cmd->add_option("--dtype", x->dtype, "F32, BF16 or F16")->check(CLI::IsMember({"F32", "BF16", "F16"}));
  cmd->add_flag("--adapter", x->adapter,
                "A LoRA run: its adapters alone, as a PEFT adapter directory, not the merged model");
  cmd->add_flag("--no-wait", x->no_wait, "Print the export's id and return");
  add_connection(*cmd, *c);
  cmd->callback([c, x] {
    guarded([&] {
      auto client = c->client();
      json body = {{"run", x->run}, {"out", x->out}, {"dtype", x->dtype}};
      if (x->step >= 0) body["step"] = x->step;
      if (x->adapter) body["adapter"] = true;
      json job = client.request("export", body).at("export");
      const std::string id = job.value("id", "");
      std::fprintf(stderr, "%s: step %lld to %s\n", id.c_str(), static_cast<long long>(job.value("step", int64_t{0})),
                   job.value("out", "").c_str());
      if (x->no_wait) {
        std::printf("%s\n", id.c_str());
        return;
      }
      job = wait_for_job(client, x->run, std::move(job), "exporting");
      std::printf("%s\n", job.value("out", "").c_str());
    });
  });
}

void add_verify_command(CLI::App& app) {
  auto c = std::make_shared<Connection>();
  struct Verify {
    std::string run;
    int64_t step = -1;
    bool no_wait = false;
  };
  auto v = std::make_shared<Verify>();
  auto* cmd = app.add_subcommand(
      "verify", "Have the daemon check a run's checkpoint: every file's size and hash against its manifest");
  cmd->add_option("run", v->run, "Run id")->required();
  cmd->add_option("--step", v->step, "The checkpoint's step (default: the newest)");
  cmd->add_flag("--no-wait", v->no_wait, "Print the verification's id and return");
  add_connection(*cmd, *c);
  cmd->callback([c, v] {
    guarded([&] {
      auto client = c->client();
      json body = {{"run", v->run}};
      if (v->step >= 0) body["step"] = v->step;
      json job = client.request("verify", body).at("verify");
      const std::string id = job.value("id", "");
      if (v->no_wait) {
        std::printf("%s\n", id.c_str());
        return;
      }
      job = wait_for_job(client, v->run, std::move(job), "verifying");
      std::printf("%s: sound\n", job.value("checkpoint", "").c_str());
    });
  });
}

void add_keygen_command(CLI::App& app) {
  struct Keygen {
    std::string name, dir = ".";
  };
  auto k = std::make_shared<Keygen>();
  auto* cmd = app.add_subcommand("keygen", "Make a CURVE key pair: NAME.key (secret, 0600) and NAME.pub");
  cmd->add_option("name", k->name, "File name stem, e.g. the daemon's host or a client's name")->required();
  cmd->add_option("--dir", k->dir, "Where to write them")->capture_default_str();
  cmd->callback([k] {
    const auto keys = ipc::generate_curve_keys();
    ipc::write_curve_keys(keys, k->dir, k->name);
    std::printf("%s\n", keys.public_key.c_str());
    std::fprintf(stderr, "wrote %s/%s.key (keep it secret) and %s.pub\n", k->dir.c_str(), k->name.c_str(),
                 k->name.c_str());
  });
}

void add_dashboard_command(CLI::App& app) {
  auto c = std::make_shared<Connection>();
  auto open = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand("dashboard", "Print the address of tided's web dashboard (docs/dashboard.md)");
  cmd->add_flag("--open", *open, "Also open it in the desktop's browser (xdg-open)");
  add_connection(*cmd, *c);
  cmd->callback([c, open] {
    guarded([&] {
      const json info = c->client().request("info");
      const json url = info.value("endpoints", json::object()).value("http", json());
      if (!url.is_string())
        throw std::runtime_error("this tided serves no HTTP (it was started with --no-http or --no-tcp)");
      std::printf("%s\n", url.get<std::string>().c_str());
      std::fprintf(stderr, "controls need the token in %s/dashboard.token (paste it in the page's token box)\n",
                   info.value("state_dir", std::string("<state dir>")).c_str());
      if (!*open) return;
      std::string command = "xdg-open";
      std::string address = url.get<std::string>();
      char* argv[] = {command.data(), address.data(), nullptr};
      pid_t pid = 0;
      if (posix_spawnp(&pid, command.c_str(), nullptr, nullptr, argv, environ) != 0)
        throw std::runtime_error("cannot run xdg-open: open the address above in a browser");
    });
  });
}

void add_daemon_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("daemon", "Ask a running tided about itself, or stop it");
  cmd->require_subcommand(1);
  auto c = std::make_shared<Connection>();
  auto* info = cmd->add_subcommand("info", "Version, slots, endpoints and run counts");
  add_connection(*info, *c);
  info->callback([c] { guarded([&] { std::printf("%s\n", c->client().request("info").dump(2).c_str()); }); });
  auto c2 = std::make_shared<Connection>();
  auto* stop = cmd->add_subcommand("stop", "Stop the daemon; its active runs resume when it starts again");
  add_connection(*stop, *c2);
  stop->callback([c2] {
    guarded([&] {
      c2->client().request("shutdown");
      std::printf("tided stopping: each training run saves a checkpoint first\n");
    });
  });
}

}  // namespace

void add_client_commands(CLI::App& app) {
  // In the order `tide --help` lists them.
  for (auto add :
       {add_submit_command, add_runs_command, add_status_command, add_watch_command, add_run_control_commands,
        add_set_command, add_metrics_command, add_logs_command, add_checkpoints_command, add_export_command,
        add_verify_command, add_dashboard_command, add_keygen_command, add_daemon_command})
    add(app);
}

}  // namespace tide::cli
