#include "http_server.h"

#include <atomic>
#include <chrono>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <httplib.h>
#include <spdlog/spdlog.h>

#include "private_file.h"
#include "prometheus_text.h"
#include "tide/engine/io/json_input.h"
#include "tide/ipc/client.h"
#include "tide/ipc/curve.h"
#include "tide/ipc/protocol.h"
#include "web_assets.h"

namespace tide::ipc {
using json = nlohmann::json;

namespace {
// /api/runs/<id>: a run id as is_safe_name allows it (the route's first match).
const std::string kRunPath = R"(/api/runs/([A-Za-z0-9._-]{1,64}))";
constexpr size_t kBodyLimit = size_t{64} * 1024;  // a control's JSON; nothing larger is ever needed
// Each event stream holds one of the pool's threads while it is open: the cap leaves
// threads for scrapes and pages.
constexpr int kThreads = 12;
constexpr int kMaxStreams = 8;
// How long a stream waits for an event before it writes a comment, so that a client
// that has gone is noticed and proxies keep the connection.
constexpr auto kStreamIdle = std::chrono::seconds(10);

// The HTTP status of a controller's error reply.
int http_status(const std::string& code) {
  if (code == "not_found") return 404;
  if (code == "unauthorized") return 403;
  if (code == "invalid_state") return 409;
  if (code == "timeout") return 504;
  if (code == "transport" || code == "internal") return 502;
  return 400;  // bad_request, invalid_value, invalid_recipe, ...
}

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

bool same_bytes(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}
}  // namespace

std::string load_or_make_token(const std::string& path) {
  require_private_file(path, "the dashboard token");
  if (std::ifstream in(path); in) {
    std::string token;
    in >> token;
    if (token.size() >= 32) return token;
    throw std::runtime_error(fmt::format("'{}' holds no token (64 hex characters); delete it to make one", path));
  }
  std::random_device random;  // the kernel's generator
  std::string token;
  for (int i = 0; i < 8; ++i) token += fmt::format("{:08x}", random());
  create_private_file(path, token + "\n");
  return token;
}

struct HttpServer::Impl {
  HttpOptions opt;
  std::string token;
  int port = 0;
  std::unique_ptr<httplib::Server> server;  // an SSLServer with TLS
  std::thread thread;
  std::mutex client_mu;  // one connection to the controller, one request at a time
  std::unique_ptr<Client> client;
  std::atomic<int> streams{0};
  std::atomic<bool> stopping{false};

  // GET /api/events[?run=ID]: the event socket's events as server-sent events, each
  // "id: <seq>", "event: <kind>", "data: <the event's JSON>"; a late subscriber's
  // snapshot comes first, as on the event socket.
  void stream(const httplib::Request& req, httplib::Response& res) {
    std::string prefix = "run.";
    if (req.has_param("run")) {
      const std::string run = req.get_param_value("run");
      if (!is_safe_name(run))
        return send_json(res, 400, {{"error", {{"code", "bad_request"}, {"message", "run: a run id"}}}});
      prefix += run + ".";
    }
    if (streams.fetch_add(1) >= kMaxStreams) {
      streams.fetch_sub(1);
      return send_json(
          res, 503,
          {{"error",
            {{"code", "unavailable"}, {"message", fmt::format("{} event streams are open already", kMaxStreams)}}}});
    }
    auto sub = std::make_shared<Subscriber>(opt.event_endpoint, std::vector<std::string>{prefix});
    res.set_header("Cache-Control", "no-store");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, sub](size_t, httplib::DataSink& sink) {
          const auto idle_until = std::chrono::steady_clock::now() + kStreamIdle;
          while (!stopping && sink.is_writable()) {
            if (const auto e = sub->next(std::chrono::milliseconds(250))) {
              const std::string text =
                  fmt::format("id: {}\nevent: {}\ndata: {}\n\n", e->message.value("seq", int64_t{0}),
                              e->message.value("kind", std::string("event")),
                              e->message.dump(-1, ' ', false, json::error_handler_t::replace));
              return sink.write(text.data(), text.size());
            }
            if (std::chrono::steady_clock::now() >= idle_until) return sink.write(": idle\n\n", 8);
          }
          return false;
        },
        [this](bool) { streams.fetch_sub(1); });
  }

  // A request on the controller's command socket; throws ClientError.
  json ask(const std::string& type, const json& body = json::object()) {
    std::lock_guard<std::mutex> lock(client_mu);
    return client->request(type, body);
  }

  // The same, answered as HTTP.
  void forward(httplib::Response& res, const std::string& type, const json& body) {
    try {
      send_json(res, 200, ask(type, body));
    } catch (const ClientError& e) {
      send_json(res, http_status(e.code()), {{"error", {{"code", e.code()}, {"message", e.what()}}}});
    }
  }

  // Why a control may not go on ("" when it may): the token, and no page of another site.
  std::string refusal(const httplib::Request& req) const {
    const std::string auth = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    if (auth.rfind(prefix, 0) != 0 || !same_bytes(auth.substr(prefix.size()), token))
      return "a control needs the dashboard token (Authorization: Bearer <token>; tided prints where it is)";
    if (req.has_header("Origin")) {
      const std::string origin = req.get_header_value("Origin");
      const std::string scheme = opt.tls_cert.empty() ? "http://" : "https://";
      const std::string own = fmt::format("{}{}:{}", scheme, opt.address, port);
      const std::string own_host = scheme + req.get_header_value("Host");
      if (origin != own && origin != own_host)
        return fmt::format("a control from another site ({}) is refused", origin);
    }
    return "";
  }

  // The dashboard (ipc/web, compiled in): one page whose script routes by the URL's
  // fragment, and its assets. The policy lets the page run only its own scripts and talk
  // only to this server, and no other site may frame it.
  void serve_pages() {
    for (const WebAsset& asset : web_assets()) {
      server->Get(std::string(asset.path), [&asset](const httplib::Request&, httplib::Response& res) {
        res.set_header("Content-Security-Policy",
                       "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
                       "frame-ancestors 'none'");
        res.set_header("X-Content-Type-Options", "nosniff");
        res.set_header("Referrer-Policy", "no-referrer");
        // Assets change only with the binary; a reload after an upgrade must see the new ones.
        res.set_header("Cache-Control", "no-cache");
        res.set_content(asset.bytes.data(), asset.bytes.size(), std::string(asset.content_type));
      });
    }
  }

  void routes() {
    // Whatever a handler throws becomes a 500 naming it; the server goes on.
    server->set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown error";
      try {
        std::rethrow_exception(std::move(ep));
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      spdlog::error("http {} {}: {}", req.method, req.path, what);
      send_json(res, 500, {{"error", {{"code", "internal"}, {"message", what}}}});
    });
    server->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      try {
        const json info = ask("info");
        const json runs = ask("list").value("runs", json::array());
        res.set_content(prometheus_text(info, runs), "text/plain; version=0.0.4; charset=utf-8");
      } catch (const ClientError& e) {
        res.status = http_status(e.code());
        res.set_content(fmt::format("# the controller did not answer: {}\n", e.what()), "text/plain");
      }
    });
    server->Get("/api/events", [this](const httplib::Request& req, httplib::Response& res) { stream(req, res); });
    server->Get("/api/info",
                [this](const httplib::Request&, httplib::Response& res) { forward(res, "info", json::object()); });
    server->Get("/api/runs",
                [this](const httplib::Request&, httplib::Response& res) { forward(res, "list", json::object()); });
    server->Get(kRunPath, [this](const httplib::Request& req, httplib::Response& res) {
      forward(res, "status", {{"run", req.matches[1].str()}});
    });
    server->Get(
        kRunPath + "/metrics", [this](const httplib::Request& req, httplib::Response& res) {
          json body = {{"run", req.matches[1].str()}};
          try {
            for (const char* key : {"since_step", "limit"})
              if (req.has_param(key)) body[key] = std::stoll(req.get_param_value(key));
          } catch (const std::exception&) {
            return send_json(res, 400,
                             {{"error", {{"code", "bad_request"}, {"message", "since_step and limit are integers"}}}});
          }
          if (req.has_param("source")) body["source"] = req.get_param_value("source");
          forward(res, "metrics", body);
        });
    server->Get(kRunPath + "/checkpoints", [this](const httplib::Request& req, httplib::Response& res) {
      forward(res, "checkpoints", {{"run", req.matches[1].str()}});
    });
    server->Get(kRunPath + "/logs", [this](const httplib::Request& req, httplib::Response& res) {
      json body = {{"run", req.matches[1].str()}, {"source", "train"}};
      try {
        for (const char* key : {"lines", "rank"})
          if (req.has_param(key)) body[key] = std::stoll(req.get_param_value(key));
      } catch (const std::exception&) {
        return send_json(res, 400, {{"error", {{"code", "bad_request"}, {"message", "lines and rank are integers"}}}});
      }
      if (req.has_param("source")) body["source"] = req.get_param_value("source");
      forward(res, "logs", body);
    });
    server->Get(kRunPath + "/recipe", [this](const httplib::Request& req, httplib::Response& res) {
      forward(res, "recipe", {{"run", req.matches[1].str()}});
    });
    serve_pages();
    server->Post(
        kRunPath + "/(pause|resume|stop|cancel|checkpoint|set|export|verify)",
        [this](const httplib::Request& req, httplib::Response& res) {
          if (const std::string why = refusal(req); !why.empty())
            return send_json(res, 403, {{"error", {{"code", "unauthorized"}, {"message", why}}}});
          json body = {{"run", req.matches[1].str()}};
          const std::string op = req.matches[2].str();
          if (op == "set") {
            const json given = parse_json_or_discard(req.body);
            if (!given.is_object() || !given.contains("values") || !given["values"].is_object())
              return send_json(
                  res, 400,
                  {{"error", {{"code", "bad_request"}, {"message", "set takes {\"values\": {FIELD: VALUE}}"}}}});
            body["values"] = given["values"];
          } else if (op == "export") {
            // The controller checks each of these as it checks the CLI's.
            const json given = req.body.empty() ? json::object() : parse_json_or_discard(req.body);
            if (!given.is_object())
              return send_json(
                  res, 400,
                  {{"error", {{"code", "bad_request"}, {"message", "export takes {\"out\", \"step\", \"dtype\"}"}}}});
            for (const char* key : {"out", "step", "dtype"})
              if (given.contains(key)) body[key] = given[key];
          } else if (op == "verify") {
            const json given = req.body.empty() ? json::object() : parse_json_or_discard(req.body);
            if (!given.is_object())
              return send_json(res, 400,
                               {{"error", {{"code", "bad_request"}, {"message", "verify takes {\"step\"}"}}}});
            if (given.contains("step")) body["step"] = given["step"];
          }
          forward(res, op, body);
        });
  }
};

HttpServer::HttpServer(HttpOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.opt = std::move(options);
  const bool tls = !m.opt.tls_cert.empty();
  if (tls != !m.opt.tls_key.empty())
    throw std::invalid_argument("HTTPS needs both a certificate (--http-cert) and its private key (--http-key)");
  if (!tls && !m.opt.insecure && !is_loopback_endpoint(fmt::format("tcp://{}:{}", m.opt.address, m.opt.port)))
    throw std::invalid_argument(
        fmt::format("serving the dashboard on {} (beyond loopback) needs TLS (--http-cert and --http-key) or "
                    "--http-insecure",
                    m.opt.address));
  if (tls) {
    require_private_file(m.opt.tls_key, "the HTTPS private key");
    auto ssl = std::make_unique<httplib::SSLServer>(m.opt.tls_cert.c_str(), m.opt.tls_key.c_str());
    if (!ssl->is_valid())
      throw std::invalid_argument(
          fmt::format("cannot serve HTTPS with certificate '{}' and key '{}' (unreadable, "
                      "not PEM, or not a pair)",
                      m.opt.tls_cert, m.opt.tls_key));
    m.server = std::move(ssl);
  } else {
    m.server = std::make_unique<httplib::Server>();
  }
  m.token = load_or_make_token(m.opt.token_file);
  m.client = std::make_unique<Client>(m.opt.command_endpoint);
  m.server->set_payload_max_length(kBodyLimit);
  m.server->set_read_timeout(5, 0);
  m.server->set_write_timeout(5, 0);
  m.server->new_task_queue = [] { return new httplib::ThreadPool(kThreads); };
  m.routes();
  m.port = m.opt.port == 0 ? m.server->bind_to_any_port(m.opt.address) : m.opt.port;
  if (m.opt.port != 0 && !m.server->bind_to_port(m.opt.address, m.opt.port)) m.port = -1;
  if (m.port <= 0) throw std::runtime_error(fmt::format("cannot serve HTTP on {}:{}", m.opt.address, m.opt.port));
  m.thread = std::thread([&m] { m.server->listen_after_bind(); });
  // httplib's stop() does nothing until the listening loop has begun: a server stopped
  // right after it started (tided failing later in its start) would listen forever.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!m.server->is_running()) {
    if (std::chrono::steady_clock::now() > deadline) {
      m.server->stop();
      m.thread.join();
      throw std::runtime_error(fmt::format("HTTP on {}:{} did not start listening", m.opt.address, m.port));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  spdlog::info("dashboard at {} (controls need the token in {})", url(), m.opt.token_file);
}

HttpServer::~HttpServer() {
  impl_->stopping = true;
  impl_->server->stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

std::string HttpServer::url() const {
  return fmt::format("{}://{}:{}/", impl_->opt.tls_cert.empty() ? "http" : "https", impl_->opt.address, impl_->port);
}

}  // namespace tide::ipc
