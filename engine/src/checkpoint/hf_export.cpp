#include "tide/engine/checkpoint/hf_export.h"

#include <filesystem>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "tide/engine/checkpoint/checkpoint.h"
#include "tide/engine/config_schema.h"
#include "tide/engine/model/hf_convert.h"
#include "tide/engine/model/parameter_units.h"
#include "tide/engine/model/transformer.h"
#include "tide/engine/optim/adamw.h"
#include "tide/engine/optim/flat_parameters.h"
#include "tide/engine/train/run_files.h"

namespace tide {
namespace fs = std::filesystem;

void require_sound_checkpoint(const std::string& step_dir) {
  const auto problems = verify_checkpoint(step_dir);
  if (problems.empty()) return;
  for (const auto& p : problems) spdlog::error("{}", p);
  // The first problem in the message too: a daemon reports a child's last error line.
  throw std::runtime_error(fmt::format("checkpoint {} failed verification ({} problem{}; the first: {})", step_dir,
                                       problems.size(), problems.size() == 1 ? "" : "s", problems.front()));
}

void export_checkpoint_hf(const std::string& step_dir, const std::string& out, const std::string& dtype) {
  require_sound_checkpoint(step_dir);
  const RunConfig cfg = config_from_json(read_manifest(step_dir)["recipe"]);
  // One process's model: the checkpoint's pieces are joined whatever layout saved them.
  Transformer model(cfg.model);
  FlatParameters::Options layout;  // as one process trains it (parallelize.cpp)
  layout.unit_of = [units = parameter_unit_layout(cfg.model)](const std::string& name) { return units.unit_of(name); };
  FlatParameters flat(*model, cfg.optimizer, layout);
  AdamW optim(flat, cfg.optimizer);
  Checkpointer(fs::path(step_dir).parent_path().string(), CheckpointParts{&cfg, model.get(), &flat, &optim, nullptr})
      .load(step_dir);
  // The run's tokenizer, two levels up (<run>/checkpoints/step-N), completes the directory.
  export_hf(out, model, 0, dtype,
            tokenizer_beside(fs::absolute(step_dir).lexically_normal().parent_path().parent_path()));
}

}  // namespace tide
