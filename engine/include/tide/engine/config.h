// Run configuration: plain structs, no LibTorch. Every field is described once in
// config_schema.cpp (name, type, range, default, live-settable, doc); validation,
// JSON, `--set` overrides and docs/recipes.md all derive from that table.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tide {

enum class NormKind { RMSNorm, LayerNorm };
enum class PositionKind { RoPE, ALiBi, Learned };
enum class RopeScaling { None, Linear, Llama3, Yarn };
// SwiGLU: down(silu(gate) * up); GeGLU: down(gelu_tanh(gate) * up) (Gemma); GELU:
// down(gelu_tanh(up)) (BLOOM, GPT-2).
enum class MlpKind { SwiGLU, GeGLU, GELU };
enum class MoeRouterScore { Softmax, Sigmoid };
// What a mixture of experts' load balance is taken over: each micro-batch's tokens on a
// rank (Megatron-Core's aux_loss), or each sequence's, then averaged (seq_aux_loss).
enum class MoeBalanceScope { MicroBatch, Sequence };
// Which of an expert's (token, choice) pairs over its capacity are dropped: those of the
// lowest router weights, or those of the latest tokens.
enum class MoeDropPolicy { Probs, Position };
// Parameter naming and fused-QKV layout of the Hugging Face family.
enum class Family { LLaMA, BLOOM };
enum class DecayKind { Constant, Cosine, Linear, Lua };
// Auto: resolved once a run knows its device (resolve_compute_dtype), never used as is.
enum class DType { Float32, BFloat16, Float16, Auto };

struct ModelConfig {
  Family family = Family::LLaMA;
  int64_t vocab_size = 32000;
  int64_t dim = 4096;
  int64_t n_layers = 32;
  int64_t n_heads = 32;
  int64_t n_kv_heads = 0;  // 0: same as n_heads (multi-head attention)
  // Each head's width; 0: dim / n_heads. Mistral NeMo, Qwen3 and Gemma set their own, so
  // that n_heads * head_dim differs from dim (the query and output projections map
  // between the two).
  int64_t head_dim = 0;
  int64_t ffn_dim = 0;  // 0: derived (LLaMA rule for the gated kinds, 4*dim for GELU)
  int64_t multiple_of = 256;
  double ffn_dim_multiplier = 0.0;  // 0: not applied
  int64_t max_seq_len = 2048;
  NormKind norm = NormKind::RMSNorm;
  double norm_eps = 1e-5;
  // Norm weights held as their difference from 1: a norm multiplies by 1 + weight, and
  // weights start at 0 (Gemma; Megatron-Core's layernorm_zero_centered_gamma). Weight
  // decay, where it reaches norms, then pulls a norm's scale towards 1, not 0.
  bool norm_zero_centered = false;
  // A norm on attention's and the MLP's outputs too, before each joins the residual
  // stream (Gemma 2 and 3: four norms a block).
  bool post_norms = false;
  PositionKind positions = PositionKind::RoPE;
  double rope_theta = 10000.0;
  // RoPE's frequencies stretched for a context longer than the one pretrained (Hugging
  // Face's rope_scaling): Linear divides each by the factor; Llama3 (Llama 3.1 and later)
  // divides those whose wavelength exceeds original / low_freq_factor tokens, keeps those
  // under original / high_freq_factor and blends in between. Defaults: Llama 3.1's.
  // Yarn (YaRN: Qwen2.5's long context) divides those that turn fewer than beta_slow
  // times over the original context, keeps those turning over beta_fast times, ramps
  // between by dimension, and scales cos and sin by the attention factor.
  RopeScaling rope_scaling = RopeScaling::None;
  double rope_scaling_factor = 8.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int64_t rope_original_max_seq_len = 8192;
  double rope_beta_fast = 32.0;
  double rope_beta_slow = 1.0;
  double rope_attention_factor = 0.0;  // 0: YaRN's 0.1 ln(factor) + 1
  // > 0: a token attends to itself and the sliding_window - 1 tokens before it
  // (Mistral's and Qwen2's sliding window); 0: to every token before it.
  int64_t sliding_window = 0;
  // With a sliding window, the layers (counted from 0, as Hugging Face's layer_idx and
  // tide's parameter names count them) that attend to every earlier token all the same:
  // Gemma 3's one in six, Gemma 2's every other, Qwen's first max_window_layers.
  // Empty: every layer attends over the window.
  std::vector<int64_t> full_attention_layers;
  // > 0: the RoPE base of the layers that attend over the window, whose frequencies are
  // not scaled (Gemma 3's rope_local_base_freq); rope_theta and rope_scaling are then the
  // full-attention layers'. 0: every layer rotates alike.
  double rope_local_theta = 0.0;
  // The factor attention's scores are multiplied by before the softmax; 0: 1 /
  // sqrt(head_dim). Gemma 2 and 3 scale by query_pre_attn_scalar^-1/2, which is not
  // always the head's width (Megatron-Core's softmax_scale).
  double softmax_scale = 0.0;
  // > 0: attention's scaled scores become cap * tanh(score / cap) before the mask and the
  // softmax (Gemma 2's attn_logit_softcapping, 50). No fused kernel takes a cap: the
  // scores are materialised, T x T a head.
  double attention_softcap = 0.0;
  // > 0: the logits become cap * tanh(logit / cap) before the loss and sampling (Gemma 2's
  // final_logit_softcapping, 30), inside the loss's chunks.
  double final_logit_softcap = 0.0;
  MlpKind mlp = MlpKind::SwiGLU;
  // > 0: each block's MLP is a mixture of this many experts (Mixtral, Qwen3-MoE), each an
  // MLP of model.mlp's kind and ffn_dim's width; a router sends every token to
  // moe_top_k of them and sums their outputs weighted by its probabilities. Dropless
  // (unless moe_capacity_factor): every expert takes all the tokens routed to it. 0: one
  // dense MLP.
  int64_t moe_experts = 0;
  int64_t moe_top_k = 2;
  // The chosen experts' probabilities divided by their sum (Mixtral; Qwen3-MoE's
  // norm_topk_prob); false: the softmax's own values (Qwen2-MoE, OLMoE).
  bool moe_normalize_top_k = true;
  // The load-balancing loss's coefficient: each block adds coef * E * sum_e f_e P_e
  // (Switch Transformer; Megatron-Core's moe_aux_loss_coeff), f_e the share of the
  // block's token choices that went to expert e, P_e its mean router probability; 1 at a
  // perfect balance. Enters the gradients, not the reported loss.
  double moe_aux_loss = 0.01;
  // The tokens f_e and P_e are taken over: the micro-batch's (above), or each sequence's
  // with the balances averaged over the sequences (DeepSeek-V3's complementary
  // sequence-wise balance loss; Megatron-Core's seq_aux_loss). moe_balance reports it.
  MoeBalanceScope moe_balance_scope = MoeBalanceScope::MicroBatch;
  // > 0: beside the routed experts, a shared expert of this width that every token goes
  // through, its output added to theirs (Qwen2-MoE's shared_expert_intermediate_size;
  // DeepSeek's shared experts, n_shared_experts x moe_intermediate_size wide). Under
  // moe_shared_gate each token's shared output is scaled by sigmoid(w . x) (Qwen2-MoE's
  // shared_expert_gate).
  int64_t moe_shared_ffn_dim = 0;
  bool moe_shared_gate = false;
  // The router's scores: a softmax over the experts (Mixtral, Qwen-MoE) or each expert's
  // sigmoid (DeepSeek-V3; Megatron-Core's moe_router_score_function), the chosen ones
  // normalised as moe_normalize_top_k says.
  MoeRouterScore moe_router = MoeRouterScore::Softmax;
  // The chosen experts' weights times this (DeepSeek-V3's routed_scaling_factor, 2.5;
  // Megatron-Core's moe_router_topk_scaling_factor).
  double moe_routed_scale = 1.0;
  // Auxiliary-loss-free balancing (DeepSeek-V3): each block holds a bias per expert,
  // added to the scores to choose the experts and not to weigh them (its `mlp.expert_bias`,
  // Megatron-Core's router.expert_bias), moved after each optimizer step by
  // moe_bias_update_rate toward the even load: b_e += rate * sign(mean load - load_e),
  // the loads those of the step's whole batch. Part of the model: saved with its weights
  // and in checkpoints, and routing with it at inference.
  bool moe_expert_bias = false;
  double moe_bias_update_rate = 1e-3;
  // Group-limited routing (DeepSeek-V3's n_group / topk_group; Megatron-Core's
  // moe_router_num_groups / moe_router_group_topk): the experts in moe_groups groups of
  // equal size (spread over devices or hosts by expert parallelism), each token choosing
  // among the moe_group_top_k groups whose top moe_top_k / moe_group_top_k scores (plus
  // biases) sum highest. 1 group: no limit.
  int64_t moe_groups = 1;
  int64_t moe_group_top_k = 1;
  // The router's z-loss coefficient (ST-MoE; Megatron-Core's moe_z_loss_coeff): each block
  // adds coef * the mean over tokens of logsumexp(router logits)^2 to the gradients,
  // keeping the logits small. 0: none.
  double moe_z_loss = 0.0;
  // > 0: in training, each expert takes at most ceil(factor * N k / E) of a micro-batch's
  // N k (token, choice) pairs on a rank (GShard, Switch Transformer; Megatron-Core's
  // moe_expert_capacity_factor); the rest are dropped (the token keeps its residual and
  // its other choices), as moe_drop_policy says. Evaluation and generation drop nothing.
  // 0: dropless.
  double moe_capacity_factor = 0.0;
  MoeDropPolicy moe_drop_policy = MoeDropPolicy::Probs;
  bool attention_bias = false;
  bool qkv_bias = false;  // biases on the query, key and value projections alone (Qwen2)
  bool qk_norm = false;   // RMSNorm over each head's query and key before RoPE (Qwen3)
  bool mlp_bias = false;
  bool embedding_norm = false;  // BLOOM's LayerNorm right after the embedding
  // The token embeddings are multiplied by this on the way in, not on the way out when
  // tied (Gemma: sqrt(dim)).
  double embedding_scale = 1.0;
  bool tie_embeddings = false;
  double dropout = 0.0;
  double init_std = 0.02;
  bool scale_residual_init = false;  // std / sqrt(2 * n_layers) on output projections
  bool activation_checkpointing = false;
  // With activation_checkpointing: only the first N blocks of each pipeline chunk (the
  // whole model without a pipeline) are recomputed; 0: every block.
  int64_t recompute_blocks = 0;
  // LoRA (Hu et al., 2021): > 0, each projection named in lora_targets gains the update
  // (lora_alpha / lora_rank) B A, A [rank, in] and B [out, rank], and only the A and B
  // matrices train; every other parameter keeps the values it started from (the weights
  // of checkpoint.init_from). 0: every parameter trains.
  int64_t lora_rank = 0;
  double lora_alpha = 16.0;
  // Dropout on each adapter's input while training (PEFT's lora_dropout): A reads x with
  // each element dropped with this probability, the rest scaled by 1 / (1 - p); the
  // frozen projection reads x whole. Masks come from the run's generators, as
  // model.dropout's do. 0: none.
  double lora_dropout = 0.0;
  // The projections that take an adapter, by their Hugging Face module names (q_proj,
  // k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; BLOOM's query_key_value,
  // dense, dense_h_to_4h, dense_4h_to_h). Empty: every projection of the blocks (PEFT's
  // "all-linear"; the QLoRA paper found all of them needed to match full fine-tuning).
  std::vector<std::string> lora_targets;
};

// One dataset of a blend and its share of the training samples.
struct DataSource {
  std::string path;
  double weight = 1.0;
  std::string name;  // its validation loss's label; "": the directory's name (source_name)
};

struct DataConfig {
  std::string path;  // a dataset directory written by `tide data prepare`
  std::vector<DataSource> blend;  // instead of path: several datasets, sampled by weight
  int64_t seq_len = 256;
  int64_t prefetch = 4;  // batches prepared ahead by the background loader
  bool document_attention = false;  // attention within each packed document only (Batch::documents)
  bool eod_mask_loss = false;       // a document's last token's prediction left out of the loss (BatchContents)
  bool loss_mask = false;           // only the targets the datasets' loss masks mark count (<split>.mask: completions)
  bool document_windows = false;    // each training window starts at a document's first token
};

struct BatchConfig {
  int64_t micro_batch = 8;   // sequences per forward/backward
  int64_t global_batch = 8;  // sequences per optimizer step (all ranks)
};

struct OptimConfig {
  double lr = 3e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;  // 0: no clipping
  double lr_scale = 1.0;   // multiplies the scheduled rate (live control, anomaly policies)
  bool decay_norms_and_biases = false;
  bool decay_embeddings = false;
};

struct ScheduleConfig {
  int64_t steps = 1000;
  int64_t warmup_steps = 0;
  DecayKind decay = DecayKind::Cosine;
  double min_lr = 0.0;
};

struct PrecisionConfig {
  DType compute = DType::Auto;  // bf16 / fp16: autocast of matmuls, fp32 master weights
  // fp16 only: the loss is multiplied by a scale before backward, so that small gradients
  // stay within fp16's range. 0: dynamic, from initial_loss_scale, halved at a step whose
  // gradients overflow (the update is skipped) and doubled after loss_scale_window steps
  // without one; otherwise this fixed scale.
  double loss_scale = 0.0;
  double initial_loss_scale = 65536.0;
  int64_t loss_scale_window = 1000;
};

struct CheckpointConfig {
  int64_t every = 0;  // steps; 0: only at the end
  int64_t keep_last = 3;
  int64_t keep_every = 0;  // also keep every checkpoint whose step is a multiple; 0: none
  bool async = true;       // written in the background while training goes on
  int64_t writers = 0;     // files (and threads) per rank; 0: one per 64 MiB, up to 4
  std::string init_from;   // weights the run starts from; empty: random initialisation
};

struct ParallelConfig {
  // The planner chooses dp, tp, pp, zero, offload, sequence parallelism, the pipeline
  // schedule, activation checkpointing and the micro-batch for the world the run gets
  // (plan/plan.h, choose_layout); the global batch stays the recipe's.
  bool auto_layout = false;
  int64_t dp = 0;  // 0: inferred as world / (cp * tp * pp)
  int64_t tp = 1;
  int64_t pp = 1;
  // Context parallelism: each sequence split over cp ranks (model/context_parallel.h).
  int64_t cp = 1;
  // How its attention sees the other ranks' tokens: "all_gather" (their keys and values)
  // or "all_to_all" (the whole sequence for 1 / cp of the heads; DeepSpeed-Ulysses).
  std::string cp_comm = "all_gather";
  // Expert parallelism (model.moe_experts): each block's experts spread over ep
  // consecutive data-parallel ranks, which send each token to its experts' ranks and take
  // the outputs back; the dp / ep ranks that hold the same experts reduce their gradients.
  int64_t ep = 1;
  int64_t zero = 0;
  bool offload_optimizer = false;
  int64_t micro_batches = 0;  // pipeline micro-batches; 0: from the batch config
  std::string pipeline_schedule = "1f1b";
  std::vector<int64_t> pipeline_stages;  // blocks per (virtual) stage; empty: balanced by cost
  // Chunks of blocks per pipeline rank (Megatron's virtual pipeline size): above 1, the
  // interleaved 1F1B schedule, whose bubble is 1 / virtual_stages of 1F1B's.
  int64_t virtual_stages = 1;
  double bucket_mb = 25.0;
  bool sequence_parallel = false;
  double timeout_s = 120;  // a collective or the rendezvous that takes longer fails
  double node_timeout_s = 60;  // a rank with no heartbeat this long: its host is lost, the job ends
  // "auto": NCCL between CUDA ranks, Gloo between CPU ranks. "gloo": Gloo on either
  // device (CUDA tensors travel through host memory), so that ranks may share a GPU,
  // which NCCL refuses.
  std::string backend = "auto";
};

// What a training anomaly triggers (every rank decides the same from reduced values).
enum class AnomalyAction { None, Skip, Rollback, ScaleLr, Stop };

struct AnomalyConfig {
  AnomalyAction on_nonfinite = AnomalyAction::Skip;  // NaN/Inf loss or gradient norm
  AnomalyAction on_loss_spike = AnomalyAction::None;
  AnomalyAction on_grad_explosion = AnomalyAction::None;
  int64_t window = 50;             // recent normal steps the verdicts compare against
  double spike_z = 6.0;            // robust z-score (median, 1.4826 x MAD) of a loss spike
  double explosion_factor = 10.0;  // gradient norm above this multiple of the window's median
  double lr_factor = 0.5;          // scale_lr multiplies optimizer.lr_scale by this
};

// A run under tided: how its workers are watched and restarted.
struct SuperviseConfig {
  int64_t max_restarts = 3;          // restarts from the latest checkpoint after a worker fault
  double heartbeat_timeout_s = 60;   // a rank silent this long is declared hung
};

// Where a run's alerts go besides tided's own receivers (docs/dashboard.md, "Alerts").
struct AlertConfig {
  std::vector<std::string> webhooks;  // http(s) URLs, each sent a POST of the alert's JSON
};

struct EvalConfig {
  int64_t every = 100;  // steps; 0: never
  int64_t batches = 8;
};

// Steps recorded by LibTorch's profiler into the run directory (docs/profiling.md).
struct ProfileConfig {
  int64_t start_step = 0;         // the first recorded step (1: the run's first); 0: none
  int64_t steps = 2;              // steps recorded from start_step on
  std::vector<int64_t> ranks{0};  // global ranks that record; empty: every rank
  bool shapes = false;            // operators' input shapes in the trace
  bool memory = false;            // allocations and frees in the trace
};

struct RunConfig {
  std::string name = "run";
  int64_t seed = 1234;
  int64_t log_every = 1;
  std::string log_level = "info";  // the run log's level (train.log)
  int64_t threads = 0;  // intra-op threads; 0: all cores of this process' share
  std::string device = "cpu";  // "cuda": each rank on GPU LOCAL_RANK, NCCL between them
  bool cuda_graphs = true;     // CUDA: each step captured once its shapes are fixed, then replayed
  ModelConfig model;
  DataConfig data;
  BatchConfig batch;
  OptimConfig optimizer;
  ScheduleConfig schedule;
  PrecisionConfig precision;
  CheckpointConfig checkpoint;
  ParallelConfig parallel;
  EvalConfig eval;
  ProfileConfig profile;
  SuperviseConfig supervise;
  AnomalyConfig anomaly;
  AlertConfig alerts;
};

// The SwiGLU hidden size rule of the LLaMA reference code, or the explicit size.
int64_t resolved_ffn_dim(const ModelConfig& m);
// Whether the MLP has a gate projection (three matrices, not two).
bool gated_mlp(const ModelConfig& m);
// Norms in a block: before attention and the MLP, and after each with post_norms.
int64_t block_norms(const ModelConfig& m);
// Whether layer `layer` (from 0) attends over model.sliding_window: every layer where
// there is one, but those of model.full_attention_layers.
bool attends_over_window(const ModelConfig& m, int64_t layer);
// Whether that window leaves keys out of a sequence of seq_len tokens (it is shorter):
// only then does the layer attend in blocks that leave out what the window does.
bool window_leaves_out_keys(const ModelConfig& m, int64_t layer, int64_t seq_len);
// Whether context parallelism attends that layer's chunks without masks, in one node that
// keeps only the rank's own keys and values for backward (model/context_parallel.h:
// unmasked_context_attention): no window leaving keys out, no ALiBi, no documents apart,
// no attention dropout, no soft cap.
bool unmasked_context_layer(const ModelConfig& m, int64_t layer, int64_t seq_len, bool documents_apart);
// The all-to-all form of context parallelism (model/context_parallel.h) splits each
// tensor-parallel rank's `heads` query and `kv_heads` key/value heads over cp ranks: cp
// must divide the query heads, and divide the key/value heads or be a multiple of them
// (each rank then receives the one its query heads read).
bool context_heads_split(int64_t heads, int64_t kv_heads, int64_t cp);
// The key/value heads a rank attends with in that form, times cp: what its exchange
// carries for each token of its own (kv_heads, or cp where each rank receives one).
int64_t context_kv_heads_exchanged(int64_t kv_heads, int64_t cp);
// The queries of a block of such a layer's attention (model/attention_masks.h): each block
// of R reads the w keys before it and its own, R + w.
int64_t window_block_rows(int64_t window);
// The RoPE settings of the layers attending over the window: the model's own, or with
// rope_local_theta its base, unscaled.
ModelConfig windowed_rope(const ModelConfig& m);
int64_t resolved_kv_heads(const ModelConfig& m);
int64_t head_dim(const ModelConfig& m);

// The datasets a run trains on: data.blend, or data.path alone with weight 1; each
// name given or, when none is, its directory's ("data/kjv/" -> "kjv").
std::vector<DataSource> data_sources(const DataConfig& d);

// Exact parameter count without allocating weights, LoRA adapters included.
int64_t parameter_count(const ModelConfig& m);
// Under model.moe_experts: the experts' parameters a token does not pass through (each
// goes through moe_top_k of a block's experts); 0 for a dense model.
int64_t inactive_expert_parameter_count(const ModelConfig& m);
// The parameters of the LoRA adapters alone (model.lora_rank): what trains under LoRA.
int64_t lora_parameter_count(const ModelConfig& m);
// The adapters' elements one rank of tensor-parallel size `tp` holds of `blocks` blocks.
int64_t lora_rank_parameter_count(const ModelConfig& m, int64_t tp, int64_t blocks);
// The Hugging Face module names of a block's projections in the family, in a block's
// order ("q_proj", ..., "down_proj"; BLOOM's "query_key_value", ...).
std::vector<std::string> block_projection_names(const ModelConfig& m);
// How a block module is split over `tp` tensor-parallel ranks (Megatron's layouts): a
// column-parallel projection by its output rows, a row-parallel one (o_proj, down_proj,
// BLOOM's dense and dense_4h_to_h) by its input columns. Whole: not a block projection
// of the family (a norm), or a key / value projection whose heads do not split over the
// ranks. With tp 1, which projections are row-parallel: those that write the residual.
enum class ProjectionSplit { Column, Row, Whole };
ProjectionSplit projection_split(const ModelConfig& m, const std::string& module, int64_t tp);
// The projections of a block that take LoRA adapters under `m`: its lora_targets, or
// every block projection of its family where that is empty. Empty when lora_rank is 0.
std::vector<std::string> lora_target_names(const ModelConfig& m);

}  // namespace tide
