// The address a rank gives its peers: the one facing the rendezvous host.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>

#include <set>
#include <string>

#include <gtest/gtest.h>

#include "tide/engine/parallel/network_address.h"

namespace tide {
namespace {

// This host's IPv4 addresses on interfaces that are up and not loopback.
std::set<std::string> outward_ipv4_addresses() {
  std::set<std::string> out;
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return out;
  for (const ifaddrs* i = all; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK))
      continue;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text);
    out.insert(text);
  }
  ::freeifaddrs(all);
  return out;
}

TEST(NetworkAddress, ALoopbackRendezvousIsReachedOverLoopback) {
  EXPECT_EQ(local_address_toward("127.0.0.1"), "127.0.0.1");
}

TEST(NetworkAddress, AnOutwardRendezvousIsReachedFromAnOutwardInterface) {
  const auto own = outward_ipv4_addresses();
  if (own.empty()) GTEST_SKIP() << "skipped: this host has no IPv4 interface but loopback";
  // Each of this host's own addresses routes from itself, never from loopback, which is
  // what a peer on another host must be told.
  for (const auto& a : own) EXPECT_EQ(local_address_toward(a), a);
}

TEST(NetworkAddress, AnUnknownHostIsNamedInTheError) {
  try {
    local_address_toward("no-such-host.invalid");
    FAIL() << "resolved a name under .invalid";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("'no-such-host.invalid' does not resolve"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tide
