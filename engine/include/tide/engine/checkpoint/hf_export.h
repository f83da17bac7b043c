// A checkpoint of any layout as Hugging Face files: safetensors + config.json, and the
// run's tokenizer when the checkpoint lies in a run directory. What `tide ckpt export`
// and a daemon's `export` request run.
#pragma once

#include <string>

#include "tide/engine/io/progress.h"

namespace tide {

// Verifies `step_dir` (every file's size and hash; a problem is logged and the export
// refused) and writes `out` in `dtype` (F32, BF16 or F16), each parameter joined from the
// pieces of whatever layout saved it as it is written: one parameter in memory at a time.
// `progress` hears ("verifying", bytes hashed, the checkpoint's bytes), then ("writing",
// bytes of the parameters written, all of theirs) before each parameter and at the end.
void export_checkpoint_hf(const std::string& step_dir, const std::string& out, const std::string& dtype,
                          const Progress& progress = {});

// The LoRA adapters of a checkpoint of a run with model.lora_rank > 0 (verified as
// above) as a PEFT adapter directory (lora.h: write_peft_adapter) in `dtype`; throws
// naming the checkpoint when its run has none.
void export_checkpoint_adapter(const std::string& step_dir, const std::string& out, const std::string& dtype,
                               const Progress& progress = {});

// Throws naming the checkpoint, how many problems verify_checkpoint found (each one
// logged at error) and the first of them. `progress`: verify_checkpoint's.
void require_sound_checkpoint(const std::string& step_dir, const Progress& progress = {});

}  // namespace tide
