#include "engine.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>

#include "tide/engine/io/json_input.h"
#include "tide/ipc/worker_group.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using tide::capi::Failure;

namespace tide::capi {
Handles<tide_engine>& engines() {
  static Handles<tide_engine> handles;
  return handles;
}

namespace {
// The tide-worker an embedded engine's workers run: $TIDE_WORKER, else the one that
// belongs with this library (installed: lib/../bin; build tree: capi/../tools).
std::string default_worker() {
  if (const char* env = std::getenv("TIDE_WORKER"); env && *env) return env;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&tide_version), &info) && info.dli_fname) {
    const std::string found = tide::ipc::find_tide_worker(fs::absolute(info.dli_fname).parent_path().string());
    if (!found.empty()) return found;
  }
  throw Failure(TIDE_ERR_INVALID_ARGUMENT,
                "no worker executable: set worker_executable or $TIDE_WORKER to the tide-worker binary");
}
}  // namespace
}  // namespace tide::capi

json tide_engine::request(const std::string& type, const json& body) {
  std::lock_guard<std::mutex> lock(mu);
  if (!client) throw Failure(TIDE_ERR_INVALID_HANDLE, "the engine is closed");
  return client->request(type, body);
}

void tide_engine::close() {
  std::lock_guard<std::mutex> lock(mu);
  client.reset();
  if (controller) {
    controller->stop();
    if (serving.joinable()) serving.join();
    controller.reset();
  }
}

tide_engine::~tide_engine() { close(); }

extern "C" {

void tide_connect_options_init(tide_connect_options* options) {
  const tide_connect_options defaults = TIDE_CONNECT_OPTIONS_INIT;
  if (options) *options = defaults;
}

void tide_embedded_options_init(tide_embedded_options* options) {
  const tide_embedded_options defaults = TIDE_EMBEDDED_OPTIONS_INIT;
  if (options) *options = defaults;
}

int tide_engine_connect(tide_engine** out, const char* endpoint, const tide_connect_options* options) {
  return tide::capi::guarded("tide_engine_connect", [&] {
    tide::capi::require(out, "out");
    *out = nullptr;
    tide_connect_options opt = TIDE_CONNECT_OPTIONS_INIT;
    if (options) {
      tide::capi::require_version(options->version, TIDE_CONNECT_OPTIONS_VERSION, "options");
      opt = *options;
    }
    if (opt.timeout_ms < 0) throw Failure(TIDE_ERR_INVALID_ARGUMENT, fmt::format("timeout_ms {} < 0", opt.timeout_ms));
    const bool any_key = opt.server_public_key || opt.client_public_key || opt.client_secret_key;
    const bool all_keys = opt.server_public_key && opt.client_public_key && opt.client_secret_key;
    if (any_key && !all_keys)
      throw Failure(TIDE_ERR_INVALID_ARGUMENT, "CURVE needs server_public_key, client_public_key and client_secret_key");
    auto engine = std::make_shared<tide_engine>();
    if (all_keys) engine->curve = {opt.server_public_key, opt.client_public_key, opt.client_secret_key};
    const std::string ep = endpoint && *endpoint ? endpoint
                                                 : tide::ipc::default_command_endpoint(tide::ipc::default_state_dir());
    engine->client = std::make_unique<tide::ipc::Client>(
        ep, std::chrono::milliseconds(opt.timeout_ms > 0 ? opt.timeout_ms : 10000), engine->curve);
    engine->event_endpoint = engine->client->event_endpoint();  // also proves the daemon answers
    *out = tide::capi::engines().add(std::move(engine));
    return TIDE_OK;
  });
}

int tide_engine_open_embedded(tide_engine** out, const tide_embedded_options* options) {
  return tide::capi::guarded("tide_engine_open_embedded", [&] {
    tide::capi::require(out, "out");
    *out = nullptr;
    tide_embedded_options opt = TIDE_EMBEDDED_OPTIONS_INIT;
    if (options) {
      tide::capi::require_version(options->version, TIDE_EMBEDDED_OPTIONS_VERSION, "options");
      opt = *options;
    }
    if (opt.cpu_slots < 0 || opt.cores < 0)
      throw Failure(TIDE_ERR_INVALID_ARGUMENT,
                    fmt::format("cpu_slots {} and cores {} must not be negative", opt.cpu_slots, opt.cores));
    const std::string level = opt.log_level ? opt.log_level : "warn";
    const auto parsed_level = spdlog::level::from_str(level);
    if (parsed_level == spdlog::level::off && level != "off")
      throw Failure(TIDE_ERR_INVALID_ARGUMENT, fmt::format("log_level '{}' is not trace, debug, info, warn or error", level));
    tide::ipc::ControllerOptions c;
    c.state_dir = opt.state_dir && *opt.state_dir ? opt.state_dir : tide::ipc::default_state_dir();
    std::error_code ec;
    fs::create_directories(c.state_dir, ec);
    if (ec) throw Failure(TIDE_ERR_IO, fmt::format("cannot create the state directory {}: {}", c.state_dir, ec.message()));
    c.state_dir = fs::canonical(c.state_dir).string();
    c.worker_executable = opt.worker_executable && *opt.worker_executable ? opt.worker_executable
                                                                          : tide::capi::default_worker();
    if (!fs::exists(c.worker_executable))
      throw Failure(TIDE_ERR_INVALID_ARGUMENT, fmt::format("worker_executable '{}' does not exist", c.worker_executable));
    c.cpu_slots = opt.cpu_slots > 0 ? opt.cpu_slots : 1;
    c.cores = opt.cores;
    c.gpus = tide::ipc::resolve_gpus(opt.gpus ? opt.gpus : "auto");
    c.command_endpoints = {tide::ipc::default_command_endpoint(c.state_dir)};
    c.event_endpoints = {tide::ipc::default_event_endpoint(c.state_dir)};
    // The controller logs through spdlog's default logger: to the state directory's
    // tided.log, as a detached tided does, not to the host's terminal.
    static std::atomic<int> opened{0};
    auto logger = spdlog::basic_logger_mt(fmt::format("tide-embedded-{}", ++opened),
                                          (fs::path(c.state_dir) / "tided.log").string());
    logger->set_level(parsed_level);
    logger->flush_on(spdlog::level::info);
    spdlog::set_default_logger(logger);

    auto engine = std::make_shared<tide_engine>();
    try {
      engine->controller = std::make_unique<tide::ipc::Controller>(c);
    } catch (const std::exception& e) {
      throw Failure(TIDE_ERR_UNAVAILABLE, e.what());
    }
    tide::ipc::Controller* controller = engine->controller.get();
    engine->serving = std::thread([controller] { controller->run(); });
    engine->client = std::make_unique<tide::ipc::Client>(c.command_endpoints[0]);
    engine->event_endpoint = c.event_endpoints[0];
    engine->client->request("info");
    *out = tide::capi::engines().add(std::move(engine));
    return TIDE_OK;
  });
}

void tide_engine_close(tide_engine* engine) {
  if (!engine) return;
  (void)tide::capi::guarded("tide_engine_close", [&] {
    if (auto e = tide::capi::engines().take(engine)) e->close();
    return TIDE_OK;
  });
}

int tide_engine_info(tide_engine* engine, char** json_out) {
  return tide::capi::guarded("tide_engine_info", [&] {
    auto e = tide::capi::engines().get(engine, "engine");
    tide::capi::require(json_out, "json_out");
    *json_out = nullptr;
    *json_out = tide::capi::duplicate(e->request("info").dump());
    return TIDE_OK;
  });
}

int tide_engine_request(tide_engine* engine, const char* type, const char* body_json, char** reply_json_out) {
  return tide::capi::guarded("tide_engine_request", [&] {
    auto e = tide::capi::engines().get(engine, "engine");
    tide::capi::require_text(type, "type");
    tide::capi::require(reply_json_out, "reply_json_out");
    *reply_json_out = nullptr;
    json body = json::object();
    if (body_json) {
      body = tide::parse_json_or_discard(body_json);
      if (!body.is_object()) throw Failure(TIDE_ERR_INVALID_ARGUMENT, "body_json is not a JSON object");
    }
    *reply_json_out = tide::capi::duplicate(e->request(type, body).dump());
    return TIDE_OK;
  });
}

}  // extern "C"
