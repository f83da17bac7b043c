#include "tide/worker/stop_signals.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

namespace tide::worker {
namespace {

volatile sig_atomic_t g_first_signal = 0;
std::atomic<bool> g_stop_taken{false};

void on_stop_signal(int sig) {
  if (g_first_signal != 0) {  // the second: end now, as the default action would
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  g_first_signal = sig;
  static const char kMessage[] =
      "\ntide: stopping at the next step boundary after a checkpoint; send the signal again to quit at once\n";
  const ssize_t ignored = ::write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
  (void)ignored;
}

}  // namespace

void install_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  // Slurm's warning before a time limit (sbatch --signal=USR1@SECONDS, scancel --signal=USR1).
  ::sigaction(SIGUSR1, &sa, nullptr);
}

int stop_signal() { return g_first_signal; }

std::string take_stop_command() {
  if (g_first_signal == 0 || g_stop_taken.exchange(true)) return "";
  return R"([{"op":"stop"}])";
}

}  // namespace tide::worker
