#include "tide/engine/io/http_url.h"

#include <regex>
#include <stdexcept>

#include <fmt/format.h>

namespace tide {

HttpUrl parse_http_url(const std::string& url, const std::string& what) {
  static const std::regex form(R"(^(https?://([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?)(/\S*)?$)");
  std::smatch m;
  if (url.size() > 2048 || !std::regex_match(url, m, form))
    throw std::invalid_argument(fmt::format("{} '{}' is not an http:// or https:// URL", what, url));
  return {m[1].str(), m[4].matched ? m[4].str() : "/"};
}

}  // namespace tide
