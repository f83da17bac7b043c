// The part of the model one rank holds (one tensor-parallel slice of one pipeline
// stage), in the terms the memory and time models need: local widths, the elements of
// each flat-buffer unit, the matmul weights. It mirrors TransformerImpl's constructor
// (layers.cpp, transformer.cpp): a test compares it with the real model's buffers.
#pragma once

#include <cstdint>
#include <vector>

#include "tide/engine/config.h"
#include "tide/engine/model/pipeline_stage.h"

namespace tide::plan {

struct RankModel {
  int64_t dim = 0, head_dim = 0;
  int64_t heads = 0;     // query heads of this rank
  int64_t kv_heads = 0;  // key/value heads this rank computes (1 when fewer than tp: held whole, one used)
  int64_t ffn = 0;       // MLP width of this rank
  int64_t vocab = 0;     // rows of this rank's embedding / output slice (padded vocabulary / tp)
  int64_t blocks = 0;    // blocks of this stage
  std::vector<int64_t> layers;  // their places in the model (from 0), for what each attends to
  bool first = true, last = true;
  int64_t block_elements = 0;    // parameters of one block on this rank (its experts included)
  int64_t block_matmul = 0;      // of which matmul weights
  // The weights a token of this rank is multiplied by in one block: the matmul weights,
  // and under a mixture of experts the router's and its top k experts' instead of all.
  int64_t block_token_weights = 0;
  // Of a block's elements, those ZeRO-3 gathered in bf16 widens to fp32: all but the
  // weights read only as their working copy (transformer.h: weights_read_in_compute_dtype),
  // so norms, biases, and key/value weights held whole under tensor parallelism.
  int64_t block_widened = 0;
  int64_t outside_elements = 0;  // unit 0: the embeddings, and (tied) the final norm
  int64_t head_elements = 0;     // the head's own unit (untied, last stage): final norm and head
  int64_t head_matmul = 0;       // the output projection's weight (last stage), tied or not
  // A mixture of experts (model.moe_experts; moe_layer.cpp): each block's router, whole
  // on every rank and read in fp32, and this rank's experts, E / ep of them, each split
  // over tp as a dense MLP is. Under expert parallelism (ep > 1) the experts sit in flat
  // buffers of their own (parallelize.cpp), a unit per block: expert_units. A shared
  // expert (split over tp) and its gate are the rest's, as a dense MLP's.
  int64_t experts = 0;          // this rank's experts in a block
  int64_t top_k = 0;            // the experts a token goes through
  // Those of its choices a token keeps on average at even routing: top_k, times
  // model.moe_capacity_factor where a factor under 1 drops the rest.
  double kept_choices = 0;
  int64_t expert_elements = 0;  // one expert's elements on this rank
  int64_t expert_matmul = 0;    // of which matmul weights
  int64_t router = 0;           // the router's weight
  int64_t shared_ffn = 0;       // the shared expert's width on this rank (model.moe_shared_ffn_dim / tp)
  bool experts_apart = false;   // ep > 1

  int64_t block_expert_elements() const { return experts * expert_elements; }

  // Elements of each flat-buffer unit, each padded to a multiple of pad_to (FlatParameters):
  // unit 0 first, then this stage's blocks (without their experts where they are apart),
  // then the head's own unit where there is one.
  std::vector<int64_t> units(int64_t pad_to) const;
  int64_t padded_elements(int64_t pad_to) const;
  int64_t largest_block_unit(int64_t pad_to) const;
  // The experts' own flat buffer where they are apart (else empty): an empty unit 0, then
  // each block's experts, padded to a multiple of pad_to (the ranks holding the same experts).
  std::vector<int64_t> expert_units(int64_t pad_to) const;
  int64_t expert_padded_elements(int64_t pad_to) const;
  int64_t expert_block_unit(int64_t pad_to) const;
};

RankModel rank_model(const ModelConfig& m, int64_t tp, const PipelineStage& stage, int64_t ep = 1);

}  // namespace tide::plan
