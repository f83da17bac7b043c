// tide plan: memory and speed of every layout of a recipe on a cluster, ranked.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "tide/engine/plan/plan.h"
#include "tide/engine/train/local_device.h"
#include "tide/ipc/worker_group.h"
#include "tide/scripting/recipe.h"

namespace tide::cli {

namespace {
struct PlanArgs {
  std::vector<std::string> recipe, overrides;
  std::string device = "cpu", calibration, attention;
  int nodes = 1, per_node = 1, top = 10, tp = 0, pp = 0, cp = 0, ep = 0, zero = -1;
  int64_t max_micro_batch = 64;
  double headroom = 0;
  bool json = false, calibrate = false, no_offload = false;
};

void calibrate(const PlanArgs& a) {
  const std::string path = a.calibration.empty() ? default_calibration_path() : a.calibration;
  spdlog::info("calibrating this machine's CPU (matmul, a small model's forward and backward)");
  const nlohmann::json j = calibrate_local_cpu(ipc::free_loopback_port());
  std::filesystem::create_directories(std::filesystem::absolute(path).parent_path());
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << j.dump(2) << "\n";
    if (!out) throw std::runtime_error("cannot write " + tmp);
  }
  std::filesystem::rename(tmp, path);
  for (const auto& [threads, d] : j.at("by_threads").items())
    std::cout << fmt::format(
        "{} thread(s): fp32 matmul peak {:.1f} GFLOP/s, training-sized products at {:.0f}% of it; bf16 peak "
        "{:.1f} GFLOP/s, products at {:.0f}% of it; elementwise work at {:.2f} GB/s; {:.2f}x as fast beside idle "
        "ranks; loopback all-reduce {:.2f} GB/s after {:.0f} us\n",
        threads, d.at("fp32_flops").get<double>() / 1e9, 100 * d.at("matmul_efficiency").get<double>(),
        d.at("bf16_flops").get<double>() / 1e9, 100 * d.at("bf16_matmul_efficiency").get<double>(),
        d.at("memory_bandwidth").get<double>() / 1e9, d.at("idle_peer_speedup").get<double>(),
        d.at("intra_node_bandwidth").get<double>() / 1e9, d.at("collective_latency").get<double>() * 1e6);
  std::cout << "stored in " << path << "\n";
}
}  // namespace

void add_plan_command(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  auto* plan = app.add_subcommand(
      "plan", "Rank every layout of a recipe on a cluster by predicted speed, with memory per rank itemised");
  plan->add_option("recipe", a->recipe, "Recipe file or bundled name")->expected(0, 1);
  add_overrides(*plan, a->overrides);
  plan->add_option("--device", a->device,
                   "Device model: h100-80, h100-96, h200, a100-40, a100-80, l40s, cpu (this machine, measured), or a "
                   "JSON file describing one (docs/planner.md)")
      ->capture_default_str();
  plan->add_option("--attention", a->attention,
                   "Attention kernel to model: fused (flash / memory-efficient, tide's) or materialized (scores "
                   "written out: the math path, stacks before FlashAttention)")
      ->check(CLI::IsMember({"fused", "materialized"}));
  plan->add_option("--nodes", a->nodes, "Nodes")->check(CLI::Range(1, 100000))->capture_default_str();
  plan->add_option("--gpus-per-node,--nproc", a->per_node, "Devices (ranks) per node")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  plan->add_option("--top", a->top, "Layouts shown")->check(CLI::Range(1, 100000))->capture_default_str();
  plan->add_option("--tp", a->tp, "Only layouts with this tensor-parallel size")->check(CLI::Range(1, 1024));
  plan->add_option("--pp", a->pp, "Only layouts with this many pipeline stages")->check(CLI::Range(1, 1024));
  plan->add_option("--cp", a->cp,
                   "Only layouts with this context-parallel size (default: cp 1, or the smallest cp with which "
                   "a layout fits where none without it does)")
      ->check(CLI::Range(1, 1024));
  plan->add_option("--ep", a->ep,
                   "Only layouts with this expert-parallel size (a mixture of experts' experts over ep of the dp "
                   "ranks)")
      ->check(CLI::Range(1, 1024));
  plan->add_option("--zero", a->zero, "Only layouts with this ZeRO stage")->check(CLI::Range(0, 3));
  plan->add_option("--max-micro-batch", a->max_micro_batch, "Largest micro-batch tried")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  plan->add_option("--headroom", a->headroom, "Fraction of device memory kept free")
      ->check(CLI::Range(0.0, 0.9))
      ->capture_default_str();
  plan->add_flag("--no-offload", a->no_offload, "Never offload optimizer state");
  plan->add_flag("--json", a->json, "Print the plan as JSON (schema tide.plan/1, docs/planner.md)");
  plan->add_flag("--calibrate", a->calibrate, "Measure this machine (matmul, memory bandwidth) and store it");
  plan->add_option("--calibration", a->calibration, "Calibration file (default: ~/.cache/tide/calibration-cpu.json)");
  plan->callback([a] {
    if (a->calibrate) {
      calibrate(*a);
      if (a->recipe.empty()) return;
    }
    if (a->recipe.empty()) throw CLI::RequiredError("recipe");
    const Recipe r = Recipe::load_file(resolve_recipe_path(a->recipe.at(0)), a->overrides);
    Cluster cluster;
    cluster.nodes = a->nodes;
    cluster.devices_per_node = a->per_node;
    if (a->device == "cpu")
      cluster.device =
          local_cpu_device(a->calibration.empty() ? default_calibration_path() : a->calibration, a->per_node);
    else if (a->device.size() > 5 && a->device.compare(a->device.size() - 5, 5, ".json") == 0)
      cluster.device = device_from_file(a->device);
    else
      cluster.device = find_device(a->device);
    if (!a->attention.empty()) cluster.device.fused_attention = a->attention == "fused";
    PlanOptions options;
    options.max_micro_batch = a->max_micro_batch;
    options.allow_offload = !a->no_offload;
    options.memory_headroom = a->headroom;
    if (a->tp > 0) options.tp = a->tp;
    if (a->pp > 0) options.pp = a->pp;
    if (a->cp > 0) options.cp = a->cp;
    if (a->ep > 0) options.ep = a->ep;
    if (a->zero >= 0) options.zero = a->zero;
    Plan p = plan_layouts(r.config(), cluster, options);
    if (a->json) {
      std::cout << to_json(p, static_cast<size_t>(a->top)).dump(2) << std::endl;
    } else {
      std::cout << format_plan(p, a->top);
    }
    if (p.ranked.empty()) throw std::runtime_error("no layout of " + r.config().name + " fits the cluster");
  });
}

}  // namespace tide::cli
