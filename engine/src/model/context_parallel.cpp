// Context parallelism's cut of a sequence and its attention (context_parallel.h).
#include "tide/engine/model/context_parallel.h"

#include <torch/types.h>

namespace tide {
namespace {
// The chunk of the 2 size chunks that rank `rank` holds as its first (0) or second (1).
int64_t chunk_of(int rank, int size, int which) { return which == 0 ? rank : 2 * size - 1 - rank; }

// The length of each of the 2 size chunks of a sequence of t tokens.
int64_t chunk_length(int64_t t, int size) {
  const int64_t chunks = 2 * static_cast<int64_t>(size);
  TORCH_CHECK(size >= 1 && t % chunks == 0, "a sequence of ", t, " tokens does not cut into 2 x cp = ", chunks,
              " equal chunks");
  return t / chunks;
}
}  // namespace

at::Tensor context_positions(int64_t t, int rank, int size, const at::Device& device) {
  const int64_t c = chunk_length(t, size);
  const auto opts = at::TensorOptions().dtype(at::kLong).device(device);
  return at::cat({at::arange(chunk_of(rank, size, 0) * c, (chunk_of(rank, size, 0) + 1) * c, opts),
                  at::arange(chunk_of(rank, size, 1) * c, (chunk_of(rank, size, 1) + 1) * c, opts)});
}

at::Tensor context_slice(const at::Tensor& x, int64_t dim, const ContextParallel& cp) {
  if (cp.size() == 1) return x;
  const int64_t c = chunk_length(x.size(dim), cp.size());
  // Two narrows and a cat: no index tensor, and autograd's backward is two narrows too.
  return at::cat({x.narrow(dim, chunk_of(cp.rank(), cp.size(), 0) * c, c),
                  x.narrow(dim, chunk_of(cp.rank(), cp.size(), 1) * c, c)},
                 dim);
}

ContextAttention context_attention_chunks(const ContextParallel& cp, int64_t t, int64_t window,
                                          const at::Tensor& documents, const at::Tensor& slopes,
                                          const at::TensorOptions& options) {
  TORCH_CHECK(cp.group, "context attention without a context-parallel group");
  const int size = cp.size(), rank = cp.rank();
  const int64_t c = chunk_length(t, size);
  ContextAttention out;
  out.group = cp.group;
  out.t = t;
  out.positions = context_positions(t, rank, size, options.device());
  // The gathered sequence holds rank j's tokens at [2 c j, 2 c (j + 1)): its positions,
  // inverted, read it in position order.
  std::vector<at::Tensor> held;
  for (int j = 0; j < size; ++j) held.push_back(context_positions(t, j, size, at::kCPU));
  const auto gathered_positions = at::cat(held);
  out.order = at::empty({t}, at::kLong).scatter_(0, gathered_positions, at::arange(t, at::kLong)).to(options.device());
  const auto opts = options.requires_grad(false);
  for (int which = 0; which < 2; ++which) {
    ContextChunk chunk;
    chunk.local_first = which * c;
    WindowPart& p = chunk.part;
    p.first = chunk_of(rank, size, which) * c;
    p.rows = c;
    // A window reaches back w - 1 keys from each query; its first query's reach is the
    // chunk's first key.
    p.keys_first = window > 0 ? std::max<int64_t>(0, p.first + 1 - window) : 0;
    // Plain causal attention needs no mask, its keys before the chunk neither: `attend`
    // is told only that the queries are the keys' last (chunk_attention.h).
    const bool plain = (window == 0 || window >= p.first + p.rows) && !documents.defined() && !slopes.defined();
    if (!plain) p.mask = part_mask(p, window, documents, slopes, opts);
    out.chunks.push_back(std::move(chunk));
  }
  return out;
}

at::Tensor context_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const ContextAttention& context, const PartAttention& attend) {
  const int64_t local = context.positions.size(0), hd = k.size(3);
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && q.size(2) == local && k.size(2) == local && v.sizes() == k.sizes(),
              "context attention made for ", local, " tokens a rank given q ", q.sizes(), ", k ", k.sizes(), " and v ",
              v.sizes());
  // Keys and values in one collective: [B, L, K, 2 Hd] gathered along time, read in
  // position order, [B, K, T, 2 Hd].
  const auto both = at::cat({k, v}, -1).transpose(1, 2);
  const auto all = context.group->gather_sequence(both).index_select(1, context.order).transpose(1, 2);
  const auto keys = all.narrow(-1, 0, hd), values = all.narrow(-1, hd, hd);
  std::vector<at::Tensor> outs;
  outs.reserve(context.chunks.size());
  for (const ContextChunk& chunk : context.chunks) {
    const WindowPart& p = chunk.part;
    outs.push_back(attend(q.narrow(2, chunk.local_first, p.rows), keys.narrow(2, p.keys_first, p.keys()),
                          values.narrow(2, p.keys_first, p.keys()), p.mask));
  }
  return at::cat(outs, 2);
}

}  // namespace tide
