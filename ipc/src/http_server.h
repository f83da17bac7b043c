// tided's HTTP face (docs/dashboard.md): Prometheus metrics (GET /metrics), the runs as
// JSON (GET /api/...), their events as a server-sent event stream (GET /api/events) and
// their controls (POST /api/runs/<id>/<op>). It holds no state of
// its own: every page and every control is a request on the controller's ipc command
// socket, the path the CLI takes, so the two cannot disagree. Controls need the dashboard
// token (Authorization: Bearer) and are refused from another site's page (Origin).
#pragma once

#include <memory>
#include <string>

namespace tide::ipc {

struct HttpOptions {
  std::string address = "127.0.0.1";
  int port = 0;                  // 0: any free port
  std::string command_endpoint;  // the controller's ipc command socket
  std::string event_endpoint;    // and its ipc event socket (server-sent events)
  std::string token_file;        // made owner-only on first start, then reused
  bool insecure = false;         // serve beyond loopback without TLS (refused otherwise)
  std::string tls_cert, tls_key;  // PEM files: serve HTTPS (the key must be owner-only)
};

class HttpServer {
 public:
  // Binds and serves on threads of its own; throws naming the address when it cannot bind,
  // or when it would serve beyond loopback without `insecure`.
  explicit HttpServer(HttpOptions options);
  ~HttpServer();  // stops serving, waits for requests in flight
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  std::string url() const;  // http://address:port/, or https://

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The dashboard token in `path`: read when the file exists (it must be owner-only), else
// made from 32 random bytes and written there with mode 0600.
std::string load_or_make_token(const std::string& path);

}  // namespace tide::ipc
