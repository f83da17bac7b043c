#include "tide/engine/parallel/launch_env.h"

#include <cerrno>
#include <cstdlib>
#include <initializer_list>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

namespace tide {
namespace {

// Throws std::invalid_argument saying what `v` should have been.
long parse_int(const std::string& v, long lo, long hi) {
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0 || x < lo || x > hi)
    throw std::invalid_argument(fmt::format("'{}' is not an integer in [{}, {}]", v, lo, hi));
  return x;
}

long env_int(const std::string& name, const std::string& v, long lo, long hi) {
  try {
    return parse_int(v, lo, hi);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("environment variable " + name + ": " + e.what());
  }
}

class Vars {
 public:
  explicit Vars(const EnvLookup& lookup) : lookup_(lookup) {}
  std::optional<std::string> get(const std::string& name) const {
    auto v = lookup_(name);
    if (v && v->empty()) return std::nullopt;  // VAR= is unset, as torchrun reads it
    return v;
  }
  bool has(const std::string& name) const { return get(name).has_value(); }
  // The first of `names` that is set, as (name, value).
  std::optional<std::pair<std::string, std::string>> first(std::initializer_list<const char*> names) const {
    for (const char* name : names)
      if (auto v = get(name)) return std::make_pair(std::string(name), *v);
    return std::nullopt;
  }
  int integer(const std::string& name, int fallback, int lo, int hi) const {
    const auto v = get(name);
    return v ? static_cast<int>(env_int(name, *v, lo, hi)) : fallback;
  }

 private:
  const EnvLookup& lookup_;
};

// parse(value) of a variable (name, value), its error prefixed with both.
template <class Parse>
auto parse_var(const std::pair<std::string, std::string>& var, Parse parse) {
  try {
    return parse(var.second);
  } catch (const std::invalid_argument& err) {
    throw std::invalid_argument(fmt::format("environment variable {}='{}': {}", var.first, var.second, err.what()));
  }
}

// MASTER_ADDR and MASTER_PORT, which every launcher honours.
void read_master(const Vars& vars, LaunchEnv& e) {
  if (auto a = vars.get("MASTER_ADDR")) e.master_addr = *a;
  e.master_port = vars.integer("MASTER_PORT", e.master_port, 1, 65535);
}

LaunchEnv from_world_size(const Vars& vars) {
  LaunchEnv e;
  e.world = vars.integer("WORLD_SIZE", 1, 1, 1 << 20);
  if (vars.has("RANK")) {
    e.rank = vars.integer("RANK", 0, 0, e.world - 1);
    e.launcher = "WORLD_SIZE and RANK";
  } else {
    e.rank = vars.integer("JOB_COMPLETION_INDEX", 0, 0, e.world - 1);
    e.launcher = vars.has("JOB_COMPLETION_INDEX") ? "WORLD_SIZE and JOB_COMPLETION_INDEX (a Kubernetes Indexed Job)"
                                                  : "WORLD_SIZE";
  }
  e.local_world = vars.integer("LOCAL_WORLD_SIZE", 1, 1, e.world);
  // Without LOCAL_RANK: the rank's place on its host where LOCAL_WORLD_SIZE says how many
  // share it, else the rank (a pod per rank sees one GPU, which takes any local rank).
  e.local_rank =
      vars.integer("LOCAL_RANK", vars.has("LOCAL_WORLD_SIZE") ? e.rank % e.local_world : e.rank, 0, e.world - 1);
  read_master(vars, e);
  return e;
}

LaunchEnv from_srun(const Vars& vars) {
  LaunchEnv e;
  if (const auto n = vars.first({"SLURM_NTASKS", "SLURM_STEP_NUM_TASKS"}))
    e.world = static_cast<int>(env_int(n->first, n->second, 1, 1 << 20));
  e.rank = vars.integer("SLURM_PROCID", 0, 0, e.world - 1);
  e.local_rank = vars.integer("SLURM_LOCALID", 0, 0, e.world - 1);
  const int node = vars.integer("SLURM_NODEID", 0, 0, e.world - 1);
  if (const auto v = vars.first({"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}))
    e.local_world = parse_var(*v, [node](const std::string& list) { return slurm_tasks_on_node(list, node); });
  if (const auto v = vars.first({"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"}))
    e.master_addr = parse_var(*v, first_host_of_slurm_nodelist);
  e.launcher = "srun";
  if (const auto job = vars.get("SLURM_JOB_ID")) {
    e.master_port = slurm_default_master_port(env_int("SLURM_JOB_ID", *job, 0, 1L << 62));
    e.launcher += " (Slurm job " + *job + ")";
  }
  read_master(vars, e);
  return e;
}

}  // namespace

std::optional<LaunchEnv> launch_env_from(const EnvLookup& lookup) {
  const Vars vars(lookup);
  if (vars.has("WORLD_SIZE")) return from_world_size(vars);
  // A task of an srun step. A batch script's shell also has SLURM_PROCID and SLURM_NTASKS
  // but no step id: a `tide train` it runs directly is one process, not rank 0 of many.
  if (vars.has("SLURM_PROCID") && vars.has("SLURM_STEP_ID")) return from_srun(vars);
  return std::nullopt;
}

std::optional<LaunchEnv> launch_env_from_environment() {
  return launch_env_from([](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    return v ? std::optional<std::string>(v) : std::nullopt;
  });
}

std::string first_host_of_slurm_nodelist(const std::string& nodelist) {
  // A host list is comma-separated entries, each a name whose bracketed groups ("[007-010,12]")
  // list numbers; the first host takes each group's first number, as written (zero padding kept).
  std::string host;
  size_t i = 0;
  while (i < nodelist.size() && nodelist[i] != ',') {
    if (nodelist[i] == ']') throw std::invalid_argument("']' without '['");
    if (nodelist[i] != '[') {
      host += nodelist[i++];
      continue;
    }
    const size_t close = nodelist.find(']', i);
    if (close == std::string::npos) throw std::invalid_argument("'[' without ']'");
    const std::string group = nodelist.substr(i + 1, close - i - 1);
    const std::string first = group.substr(0, group.find_first_of("-,"));
    if (first.empty() || first.find_first_not_of("0123456789") != std::string::npos)
      throw std::invalid_argument("'[" + group + "]' does not start with a number");
    host += first;
    i = close + 1;
  }
  if (host.empty()) throw std::invalid_argument("no host in the list");
  return host;
}

int slurm_tasks_on_node(const std::string& tasks_per_node, int node) {
  // "2(x3),1": 2 tasks on each of 3 nodes, then 1.
  int first_node = 0;
  size_t i = 0;
  while (i < tasks_per_node.size()) {
    const size_t end = tasks_per_node.find(',', i);
    const std::string entry = tasks_per_node.substr(i, end == std::string::npos ? std::string::npos : end - i);
    const size_t paren = entry.find("(x");
    const long tasks = parse_int(entry.substr(0, paren), 1, 1 << 20);
    long repeat = 1;
    if (paren != std::string::npos) {
      if (entry.back() != ')') throw std::invalid_argument("'" + entry + "' is not N or N(xK)");
      repeat = parse_int(entry.substr(paren + 2, entry.size() - paren - 3), 1, 1 << 20);
    }
    if (node < first_node + repeat) return static_cast<int>(tasks);
    first_node += static_cast<int>(repeat);
    if (end == std::string::npos) break;
    i = end + 1;
  }
  throw std::invalid_argument(fmt::format("no entry for node {} (the list covers {} nodes)", node, first_node));
}

int slurm_default_master_port(long job_id) { return 20000 + static_cast<int>(job_id % 10000); }

int cuda_device_of_local_rank(int local_rank, int gpus, bool share_gpus) {
  if (gpus < 1) throw std::invalid_argument("no CUDA device is visible");
  if (share_gpus) return local_rank % gpus;
  if (local_rank < gpus) return local_rank;
  if (gpus == 1) return 0;  // a device of its own (CUDA_VISIBLE_DEVICES names one)
  throw std::invalid_argument(
      fmt::format("this is local rank {} but {} GPUs are visible; NCCL needs a GPU per rank", local_rank, gpus));
}

}  // namespace tide
