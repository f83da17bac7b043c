#include "wake_pipe.h"

#include <gtest/gtest.h>
#include <poll.h>

namespace tide::ipc {
namespace {

bool readable(const WakePipe& w) {
  pollfd fd{w.read_fd(), POLLIN, 0};
  return ::poll(&fd, 1, 0) == 1 && (fd.revents & POLLIN);
}

TEST(WakePipe, AWakeIsSeenUntilDrainedAndAFullPipeNeverBlocksTheWaker) {
  WakePipe w;
  EXPECT_FALSE(readable(w));
  w.wake();
  EXPECT_TRUE(readable(w));
  w.drain();
  EXPECT_FALSE(readable(w));
  // More wakes than a pipe holds (64 KiB on Linux): the writes past it are dropped, not
  // waited on, and one drain takes them all.
  for (int i = 0; i < 100'000; ++i) w.wake();
  EXPECT_TRUE(readable(w));
  w.drain();
  EXPECT_FALSE(readable(w));
}

}  // namespace
}  // namespace tide::ipc
