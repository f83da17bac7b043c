#include "wake_pipe.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace tide::ipc {

WakePipe::WakePipe() {
  if (::pipe2(fds_, O_NONBLOCK | O_CLOEXEC) != 0)
    throw std::system_error(errno, std::generic_category(), "cannot make the controller's wake-up pipe");
}

WakePipe::~WakePipe() {
  ::close(fds_[0]);
  ::close(fds_[1]);
}

void WakePipe::wake() const noexcept {
  const int saved = errno;  // a signal handler must leave errno as it found it
  const char byte = 1;
  (void)!::write(fds_[1], &byte, 1);
  errno = saved;
}

void WakePipe::drain() const noexcept {
  char bytes[64];
  while (::read(fds_[0], bytes, sizeof bytes) > 0) {
  }
}

}  // namespace tide::ipc
