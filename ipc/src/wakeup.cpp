#include "wakeup.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <system_error>

namespace tide::ipc {

Wakeup::Wakeup(const char* what) : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (fd_ < 0)
    throw std::system_error(errno, std::generic_category(), std::string("cannot make the eventfd of ") + what);
}

Wakeup::~Wakeup() { ::close(fd_); }

void Wakeup::wake() const noexcept {
  const int saved = errno;  // a signal handler must leave errno as it found it
  const uint64_t one = 1;
  (void)!::write(fd_, &one, sizeof one);
  errno = saved;
}

void Wakeup::drain() const noexcept {
  uint64_t count = 0;
  (void)!::read(fd_, &count, sizeof count);  // an eventfd's read takes the whole counter
}

}  // namespace tide::ipc
