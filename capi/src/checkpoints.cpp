// Checkpoints: listing, and exports the engine runs in a child process.
#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "engine.h"

using json = nlohmann::json;
using tide::capi::Failure;
using tide::capi::require;
using tide::capi::require_text;

extern "C" {

void tide_export_options_init(tide_export_options* options) {
  const tide_export_options defaults = TIDE_EXPORT_OPTIONS_INIT;
  if (options) *options = defaults;
}

int tide_run_checkpoints(tide_engine* engine, const char* run_id, char** json_out) {
  return tide::capi::guarded("tide_run_checkpoints", [&] {
    require(json_out, "json_out");
    *json_out = nullptr;
    auto e = tide::capi::engines().get(engine, "engine");
    require_text(run_id, "run_id");
    *json_out = tide::capi::duplicate(e->request("checkpoints", {{"run", run_id}}).at("checkpoints").dump());
    return TIDE_OK;
  });
}

int tide_checkpoint_export(tide_engine* engine, const char* run_id, const char* out_dir,
                           const tide_export_options* options, char** export_json_out) {
  return tide::capi::guarded("tide_checkpoint_export", [&] {
    if (export_json_out) *export_json_out = nullptr;
    auto e = tide::capi::engines().get(engine, "engine");
    require_text(run_id, "run_id");
    require_text(out_dir, "out_dir");
    tide_export_options opt = TIDE_EXPORT_OPTIONS_INIT;
    if (options) {
      tide::capi::require_version(options->version, TIDE_EXPORT_OPTIONS_VERSION, "tide_export_options");
      // A caller built against an older header passes its shorter struct: only the fields
      // of its version are read.
      opt.step = options->step;
      opt.dtype = options->dtype;
      opt.timeout_ms = options->timeout_ms;
      if (options->version >= 2) opt.adapter = options->adapter;
    }
    if (opt.step < -1) throw Failure(TIDE_ERR_INVALID_ARGUMENT, fmt::format("step {} < -1", opt.step));
    if (opt.timeout_ms < -1)
      throw Failure(TIDE_ERR_INVALID_ARGUMENT, fmt::format("timeout_ms {} < -1", opt.timeout_ms));
    json body = {{"run", run_id}, {"out", out_dir}, {"dtype", opt.dtype ? opt.dtype : "F32"}};
    if (opt.step >= 0) body["step"] = opt.step;
    if (opt.adapter) body["adapter"] = true;
    json job = e->request("export", body).at("export");
    const std::string id = job.value("id", "");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(opt.timeout_ms);
    while (job.value("state", "") == "running" && opt.timeout_ms != 0 &&
           (opt.timeout_ms < 0 || std::chrono::steady_clock::now() < deadline)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      job = e->request("exports", {{"run", run_id}, {"export", id}}).at("export");
    }
    if (export_json_out) *export_json_out = tide::capi::duplicate(job.dump());
    const std::string state = job.value("state", "");
    if (state == "failed") throw Failure(TIDE_ERR_IO, fmt::format("{}: {}", id, job.value("error", "failed")));
    if (state == "running" && opt.timeout_ms != 0)
      throw Failure(TIDE_ERR_TIMEOUT, fmt::format("{} is still running after {} ms", id, opt.timeout_ms));
    return TIDE_OK;
  });
}

}  // extern "C"
