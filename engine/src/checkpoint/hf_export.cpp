#include "tide/engine/checkpoint/hf_export.h"

#include <filesystem>
#include <functional>
#include <map>
#include <numeric>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "frozen_weights.h"
#include "saved_pieces.h"
#include "tide/engine/checkpoint/checkpoint.h"
#include "tide/engine/config_schema.h"
#include "tide/engine/io/safetensors.h"
#include "tide/engine/model/hf_convert.h"
#include "tide/engine/model/lora.h"
#include "tide/engine/model/parameter_names.h"
#include "tide/engine/model/transformer.h"
#include "tide/engine/train/initial_weights.h"
#include "tide/engine/train/run_files.h"

namespace tide {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
// The recipe a checkpoint was saved under, a LoRA run's base where the run found it
// (checkpoint.init_from as resolved then: an export from another directory reads it).
RunConfig recipe_of(const json& manifest) {
  RunConfig cfg = config_from_json(manifest["recipe"]);
  if (manifest.value("frozen_source", json(nullptr)).is_string())
    cfg.checkpoint.init_from = manifest["frozen_source"].get<std::string>();
  return cfg;
}
}  // namespace

void require_sound_checkpoint(const std::string& step_dir, const Progress& progress) {
  const auto problems = verify_checkpoint(step_dir, progress);
  if (problems.empty()) return;
  for (const auto& p : problems) spdlog::error("{}", p);
  // The first problem in the message too: a daemon reports a child's last error line.
  throw std::runtime_error(fmt::format("checkpoint {} failed verification ({} problem{}; the first: {})", step_dir,
                                       problems.size(), problems.size() == 1 ? "" : "s", problems.front()));
}

void export_checkpoint_hf(const std::string& step_dir, const std::string& out, const std::string& dtype,
                          const Progress& progress) {
  require_sound_checkpoint(step_dir, progress);
  const json manifest = read_manifest(step_dir);
  const RunConfig cfg = recipe_of(manifest);
  // Each parameter joined from the pieces of whatever layout saved it, as its turn to be
  // written comes: one whole parameter in memory at a time, not the model (and AdamW's
  // moments beside it).
  const SavedPieces pieces(step_dir, manifest);
  const TensorSource saved = [&](const std::string& name) { return pieces.whole(name, "param"); };
  // A LoRA checkpoint holds the adapters alone: the frozen base comes from the run's
  // initial weights again, checked against what the adapters were trained on, and the
  // adapters are merged into it.
  TensorSource whole = saved;
  if (cfg.model.lora_rank > 0) {
    const auto initial = initial_parameter_values(cfg);
    const Transformer shapes(cfg.model, TensorParallel{}, PipelineStage{}, ParameterStorage::Deferred);
    const auto frozen = frozen_parameter_names(*shapes);
    if (const std::string differs =
            fingerprint_difference(recorded_fingerprints(manifest), weights_fingerprints(frozen, initial), true);
        !differs.empty())
      throw std::runtime_error(fmt::format(
          "checkpoint {} holds LoRA adapters trained on other base weights than its run's initial weights ({}): {}",
          step_dir, cfg.checkpoint.init_from.empty() ? "the seed's draw" : cfg.checkpoint.init_from, differs));
    whole = merged_weights(cfg.model, [initial, saved](const std::string& name) {
      return is_lora_parameter(name) ? saved(name) : initial(name);
    });
  }
  const ModelConfig model = without_lora(cfg.model);
  const auto shapes = parameter_shapes(model);
  // Parameters are fetched in the order they are written: a fetch means every one before
  // it is on disk.
  std::map<std::string, int64_t> bytes_before;
  int64_t total = 0;
  const auto width = static_cast<int64_t>(safetensors_dtype_size(dtype));
  for (const auto& s : shapes) {
    bytes_before[s.name] = total;
    total += width * std::accumulate(s.shape.begin(), s.shape.end(), int64_t{1}, std::multiplies<>());
  }
  const auto report = [&](int64_t done) {
    if (progress) progress("writing", done, total);
  };
  // The run's tokenizer, two levels up (<run>/checkpoints/step-N), completes the directory.
  export_hf(
      out, model, shapes,
      [&](const std::string& name) {
        report(bytes_before.at(name));
        return whole(name);
      },
      0, dtype, tokenizer_beside(fs::absolute(step_dir).lexically_normal().parent_path().parent_path()));
  report(total);
}

void export_checkpoint_adapter(const std::string& step_dir, const std::string& out, const std::string& dtype,
                               const Progress& progress) {
  require_sound_checkpoint(step_dir, progress);
  const json manifest = read_manifest(step_dir);
  const RunConfig cfg = recipe_of(manifest);
  if (cfg.model.lora_rank == 0)
    throw std::runtime_error(
        fmt::format("checkpoint {} is of a run without LoRA adapters (model.lora_rank = 0): "
                    "export it whole, without --adapter",
                    step_dir));
  const SavedPieces pieces(step_dir, manifest);
  write_peft_adapter(
      out, cfg.model, [&](const std::string& name) { return pieces.whole(name, "param"); }, cfg.checkpoint.init_from,
      dtype);
}

}  // namespace tide
