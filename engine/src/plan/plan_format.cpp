// The plan as JSON (docs/planner.md has the schema) and as the text `tide plan` prints.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tide/engine/config_schema.h"
#include "tide/engine/plan/plan.h"

namespace tide {

namespace {
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

nlohmann::json to_json(const PlanLayout& l) {
  return {{"dp", l.dp},
          {"tp", l.tp},
          {"pp", l.pp},
          {"cp", l.cp},
          {"cp_comm", l.cp_comm},
          {"ep", l.ep},
          {"zero", l.zero},
          {"offload", l.offload},
          {"activation_checkpointing", l.activation_checkpointing},
          {"recompute_blocks", l.recompute_blocks},
          {"sequence_parallel", l.sequence_parallel},
          {"schedule", l.schedule},
          {"virtual_stages", l.virtual_stages},
          {"micro_batch", l.micro_batch},
          {"micro_batches", l.micro_batches},
          {"describe", l.describe()}};
}

nlohmann::json to_json(const MemoryEstimate& m) {
  return {{"parameters", m.parameters},
          {"gradients", m.gradients},
          {"optimizer", m.optimizer},
          {"working_copy", m.working_copy},
          {"gathered", m.gathered},
          {"activations", m.activations},
          {"loss", m.loss},
          {"backward_transient", m.backward_transient},
          {"communication", m.communication},
          {"runtime", m.runtime},
          {"device", m.device},
          {"host", m.host},
          {"checkpoint", m.checkpoint},
          {"activations_by_block", m.activations_by_block},
          {"peak_stage", m.peak_stage},
          {"by_stage", m.by_stage}};
}

nlohmann::json to_json(const TimeEstimate& t) {
  return {{"compute", t.compute},
          {"recompute", t.recompute},
          {"elementwise", t.elementwise},
          {"tp_comm", t.tp_comm},
          {"cp_comm", t.cp_comm},
          {"ep_comm", t.ep_comm},
          {"dp_comm", t.dp_comm},
          {"pp_comm", t.pp_comm},
          {"bubble", t.bubble},
          {"optimizer", t.optimizer},
          {"step", t.step},
          {"tokens_per_second", t.tokens_per_second},
          {"mfu", t.mfu},
          {"dp_comm_total", t.dp_comm_total}};
}

// GiB: one decimal, three below one GiB (small models, CPU runs).
std::string gib(double bytes) {
  return bytes >= kGiB ? fmt::format("{:.1f}", bytes / kGiB) : fmt::format("{:.3f}", bytes / kGiB);
}
std::string seconds(double s) { return s >= 1 ? fmt::format("{:.2f} s", s) : fmt::format("{:.1f} ms", s * 1e3); }

std::string itemised(const LayoutPlan& p) {
  const auto& m = p.memory;
  const auto& t = p.time;
  std::string out = fmt::format(
      "  memory per rank (GiB, pipeline stage {}): parameters {} | gradients {} | optimizer {} | bf16 weights {} | "
      "ZeRO buffers {} | activations {} | loss {} | backward temporaries {} | receive buffers {} | runtime {} "
      "= {}",
      m.peak_stage, gib(m.parameters), gib(m.gradients), gib(m.optimizer), gib(m.working_copy), gib(m.gathered),
      gib(m.activations), gib(m.loss), gib(m.backward_transient), gib(m.communication), gib(m.runtime), gib(m.device));
  if (m.host > 0) out += fmt::format("; host (offload) {}", gib(m.host));
  out += fmt::format(
      "\n  step time: compute {} | recompute {} | elementwise {} | tp comm {} | {}{}dp comm {} (of {}, the rest "
      "overlapped) | pp comm {} | bubble {} | optimizer {} = {}\n",
      seconds(t.compute), seconds(t.recompute), seconds(t.elementwise), seconds(t.tp_comm),
      p.layout.cp > 1 ? fmt::format("cp comm {} | ", seconds(t.cp_comm)) : "",
      p.layout.ep > 1 ? fmt::format("ep comm {} | ", seconds(t.ep_comm)) : "", seconds(t.dp_comm),
      seconds(t.dp_comm_total), seconds(t.pp_comm), seconds(t.bubble), seconds(t.optimizer), seconds(t.step));
  out += fmt::format("  largest micro-batch that fits this layout: {}\n", p.largest_micro_batch);
  return out;
}
}  // namespace

nlohmann::json to_json(const LayoutPlan& p) {
  nlohmann::json j = {{"layout", to_json(p.layout)},
                      {"memory", to_json(p.memory)},
                      {"time", to_json(p.time)},
                      {"fits", p.fits},
                      {"largest_micro_batch", p.largest_micro_batch}};
  if (!p.reason.empty()) j["reason"] = p.reason;
  return j;
}

nlohmann::json to_json(const Plan& plan, size_t top) {
  nlohmann::json ranked = nlohmann::json::array(), rejected = nlohmann::json::array();
  for (size_t i = 0; i < plan.ranked.size() && i < top; ++i) ranked.push_back(to_json(plan.ranked[i]));
  for (const auto& p : plan.rejected) {
    nlohmann::json j = {{"layout", to_json(p.layout)}, {"reason", p.reason}};
    if (p.memory.device > 0) j["memory"] = to_json(p.memory);
    rejected.push_back(std::move(j));
  }
  nlohmann::json j = {{"schema", "tide.plan/1"},
                      {"recipe", plan.recipe},
                      {"parameters", plan.parameters},
                      {"active_parameters", plan.active_parameters},
                      {"flops_per_token", plan.flops_per_token},
                      {"compute", dtype_name(plan.compute)},
                      {"cluster",
                       {{"nodes", plan.cluster.nodes},
                        {"devices_per_node", plan.cluster.devices_per_node},
                        {"device", to_json(plan.cluster.device)}}},
                      {"layouts_that_fit", plan.ranked.size()},
                      {"ranked", std::move(ranked)},
                      {"rejected", std::move(rejected)}};
  if (plan.recipe_layout) {
    auto own = plan.recipe_layout->memory.device > 0 ? to_json(*plan.recipe_layout)
                                                     : nlohmann::json{{"reason", plan.recipe_layout->reason}};
    j["recipe_layout"] = std::move(own);
  }
  return j;
}

std::string format_plan(const Plan& plan, int top) {
  const auto& c = plan.cluster;
  const std::string active = plan.active_parameters < plan.parameters
                                 ? fmt::format(" ({:.2f}B a token)", static_cast<double>(plan.active_parameters) / 1e9)
                                 : "";
  std::string out = fmt::format("{}: {:.2f}B parameters{}, {} compute, on {} x {} {} ({}, {} GiB each)\n", plan.recipe,
                                static_cast<double>(plan.parameters) / 1e9, active, dtype_name(plan.compute), c.nodes,
                                c.devices_per_node, c.device.name, c.device.description, gib(c.device.memory_bytes));
  if (plan.ranked.empty()) {
    out += "no layout fits this cluster.\n";
  } else {
    out += fmt::format("{} layouts fit; the best {}:\n", plan.ranked.size(), std::min<size_t>(plan.ranked.size(), top));
    out += fmt::format("  {:>3}  {:<44} {:>9} {:>10} {:>12} {:>6}  {}\n", "#", "layout", "mem GiB", "step", "tokens/s",
                       "MFU", "");
    for (size_t i = 0; i < plan.ranked.size() && static_cast<int>(i) < top; ++i) {
      const auto& p = plan.ranked[i];
      out +=
          fmt::format("  {:>3}  {:<44} {:>9} {:>10} {:>12.0f} {:>5.1f}%  {}\n", i + 1, p.layout.describe(),
                      gib(p.memory.device), seconds(p.time.step), p.time.tokens_per_second, 100 * p.time.mfu, p.reason);
    }
    out += fmt::format("best: {}\n", plan.ranked.front().layout.describe());
    out += itemised(plan.ranked.front());
  }
  if (plan.recipe_layout) {
    const auto& own = *plan.recipe_layout;
    if (own.memory.device <= 0) {
      out += fmt::format("the recipe's layout cannot run here: {}\n", own.reason);
    } else {
      out += fmt::format("the recipe's layout, {}: {}\n", own.layout.describe(),
                         own.fits ? (own.reason.empty() ? "as fast as the best" : own.reason) : own.reason);
      out += itemised(own);
    }
  }
  if (!plan.rejected.empty()) {
    out += fmt::format("refused ({}):\n", plan.rejected.size());
    for (const auto& p : plan.rejected) {
      const auto& l = p.layout;
      const std::string name =
          l.dp > 0 ? fmt::format("dp{} tp{} pp{} zero{}", l.dp, l.tp, l.pp, l.zero) : fmt::format("tp{}", l.tp);
      out += fmt::format("  {:<24} {}\n", name, p.reason);
    }
  }
  return out;
}

}  // namespace tide
