#include "launcher.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <stdexcept>
#include <thread>

#include <spdlog/spdlog.h>

namespace tide::cli {
namespace {

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) ::close(fd);
    throw std::runtime_error(std::string("cannot find a free port for the rendezvous: ") + std::strerror(errno));
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string describe(int status) {
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
                                  strsignal(WTERMSIG(status)) + ")";
  return "exited with status " + std::to_string(WEXITSTATUS(status));
}

}  // namespace

int launch_workers(const LaunchSpec& spec) {
  const std::string addr = spec.master_addr.empty() ? "127.0.0.1" : spec.master_addr;
  const int port = spec.master_port > 0 ? spec.master_port : free_port();
  const int world = spec.nproc * spec.nnodes;
  std::map<pid_t, int> ranks;  // pid → global rank
  for (int local = 0; local < spec.nproc; ++local) {
    const int rank = spec.node_rank * spec.nproc + local;
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
    if (pid == 0) {
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(spec.nproc).c_str(), 1);
      ::setenv("MASTER_ADDR", addr.c_str(), 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      std::vector<std::string> args{"tide"};
      args.insert(args.end(), spec.worker_args.begin(), spec.worker_args.end());
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv("/proc/self/exe", argv.data());
      std::fprintf(stderr, "rank %d: cannot start the worker: %s\n", rank, std::strerror(errno));
      ::_exit(127);
    }
    ranks[pid] = rank;
  }
  spdlog::info("started {} workers (ranks {}..{} of {}), rendezvous at {}:{}", spec.nproc,
               spec.node_rank * spec.nproc, spec.node_rank * spec.nproc + spec.nproc - 1, world, addr, port);

  int exit_code = 0;
  while (!ranks.empty()) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    const auto it = ranks.find(pid);
    if (it == ranks.end()) continue;
    const int rank = it->second;
    ranks.erase(it);
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (ok || exit_code != 0) continue;
    exit_code = 1;
    spdlog::error("rank {} (pid {}) {}; stopping the other {} workers", rank, pid, describe(status), ranks.size());
    for (const auto& [p, r] : ranks) ::kill(p, SIGTERM);
    // Workers blocked in a collective may not react to SIGTERM at once: give them a
    // moment, then kill them.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!ranks.empty() && std::chrono::steady_clock::now() < deadline) {
      const pid_t done = ::waitpid(-1, &status, WNOHANG);
      if (done > 0) ranks.erase(done);
      else std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    for (const auto& [p, r] : ranks) ::kill(p, SIGKILL);
  }
  return exit_code;
}

}  // namespace tide::cli
