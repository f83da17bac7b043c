// The masks attention is given, and attention over a sliding window a block of queries at
// a time.
//
// LibTorch's attention kernels take no window: a [T, T] mask makes them compute every
// score, the ones the window leaves out too (at 32768 tokens and a window of 512, 64
// times the scores the window needs). So a layer whose window is shorter than the
// sequence attends in parts: the first w queries see every key before them (plain causal
// attention over [0, w)); after them, blocks of R queries [f, f + R) each see the keys
// [f - w, f + R), one attention call for all such blocks of the batch (the blocks stacked
// as sequences of a batch). A sequence costs about T (R + w) scores in place of T^2.
//
// Shape legend: B batch, H query heads, K key/value heads, T time, Hd head width, n the
// blocks of a part, R a block's queries, S its keys.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tide {

// What an additive mask adds to the score of a key a query may not see.
inline constexpr float kMaskedScore = -std::numeric_limits<float>::infinity();

// [rows, keys] booleans, true where a query may see a key: the queries are the last `rows`
// of the keys' positions (query r sits at key keys - rows + r), each sees the keys at or
// before it, and with a window w > 0 only the w nearest (its own among them).
at::Tensor allowed_keys(int64_t rows, int64_t keys, int64_t window, const at::Device& device);

// `allowed` as the additive mask attention adds to its scores: 0 where a key is allowed,
// -inf where not, in `options`' dtype (the stream's). PyTorch's attention turns a boolean
// mask into this at every call, and autograd keeps each call's copy for backward; made
// once, every block of a chunk shares one.
at::Tensor additive_mask(const at::Tensor& allowed, const at::TensorOptions& options);

// ALiBi's bias [1, H, rows, keys] in fp32, slope_h * (j - i) for query i and key j placed
// as allowed_keys places them (unmasked: -inf goes on where a key is not allowed).
// Softmax is shift-invariant per row, so this equals BLOOM's slope_h * j.
at::Tensor alibi_distances(const at::Tensor& slopes, int64_t rows, int64_t keys, const at::Device& device);

// One attention call of a windowed layer: `blocks` blocks of `rows` queries from query
// `first` on, block i's keys [keys_first + i rows, + keys) with the queries their last
// `rows` (keys = rows + first - keys_first). `mask` additive, [1 or B n, 1 or H, rows,
// keys]; undefined where the part is plain causal attention (each query sees every key
// up to it: rows == keys, or a context-parallel chunk after other keys).
struct WindowPart {
  int64_t first = 0, blocks = 1, rows = 0, keys_first = 0;
  at::Tensor mask;
  int64_t keys() const { return rows + first - keys_first; }
};

// The additive mask of part `p`, [1 or B n, 1 or H, R, S] in `options`' dtype: each query
// sees the keys at or before it, with a window w > 0 only the w nearest; with `documents`
// [B, T] only keys of its own document; with ALiBi's `slopes` [H] (undefined: none) its bias.
at::Tensor part_mask(const WindowPart& p, int64_t window, const at::Tensor& documents, const at::Tensor& slopes,
                     const at::TensorOptions& options);

// A windowed layer's parts for a sequence of t tokens: the first `window` queries, then
// blocks of `rows`, then the queries left (fewer than `rows`), in order.
struct WindowedAttention {
  int64_t t = 0;
  std::vector<WindowPart> parts;
};

// The parts of a sequence of t tokens (t > window > 0) in blocks of `rows`, their masks
// in `options`' dtype: the window's band; with `documents` [B, T] (numbers that never
// decrease along a row) a query sees only keys of its own document; with ALiBi's
// `slopes` [H] (undefined: none) its bias.
WindowedAttention windowed_attention_parts(int64_t t, int64_t window, int64_t rows, const at::Tensor& documents,
                                           const at::Tensor& slopes, const at::TensorOptions& options);

// Attention of a part: q [N, H, R, Hd] and k, v [N, K, S, Hd] (the queries the last R of
// the keys' positions), `mask` as WindowPart's; returns [N, H, R, Hd].
using PartAttention =
    std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask)>;

// q [B, H, T, Hd], k and v [B, K, T, Hd] attended part by part through `attend`;
// returns [B, H, T, Hd]. Gradients reach q, k and v through the parts' slices.
at::Tensor windowed_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const WindowedAttention& parts, const PartAttention& attend);

struct ContextAttention;  // context_parallel.h
struct ContextParallel;

// What a block's attention is told about the keys each query may see: `bias` for
// attention over the whole sequence (undefined: causal; additive [1 or B, 1 or H, T, T];
// or boolean, true where a query may look), or `windowed`, the parts of a window shorter
// than the sequence, or `context`, this rank's chunks of a sequence cut by context
// parallelism (their keys gathered from every rank). With `by_heads` (all-to-all context
// parallelism) the block exchanges its tokens' q, k and v for the whole sequence's of its
// share of the heads, which `bias` or `windowed` then describe, and exchanges the output
// back. Shared by every block of a kind in a chunk.
struct AttentionMask {
  at::Tensor bias;
  std::shared_ptr<const WindowedAttention> windowed;
  std::shared_ptr<const ContextAttention> context;
  std::shared_ptr<const ContextParallel> by_heads;
  AttentionMask() = default;
  AttentionMask(at::Tensor dense) : bias(std::move(dense)) {}  // NOLINT: a dense mask is a mask
};

}  // namespace tide
