#include "slurm_job.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "run_command.h"

namespace tide::ipc {
namespace fs = std::filesystem;

namespace {
constexpr auto kPollEvery = std::chrono::seconds(2);
// How long a scheduler command may take: slurmctld answers in milliseconds, a busy one
// in seconds; beyond this it is down, and the next poll asks again.
constexpr auto kCommandLimit = std::chrono::seconds(30);
// After a cancel, how long the job may go unconfirmed (slurmctld down) before the
// controller stops waiting for it.
constexpr auto kConfirmLimit = std::chrono::seconds(60);

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

bool slurm_state_is_final(const std::string& state) {
  for (const char* s : {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                        "BOOT_FAIL", "DEADLINE", "REVOKED", "GONE"})
    if (state == s) return true;
  return false;
}

std::string slurm_batch_script(const SlurmJobSpec& spec) {
  std::ostringstream s;
  const fs::path dir(spec.run_dir);
  s << "#!/bin/bash\n"
    << "# Written by tided and submitted with sbatch: one srun task per rank, each of which\n"
    << "# reads its place from Slurm's variables and connects back to tided\n"
    << "# (docs/multinode.md, \"tided on Slurm\"). Options on sbatch's command line win.\n"
    << "#SBATCH --job-name=" << spec.name << "\n"
    << "#SBATCH --output=" << (dir / "slurm-%j.out").string() << "\n"
    << "#SBATCH --open-mode=append\n"
    << "#SBATCH --ntasks=" << spec.ranks << "\n";
  if (!spec.working_dir.empty()) s << "#SBATCH --chdir=" << spec.working_dir << "\n";
  if (spec.gpus) {
    s << "#SBATCH --ntasks-per-node=" << std::min(spec.ranks, std::max(1, spec.gpus_per_node)) << "\n"
      << "#SBATCH --gpus-per-task=1\n";
  }
  if (spec.cpus_per_task > 0) s << "#SBATCH --cpus-per-task=" << spec.cpus_per_task << "\n";
  for (const auto& [k, v] : spec.env) s << "export " << k << "=" << shell_quote(v) << "\n";
  // srun does not inherit sbatch's --cpus-per-task since Slurm 22.05: say it again.
  s << "export SRUN_CPUS_PER_TASK=${SLURM_CPUS_PER_TASK:-1}\n";
  s << "exec srun --kill-on-bad-exit=1 --open-mode=append --output="
    << shell_quote((dir / "worker-rank%t.log").string()) << " " << shell_quote(spec.executable);
  for (const auto& a : spec.args) s << " " << shell_quote(a);
  s << "\n";
  return s.str();
}

void cancel_slurm_job(const std::string& id) {
  const std::vector<std::string> argv = {"scancel", "--full", id};
  const auto r = run_command(argv, kCommandLimit);
  if (!r.ok()) spdlog::warn("{}", r.describe(argv));
}

SlurmJob::SlurmJob(const SlurmJobSpec& spec) : ranks_(spec.ranks) {
  const std::string script = (fs::path(spec.run_dir) / "slurm-job.sh").string();
  {
    std::ofstream out(script, std::ios::trunc);
    out << slurm_batch_script(spec);
    if (!out) throw std::runtime_error(fmt::format("cannot write '{}'", script));
  }
  ::chmod(script.c_str(), 0700);
  std::vector<std::string> argv = {"sbatch", "--parsable"};
  argv.insert(argv.end(), spec.sbatch_args.begin(), spec.sbatch_args.end());
  argv.push_back(script);
  const auto r = run_command(argv, kCommandLimit);
  // --parsable prints "<job id>" or "<job id>;<cluster>".
  std::string out;
  std::istringstream(r.out) >> out;
  id_ = out.substr(0, out.find(';'));
  if (!r.ok() || id_.empty() || !std::all_of(id_.begin(), id_.end(), ::isdigit))
    throw std::runtime_error(r.ok() ? fmt::format("sbatch printed '{}', not a job id", out) : r.describe(argv));
  spdlog::info("{}: submitted as Slurm job {} ({} ranks)", spec.name, id_, spec.ranks);
  follower_ = std::thread([this] { follow(); });
}

SlurmJob::~SlurmJob() {
  bool ended = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    quit_ = true;
    ended = ended_;
  }
  wake_.notify_all();
  if (follower_.joinable()) follower_.join();
  if (!ended) cancel_slurm_job(id_);
}

void SlurmJob::observe(const std::string& line) {
  std::vector<std::string> fields;
  std::stringstream in(line);
  for (std::string f; std::getline(in, f, '|');) fields.push_back(f);
  fields.resize(3);
  const std::string &state = fields[0], &nodes = fields[1];
  reason_ = state == "PENDING" ? fields[2] : "";
  if (state != state_) spdlog::info("Slurm job {}: {}{}", id_, state, nodes.empty() ? "" : " on " + nodes);
  if (state == "RUNNING" && state_ != "RUNNING") running_since_ = Clock::now();
  state_ = state;
  if (!nodes.empty()) nodes_ = nodes;
  if (slurm_state_is_final(state)) ended_ = true;
}

void SlurmJob::follow() {
  bool warned = false;
  std::unique_lock<std::mutex> lock(mu_);
  while (!quit_ && !ended_) {
    const bool cancel = cancel_asked_ && !cancel_sent_, kill = kill_asked_ && !kill_sent_;
    cancel_sent_ = cancel_sent_ || cancel;
    kill_sent_ = kill_sent_ || kill;
    lock.unlock();
    if (cancel) cancel_slurm_job(id_);
    if (kill) {
      const std::vector<std::string> argv = {"scancel", "--full", "--signal=KILL", id_};
      if (const auto r = run_command(argv, kCommandLimit); !r.ok()) spdlog::warn("{}", r.describe(argv));
    }
    // -t all: a job that has ended still shows, with its final state, for MinJobAge.
    const std::vector<std::string> argv = {"squeue", "--noheader", "--states=all", "--jobs=" + id_,
                                           "--format=%T|%N|%r"};
    const auto r = run_command(argv, kCommandLimit);
    lock.lock();
    const std::string line = r.out.substr(0, r.out.find('\n'));  // one job: one line, no padding
    if (r.ok() && !line.empty()) {
      warned = false;
      observe(line);
    } else if ((r.ok() && line.empty()) || r.err.find("Invalid job id") != std::string::npos) {
      observe("GONE");  // purged from slurmctld's memory: ended long ago
    } else if (!warned) {
      warned = true;
      spdlog::warn("Slurm job {}: no state from the scheduler: {}", id_, r.describe(argv));
    }
    if (!ended_ && Clock::now() > give_up_at_) {
      spdlog::warn("Slurm job {}: cancelled {} s ago and still not confirmed ended; no longer waiting for it", id_,
                   std::chrono::duration_cast<std::chrono::seconds>(kConfirmLimit).count());
      ended_ = true;
    }
    if (!ended_)
      wake_.wait_for(lock, kPollEvery,
                     [this] { return quit_ || (cancel_asked_ && !cancel_sent_) || (kill_asked_ && !kill_sent_); });
  }
}

std::vector<std::string> SlurmJob::reap() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!ended_ || reported_) return {};
  reported_ = true;
  if (state_ == "COMPLETED") return {};
  return {fmt::format("Slurm job {} ended {}{}", id_, state_, nodes_.empty() ? "" : " on " + nodes_)};
}

bool SlurmJob::all_ended() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ended_;
}

std::map<int, RunExecutor::LiveRank> SlurmJob::live() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<int, LiveRank> out;
  if (ended_ || state_ != "RUNNING") return out;
  for (int rank = 0; rank < ranks_; ++rank)
    out[rank] = {fmt::format("Slurm job {} on {}", id_, nodes_), running_since_};
  return out;
}

void SlurmJob::terminate(std::chrono::milliseconds grace) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_ || cancel_asked_) return;
    cancel_asked_ = true;
    kill_at_ = Clock::now() + grace;
    give_up_at_ = kill_at_ + kConfirmLimit;
  }
  wake_.notify_all();
}

void SlurmJob::enforce_deadline() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_ || kill_asked_ || Clock::now() < kill_at_) return;
    kill_asked_ = true;
  }
  wake_.notify_all();
}

void SlurmJob::end(std::chrono::milliseconds grace) {
  terminate(grace);
  while (!all_ended()) {
    enforce_deadline();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void SlurmJob::describe(nlohmann::json& status) const { status["scheduler"] = scheduler(); }

nlohmann::json SlurmJob::scheduler() const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json j = {{"slurm_job", id_}, {"state", state_}};
  if (!nodes_.empty()) j["nodes"] = nodes_;
  if (!reason_.empty()) j["reason"] = reason_;
  return j;
}

}  // namespace tide::ipc
