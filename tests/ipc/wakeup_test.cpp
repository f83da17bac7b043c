#include "wakeup.h"

#include <gtest/gtest.h>
#include <poll.h>

#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

namespace tide::ipc {
namespace {

bool readable(const Wakeup& w) {
  pollfd fd{w.fd(), POLLIN, 0};
  return ::poll(&fd, 1, 0) == 1 && (fd.revents & POLLIN);
}

TEST(Wakeup, AWakeIsSeenUntilDrainedFromAnyThread) {
  Wakeup w("a test");
  EXPECT_FALSE(readable(w));
  w.wake();
  EXPECT_TRUE(readable(w));
  w.drain();
  EXPECT_FALSE(readable(w));
  // Many wakes from several threads: one drain takes them all.
  std::vector<std::thread> wakers;
  for (int t = 0; t < 4; ++t)
    wakers.emplace_back([&w] {
      for (int i = 0; i < 10'000; ++i) w.wake();
    });
  for (auto& t : wakers) t.join();
  EXPECT_TRUE(readable(w));
  w.drain();
  EXPECT_FALSE(readable(w));
}

TEST(Wakeup, ACounterAtItsMaximumNeitherBlocksTheWakerNorLosesTheWakeup) {
  Wakeup w("a test");
  // An eventfd's counter holds at most 2^64 - 2; bring it there in one write.
  const uint64_t most = std::numeric_limits<uint64_t>::max() - 1;
  ASSERT_EQ(::write(w.fd(), &most, sizeof most), static_cast<ssize_t>(sizeof most));
  w.wake();  // would block on a blocking eventfd; here it fails at once
  EXPECT_TRUE(readable(w));
  w.drain();
  EXPECT_FALSE(readable(w));
}

}  // namespace
}  // namespace tide::ipc
