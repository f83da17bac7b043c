#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

#include <fmt/format.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>
#include <zmq_addon.hpp>

#include "controller_impl.h"

namespace tide::ipc {
namespace fs = std::filesystem;

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

namespace {
constexpr auto kTick = std::chrono::milliseconds(50);

bool is_tcp(const std::string& ep) { return ep.rfind("tcp://", 0) == 0; }

// Binds `ep`; without CURVE, a TCP endpoint must have bound a loopback address. The
// check reads the address ZeroMQ actually bound (after its own parsing: interface names,
// "source;address" forms, wildcards, host names), so no spelling of the endpoint can
// slip past it; a refused bind is undone before the controller serves anything.
void bind_one(zmq::socket_t& socket, const std::string& ep, bool curve, std::vector<std::string>& bound) {
  try {
    socket.bind(ep);
  } catch (const zmq::error_t& e) {
    throw std::runtime_error(fmt::format("cannot bind {}: {}", ep, e.what()));
  }
  const std::string actual = socket.get(zmq::sockopt::last_endpoint);
  if (is_tcp(actual) && !curve && !is_loopback_endpoint(actual)) {
    try {
      socket.unbind(actual);
    } catch (const zmq::error_t&) {
    }
    throw std::invalid_argument(fmt::format(
        "binding {} (bound as {}) beyond loopback needs CURVE (--curve-key and --clients)", ep, actual));
  }
  bound.push_back(actual);
}

// Types that change runs or the daemon: operators only.
bool changes_something(const std::string& type) {
  for (const char* t : {"submit", "pause", "resume", "stop", "cancel", "checkpoint", "set", "export", "shutdown"})
    if (type == t) return true;
  return false;
}
}  // namespace

void Controller::Impl::bind_endpoints() {
  if (!opt.curve_key_file.empty()) {
    curve = read_curve_keys(opt.curve_key_file);
    if (opt.allowlist_file.empty())
      throw std::invalid_argument("a CURVE key needs an allowlist of client keys (--clients)");
    allowed = read_allowlist(opt.allowlist_file);
    zap.set(zmq::sockopt::linger, 0);
    zap.bind("inproc://zeromq.zap.01");
  } else if (!opt.allowlist_file.empty()) {
    throw std::invalid_argument(fmt::format(
        "an allowlist of client keys (--clients {}) needs this daemon's CURVE key (--curve-key)", opt.allowlist_file));
  }
  // Options apply to the binds that follow them: local endpoints first, without CURVE.
  for (auto [socket, endpoints, bound] : {std::tuple{&commands, &opt.command_endpoints, &command_eps},
                                          std::tuple{&events, &opt.event_endpoints, &event_eps}}) {
    for (const auto& ep : *endpoints)
      if (!is_tcp(ep)) bind_one(*socket, ep, curve.has_value(), *bound);
    if (curve) {
      socket->set(zmq::sockopt::curve_server, true);
      socket->set(zmq::sockopt::curve_secretkey, curve->secret_key);
      socket->set(zmq::sockopt::zap_domain, "tide");
    }
    for (const auto& ep : *endpoints)
      if (is_tcp(ep)) bind_one(*socket, ep, curve.has_value(), *bound);
  }
}

void Controller::Impl::serve_zap() {
  // RFC 27: version, request id, domain, address, identity, mechanism, credentials.
  std::vector<zmq::message_t> req;
  if (!zmq::recv_multipart(zap, std::back_inserter(req), zmq::recv_flags::dontwait) || req.size() < 6) return;
  std::string status = "400", text = "unknown client key", user;
  const std::string mechanism = req[5].to_string();
  if (mechanism == "CURVE" && req.size() >= 7 && req[6].size() == 32) {
    char z85[41];
    zmq_z85_encode(z85, static_cast<const uint8_t*>(req[6].data()), 32);
    if (const auto it = allowed.find(z85); it != allowed.end()) {
      status = "200";
      text = "OK";
      user = role_name(it->second);
    } else {
      spdlog::warn("refused a CURVE client from {} with unknown key {}", req[3].to_string(), z85);
    }
  } else {
    text = "CURVE required";
  }
  for (const std::string& frame : {std::string("1.0"), req[1].to_string(), status, text, user})
    (void)zap.send(zmq::buffer(frame), zmq::send_flags::sndmore);
  (void)zap.send(zmq::message_t(), zmq::send_flags::none);
}

std::vector<std::string> resolve_gpus(const std::string& spec) {
  std::vector<std::string> out;
  auto split = [&out](const std::string& list) {
    std::stringstream in(list);
    for (std::string item; std::getline(in, item, ',');)
      if (!item.empty()) out.push_back(item);
  };
  if (spec == "none") return out;
  if (spec != "auto") {
    split(spec);
    return out;
  }
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) {
    split(visible);
    return out;
  }
  int count = 0;
  while (fs::exists(fmt::format("/dev/nvidia{}", count))) ++count;
  for (int i = 0; i < count; ++i) out.push_back(std::to_string(i));
  return out;
}

Controller::Impl::Impl(ControllerOptions o) : opt(std::move(o)) {
  if (opt.state_dir.empty()) throw std::invalid_argument("the controller needs a state directory");
  if (opt.cpu_slots < 1) throw std::invalid_argument(fmt::format("cpu slots must be at least 1, not {}", opt.cpu_slots));
  if (opt.cores <= 0) opt.cores = static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  fs::create_directories(opt.state_dir);
  // Workers start in their run's workdir: a relative path to their executable would miss.
  if (!opt.worker_executable.empty()) opt.worker_executable = fs::absolute(opt.worker_executable).string();
  // One controller per state directory: a second would rebind its sockets under the first.
  const std::string lock_path = (fs::path(opt.state_dir) / "controller.lock").string();
  state_lock = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (state_lock < 0 || ::flock(state_lock, LOCK_EX | LOCK_NB) != 0) {
    if (state_lock >= 0) ::close(state_lock);
    throw std::runtime_error(fmt::format("another controller (tided or an embedded engine) serves {}", opt.state_dir));
  }
  epoch = fmt::format("{}-{}", static_cast<int64_t>(unix_now()), ::getpid());
  registry = std::make_unique<RunRegistry>(opt.state_dir);
  // Runs that had workers when the last controller ended: queued again, to resume.
  for (auto* r : registry->all()) {
    if (has_workers(r->state)) {
      spdlog::info("run {} was {} when the controller last ended: queued to resume from its latest checkpoint",
                   r->id, state_name(r->state));
      r->state = RunState::queued;
      r->resume = true;
      registry->save(*r);
    }
  }
  for (auto* s : {&commands, &workers}) {
    s->set(zmq::sockopt::maxmsgsize, kTransportLimit);
    s->set(zmq::sockopt::linger, 0);
    s->set(zmq::sockopt::router_mandatory, false);
  }
  events.set(zmq::sockopt::linger, 0);
  // Every subscription reaches us (for the snapshot), and a subscriber that does not
  // read loses messages beyond this many instead of slowing anything down.
  events.set(zmq::sockopt::xpub_verbose, 1);
  events.set(zmq::sockopt::sndhwm, 10000);
  bind_endpoints();
  worker_ep = "ipc://" + (fs::absolute(opt.state_dir) / "workers.sock").string();
  workers.bind(worker_ep);
  std::ofstream(fs::path(opt.state_dir) / "endpoints.json", std::ios::trunc)
      << json{{"commands", command_eps},
              {"events", event_eps},
              {"pid", ::getpid()},
              {"curve_public_key", curve ? json(curve->public_key) : json(nullptr)}}
             .dump(2)
      << "\n";
}

Controller::Controller(ControllerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Controller::~Controller() = default;

Controller::Impl::~Impl() {
  if (state_lock >= 0) ::close(state_lock);
}

std::vector<std::string> Controller::command_endpoints() const { return impl_->command_eps; }
std::vector<std::string> Controller::event_endpoints() const { return impl_->event_eps; }
void Controller::stop() {
  // A second stop (a second SIGTERM or Ctrl-C) does not wait for the runs' checkpoints.
  if (impl_->stopping.exchange(true)) impl_->hurry = true;
}

void Controller::run() {
  auto& m = *impl_;
  spdlog::info("controller serving commands on {} and events on {}; {} cpu slots; gpus: {}",
               fmt::join(m.command_eps, ", "), fmt::join(m.event_eps, ", "), m.opt.cpu_slots,
               m.opt.gpus.empty() ? "none" : fmt::format("{}", fmt::join(m.opt.gpus, ",")));
  while (!m.stopping) {
    zmq::pollitem_t items[] = {{m.commands.handle(), 0, ZMQ_POLLIN, 0},
                               {m.events.handle(), 0, ZMQ_POLLIN, 0},
                               {m.workers.handle(), 0, ZMQ_POLLIN, 0},
                               {m.zap.handle(), 0, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, m.curve ? 4 : 3, kTick);
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      throw;
    }
    // Nothing a client or a worker sends may take the controller down: every handler
    // turns its failures into replies or log lines.
    try {
      if (m.curve && (items[3].revents & ZMQ_POLLIN)) m.serve_zap();
      if (items[2].revents & ZMQ_POLLIN) m.serve_workers();
      if (items[0].revents & ZMQ_POLLIN) m.serve_commands();
      if (items[1].revents & ZMQ_POLLIN) m.serve_subscriptions();
      m.supervise();
      m.watch_exports();
      m.schedule();
    } catch (const std::exception& e) {
      spdlog::error("controller: {}", e.what());
    }
  }
  m.shutdown();
}

void Controller::Impl::serve_commands() {
  while (true) {
    std::vector<zmq::message_t> parts;
    if (!zmq::recv_multipart(commands, std::back_inserter(parts), zmq::recv_flags::dontwait)) return;
    // [identity][body] from a DEALER, [identity][empty][body] from a REQ.
    const bool delimited = parts.size() == 3 && parts[1].size() == 0;
    json id = nullptr;
    std::string reply;
    if (parts.size() != 2 && !delimited) {
      spdlog::warn("command socket: dropped a message of {} frames (want one body frame)", parts.size() - 1);
      reply = reply_error(id, ErrorCode::bad_request,
                          fmt::format("a request is one frame; this message had {}", parts.size() - 1));
    } else {
      const auto& frame = parts.back();
      try {
        const Request req = parse_request(frame.to_string_view(), id);
        // CURVE clients carry the role their key was allowed with; local (ipc) ones none.
        const char* role = zmq_msg_gets(const_cast<zmq_msg_t*>(frame.handle()), "User-Id");
        if (role && std::string(role) == "observer" && changes_something(req.type))
          throw ProtocolError(ErrorCode::unauthorized, fmt::format("'{}' needs the operator role; this key is an observer's", req.type));
        reply = reply_ok(id, handle(req));
      } catch (const ProtocolError& e) {
        spdlog::warn("request refused ({}): {}", error_name(e.code()), e.what());
        reply = reply_error(id, e.code(), e.what());
      } catch (const std::exception& e) {
        spdlog::error("request failed: {}", e.what());
        reply = reply_error(id, ErrorCode::internal, e.what());
      }
    }
    (void)commands.send(parts[0], zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    if (delimited) (void)commands.send(zmq::message_t(), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    (void)commands.send(zmq::buffer(reply), zmq::send_flags::dontwait);
  }
}

void Controller::Impl::serve_subscriptions() {
  zmq::message_t msg;
  while (events.recv(msg, zmq::recv_flags::dontwait)) {
    const auto data = msg.to_string_view();
    if (!data.empty() && data[0] == 1) snapshot(std::string(data.substr(1)));
  }
}

void Controller::Impl::publish(const std::string& run, const std::string& kind, json body, bool is_snapshot) {
  const int64_t n = is_snapshot ? seq[run] : ++seq[run];
  json event = {{"v", kProtocolVersion}, {"run", run},   {"seq", n},        {"kind", kind},
                {"time", unix_now()},    {"epoch", epoch}, {"body", std::move(body)}};
  if (is_snapshot) event["snapshot"] = true;
  const std::string topic = run_topic(run, kind);
  const std::string text = event.dump(-1, ' ', false, json::error_handler_t::replace);
  (void)events.send(zmq::buffer(topic), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  (void)events.send(zmq::buffer(text), zmq::send_flags::dontwait);
}

void Controller::Impl::set_state(RunRecord& r, RunState s, json extra) {
  const RunState before = r.state;
  r.state = s;
  if (is_finished(s)) r.finished = unix_now();
  registry->save(r);
  extra["state"] = state_name(s);
  extra["previous"] = state_name(before);
  extra["attempt"] = r.attempt;
  extra["restarts"] = r.restarts;
  spdlog::info("run {}: {} -> {}{}", r.id, state_name(before), state_name(s),
               r.error.empty() || !is_finished(s) ? "" : " (" + r.error + ")");
  // Why a run failed or restarts belongs in its own log, beside its training lines.
  if (s == RunState::failed && !r.error.empty()) run_log(r.id, spdlog::level::err, "failed: " + r.error);
  if (s == RunState::restarting && extra.contains("reason"))
    run_log(r.id, spdlog::level::warn, "restarting: " + extra["reason"].get<std::string>());
  if (is_finished(s) && !r.error.empty()) extra["error"] = r.error;
  publish(r.id, "state", std::move(extra));
  if (is_finished(s)) {
    configs.erase(r.id);
    policies.erase(r.id);
  }
}

void Controller::Impl::run_log(const std::string& run, spdlog::level::level_enum level, const std::string& line) {
  spdlog::log(level, "run {}: {}", run, line);
  try {
    // The file is the workers' too: each line goes out in one append.
    auto sink = std::make_shared<spdlog::sinks::basic_file_sink_st>(
        (fs::path(registry->run_dir(run)) / "train.log").string(), false);
    spdlog::logger("controller", sink).log(level, "{}", line);
  } catch (const std::exception& e) {
    spdlog::warn("run {}: cannot append to its train.log: {}", run, e.what());
  }
  publish(run, "log", {{"level", spdlog::level::to_string_view(level).data()}, {"line", line}});
}

void Controller::Impl::snapshot(const std::string& prefix) {
  // What a late subscriber missed: each unfinished run's state and latest metrics, and
  // the state of the last finished ones.
  auto runs = registry->all();
  int finished_shown = 0;
  for (auto it = runs.rbegin(); it != runs.rend(); ++it) {
    RunRecord& r = **it;
    if (is_finished(r.state) && ++finished_shown > 20) continue;
    const std::string state_topic = run_topic(r.id, "state");
    if (state_topic.compare(0, prefix.size(), prefix) == 0)
      publish(r.id, "state",
              {{"state", state_name(r.state)}, {"attempt", r.attempt}, {"restarts", r.restarts},
               {"last_step", r.last_step}},
              true);
    const auto metrics = last_metrics.find(r.id);
    if (metrics != last_metrics.end() && run_topic(r.id, "metrics").compare(0, prefix.size(), prefix) == 0)
      publish(r.id, "metrics", metrics->second, true);
  }
}

}  // namespace tide::ipc
