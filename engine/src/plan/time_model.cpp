// Seconds of one optimizer step on the slowest pipeline stage, following what the
// engine runs:
//   matmuls at the device's matmul rate (its peak times the efficiency the table assumes
//     or --calibrate measured); causal attention at half its counted FLOPs (the flash
//     kernels skip the masked blocks; a mask makes them compute all, and a window shorter
//     than the sequence about R + w keys a query: computed_keys), at the rate
//     --calibrate measured for the fused kernel on a CPU,
//     else the matmul rate; recomputation one more forward of the blocks;
//   elementwise work (norms, activations, softmax, residuals, the loss) as memory
//     traffic: every saved activation written in forward, read in backward and its
//     gradient written and read once more;
//   tensor parallelism: four all-reduces (or gather + reduce-scatter pairs, and the two
//     norms' outputs gathered again in backward) of the residual stream per block and
//     micro-batch, on the critical path;
//   data parallelism: gradient all-reduce (ZeRO-0) or reduce-scatter (1-3, every
//     micro-batch for 2-3) overlapping the backward that produces it, the parameter
//     all-gather after the update (ZeRO-1/2) or before each block (ZeRO-3, prefetched);
//   context parallelism: each rank computes its 1 / cp of the tokens; causal attention
//     half the keys a query, as without it (each chunk's keys before it unmasked, its
//     own causally: chunk_attention.h); a mask (ALiBi, documents, a window) makes every
//     chunk's attention compute (2 cp + 1) / (4 cp) of the keys a query, at the matmul rate;
//     per block and micro-batch the keys and values of the whole sequence all-gathered
//     forward and again in backward (a masked block's: again only where recomputed) and
//     their gradients reduce-scattered backward, on the critical path; the all-to-all
//     form instead attends as one process does for its share of the heads, and exchanges
//     q, k, v and the output forward, their gradients backward (and forward again where
//     recomputed): (2 H + 2 K') Hd values a token of its own each way; the gradients
//     reduced over the dp x cp ranks;
//   a mixture of experts: a token multiplies by the router and its top k experts alone
//     (evenly routed, every rank's experts take as many rows); the routing's own ops
//     and each expert's; under expert parallelism the routed rows sent to their experts'
//     ranks and back, forward and backward (and forward again where recomputed), on the
//     critical path; the experts' gradients reduced over the dp / ep ranks that hold them;
//   pipelines: one send and receive per micro-batch and direction, and the fill and drain
//     bubble: the slowest stage works through every micro-batch while each other stage
//     adds one micro-batch of its own time (fill before it, drain after it), (pp - 1)
//     slots when the stages are alike; on ranks that share a machine's cores, what the
//     slowest stage computes while the others wait runs at the idle peers' speed;
//   AdamW reading and writing 28 bytes per owned element; offload moves gradients to the
//     host and parameters back, and updates at the host's speed.
#include <algorithm>
#include <cmath>
#include <limits>

#include "estimates.h"
#include "rank_model.h"
#include "tide/engine/model/pipeline_stage.h"
#include "tide/engine/run_layout.h"
#include "tide/engine/train/flops.h"

namespace tide::plan {

namespace {

// A ring collective over `ranks` of `bytes` per rank: all-reduce moves 2 (n-1)/n of
// them, all-gather and reduce-scatter (n-1)/n.
double ring_seconds(double bytes, int ranks, double factor, double bandwidth, double latency) {
  if (ranks <= 1) return 0.0;
  const double n = ranks;
  return factor * (n - 1) / n * bytes / bandwidth + latency * std::log2(n);
}

// Host memory bandwidth a GPU's share of its node's CPUs reaches for the offloaded AdamW.
constexpr double kHostAdamBandwidth = 20e9;

// Operators one block runs per micro-batch, forward and backward (about 40 forward:
// norms, projections, RoPE, attention, SwiGLU, residuals; twice that backward), and the
// embedding, head and loss.
constexpr double kOpsPerBlock = 120, kOpsOutsideBlocks = 30;
// A mixture of experts' routing (router, softmax, top-k, sort, counts, gathers, the
// combining sum, the balance; forward and backward), and each expert's MLP.
constexpr double kOpsPerRouting = 60, kOpsPerExpert = 24;

// Soft-capped attention reads a block's keys up to its last query (computed_keys: about
// half of them, as a causal kernel does) and makes the scores again in backward: 7
// products of the 6 counted.
constexpr double kSoftcapProducts = 7.0 / 6.0;

// Bytes soft-capped attention moves per score it makes (softcapped_attention.cpp, in
// LibTorch ops on fp32 scores): forward writes the product, widens it, scales, tanh,
// caps, masks, reads it for the log-sum-exp, shifts, exponentiates and narrows it for the
// product with V (about 12 passes of 4 bytes); backward makes it again and then the
// probabilities' gradient, its shift, the softmax's and tanh's slopes and the narrowed
// copy for two products (about 25 more). Recomputation repeats the forward's.
constexpr double kSoftcapForwardBytes = 12 * 4, kSoftcapBackwardBytes = 25 * 4;

// Bytes a materialised attention moves per score (one row of T per head and token):
// forward writes the scores, softmax reads them and writes the probabilities, the
// product with V reads them (4 s); backward writes the probabilities' gradient, softmax's
// backward reads it and the probabilities and writes the scores' gradient, which the two
// products read (6 s). Dropout on the probabilities reads them and writes the dropped
// copy and its one-byte mask forward, and reads the mask and a gradient and writes one
// backward (4 s + 2). Recomputation repeats the forward's share.
double score_bytes(const ModelConfig& mc, double s, bool recompute) {
  const bool dropout = mc.dropout > 0;
  double bytes = 10 * s + (dropout ? 4 * s + 2 : 0);
  if (recompute) bytes += 4 * s + (dropout ? 2 * s + 1 : 0);
  return bytes;
}

// Per token of one micro-batch on this rank's stage: matmul FLOPs (6 per weight),
// attention's, and elementwise traffic: about four passes over what a block saves
// (written, read back, its gradient written and read), the ALiBi mask's rows read in
// forward and backward, five passes over the logits; recomputation adds one forward's
// writes.
TokenCost stage_token_cost(const ModelConfig& mc, const RankModel& r, double T, double s, bool recompute,
                           bool fused_attention, bool documents, int cp = 1) {
  const double blocks = static_cast<double>(r.blocks);
  const double D = static_cast<double>(r.dim), F = static_cast<double>(r.ffn);
  const double attn_width = static_cast<double>(r.heads * r.head_dim);
  TokenCost c;
  c.matmul_flops = 6.0 * (blocks * static_cast<double>(r.block_token_weights) + static_cast<double>(r.head_matmul));
  // Each block's keys as its kernel computes them (flops.h: a causal kernel without a mask
  // skips half; a mask makes it compute every score; a window's parts about R + w).
  // Under context parallelism a chunk that sees every key before it is attended without
  // a mask (chunk_attention.h): half the keys a query on average, as without cp. With
  // ALiBi or documents every chunk but rank 0's first is masked: a query's keys are its
  // chunk's, (2 cp + 1) T / (4 cp) on average, or a window's chunk's about c + w.
  const double context_keys = (2.0 * cp + 1) * T / (4.0 * cp);
  const bool masked_chunks = documents || mc.positions == PositionKind::ALiBi;
  double keys = 0;
  for (const int64_t layer : r.layers) {
    const bool windowed = window_leaves_out_keys(mc, layer, static_cast<int64_t>(T));
    keys += cp == 1 || (!masked_chunks && !windowed)
                ? computed_keys(mc, layer, static_cast<int64_t>(T), documents, fused_attention)
            : windowed ? std::min(context_keys, T / (2.0 * cp) + static_cast<double>(mc.sliding_window))
                       : context_keys;
  }
  c.attention_flops = 12.0 * attn_width * keys * (mc.attention_softcap > 0 ? kSoftcapProducts : 1.0);
  double saved =
      D * (4 * 2 + 2 * s) + static_cast<double>((r.heads + 2 * r.kv_heads) * r.head_dim) * s + attn_width * s;
  // A mixture of experts: each of the top k experts' MLP on its copy of the token, the
  // copy gathered and its output combined, the router's fp32 input and probabilities.
  if (r.experts > 0)
    saved += r.kept_choices * ((gated_mlp(mc) ? 4 : 2) * F + 2 * D) * s +
             (D + static_cast<double>(mc.moe_experts)) * 4 +
             (r.shared_ffn > 0 ? (gated_mlp(mc) ? 4 : 2) * static_cast<double>(r.shared_ffn) * s + D * s : 0.0);
  else
    saved += (gated_mlp(mc) ? 4 : 2) * F * s;
  if (mc.post_norms) saved += 2 * D * 2 * s;  // each post-norm's input and output
  if (mc.positions == PositionKind::ALiBi) saved += 2.0 * static_cast<double>(r.heads) * T * s / 4.0;
  c.elementwise_bytes = 4.0 * blocks * saved;
  if (r.last) c.elementwise_bytes += 5.0 * static_cast<double>(r.vocab) * 4;
  if (recompute) c.elementwise_bytes *= 1.25;
  // Scores through memory, each query's computed keys' (soft-capped: those up to each
  // block's last query).
  if (mc.attention_softcap > 0)
    c.elementwise_bytes +=
        static_cast<double>(r.heads) * keys * (kSoftcapBackwardBytes + kSoftcapForwardBytes * (recompute ? 2 : 1));
  else if (!fused_attention)
    c.elementwise_bytes += static_cast<double>(r.heads) * keys * score_bytes(mc, s, recompute);
  return c;
}

}  // namespace

DType planned_compute_dtype(const RunConfig& cfg, const DeviceSpec& device) {
  if (cfg.precision.compute != DType::Auto) return cfg.precision.compute;
  return device.host ? DType::Float32 : DType::BFloat16;
}

TimeEstimate estimate_time(const RunConfig& cfg, const Cluster& cluster, const PlanLayout& L, DType compute) {
  const ModelConfig& mc = cfg.model;
  const DeviceSpec& dev = cluster.device;
  const bool bf16 = compute != DType::Float32;  // or fp16: the same widths and rates
  const double s = bf16 ? 2.0 : 4.0;
  const double peak = bf16 ? dev.bf16_flops : dev.fp32_flops;
  const double matmul_rate =
      peak * (bf16 && dev.bf16_matmul_efficiency > 0 ? dev.bf16_matmul_efficiency : dev.matmul_efficiency);
  const double measured_attention = bf16 ? dev.attention_bf16_flops : dev.attention_fp32_flops;
  // What the calibration measured is the causal kernel with no mask. A materialised
  // attention is two batched matmuls, and the masked kernel (ALiBi, a window's parts,
  // documents) is not probed: the matmul rate stands in for both (it predicted BLOOM's steps within
  // 3-10% before).
  const bool fused = dev.fused_attention && mc.attention_softcap == 0;  // no fused kernel takes a cap
  const bool documents = cfg.data.document_attention;
  bool window_masks = false;
  for (int64_t layer = 0; layer < mc.n_layers; ++layer)
    window_masks = window_masks || window_leaves_out_keys(mc, layer, cfg.data.seq_len);
  const bool probed_kernel = fused && mc.positions != PositionKind::ALiBi && !documents && !window_masks;
  const double attention_rate = measured_attention > 0 && probed_kernel ? measured_attention : matmul_rate;
  const double memory_rate = dev.memory_bandwidth * dev.bandwidth_efficiency;
  const int per_node = cluster.devices_per_node;
  // Rank order (grid.h): tp fastest, then cp, then dp, then pp. A group whose span of ranks
  // exceeds a node crosses the slower link. Gradients are reduced over the dp x cp ranks.
  const int replicas = L.replicas();
  const int holders = replicas / L.ep;
  const double tp_bw = L.tp <= per_node ? dev.intra_node_bandwidth : dev.inter_node_bandwidth;
  const double cp_bw = L.tp * L.cp <= per_node ? dev.intra_node_bandwidth : dev.inter_node_bandwidth;
  // The expert-parallel group: ep consecutive dp ranks.
  const double ep_bw = L.tp * L.cp * L.ep <= per_node ? dev.intra_node_bandwidth : dev.inter_node_bandwidth;
  const double dp_bw = L.tp * replicas <= per_node ? dev.intra_node_bandwidth : dev.inter_node_bandwidth;
  const double pp_bw = L.tp * replicas * L.pp <= per_node ? dev.intra_node_bandwidth : dev.inter_node_bandwidth;
  const double lat = dev.collective_latency;

  const double T = static_cast<double>(cfg.data.seq_len);
  const double B = static_cast<double>(L.micro_batch);
  const double M = static_cast<double>(L.micro_batches);
  const double tokens_mb = B * T / L.cp;  // per micro-batch and rank

  std::vector<PipelineStage> stages{PipelineStage{}};
  if (L.pp > 1)
    stages = partition_stages(mc, L.pp, cfg.data.seq_len, cfg.parallel.pipeline_stages, L.virtual_stages,
                              cfg.data.document_attention);
  const int64_t world = static_cast<int64_t>(replicas) * L.tp * L.pp;
  const int64_t pad = world > 1 ? replicas : 1;

  TimeEstimate worst;
  double worst_busy = -1, all_busy = 0;
  for (const auto& stage : stages) {
    const RankModel r = rank_model(mc, L.tp, stage, L.ep);
    const double blocks = static_cast<double>(r.blocks);
    const double D = static_cast<double>(r.dim);
    TimeEstimate t;
    // The all-to-all form attends the whole sequence for its heads: one process' keys.
    const bool by_heads = L.cp > 1 && L.cp_comm == "all_to_all";
    const int keys_cp = by_heads ? 1 : L.cp;
    const TokenCost cost = stage_token_cost(mc, r, T, s, false, fused, documents, keys_cp);
    t.compute = M * tokens_mb * (cost.matmul_flops / matmul_rate + cost.attention_flops / attention_rate);
    // Recomputation: one more forward of the recomputed blocks (attention's: a third of
    // its forward and backward).
    ModelConfig checkpointed = mc;
    checkpointed.activation_checkpointing = L.activation_checkpointing;
    checkpointed.recompute_blocks = L.recompute_blocks;
    double recomputed = 0;
    for (const auto& range : stage.chunks) recomputed += static_cast<double>(recomputed_blocks(checkpointed, range));
    const double share = blocks > 0 ? recomputed / blocks : 0.0;
    t.recompute = M * tokens_mb *
                  (2.0 * recomputed * static_cast<double>(r.block_token_weights) / matmul_rate +
                   share * cost.attention_flops / 3.0 / attention_rate);
    const double elementwise_bytes =
        (1 - share) * cost.elementwise_bytes +
        share * stage_token_cost(mc, r, T, s, true, fused, documents, keys_cp).elementwise_bytes;
    const double ops_per_block =
        kOpsPerBlock +
        (r.experts > 0 ? kOpsPerRouting + static_cast<double>(r.experts + (r.shared_ffn > 0 ? 1 : 0)) * kOpsPerExpert
                       : 0.0);
    t.elementwise = M * tokens_mb * elementwise_bytes / memory_rate +
                    M * (blocks * ops_per_block * (1.0 + share / 3.0) + kOpsOutsideBlocks) * dev.op_overhead;

    if (L.tp > 1) {
      const double per_collective = tokens_mb * D * s;
      // Sequence parallelism moves the same bytes as an all-reduce, as an all-gather and
      // a reduce-scatter: two collectives, each paying the latency.
      const double region = L.sequence_parallel ? 2 * ring_seconds(per_collective, L.tp, 1.0, tp_bw, lat)
                                                : ring_seconds(per_collective, L.tp, 2.0, tp_bw, lat);
      t.tp_comm = M * blocks * 4 * region;
      // Each norm's node gathers its output again in backward (normed_projections).
      if (L.sequence_parallel) t.tp_comm += M * blocks * 2 * ring_seconds(per_collective, L.tp, 1.0, tp_bw, lat);
      if (stage.last) t.tp_comm += M * 2 * ring_seconds(tokens_mb * D * s, L.tp, 2.0, tp_bw, lat);
    }

    if (by_heads) {
      // q, k, v and the output exchanged forward (again where recomputed), their gradients
      // backward: a token of this rank's (H + K' cp) Hd and H Hd values each way, K' the
      // key/value heads each rank receives (K / cp, or one several ranks share).
      const auto kv_sent = static_cast<double>(context_kv_heads_exchanged(r.kv_heads, L.cp));
      const double width = tokens_mb * static_cast<double>(r.head_dim) * s;
      const double exchanges =
          ring_seconds(width * (static_cast<double>(r.heads) + 2 * kv_sent), L.cp, 1.0, cp_bw, lat) +
          ring_seconds(width * static_cast<double>(r.heads), L.cp, 1.0, cp_bw, lat);
      t.cp_comm = M * (2 * blocks + recomputed) * exchanges;
    } else if (L.cp > 1) {
      // The keys and values of the whole sequence, gathered forward, their gradients
      // reduce-scattered backward; gathered once more in backward, by the node of an
      // unmasked block (which keeps the gathered ones where it is recomputed) or by a
      // masked block's recomputation.
      const double kv = B * T * 2 * static_cast<double>(r.kv_heads * r.head_dim) * s;
      double unmasked = 0;
      for (const int64_t layer : r.layers)
        unmasked += unmasked_context_layer(mc, layer, static_cast<int64_t>(T), documents) ? 1 : 0;
      const double again = unmasked + recomputed * (blocks - unmasked) / std::max(blocks, 1.0);
      t.cp_comm = M * (2 * blocks + again) * ring_seconds(kv, L.cp, 1.0, cp_bw, lat);
    }

    if (L.ep > 1) {
      // Each block's routed rows (k a token) to their experts' ranks and back, forward and
      // backward, and forward again where recomputed; before each forward the experts'
      // batch sizes (one message's latency).
      const double rows = tokens_mb * r.kept_choices * D * s;
      t.ep_comm =
          M * ((4 * blocks + 2 * recomputed) * ring_seconds(rows, L.ep, 1.0, ep_bw, lat) + (blocks + recomputed) * lat);
    }

    // Data parallelism over the flat fp32 buffers. Embeddings tied across pipeline
    // stages (unit 0 of the first and last stage) are summed over the two stages after
    // backward, and reduced after that.
    // A rank's experts, apart under ep, are reduced and sharded over the dp / ep ranks
    // that hold them, beside the rest.
    const double P = static_cast<double>(r.padded_elements(pad));
    const double Pe = static_cast<double>(r.expert_padded_elements(holders));
    const double deferred = mc.tie_embeddings && L.pp > 1 ? static_cast<double>(r.units(pad).front()) : 0.0;
    const auto ring_of = [&](double elements, double experts, double factor) {
      return (elements > 0 ? ring_seconds(elements * 4, replicas, factor, dp_bw, lat) : 0.0) +
             (experts > 0 ? ring_seconds(experts * 4, holders, factor, dp_bw, lat) : 0.0);
    };
    double reduce = 0, after = 0, gather = 0;
    if (L.zero == 0) reduce = ring_of(P - deferred, Pe, 2.0), after = ring_of(deferred, 0, 2.0);
    if (L.zero == 1) reduce = ring_of(P - deferred, Pe, 1.0), after = ring_of(deferred, 0, 1.0);
    if (L.zero >= 2) reduce = M * ring_of(P - deferred, Pe, 1.0), after = ring_of(deferred, 0, 1.0);
    if (L.zero == 1 || L.zero == 2) gather = ring_of(P, Pe, 1.0);
    if (L.zero == 3) gather = 2 * M * (bf16 ? ring_of(P / 2, Pe / 2, 1.0) : ring_of(P, Pe, 1.0));  // bf16: in bf16
    t.dp_comm_total = reduce + after + gather;
    // A unit's reduction starts once its last backward pass has produced its gradients
    // (ZeRO-0/1: the last micro-batch's; 2-3: each pass's) and runs under the backward
    // that follows; the last unit's is exposed. Interleaved, chunk c's last pass ends
    // c·pp passes before the step's backward does, so the earlier chunks' reductions hide
    // under the later chunks' passes. ZeRO-3 gathers overlap the forward and backward
    // they prefetch for; ZeRO-1/2 gathers follow the update. On a CPU nothing overlaps:
    // Gloo's threads take the cores the step computes on.
    const double overlap = dev.host ? 0.0 : 1.0;
    const double backward_compute = overlap * (t.compute + t.recompute) * 2.0 / 3.0;
    const double units = static_cast<double>(r.units(pad).size());
    double exposed = after;
    if (L.zero >= 2) {
      exposed += std::max(0.0, reduce - backward_compute) + reduce / units;
    } else {
      const double V = static_cast<double>(L.virtual_stages);
      const double pass = backward_compute / (M * V);
      double done = -std::numeric_limits<double>::infinity();
      for (double c = V - 1; c >= 0; --c) done = std::max(done, -(c * L.pp + 1) * pass) + reduce / V;
      exposed += std::max(0.0, done) + reduce / units;
    }
    if (L.zero == 3)
      exposed += std::max(0.0, gather - overlap * (t.compute + t.recompute)) + gather / (2 * M * units);
    else
      exposed += gather;
    t.dp_comm = replicas > 1 ? exposed : 0.0;

    if (L.pp > 1) {
      const double wire = bf16 ? 2.0 : 4.0;
      const double hop = tokens_mb * D * wire / pp_bw + lat;
      t.pp_comm = M * 2 * static_cast<double>(L.virtual_stages) * hop;  // each chunk's boundary
    }

    const double owned = L.zero >= 1 ? P / replicas + Pe / holders : P + Pe;
    t.optimizer = owned * 28 / memory_rate;
    if (L.offload) {
      const double host_bw = dev.host ? memory_rate : kHostAdamBandwidth;
      t.optimizer = owned * 28 / host_bw;
      if (!dev.host)
        t.optimizer += owned * 8 / dev.host_link_bandwidth;  // gradients out, parameters back
      else
        t.optimizer += owned * 8 / memory_rate;
    }
    const double busy = t.compute + t.recompute + t.elementwise + t.tp_comm + t.cp_comm + t.ep_comm + t.pp_comm;
    all_busy += busy;
    if (busy > worst_busy) {
      worst_busy = busy;
      worst = t;
    }
  }
  // Fill and drain: one micro-batch of every stage but the slowest (1F1B and GPipe alike),
  // through one chunk of each when interleaved.
  if (L.pp > 1) {
    worst.bubble = (all_busy - worst_busy) / M / static_cast<double>(L.virtual_stages);
    const double speedup = dev.idle_peer_speedup;
    if (speedup > 1) {
      // Ranks sharing a machine (CPU cores): the slowest stage computes faster while the
      // others wait. Of its M micro-batches' time the others work (M - 1) of their own
      // alongside (their first forward and last backward are the fill and drain), on
      // average over the P - 1 of them; the rest runs at the idle peers' speed. In the
      // fill and drain (P - 2) / (2 (P - 1)) of the other stages work on average (none for
      // two stages).
      const double others = static_cast<double>(L.pp - 1);
      const double alongside = std::min(worst_busy, (all_busy - worst_busy) * (M - 1) / M / others);
      const double scale = (alongside + (worst_busy - alongside) / speedup) / worst_busy;
      worst.compute *= scale;
      worst.recompute *= scale;
      worst.elementwise *= scale;
      worst_busy = worst.compute + worst.recompute + worst.elementwise + worst.tp_comm + worst.cp_comm + worst.ep_comm +
                   worst.pp_comm;
      const double busy_in_bubble = (others - 1) / (2 * others);
      worst.bubble *= busy_in_bubble + (1 - busy_in_bubble) / speedup;
    }
  }
  worst.step = worst_busy + worst.bubble + worst.dp_comm + worst.optimizer;
  const double global_tokens = static_cast<double>(cfg.batch.global_batch) * T;
  worst.tokens_per_second = global_tokens / worst.step;
  return worst;
}

}  // namespace tide::plan

namespace tide {

TokenCost token_cost(const ModelConfig& m, int64_t seq_len, DType compute) {
  return plan::stage_token_cost(m, plan::rank_model(m, 1, PipelineStage{}), static_cast<double>(seq_len),
                                compute == DType::Float32 ? 4.0 : 2.0, false, true, false);
}

}  // namespace tide
