#include "plan_request.h"

#include <fmt/format.h>

#include "tide/ipc/protocol.h"

namespace tide::ipc {

namespace {
// The largest cluster planned: the planner visits every factorisation of the world, and
// a request must not hold the evaluator (and the submits behind it) for long.
constexpr int64_t kMaxWorld = 131072;

DeviceSpec requested_device(const nlohmann::json& cluster, int per_node,
                            const std::function<DeviceSpec(int)>& local_cpu) {
  if (!cluster.contains("device")) return local_cpu(per_node);
  const nlohmann::json& d = cluster["device"];
  if (d.is_object()) {
    try {
      return device_from_json(d);
    } catch (const std::exception& e) {
      throw ProtocolError(ErrorCode::bad_request, fmt::format("cluster.device: {}", e.what()));
    }
  }
  const std::string name = require_string(cluster, "device");
  if (name == "cpu") return local_cpu(per_node);
  try {
    return find_device(name);
  } catch (const std::exception& e) {
    throw ProtocolError(ErrorCode::bad_request, fmt::format("cluster.device: {}", e.what()));
  }
}
}  // namespace

PlanRequest parse_plan_request(const nlohmann::json& body, const std::function<DeviceSpec(int)>& local_cpu) {
  PlanRequest r;
  const nlohmann::json cluster =
      body.contains("cluster") ? require(body, "cluster", nlohmann::json::value_t::object) : nlohmann::json::object();
  r.cluster.nodes = static_cast<int>(optional_int(cluster, "nodes", 1, 1, kMaxWorld));
  r.cluster.devices_per_node = static_cast<int>(optional_int(cluster, "devices_per_node", 1, 1, 1024));
  if (static_cast<int64_t>(r.cluster.nodes) * r.cluster.devices_per_node > kMaxWorld)
    throw ProtocolError(ErrorCode::bad_request,
                        fmt::format("cluster: {} nodes x {} devices exceed the {} devices a plan covers",
                                    r.cluster.nodes, r.cluster.devices_per_node, kMaxWorld));
  r.cluster.device = requested_device(cluster, r.cluster.devices_per_node, local_cpu);
  if (body.contains("attention")) {
    const std::string kernel = require_string(body, "attention");
    if (kernel != "fused" && kernel != "materialized")
      throw ProtocolError(ErrorCode::bad_request,
                          fmt::format("attention '{}' is neither 'fused' nor 'materialized'", kernel));
    r.cluster.device.fused_attention = kernel == "fused";
  }
  if (body.contains("tp")) r.options.tp = static_cast<int>(optional_int(body, "tp", 1, 1, 1024));
  if (body.contains("pp")) r.options.pp = static_cast<int>(optional_int(body, "pp", 1, 1, 1024));
  if (body.contains("cp")) r.options.cp = static_cast<int>(optional_int(body, "cp", 1, 1, 1024));
  if (body.contains("ep")) r.options.ep = static_cast<int>(optional_int(body, "ep", 1, 1, 1024));
  if (body.contains("zero")) r.options.zero = static_cast<int>(optional_int(body, "zero", 0, 0, 3));
  r.options.max_micro_batch = optional_int(body, "max_micro_batch", r.options.max_micro_batch, 1, 1024);
  if (body.contains("offload"))
    r.options.allow_offload = require(body, "offload", nlohmann::json::value_t::boolean).get<bool>();
  if (body.contains("headroom")) {
    const nlohmann::json& h = body["headroom"];
    if (!h.is_number() || !(h.get<double>() >= 0.0 && h.get<double>() <= 0.9))
      throw ProtocolError(ErrorCode::bad_request,
                          fmt::format("'headroom' is {}: a fraction from 0 to 0.9 of device memory", h.dump()));
    r.options.memory_headroom = h.get<double>();
  }
  r.top = static_cast<size_t>(optional_int(body, "top", 10, 1, 1000));
  return r;
}

}  // namespace tide::ipc
