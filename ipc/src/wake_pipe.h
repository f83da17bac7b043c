// A self-pipe that ends the controller loop's wait at once: stop() (from a signal
// handler too) and a finished recipe evaluation write to it, the loop polls its read end
// beside its sockets. Without it they waited for the loop's next tick.
#pragma once

namespace tide::ipc {

class WakePipe {
 public:
  WakePipe();  // throws std::system_error when no pipe can be made
  ~WakePipe();
  WakePipe(const WakePipe&) = delete;
  WakePipe& operator=(const WakePipe&) = delete;

  int read_fd() const { return fds_[0]; }
  // Async-signal-safe; a full pipe already holds a wake-up, so a write that would block
  // is dropped.
  void wake() const noexcept;
  // Takes every byte written so far.
  void drain() const noexcept;

 private:
  int fds_[2] = {-1, -1};
};

}  // namespace tide::ipc
