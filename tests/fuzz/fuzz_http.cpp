// Bytes on a real tided HTTP server's socket (the dashboard, /metrics, the JSON API and
// its controls, docs/dashboard.md): each input is written as it is to a fresh TCP
// connection, as any client on the network could write it, and its answer read. No
// handler may fail on what it was given (the server logs a failed handler as an error,
// "http METHOD PATH: what", and answers 500), the server answers or closes every
// connection, and it still answers GET /api/info after the input. One controller and
// server serve the whole campaign (each start binds ports and starts a thread pool); the
// controller has no runs, so what an input asks of one is refused alike every time and a
// finding still reproduces from its file alone. The dashboard token is fixed, so seeds
// reach the controls past the token check.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include "fuzz_check.h"
#include "fuzz_input.h"
#include "tide/ipc/controller.h"

namespace {
// The token the seeds carry (make_seeds.py: HTTP_TOKEN).
constexpr std::string_view kToken = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
// Longer than the server's own read and write timeouts (5 s): an answer that has not
// begun by then never will.
constexpr auto kAnswerDeadline = std::chrono::seconds(12);
// The check after each input.
constexpr std::string_view kInfo = "GET /api/info HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";

std::unique_ptr<tide::ipc::Controller> controller;
std::thread serving;
int port = 0;

// A handler that threw: the server's exception handler logs "http METHOD PATH: what".
class HandlerFailures : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    const std::string_view text(msg.payload.data(), msg.payload.size());
    if (msg.level >= spdlog::level::err && (text.rfind("http ", 0) == 0 || text.rfind("controller: ", 0) == 0))
      tide::fuzz::fault("a request failed inside the server: " + std::string(text));
  }
  void flush_() override {}
};

int connect_to_server() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) tide::fuzz::fault(std::string("socket: ") + std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    int error = errno;
    // A signal (libFuzzer's -timeout alarm) ended the wait, not the connection, which goes
    // on: its outcome is the socket's error once it is writable. A connect waits where the
    // server's listen queue is full, as it can be on a loaded machine.
    if (error == EINTR) {
      pollfd p{fd, POLLOUT, 0};
      while (::poll(&p, 1, static_cast<int>(std::chrono::milliseconds(kAnswerDeadline).count())) < 0 &&
             errno == EINTR) {
      }
      socklen_t size = sizeof error;
      if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) != 0) error = errno;
    }
    if (error != 0) tide::fuzz::fault(std::string("the HTTP server refused a connection: ") + std::strerror(error));
  }
  return fd;
}

// Writes `input` and reads the answer. The input is not ended by closing its half of the
// connection: httplib takes a half-closed connection for one that has gone and answers
// nothing. Nor does a request after it help: httplib answers one request of those a
// client sends without waiting (pipelined), then waits for more. So the answer is what
// arrives until the server closes the connection or it goes quiet (150 ms before a first
// byte, 30 ms after one; an unfinished request gets nothing, a keep-alive connection stays
// open), and an event stream's headers are answer enough. `until_closed`: the whole answer
// of a request that closes its connection.
std::string exchange(std::string_view input, bool until_closed = false) {
  const int fd = connect_to_server();
  const std::string_view bytes = input;
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the server closed early (a request it refused): its answer is still readable
    sent += static_cast<size_t>(n);
  }
  std::string answer;
  const auto deadline = std::chrono::steady_clock::now() + kAnswerDeadline;
  while (answer.find("text/event-stream") == std::string::npos) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      ::close(fd);
      tide::fuzz::fault("the HTTP server neither finished its answer nor closed the connection in 12 s; it sent: " +
                        answer.substr(0, 300));
    }
    const int quiet = until_closed ? static_cast<int>(left) : answer.empty() ? 150 : 30;
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, quiet);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;
    char buffer[16384];
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) break;  // closed (or reset: a refusal of what could not be parsed)
    if (answer.size() < (1u << 20)) answer.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return answer;
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  namespace fs = std::filesystem;
  using namespace tide;
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("fuzz", std::make_shared<HandlerFailures>()));
  spdlog::set_level(spdlog::level::err);
  const std::string state = fuzz::work_dir() + "/state";
  fs::create_directories(state);
  fs::permissions(state, fs::perms::owner_all);
  const std::string token = state + "/dashboard.token";
  const int fd = ::open(token.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0 || ::write(fd, kToken.data(), kToken.size()) != static_cast<ssize_t>(kToken.size()))
    fuzz::fault("cannot write the dashboard token " + token);
  ::close(fd);

  ipc::ControllerOptions opt;
  opt.state_dir = state;
  opt.command_endpoints = {"ipc://" + fuzz::work_dir() + "/commands"};
  opt.event_endpoints = {"ipc://" + fuzz::work_dir() + "/events"};
  opt.worker_executable = "/bin/false";  // no input can submit a run over HTTP
  opt.cpu_slots = 1;
  opt.cores = 2;
  opt.shutdown_timeout_s = 1;
  opt.alerts.recipe_webhooks = false;
  opt.http.port = 0;
  controller = std::make_unique<ipc::Controller>(opt);
  serving = std::thread([] { controller->run(); });
  const std::string url = controller->http_url();  // http://127.0.0.1:PORT/
  port = std::atoi(url.substr(url.rfind(':') + 1).c_str());
  if (port <= 0) fuzz::fault("no HTTP port in " + url);
  // libFuzzer ends the process with exit(): stop the controller first, so that its
  // threads are not destroyed while they serve.
  std::atexit([] {
    controller->stop();
    controller->stop();
    if (serving.joinable()) serving.join();
    controller.reset();
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool show = std::getenv("TIDE_FUZZ_SHOW") != nullptr;  // to read a finding's exchange
  const std::string answer = exchange(std::string_view(reinterpret_cast<const char*>(data), size));
  if (show)
    std::fprintf(stderr, "> %.*s\n< %s\n", static_cast<int>(size), reinterpret_cast<const char*>(data),
                 answer.substr(0, 2000).c_str());
  const std::string info = exchange(kInfo, true);
  if (info.rfind("HTTP/1.1 200", 0) != 0)
    tide::fuzz::fault("the server did not answer GET /api/info after the input: " + info.substr(0, 300));
  return 0;
}
