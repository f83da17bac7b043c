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
#include <spdlog/spdlog.h>
#include <zmq_addon.hpp>

#include "controller_impl.h"
#include "tide/engine/plan/cluster.h"

namespace tide::ipc {
namespace fs = std::filesystem;
using json = nlohmann::json;

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

// Types that change runs or the daemon, or spend its machine (a verification reads a
// whole checkpoint): operators only.
bool changes_something(const std::string& type) {
  for (const char* t :
       {"submit", "pause", "resume", "stop", "cancel", "checkpoint", "set", "export", "verify", "shutdown"})
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
  } else if (!opt.allowlist_file.empty()) {
    throw std::invalid_argument(fmt::format(
        "an allowlist of client keys (--clients {}) needs this daemon's CURVE key (--curve-key)", opt.allowlist_file));
  }
  // Options apply to the binds that follow them: local endpoints first, without CURVE.
  for (auto [socket, endpoints, bound] : {std::tuple{&commands, &opt.command_endpoints, &service.command_endpoints},
                                          std::tuple{&bus->socket(), &opt.event_endpoints, &service.event_endpoints}}) {
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
  const bool worker = req[2].to_string() == Supervisor::kWorkerZapDomain;
  if (mechanism == "CURVE" && req.size() >= 7 && req[6].size() == 32) {
    char z85[41];
    zmq_z85_encode(z85, static_cast<const uint8_t*>(req[6].data()), 32);
    if (worker) {
      // The ranks of a run under a scheduler: its key, admitted while its job is active.
      if (const auto run = supervisor->run_of_worker_key(z85)) {
        status = "200";
        text = "OK";
        user = *run;
      } else {
        spdlog::warn("refused a worker from {} with a key of no active run: {}", req[3].to_string(), z85);
      }
    } else if (const auto it = allowed.find(z85); it != allowed.end()) {
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
  if (opt.cores <= 0) opt.cores = local_cores();
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
  evaluator = std::make_unique<RecipeEvaluator>([this] { wake.wake(); });
  bus = std::make_unique<EventBus>(ctx, fmt::format("{}-{}", static_cast<int64_t>(unix_now()), ::getpid()));
  runs = std::make_unique<RunBook>(opt.state_dir, *bus);
  policies = std::make_unique<PolicyHost>(
      *runs, *bus, *evaluator,
      [this](RunRecord& r, const json& command, const std::string& id) { requests->apply(r, command, id); });
  runs->on_finished([this](const std::string& run) { policies->forget(run); });
  // The ZAP handler is bound before any CURVE socket: a CURVE handshake that finds no
  // handler is let through.
  if (!opt.curve_key_file.empty() || opt.slurm.enabled) {
    zap.set(zmq::sockopt::linger, 0);
    zap.bind("inproc://zeromq.zap.01");
    zap_bound = true;
  }
  for (auto* r : runs->registry().all())
    if (!is_finished(r->state)) policies->load(*r);
  supervisor = std::make_unique<Supervisor>(opt, ctx, *runs, *policies, *bus);
  exports = std::make_unique<Exports>(opt, *runs, *bus);
  commands.set(zmq::sockopt::maxmsgsize, kTransportLimit);
  commands.set(zmq::sockopt::linger, 0);
  commands.set(zmq::sockopt::router_mandatory, false);
  bind_endpoints();
  if (curve) service.curve_public_key = curve->public_key;
  requests =
      std::make_unique<Requests>(opt, service, *runs, *supervisor, *policies, *exports, *bus, *evaluator, stopping);
  if (opt.http.port >= 0) {
    // Through the ipc command socket: local, and the path the CLI's requests take.
    auto ipc_of = [](const std::vector<std::string>& endpoints) {
      for (const auto& ep : endpoints)
        if (ep.rfind("ipc://", 0) == 0) return ep;
      throw std::invalid_argument("the HTTP server needs the ipc command and event endpoints to reach the controller");
    };
    http = std::make_unique<HttpServer>(HttpOptions{opt.http.address, opt.http.port, ipc_of(service.command_endpoints),
                                                    ipc_of(service.event_endpoints),
                                                    (fs::path(opt.state_dir) / "dashboard.token").string(),
                                                    opt.http.insecure, opt.http.tls_cert, opt.http.tls_key});
    service.http_url = http->url();
  }
  if (!opt.alerts.webhooks.empty() || !opt.alerts.commands.empty() || opt.alerts.recipe_webhooks) {
    AlertOptions alerting{opt.alerts.webhooks,    opt.alerts.commands, opt.alerts.stall_factor,
                          opt.alerts.stall_min_s, service.http_url,    nullptr};
    // On the controller's thread, as every alert is raised: the resolved recipe (read back
    // from the run directory for a run that has just finished).
    if (opt.alerts.recipe_webhooks)
      alerting.run_webhooks = [this](const std::string& run) {
        const RunRecord* r = runs->registry().find(run);
        return r ? runs->config_of(*r).alerts.webhooks : std::vector<std::string>{};
      };
    alerts = std::make_unique<Alerts>(std::move(alerting));
    bus->observe([this](const std::string& run, const std::string& kind, const json& body) {
      if (alerts) alerts->on_event(run, kind, body, unix_now());
    });
  }
  std::ofstream(fs::path(opt.state_dir) / "endpoints.json", std::ios::trunc)
      << json{{"commands", service.command_endpoints},
              {"events", service.event_endpoints},
              {"pid", ::getpid()},
              {"curve_public_key", curve ? json(curve->public_key) : json(nullptr)},
              {"http", http ? json(http->url()) : json(nullptr)}}
             .dump(2)
      << "\n";
}

Controller::Controller(ControllerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Controller::~Controller() = default;

Controller::Impl::~Impl() {
  if (state_lock >= 0) ::close(state_lock);
}

std::vector<std::string> Controller::command_endpoints() const { return impl_->service.command_endpoints; }
std::vector<std::string> Controller::event_endpoints() const { return impl_->service.event_endpoints; }
std::string Controller::http_url() const { return impl_->http ? impl_->http->url() : ""; }
void Controller::stop() {
  // A second stop (a second SIGTERM or Ctrl-C) does not wait for the runs' checkpoints.
  if (impl_->stopping.exchange(true)) impl_->hurry = true;
  impl_->wake.wake();
}

void Controller::run() {
  auto& m = *impl_;
  spdlog::info("controller serving commands on {} and events on {}; {} cpu slots; gpus: {}",
               fmt::join(m.service.command_endpoints, ", "), fmt::join(m.service.event_endpoints, ", "),
               m.opt.cpu_slots, m.opt.gpus.empty() ? "none" : fmt::format("{}", fmt::join(m.opt.gpus, ",")));
  while (!m.stopping) m.tick();
  m.shutdown();
}

void Controller::Impl::tick() {
  zmq::pollitem_t items[] = {{commands.handle(), 0, ZMQ_POLLIN, 0},
                             {bus->socket().handle(), 0, ZMQ_POLLIN, 0},
                             {supervisor->socket().handle(), 0, ZMQ_POLLIN, 0},
                             {nullptr, wake.fd(), ZMQ_POLLIN, 0},
                             {zap.handle(), 0, ZMQ_POLLIN, 0}};
  try {
    zmq::poll(items, zap_bound ? 5 : 4, kTick);
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return;
    throw;
  }
  // Nothing a client or a worker sends may take the controller down: every handler
  // turns its failures into replies or log lines.
  try {
    if (items[3].revents & ZMQ_POLLIN) wake.drain();
    if (zap_bound && (items[4].revents & ZMQ_POLLIN)) serve_zap();
    if (items[2].revents & ZMQ_POLLIN) supervisor->serve_workers();
    if (items[0].revents & ZMQ_POLLIN) serve_commands();
    if (items[1].revents & ZMQ_POLLIN)
      bus->serve_subscriptions([this](const std::string& prefix) { runs->snapshot(prefix); });
    reply_to_finished_submits(false);
    supervisor->supervise();
    exports->watch();
    supervisor->schedule();
    if (alerts) alerts->tick(unix_now());
  } catch (const std::exception& e) {
    spdlog::error("controller: {}", e.what());
  }
}

void Controller::Impl::shutdown() {
  http.reset();  // no page waits on a controller that has stopped answering
  // A submit being evaluated is answered: its run is queued for the next controller.
  try {
    reply_to_finished_submits(true);
  } catch (const std::exception& e) {
    spdlog::error("controller: {}", e.what());
  }
  supervisor->shutdown(hurry);
  exports->end();
  alerts.reset();  // what is still queued gets a few seconds to go out
  spdlog::info("controller stopped");
}

void Controller::Impl::send_reply(const ReplyTo& to, const std::string& text) {
  (void)commands.send(zmq::buffer(to.identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  if (to.delimited) (void)commands.send(zmq::message_t(), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  (void)commands.send(zmq::buffer(text), zmq::send_flags::dontwait);
}

void Controller::Impl::reply_to_finished_submits(bool wait) {
  for (const auto& [to, text] : requests->finished_submits(wait)) send_reply(to, text);
}

void Controller::Impl::serve_commands() {
  while (true) {
    std::vector<zmq::message_t> parts;
    if (!zmq::recv_multipart(commands, std::back_inserter(parts), zmq::recv_flags::dontwait)) return;
    // [identity][body] from a DEALER, [identity][empty][body] from a REQ.
    ReplyTo to{parts[0].to_string(), parts.size() == 3 && parts[1].empty(), nullptr};
    std::string reply;
    if (parts.size() != 2 && !to.delimited) {
      spdlog::warn("command socket: dropped a message of {} frames (want one body frame)", parts.size() - 1);
      reply = reply_error(to.id, ErrorCode::bad_request,
                          fmt::format("a request is one frame; this message had {}", parts.size() - 1));
    } else {
      const auto& frame = parts.back();
      try {
        const Request req = parse_request(frame.to_string_view(), to.id);
        // CURVE clients carry the role their key was allowed with; local (ipc) ones none.
        const char* role = zmq_msg_gets(const_cast<zmq_msg_t*>(frame.handle()), "User-Id");
        if (role && std::string(role) == "observer" && changes_something(req.type))
          throw ProtocolError(ErrorCode::unauthorized, fmt::format("'{}' needs the operator role; this key is an observer's", req.type));
        const std::optional<json> body = requests->handle(req, to);
        if (!body) continue;  // answered when its recipe has been evaluated
        reply = reply_ok(to.id, *body);
      } catch (const ProtocolError& e) {
        spdlog::warn("request refused ({}): {}", error_name(e.code()), e.what());
        reply = reply_error(to.id, e.code(), e.what());
      } catch (const std::exception& e) {
        spdlog::error("request failed: {}", e.what());
        reply = reply_error(to.id, ErrorCode::internal, e.what());
      }
    }
    send_reply(to, reply);
  }
}

}  // namespace tide::ipc
