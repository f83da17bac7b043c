// An http:// or https:// URL that tide sends to (an alert webhook), checked before use.
#pragma once

#include <string>

namespace tide {

struct HttpUrl {
  std::string origin;  // "https://hooks.example.com:8443": scheme, host and port
  std::string path;    // "/services/T0/B0" ("/" when none), with any query
};

// scheme://host[:port][/path], the host a name, an IPv4 address or a bracketed IPv6 one,
// 2048 characters at most. Throws std::invalid_argument naming `what` and the URL.
HttpUrl parse_http_url(const std::string& url, const std::string& what);

}  // namespace tide
