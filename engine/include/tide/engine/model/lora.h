// LoRA adapters (model.lora_rank) as weights leave a run: merged into the projections
// they adapt, so that every reader of a plain model (eval, generate, Hugging Face,
// another run's checkpoint.init_from) takes them as they are.
#pragma once

#include <string>

#include "tide/engine/config.h"
#include "tide/engine/model/weights_io.h"

namespace tide {

// The model without adapters: what merged weights are the weights of.
ModelConfig without_lora(const ModelConfig& m);

// W + scale B A in fp32, for W [out, in], A [rank, in], B [out, rank].
at::Tensor merge_lora(const at::Tensor& weight, const at::Tensor& a, const at::Tensor& b, double scale);

// Each parameter of without_lora(m) from `source`, which gives m's parameters: a
// projection's weight merged with its adapter where m gives it one, the rest as they are.
TensorSource merged_weights(const ModelConfig& m, TensorSource source);

// A PEFT adapter directory, what PeftModel.from_pretrained(base, dir) reads:
// adapter_config.json (LoRA of m's rank, alpha and targets, no dropout, `base` as
// base_model_name_or_path where given) and adapter_model.safetensors, every adapter
// matrix of m from `adapters` under PEFT's name ("base_model.model." + tide's), in `dtype`
// (F32, BF16, F16).
void write_peft_adapter(const std::string& dir, const ModelConfig& m, const TensorSource& adapters,
                        const std::string& base, const std::string& dtype);

}  // namespace tide
