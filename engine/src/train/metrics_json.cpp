#include <cmath>

#include <nlohmann/json.hpp>

#include "tide/engine/train/metrics.h"

namespace tide {

nlohmann::json to_json(const StepMetrics& m) {
  auto finite = [](double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); };
  nlohmann::json j = {
      {"step", m.step},
      {"total_steps", m.total_steps},
      {"loss", finite(m.loss)},
      {"grad_norm", finite(m.grad_norm)},
      {"lr", m.lr},
      {"tokens", m.tokens_seen},
      {"time", m.time},
      {"step_seconds", m.step_seconds},
      {"data_seconds", m.data_seconds},
      {"comm_seconds", m.comm_seconds},
      {"checkpoint_seconds", m.checkpoint_seconds},
      {"tokens_per_second", m.tokens_per_second},
      {"mfu", m.mfu},
      {"rss_mb", m.rss_mb},
      {"peak_rss_mb", m.peak_rss_mb},
      {"peak_gpu_mb", m.peak_gpu_mb},
      {"peak_host_tensor_mb", m.peak_host_tensor_mb},
      {"host_tensor_mb", m.host_tensor_mb},
      {"model_state_bytes", {{"params", m.param_bytes}, {"grads", m.grad_bytes}, {"optimizer", m.optimizer_bytes}}},
      {"comm_bytes", m.comm_bytes},
      {"transient_peak_bytes", m.transient_bytes}};
  if (m.skipped) j["skipped"] = true;
  if (m.loss_scale > 0) j["loss_scale"] = m.loss_scale;
  if (m.moe_balance) j["moe_balance"] = finite(*m.moe_balance);
  if (m.moe_max_load) j["moe_max_load"] = finite(*m.moe_max_load);
  if (m.moe_z) j["moe_z"] = finite(*m.moe_z);
  if (m.moe_dropped) j["moe_dropped"] = finite(*m.moe_dropped);
  if (!m.anomaly.empty()) j["anomaly"] = {{"kind", m.anomaly}, {"action", m.anomaly_action}};
  if (m.val_loss) j["val_loss"] = finite(*m.val_loss);
  if (!m.val_losses.empty()) {
    auto& by_name = j["val_losses"] = nlohmann::json::object();
    for (const auto& [name, loss] : m.val_losses) by_name[name] = finite(loss);
  }
  if (!m.changes.empty()) {
    auto& changes = j["changes"] = nlohmann::json::object();
    for (const auto& [field, value] : m.changes) changes[field] = nlohmann::json::parse(value);
  }
  return j;
}

nlohmann::json rank_figures(const StepMetrics& m) {
  return {{"step", m.step},
          {"step_seconds", m.step_seconds},
          {"data_seconds", m.data_seconds},
          {"comm_seconds", m.comm_seconds},
          {"checkpoint_seconds", m.checkpoint_seconds},
          {"rss_mb", m.rss_mb},
          {"peak_rss_mb", m.peak_rss_mb},
          {"peak_gpu_mb", m.peak_gpu_mb},
          {"peak_host_tensor_mb", m.peak_host_tensor_mb},
          {"host_tensor_mb", m.host_tensor_mb},
          {"comm_bytes", m.comm_bytes}};
}

}  // namespace tide
