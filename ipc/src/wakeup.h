// Ends a poll's wait at once: an eventfd polled beside a loop's sockets. The controller's
// loop is woken by stop() (from a signal handler too) and by a finished recipe evaluation;
// a worker link's thread by a message to send. Without it they waited for the poll's
// next timeout.
#pragma once

namespace tide::ipc {

class Wakeup {
 public:
  // Throws std::system_error (naming `what`) when no eventfd can be made.
  explicit Wakeup(const char* what);
  ~Wakeup();
  Wakeup(const Wakeup&) = delete;
  Wakeup& operator=(const Wakeup&) = delete;

  // Readable (POLLIN) from a wake() until the next drain().
  int fd() const { return fd_; }
  // Thread-safe and async-signal-safe. Never blocks: a counter at its maximum is already
  // readable, so the write that fails then loses nothing.
  void wake() const noexcept;
  // Takes every wake-up so far.
  void drain() const noexcept;

 private:
  int fd_ = -1;
};

}  // namespace tide::ipc
