#include "tide/ipc/worker_group.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

namespace tide::ipc {

std::string find_tide_worker(const std::string& dir) {
  const std::filesystem::path d(dir);
  for (const auto& candidate :
       {d / "tide-worker", d.parent_path() / "bin" / "tide-worker", d.parent_path() / "tools" / "tide-worker"})
    if (std::filesystem::exists(candidate)) return candidate.string();
  return "";
}

int free_loopback_port() {
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

bool WorkerExit::ok() const { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

std::string WorkerExit::describe() const {
  if (WIFSIGNALED(status))
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return fmt::format("exited with status {}", WEXITSTATUS(status));
}

namespace {
// A program, its arguments and its whole environment (this process's, with `set` over
// it) as execve takes them, made before fork.
class ExecImage {
 public:
  ExecImage(const std::string& program, const std::vector<std::string>& args,
            const std::map<std::string, std::string>& set)
      : program_(program) {
    strings_.push_back(program);
    strings_.insert(strings_.end(), args.begin(), args.end());
    const size_t n_args = strings_.size();
    for (char** e = environ; *e; ++e) {
      const std::string_view entry(*e);
      if (!set.count(std::string(entry.substr(0, entry.find('='))))) strings_.emplace_back(entry);
    }
    for (const auto& [k, v] : set) strings_.push_back(k + "=" + v);
    for (size_t i = 0; i < strings_.size(); ++i) (i < n_args ? argv_ : envp_).push_back(strings_[i].data());
    argv_.push_back(nullptr);
    envp_.push_back(nullptr);
  }
  // Async-signal-safe; returns only when the exec failed.
  void exec() { ::execve(program_.c_str(), argv_.data(), envp_.data()); }

 private:
  std::string program_;
  std::vector<std::string> strings_;
  std::vector<char*> argv_, envp_;
};

// In a forked child: `what`, errno's description, and an exit with 127, with
// async-signal-safe calls only.
[[noreturn]] void exit_child_after(const std::string& what) {
  const char* why = strerrordesc_np(errno);
  (void)!::write(2, what.data(), what.size());
  if (why) (void)!::write(2, why, std::strlen(why));
  (void)!::write(2, "\n", 1);
  ::_exit(127);
}
}  // namespace

WorkerGroup::WorkerGroup(const WorkerSpec& spec) {
  const std::string addr = spec.master_addr.empty() ? "127.0.0.1" : spec.master_addr;
  const int port = spec.master_port > 0 ? spec.master_port : free_loopback_port();
  master_ = fmt::format("{}:{}", addr, port);
  const int world = spec.nproc * spec.nnodes;
  const pid_t parent = ::getpid();
  for (int local = 0; local < spec.nproc; ++local) {
    const int rank = spec.node_rank * spec.nproc + local;
    std::string log_path;
    if (!spec.log_dir.empty()) log_path = fmt::format("{}/worker-rank{}.log", spec.log_dir, rank);
    if (!spec.log_file.empty()) log_path = spec.log_file;
    // Everything the child needs is made here: between fork and exec a process with
    // other threads may only make async-signal-safe calls (no allocation).
    std::map<std::string, std::string> env{{"RANK", std::to_string(rank)},
                                           {"LOCAL_RANK", std::to_string(local)},
                                           {"WORLD_SIZE", std::to_string(world)},
                                           {"LOCAL_WORLD_SIZE", std::to_string(spec.nproc)},
                                           {"MASTER_ADDR", addr},
                                           {"MASTER_PORT", std::to_string(port)}};
    for (const auto& [k, v] : spec.env) env[k] = v;
    ExecImage image(spec.executable, spec.args, env);
    const std::string cannot_enter = fmt::format("rank {}: cannot enter {}: ", rank, spec.working_dir);
    const std::string cannot_start = fmt::format("rank {}: cannot start the worker {}: ", rank, spec.executable);
    const pid_t pid = ::fork();
    if (pid < 0) {
      const std::string why = std::strerror(errno);
      end(std::chrono::milliseconds(0));
      throw std::runtime_error("fork failed: " + why);
    }
    if (pid == 0) {
      // Its own process group: a terminal's Ctrl-C reaches the launcher or tided, which
      // decide how the workers end (a checkpoint first), not the workers directly.
      ::setpgid(0, 0);
      if (spec.die_with_parent) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != parent) ::_exit(1);  // the parent died before prctl
      }
      if (!log_path.empty()) {
        const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
          ::dup2(fd, 1);
          ::dup2(fd, 2);
          ::close(fd);
        }
        const int null = ::open("/dev/null", O_RDONLY);
        if (null >= 0) {
          ::dup2(null, 0);
          ::close(null);
        }
      }
      if (!spec.working_dir.empty() && ::chdir(spec.working_dir.c_str()) != 0) exit_child_after(cannot_enter);
      image.exec();
      exit_child_after(cannot_start);
    }
    live_[pid] = rank;
  }
}

WorkerGroup::~WorkerGroup() {
  for (const auto& [pid, rank] : live_) ::kill(pid, SIGKILL);
  for (const auto& [pid, rank] : live_) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
}

std::vector<WorkerExit> WorkerGroup::reap() {
  std::vector<WorkerExit> out;
  for (auto it = live_.begin(); it != live_.end();) {
    int status = 0;
    const pid_t done = ::waitpid(it->first, &status, WNOHANG);
    if (done == it->first || (done < 0 && errno == ECHILD)) {
      out.push_back({it->second, it->first, done == it->first ? status : 0});
      it = live_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

void WorkerGroup::terminate(std::chrono::milliseconds grace) {
  for (const auto& [pid, rank] : live_) ::kill(pid, SIGTERM);
  kill_at_ = std::chrono::steady_clock::now() + grace;
}

void WorkerGroup::enforce_deadline() {
  if (std::chrono::steady_clock::now() < kill_at_) return;
  for (const auto& [pid, rank] : live_) ::kill(pid, SIGKILL);
}

std::vector<WorkerExit> WorkerGroup::end(std::chrono::milliseconds grace) {
  terminate(grace);
  std::vector<WorkerExit> out;
  while (!live_.empty()) {
    auto done = reap();
    out.insert(out.end(), done.begin(), done.end());
    if (live_.empty()) break;
    enforce_deadline();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return out;
}

}  // namespace tide::ipc
