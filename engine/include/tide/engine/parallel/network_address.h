// Which of this host's addresses its peers can reach it at.
#pragma once

#include <string>

namespace tide {

// The local address the kernel routes from when sending to `host` (a name or an IPv4 or
// IPv6 literal): the interface that faces the job's rendezvous, which is what the other
// hosts can connect back to. A loopback rendezvous gives the loopback address. No packet
// is sent. Throws std::runtime_error naming `host` when it does not resolve or no route
// leads there.
std::string local_address_toward(const std::string& host);

}  // namespace tide
