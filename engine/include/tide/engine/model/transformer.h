// One decoder-only transformer whose parts are chosen by ModelConfig. LLaMA and BLOOM
// are presets of it. Parameter names follow the Hugging Face layout of the family so
// that weights round-trip (`model.layers.0.self_attn.q_proj.weight`,
// `transformer.h.0.self_attention.query_key_value.weight`).
//
// Shape legend: B = batch, T = time (sequence), D = model dim, H = query heads,
// K = key/value heads, Hd = head dim (D / H), F = MLP hidden, V = vocabulary.
#pragma once

#include <set>
#include <string>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include "tide/engine/config.h"
#include "tide/engine/model/attention_masks.h"
#include "tide/engine/model/context_parallel.h"
#include "tide/engine/model/fused_ops.h"
#include "tide/engine/model/pipeline_stage.h"
#include "tide/engine/model/tensor_parallel.h"

namespace tide {

class ParameterUnits;

// RMSNorm (weight) or LayerNorm (weight, bias); normalises in fp32. Zero-centred, it
// multiplies by 1 + weight (ModelConfig::norm_zero_centered). With sequence parallelism
// (`tp` given) each rank normalises its part of the sequence, so the weight's gradient is
// summed over the tensor-parallel group.
class NormImpl : public torch::nn::Module {
 public:
  NormImpl(NormKind kind, int64_t dim, double eps, bool zero_centered,
           std::shared_ptr<TensorParallelGroup> sequence_parallel = nullptr);
  torch::Tensor forward(const torch::Tensor& x);
  void reset_parameters();

  // The parameters as a step uses them: 1 + weight where zero-centred; with sequence
  // parallelism through copy_to, since each rank saw part of the sequence and their
  // gradients are summed over ranks.
  NormWeights step_weights() const;

  torch::Tensor weight, bias;

 private:
  NormKind kind_;
  double eps_;
  bool zero_centered_;
  std::shared_ptr<TensorParallelGroup> sequence_parallel_;
};
TORCH_MODULE(Norm);

// What a projection's LoRA adapter is: its rank (0: none) and lora_alpha.
struct LoraShape {
  int64_t rank = 0;
  double alpha = 0;
  double dropout = 0;  // on the adapter's input, while training
};

// A linear layer's weight [out, in] and optional bias [out], allocated and not
// initialised (the model's reset_parameters / initialise_parameter give every value), so
// that building a model costs no random draws and a deferred one (ParameterStorage) no
// work at all. forward is x W^T + b through `projection` (fused_ops.h), plus the LoRA
// adapter's update where it has one.
class ProjectionImpl : public torch::nn::Module {
 public:
  ProjectionImpl(int64_t in, int64_t out, bool bias, LoraShape lora = {});
  torch::Tensor forward(const torch::Tensor& x) const;

  bool adapted() const { return lora_a.defined(); }
  // The adapter's update of the output, scale (x A^T) B^T, from a = x A^T: the layers
  // compute a beside the projection's own product (normed_projections) and add this.
  // b: the B this rank's step reads (under tensor parallelism a view of lora_b whose
  // gradient is summed over the ranks); lora_b where undefined.
  torch::Tensor lora_update(const torch::Tensor& a, const torch::Tensor& b = {}) const;
  // The adapter's update of the output from the projection's input x.
  torch::Tensor lora_update_of_input(const torch::Tensor& x) const;
  // Whether A reads its input with elements dropped (model.lora_dropout, while training).
  bool drops_adapter_input() const { return adapted() && lora_dropout > 0 && is_training(); }
  // What A reads of the layer's input x: x, or under drops_adapter_input x with each
  // element dropped with probability lora_dropout and the rest scaled by 1 / (1 - p), as
  // PEFT's lora_dropout does. x may be part `part` of `parts` equal parts of the input's
  // last dimension (a row-parallel layer's columns): the mask is drawn for the whole
  // input and this part's columns kept, so that tensor-parallel ranks, whose generators
  // draw in step, draw one process's mask.
  torch::Tensor adapter_input(const torch::Tensor& x, int64_t part = 0, int64_t parts = 1) const;

  torch::Tensor weight, bias;
  // LoRA's A [rank, in] and B [out, rank], parameters `lora_A.weight` and `lora_B.weight`
  // (PEFT's names); undefined without an adapter.
  torch::Tensor lora_a, lora_b;
  double lora_scale = 0;  // lora_alpha / rank
  double lora_dropout = 0;
};
TORCH_MODULE(Projection);

// What attention or the MLP reads: a tensor as it is, or the residual stream and the norm
// before the layer, which the layer's projections apply themselves so that the norm's
// output is not kept for backward (fused_ops.h: normed_projections).
struct LayerInput {
  LayerInput(const torch::Tensor& x) : x(x) {}  // implicit: a tensor is read as it is
  LayerInput(const torch::Tensor& residual, NormImpl& norm, bool onto_residual = false)
      : x(residual), norm(&norm), onto_residual(onto_residual) {}

  torch::Tensor x;
  NormImpl* norm = nullptr;
  // The layer returns x + its output, the block's residual add, with x handed on by the
  // layer's normed_projections node: the stream's gradient then joins the norm's in the
  // norm's backward pass instead of in an add of autograd's (fused_ops.h).
  bool onto_residual = false;
};

// Causal self-attention, multi-head or grouped-query; RoPE or ALiBi or neither. Under
// tensor parallelism each rank holds H / tp query heads (column-parallel projections;
// key/value heads split, or held whole and used in part when there are fewer than tp)
// and the output projection is row-parallel.
class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(const ModelConfig& cfg, const TensorParallel& tp);
  // x [B, T, D] (with sequence parallelism [B, T / tp, D]); `mask` (attention_masks.h)
  // dense: undefined (causal), [1 or B, H / tp, T, T] ALiBi of this rank's heads with
  // -inf where a query may not look, or a boolean [B, 1, T, T] (true: may attend); or a
  // window's parts. cos/sin [T, Hd] when RoPE is used, else undefined. Returns the same
  // shape as x.
  torch::Tensor forward(const LayerInput& x, const AttentionMask& mask, const torch::Tensor& cos,
                        const torch::Tensor& sin);

  // Separate projections (LLaMA) or one fused per-head QKV projection (BLOOM).
  Projection q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, qkv{nullptr}, out{nullptr};
  // model.qk_norm: one RMSNorm of a head's width for every query head, one for every key
  // head; each tensor-parallel rank holds both whole and their gradients are summed.
  Norm q_norm{nullptr}, k_norm{nullptr};
  // Fewer key/value heads than tensor-parallel ranks: k_proj and v_proj are held whole
  // and each rank reads its head's rows of the fp32 weights (through copy_to).
  bool reads_key_value_whole() const { return kv_first_ >= 0; }

 private:
  ModelConfig cfg_;
  TensorParallel tp_;
  int64_t heads_ = 0, kv_heads_ = 0;  // on this rank
  int64_t kv_first_ = -1;             // key/value held whole: the one head this rank uses
};
TORCH_MODULE(Attention);

// SwiGLU: down(silu(gate(x)) * up(x)); GeGLU: down(gelu_tanh(gate(x)) * up(x)); GELU:
// down(gelu_tanh(up(x))). Under tensor
// parallelism gate and up are column-parallel, down row-parallel.
class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(const ModelConfig& cfg, const TensorParallel& tp);
  torch::Tensor forward(const LayerInput& x);
  // Under tensor parallelism, this rank's part of the output (its columns' product, before
  // the sum over the ranks; no bias) of an input every rank holds whole and whose gradient
  // the caller sums over them: a mixture's experts, whose parts are summed once, after
  // their outputs are combined.
  torch::Tensor forward_part(const torch::Tensor& x);

  Projection gate{nullptr}, up{nullptr}, down{nullptr};

 private:
  MlpKind kind_;
  TensorParallel tp_;
};
TORCH_MODULE(Mlp);

// What one training pass (a micro-batch's forward and backward) of a mixture-of-experts
// model shares between its loss and its blocks (moe_layer.cpp).
struct MoePass;

// A mixture of experts in place of the MLP (model.moe_experts): the router, a linear map
// [E, D] applied in fp32, gives each token a score per expert (a softmax over the E, or
// each one's sigmoid: model.moe_router); the token goes to its top k (by score plus the
// expert's bias under model.moe_expert_bias, within its best groups of experts under
// model.moe_groups), and its output is theirs weighted by their
// scores (divided by their sum under model.moe_normalize_top_k, times
// model.moe_routed_scale). Dropless (unless model.moe_capacity_factor, in training): the
// tokens are grouped by expert and each expert, an Mlp, takes all of its own. Parameters as Qwen2/3-MoE name them:
// `mlp.gate.weight`, `mlp.experts.<e>.{gate,up,down}_proj.weight`. Under tensor
// parallelism every rank routes alike and holds every expert's columns (gate and up split
// by rows, down by columns, as a dense MLP's); the experts' combined parts are summed over
// the ranks once. Under expert parallelism a rank holds its share of the experts (named
// by their index in the whole block) and exchanges the routed tokens with the other
// ranks' (two all-to-alls forward, two backward). A shared expert (model.moe_shared_ffn_dim)
// takes every token beside them, split over tp as a dense MLP, held whole by every
// expert-parallel rank (`mlp.shared_expert.*`; its gate `mlp.shared_expert_gate.weight`,
// Qwen2-MoE's names).
class MoeImpl : public torch::nn::Module {
 public:
  MoeImpl(const ModelConfig& cfg, const TensorParallel& tp, const ExpertParallel& ep = {});
  // x [B, T, D], normed. Under `pass` (training) the block's load-balancing loss joins
  // the gradients, weighted as the pass's loss is, and its value is added to the pass's.
  torch::Tensor forward(const torch::Tensor& x, const std::shared_ptr<MoePass>& pass);

  Projection gate{nullptr};
  // This rank's experts, in order: experts [first_expert(), first_expert() + size()).
  std::vector<Mlp> experts;
  int64_t first_expert() const { return first_expert_; }
  Mlp shared_expert{nullptr};              // model.moe_shared_ffn_dim > 0
  Projection shared_expert_gate{nullptr};  // model.moe_shared_gate: [1, D]
  // model.moe_expert_bias: [E] fp32, a buffer (`mlp.expert_bias`), whole on every rank.
  torch::Tensor expert_bias;
  // model.moe_expert_bias: b_e += rate * sign(mean(load) - load_e) for `load` [E] (any
  // float dtype), unless `skip` (a bool scalar; undefined: never) is set. On the device,
  // without waiting for it.
  void balance_expert_bias(const torch::Tensor& load, double rate, const torch::Tensor& skip);

 private:
  // The chosen experts' outputs for `routed` [N k, D], the (token, choice) pairs grouped
  // by expert (`count[e]` rows for expert e of the block's E), held here or under expert
  // parallelism computed by the ranks that hold them.
  torch::Tensor experts_forward(const torch::Tensor& routed, const int64_t* count);
  torch::Tensor expert_forward(size_t local, const torch::Tensor& rows);
  // experts_forward under expert parallelism: the rows sent to their experts' ranks, the
  // rows that came here computed, the outputs sent back.
  torch::Tensor dispatched_forward(const torch::Tensor& routed, const int64_t* count);
  // What the router chooses the top k by: `scores` [N, E] plus the experts' biases
  // (model.moe_expert_bias), -inf outside each token's best groups (model.moe_groups).
  torch::Tensor choice_scores(const torch::Tensor& scores) const;

  int64_t n_experts_, first_expert_ = 0, top_k_, n_layers_;
  bool normalize_, sigmoid_, per_sequence_, drop_by_position_;
  double routed_scale_;
  int64_t groups_, group_top_k_;
  double z_coef_, capacity_factor_;
  double aux_coef_;
  TensorParallel tp_;
  ExpertParallel ep_;
};
TORCH_MODULE(Moe);

// Pre-norm block: x + attn(norm(x)), then + mlp(norm(x)); with post-norms (Gemma 2 and
// 3) x + norm(attn(norm(x))), then + norm(mlp(norm(x))). The MLP is a mixture of experts
// where the model has them.
class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const ModelConfig& cfg, const TensorParallel& tp, const ExpertParallel& ep = {});
  torch::Tensor forward(const torch::Tensor& x, const AttentionMask& mask, const torch::Tensor& cos,
                        const torch::Tensor& sin, const std::shared_ptr<MoePass>& moe_pass = nullptr);

  Norm input_norm{nullptr}, mlp_norm{nullptr};
  Norm attention_out_norm{nullptr}, mlp_out_norm{nullptr};  // post-norms, where the model has them
  Attention attention{nullptr};
  Mlp mlp{nullptr};
  Moe moe{nullptr};  // instead of mlp (model.moe_experts)

 private:
  double dropout_;
};
TORCH_MODULE(Block);

// How a parameter is cut under tensor parallelism: this rank holds `length` of the
// `whole` entries along `dim` from `first` (dim -1: held whole by every rank). Entries
// past `valid` are padding (the vocabulary rounded up to a multiple of tp).
struct TpSlice {
  int dim = -1;
  int64_t first = 0, length = 0, whole = 0, valid = 0;
};

// What a model's constructor gives its parameters.
enum class ParameterStorage {
  Initialised,  // memory, and the values of reset_parameters(0)
  // Shapes alone, never any memory (tensor_storage.h: DeferredStorage): the model of a
  // run, whose parameters are placed in the flat buffers or ZeRO-3's pieces and written
  // there by initialise_parameter, so the whole model never exists on one rank; the
  // shapes a converter streams by. Nothing may read a parameter before it is placed.
  Deferred,
};

class TransformerImpl : public torch::nn::Module {
 public:
  // Under expert parallelism (`ep`) the mixture-of-experts blocks hold this rank's share of
  // their experts.
  explicit TransformerImpl(const ModelConfig& cfg, TensorParallel tp = {}, PipelineStage stage = {},
                           ParameterStorage storage = ParameterStorage::Initialised, ExpertParallel ep = {});

  // tokens [B, T] int64 → logits [B, T, V]. Not under tensor parallelism.
  torch::Tensor forward(const torch::Tensor& tokens);
  // `documents` below: [B, T], each token's document within its row, numbers that never
  // decrease along it (Batch::documents). Given, a token attends only to the earlier
  // tokens of its document and learned positions count from the document's first token;
  // undefined, attention spans the row.

  // Mean next-token cross-entropy; targets [B, T] int64.
  torch::Tensor loss(const torch::Tensor& tokens, const torch::Tensor& targets, const torch::Tensor& documents = {});
  // Final hidden state after the last norm, [B, T, D] ([B, T / tp, D] with sequence
  // parallelism). The whole model only.
  torch::Tensor hidden(const torch::Tensor& tokens, const torch::Tensor& documents = {});
  // One chunk of this pipeline stage (pipeline_stage.h): tokens (the model's first chunk)
  // or the previous virtual stage's activations in, the mean loss (its last chunk;
  // targets [B, T]) or activations out. Every stage is given the batch's documents.
  torch::Tensor stage_forward(const torch::Tensor& input, const torch::Tensor& targets, size_t chunk = 0,
                              const torch::Tensor& documents = {});
  const PipelineStage& pipeline_stage() const { return stage_; }

  // Normal(0, init_std) weights, zero biases, unit norms. A weight's element is a pure
  // function of (seed, name, its index in the whole tensor) (normal_draw.h), so any
  // layout holds the same values as one process, each rank drawing only its part.
  void reset_parameters(uint64_t seed);
  // Elements [first, first + into.numel()) of parameter `name` (this rank's tensor, in
  // row-major order) as reset_parameters(seed) gives them, written into `into` (any
  // shape, read row-major; any device). The parameter itself is not read, and only the
  // elements asked for are drawn: a ZeRO-3 rank draws its pieces, a tensor-parallel rank
  // its slice.
  void initialise_parameter(const std::string& name, const torch::Tensor& into, uint64_t seed, int64_t first = 0) const;

  const TensorParallel& tensor_parallel() const { return tp_; }
  const ExpertParallel& expert_parallel() const { return ep_; }
  // Context parallelism (context_parallel.h), applied by the parallelize step before any
  // forward: loss() and stage_forward() are then given whole sequences, and this rank
  // computes on its share of each.
  void set_context_parallel(ContextParallel cp);
  const ContextParallel& context_parallel() const { return cp_; }
  // The targets [B, T] whose mean loss() returns on this rank: all of them, or under
  // context parallelism this rank's share of the sequence, [B, T / cp].
  torch::Tensor loss_targets(const torch::Tensor& targets) const { return context_slice(targets, 1, cp_); }
  TpSlice tp_slice(const std::string& name) const;
  // Every tensor-parallel rank calls it for the same parameter: the slices of all ranks
  // joined (padding dropped); a parameter every rank holds whole, itself.
  torch::Tensor whole_parameter(const std::string& name);

  const ModelConfig& config() const { return cfg_; }
  const torch::Tensor& output_weight() const;
  // The logits of final hidden states [.., D]: the output projection, soft-capped where
  // model.final_logit_softcap says. The whole vocabulary (not under tensor parallelism).
  torch::Tensor logits_of(const torch::Tensor& h) const;
  // The parameters a forward or backward pass reads only as their working copy in the
  // compute dtype (compute_dtype.h: working_copy): the projections' weights and an
  // untied head. Their owner may hold them as that copy alone (ZeRO-3 under bf16 compute:
  // sharded_parameters.h). Not the embeddings (the lookup reads the table), norms or
  // biases, nor key/value weights that each tensor-parallel rank reads in part.
  std::set<std::string> weights_read_in_compute_dtype() const;

  torch::Tensor tok_embeddings, pos_embeddings;  // on the first stage (and tied: the last)
  Norm embedding_norm{nullptr}, final_norm{nullptr};
  torch::nn::ModuleList blocks{nullptr};  // this stage's blocks, chunk after chunk
  torch::Tensor lm_head;  // undefined when tied

  // Called around the use of each parameter unit (see parameter_units.h); null: none.
  // The owner must outlive the model's forward and backward passes.
  void set_parameter_units(ParameterUnits* units) { units_ = units; }

  // Under model.moe_experts: the load balances (E sum_e f_e P_e, 1 when balanced) of this
  // rank's blocks summed over the training passes since the last call, a scalar on the
  // device (not read here); undefined where none ran.
  torch::Tensor take_moe_balance();
  // Under model.moe_z_loss: the blocks' router z statistics (mean over tokens of
  // logsumexp(logits)^2), summed as take_moe_balance's.
  torch::Tensor take_moe_z();
  // Under model.moe_capacity_factor: the (token, choice) pairs this rank's blocks routed
  // in the training passes since the last call, and how many of them they dropped.
  std::pair<int64_t, int64_t> take_moe_drops();
  // Under model.moe_experts: the (token, choice) pairs each expert of each layer got over
  // the training passes since the last call, [n_layers, E] float64 on the device (0 for
  // other stages' layers); undefined where none ran.
  torch::Tensor take_moe_loads();
  // Under model.moe_expert_bias: each of this rank's blocks moves its experts' biases by
  // `loads` [n_layers, E], its layer's row (MoeImpl::balance_expert_bias).
  void balance_expert_biases(const torch::Tensor& loads, double rate, const torch::Tensor& skip);
  // Under model.moe_experts, for a pipeline stage whose pass ends in a loss on another
  // rank: the gradient backward will give that loss (its micro-batch's share of the step
  // times any fp16 loss scale), which weighs the blocks' load-balancing losses
  // (moe_pass.h). Holds for the training passes that follow; a loss on this rank records
  // its own.
  void set_moe_loss_gradient(torch::Tensor gradient) { moe_loss_gradient_ = std::move(gradient); }

  // What a layer attending in full is given without documents apart: with ALiBi the
  // additive bias [1, H, T, T], -inf above the diagonal; undefined for plain causal
  // attention. In `options`' dtype, cached per length and dtype.
  torch::Tensor attention_bias(int64_t t, const torch::TensorOptions& options);

 private:
  // What the layers of one kind share: those attending in full, or over the sliding
  // window (attends_over_window), each kind with its RoPE tables (windowed_rope).
  struct LayerAttention {
    int64_t window = 0;                // model.sliding_window for the windowed kind, else 0
    torch::Tensor rope_inv_freq;       // [Hd / 2], float64
    double rope_scale = 1.0;           // YaRN's attention factor, else 1
    torch::Tensor rope_cos, rope_sin;  // [positions used so far, Hd], not parameters
    torch::Tensor bias_cache;          // the last bias made, reused while it fits
    // The last window's parts made without documents, reused while they fit.
    std::shared_ptr<const WindowedAttention> window_cache;
    // The last context-parallel chunks made without documents, reused while they fit.
    std::shared_ptr<const ContextAttention> context_cache;
    // The window where it leaves keys out of a sequence of t tokens, else 0.
    int64_t window_for(int64_t t) const { return window > 0 && t > window ? window : 0; }
  };
  // What a block of the kind is given: the mask, RoPE's cos and sin.
  struct BlockInputs {
    AttentionMask mask;
    torch::Tensor cos, sin;
  };
  torch::Tensor bias_of(LayerAttention& kind, int64_t t, const torch::TensorOptions& options);
  std::shared_ptr<const WindowedAttention> window_of(LayerAttention& kind, int64_t t,
                                                     const torch::TensorOptions& options,
                                                     const torch::Tensor& documents);
  std::shared_ptr<const ContextAttention> context_of(LayerAttention& kind, int64_t t,
                                                     const torch::TensorOptions& options,
                                                     const torch::Tensor& documents);
  // `t`: the whole sequence's length, whatever part of it this rank holds.
  BlockInputs block_inputs(LayerAttention& kind, const torch::Tensor& x, int64_t t, const torch::Tensor& documents);
  torch::Tensor embed(const torch::Tensor& tokens, const torch::Tensor& documents);
  // The blocks of one of the stage's chunks.
  torch::Tensor run_blocks(torch::Tensor x, size_t chunk, const torch::Tensor& documents);
  torch::Tensor normed_output(const torch::Tensor& x);      // the final norm, its unit gathered first
  torch::Tensor head_loss(const torch::Tensor& h, const torch::Tensor& targets);

  ModelConfig cfg_;
  TensorParallel tp_;
  ExpertParallel ep_;
  ContextParallel cp_;
  PipelineStage stage_;
  int64_t vocab_first_ = 0, vocab_local_ = 0;  // this rank's vocabulary rows
  ParameterUnits* units_ = nullptr;
  LayerAttention full_, windowed_;
  torch::Tensor alibi_slopes_;  // [H]
  // The training pass in flight (model.moe_experts), from its blocks to its loss.
  std::shared_ptr<MoePass> moe_pass_;
  torch::Tensor moe_loss_gradient_;  // set_moe_loss_gradient
  torch::Tensor moe_balance_;        // summed over the passes since take_moe_balance
  torch::Tensor moe_z_;              // summed over the passes since take_moe_z
  int64_t moe_routed_pairs_ = 0, moe_dropped_pairs_ = 0;  // since take_moe_drops
  torch::Tensor moe_loads_;          // summed over the passes since take_moe_loads
};
TORCH_MODULE(Transformer);

// ALiBi slopes of the BLOOM reference, for any head count (not only powers of two).
std::vector<double> alibi_slopes(int64_t n_heads);

// RoPE's inverse frequencies theta^(-2i / Hd), one per pair of a head's dimensions, with
// the model's rope_scaling applied.
std::vector<double> rope_inverse_frequencies(const ModelConfig& m);
// What RoPE's cos and sin tables are multiplied by: YaRN's attention factor, else 1.
double rope_attention_scale(const ModelConfig& m);

}  // namespace tide
