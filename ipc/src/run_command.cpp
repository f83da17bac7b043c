#include "run_command.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tide::ipc {
namespace {
constexpr size_t kOutputLimit = 1 << 20;

// The program's path as execvp would find it, looked up before fork: execvp itself may
// allocate, which a child of a threaded process must not.
std::string find_on_path(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/local/bin:/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

std::string first_line(const std::string& text) {
  const auto end = text.find('\n');
  return text.substr(0, end);
}
}  // namespace

bool CommandResult::ok() const { return !timed_out && status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0; }

std::string CommandResult::describe(const std::vector<std::string>& argv) const {
  const std::string cmd = fmt::format("`{}`", fmt::join(argv, " "));
  if (status == -1 && !timed_out) return fmt::format("{} could not start: {}", cmd, err);
  std::string how = timed_out             ? "did not end in time"
                    : WIFSIGNALED(status) ? fmt::format("was killed by signal {}", WTERMSIG(status))
                                          : fmt::format("exited with status {}", WEXITSTATUS(status));
  const std::string said = first_line(err.empty() ? out : err);
  return said.empty() ? fmt::format("{} {}", cmd, how) : fmt::format("{} {}: {}", cmd, how, said);
}

CommandResult run_command(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) {
  CommandResult result;
  const std::string program = argv.empty() ? "" : find_on_path(argv[0]);
  if (program.empty()) {
    result.err = argv.empty() ? "no program given" : fmt::format("'{}' is not on PATH", argv[0]);
    return result;
  }
  std::vector<std::string> args = argv;
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
    result.err = std::strerror(errno);
    return result;
  }
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    result.err = std::strerror(errno);
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    return result;
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0) ::dup2(null, 0);
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    ::execv(program.c_str(), cargs.data());
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (pid < 0) {
    result.err = std::strerror(errno);
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    return result;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_fds = 2;
  while (open_fds > 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      result.timed_out = true;
      ::kill(pid, SIGKILL);
      break;
    }
    if (::poll(fds, 2, static_cast<int>(left.count())) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[4096];
      const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        if (sinks[i]->size() < kOutputLimit)
          sinks[i]->append(buf, std::min<size_t>(n, kOutputLimit - sinks[i]->size()));
      } else if (n == 0 || errno != EINTR) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (const auto& f : fds)
    if (f.fd >= 0) ::close(f.fd);
  while (::waitpid(pid, &result.status, 0) < 0 && errno == EINTR) {
  }
  return result;
}

}  // namespace tide::ipc
