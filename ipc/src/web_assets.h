// The dashboard's pages, scripts and styles (ipc/web), compiled into tided at build time
// by cmake/EmbedWeb.cmake: tided serves them from memory and fetches nothing at run time.
#pragma once

#include <string_view>
#include <vector>

namespace tide::ipc {

struct WebAsset {
  std::string_view path;  // the URL path it is served at: "/", "/assets/app.js"
  std::string_view content_type;
  std::string_view bytes;
};

const std::vector<WebAsset>& web_assets();

}  // namespace tide::ipc
