// What a parameter's Hugging Face name says about where it sits, and the units of the
// flat buffers (flat_parameters.h) that follow from it (no LibTorch).
#pragma once

#include <cstdint>
#include <string>

#include "tide/engine/config.h"

namespace tide {

// 1 + the block index for names with a block path ("model.layers.3." /
// "transformer.h.3."), else 0.
int block_unit(const std::string& parameter_name);

// The final norm and the output head ("model.norm.", "transformer.ln_f.", "lm_head.weight").
bool is_head_parameter(const std::string& parameter_name);

// A LoRA adapter's matrix ("....q_proj.lora_A.weight", "....lora_B.weight").
bool is_lora_parameter(const std::string& parameter_name);

// The expert a parameter of a mixture of experts' experts belongs to, its index in the
// block (5 for "model.layers.3.mlp.experts.5.up_proj.weight"); -1 for any other
// parameter, the router ("....mlp.gate.weight") included. Expert parallelism spreads
// the experts over ranks.
int64_t expert_index(const std::string& parameter_name);
inline bool is_expert_parameter(const std::string& parameter_name) { return expert_index(parameter_name) >= 0; }

// A block's routing biases ("....mlp.expert_bias", model.moe_expert_bias): a buffer,
// not a parameter, which weight files and checkpoints carry beside the parameters.
bool is_expert_bias(const std::string& name);

// Whether a name ends with `suffix` (".bias", ".lora_B.weight").
bool ends_with(const std::string& name, const std::string& suffix);

// The name of the block module a parameter belongs to, its adapter's included ("q_proj"
// for "model.layers.3.self_attn.q_proj.lora_A.weight", "dense" for BLOOM's
// "transformer.h.0.self_attention.dense.bias"); empty outside the blocks.
std::string block_module_of(const std::string& parameter_name);

// The model's parameters in units that are used together, each padded in the flat
// buffers, reduce-scattered as one under ZeRO-2/3 and gathered as one under ZeRO-3:
//   unit 0            the embeddings (tokens, learned positions, BLOOM's embedding norm);
//   unit 1 + i        block i;
//   unit n_layers + 1 the final norm and the output head, where the head has its own
//                     weight. Tied, the head's weight is the embedding, so the final norm
//                     joins unit 0.
// The head is a unit of its own so that ZeRO-3 holds neither the embedding nor the head
// through a micro-batch's blocks (as torchtitan shards them apart): for an 8B LLaMA each
// is half a billion parameters, twice a block.
struct ParameterUnitLayout {
  int64_t n_layers = 0;
  bool tied = false;  // the head reads the embedding
  bool embedding_norm = false;

  int unit_of(const std::string& parameter_name) const;
  int head() const { return tied ? 0 : static_cast<int>(n_layers) + 1; }
  int last_block() const { return static_cast<int>(n_layers); }
  int count() const { return static_cast<int>(n_layers) + (tied ? 1 : 2); }
  // Whether a forward reads unit 0 after the token lookup (the tied head) or its backward
  // does (the embedding norm). The lookup's own backward needs only the table's shape.
  bool embeddings_read_after_lookup() const { return tied || embedding_norm; }
};

ParameterUnitLayout parameter_unit_layout(const ModelConfig& m);

}  // namespace tide
