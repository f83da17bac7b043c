// tided's state in the Prometheus text exposition format (GET /metrics): built at each
// scrape from the same `info` and `list` replies a client gets, and written out by
// prometheus-cpp's serializer (names, labels and escaping as Prometheus parses them).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace tide::ipc {

// info: the `info` reply's body; runs: the `list` reply's "runs".
std::string prometheus_text(const nlohmann::json& info, const nlohmann::json& runs);

}  // namespace tide::ipc
