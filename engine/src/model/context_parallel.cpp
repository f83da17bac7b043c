// Context parallelism's cut of a sequence and its attention (context_parallel.h).
#include "tide/engine/model/context_parallel.h"

#include <algorithm>

#include <torch/csrc/autograd/custom_function.h>
#include <torch/types.h>

#include "recompute.h"
#include "tide/engine/config.h"
#include "tide/engine/model/chunk_attention.h"

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

// `by_rank` [cp, ...]: each rank's tokens (its two chunks) along `dim` of its part, read
// in position order along `dim` (position chunk m is rank m's first for m < cp, rank 2 cp
// - 1 - m's second after). One copy.
at::Tensor in_position_order(const at::Tensor& by_rank, int64_t dim) {
  const auto size = static_cast<int>(by_rank.size(0));
  const int64_t c = by_rank.size(dim + 1) / 2;
  std::vector<at::Tensor> chunks;
  for (int m = 0; m < 2 * size; ++m)
    chunks.push_back(m < size ? by_rank.select(0, m).narrow(dim, 0, c)
                              : by_rank.select(0, 2 * size - 1 - m).narrow(dim, c, c));
  return at::cat(chunks, dim);
}

// in_position_order's reverse: `ordered`'s chunks along `dim` written into `by_rank` [cp,
// ...], each rank's two at its index.
void write_by_rank(const at::Tensor& by_rank, const at::Tensor& ordered, int64_t dim) {
  const auto size = static_cast<int>(by_rank.size(0));
  const int64_t c = by_rank.size(dim + 1) / 2;
  for (int j = 0; j < size; ++j)
    for (int which = 0; which < 2; ++which)
      by_rank.select(0, j).narrow(dim, which * c, c).copy_(ordered.narrow(dim, chunk_of(j, size, which) * c, c));
}

// Every rank's keys and values, `local` [2, B, K, L, Hd] on each, read in position
// order: [2, B, K, T, Hd]. One copy beside the collective's.
at::Tensor gathered_in_order(const at::Tensor& local, const ContextAttention& context) {
  std::vector<int64_t> by_rank{context.group->size()};
  by_rank.insert(by_rank.end(), local.sizes().begin(), local.sizes().end());
  return in_position_order(context.group->all_gather(local, "context-parallel keys and values").view(by_rank), 3);
}

// gathered_in_order's backward: the gradients of the whole sequence's keys and values,
// [2, B, K, T, Hd] on each rank, summed over the ranks into this rank's [2, B, K, L, Hd].
at::Tensor scattered_from_order(const at::Tensor& grad, const ContextAttention& context) {
  const int size = context.group->size();
  auto local = grad.sizes().vec();
  local[3] /= size;
  std::vector<int64_t> sizes{size};
  sizes.insert(sizes.end(), local.begin(), local.end());
  auto by_rank = at::empty(sizes, grad.options());
  write_by_rank(by_rank, grad, 3);
  return context.group->reduce_scatter_sum(by_rank, "context-parallel key and value gradients").view(local);
}

void check_local(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ContextAttention& context) {
  const int64_t local = context.positions.size(0);
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && q.size(2) == local && k.size(2) == local && v.sizes() == k.sizes(),
              "context attention made for ", local, " tokens a rank given q ", q.sizes(), ", k ", k.sizes(), " and v ",
              v.sizes());
}

struct ContextHolder : torch::CustomClassHolder {
  explicit ContextHolder(ContextAttention c, double s = 0) : context(std::move(c)), scale(s) {}
  ContextAttention context;
  double scale;                             // unmasked_context_attention's softmax scale
  std::vector<std::vector<int64_t>> sizes;  // each chunk's chunk_attention_forward sizes
  size_t state_tensors = 0;                 // and the number of its saved tensors
};

// gathered_in_order with autograd: backward scatters the gradients (the masked path,
// whose attention nodes keep the gathered keys and values).
struct GatherInOrder : torch::autograd::Function<GatherInOrder> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& local,
                            const c10::intrusive_ptr<ContextHolder>& holder) {
    ctx->saved_data["context"] = c10::IValue::make_capsule(holder);
    return gathered_in_order(local, holder->context);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto holder = c10::static_intrusive_pointer_cast<ContextHolder>(ctx->saved_data["context"].toCapsule());
    return {scattered_from_order(grads[0], holder->context), at::Tensor()};
  }
};

struct UnmaskedContextAttention : torch::autograd::Function<UnmaskedContextAttention> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const c10::intrusive_ptr<ContextHolder>& holder) {
    const ContextAttention& context = holder->context;
    const auto local = at::stack({k, v});
    const auto all = gathered_in_order(local, context);
    const auto keys = all.select(0, 0), values = all.select(0, 1);
    // [B, H, L, Hd] over [B, L, H, Hd] memory, as the fused kernels lay out their outputs:
    // the output projection reads it as [B, L, H Hd] without a copy, so the node and the
    // projection keep one tensor.
    const auto out = at::empty({q.size(0), q.size(2), q.size(1), q.size(3)}, q.options()).transpose(1, 2);
    std::vector<at::Tensor> keep{q, local};
    for (const ContextChunk& chunk : context.chunks) {
      const int64_t seen = chunk.part.first + chunk.part.rows;  // the keys up to its last query
      ChunkAttentionForward f =
          chunk_attention_forward(q.narrow(2, chunk.local_first, chunk.part.rows), keys.narrow(2, 0, seen),
                                  values.narrow(2, 0, seen), holder->scale);
      out.narrow(2, chunk.local_first, chunk.part.rows).copy_(f.out);
      keep.insert(keep.end(), f.saved.begin(), f.saved.end());
      holder->state_tensors = f.saved.size();
      holder->sizes.push_back(std::move(f.sizes));
    }
    keep.push_back(out);
    if (recomputing_for_backward()) keep.push_back(all);
    ctx->save_for_backward(keep);
    ctx->saved_data["context"] = c10::IValue::make_capsule(holder);
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto holder = c10::static_intrusive_pointer_cast<ContextHolder>(ctx->saved_data["context"].toCapsule());
    const ContextAttention& context = holder->context;
    const auto s = ctx->get_saved_variables();
    const size_t chunks = context.chunks.size(), states = 2 + chunks * holder->state_tensors;
    const at::Tensor &q = s[0], &local = s[1], &out = s[states];
    auto all = s.size() > states + 1 ? s[states + 1] : gathered_in_order(local, context);
    auto keys = all.select(0, 0), values = all.select(0, 1);
    auto grad_all = at::zeros_like(all);
    std::vector<at::Tensor> grad_q;
    for (size_t i = 0; i < chunks; ++i) {
      const ContextChunk& chunk = context.chunks[i];
      const int64_t first = chunk.local_first, rows = chunk.part.rows, seen = chunk.part.first + rows;
      const auto first_state = s.begin() + static_cast<std::ptrdiff_t>(2 + i * holder->state_tensors);
      const std::vector<at::Tensor> state(first_state,
                                          first_state + static_cast<std::ptrdiff_t>(holder->state_tensors));
      grad_q.push_back(chunk_attention_backward(
          grads[0].narrow(2, first, rows), q.narrow(2, first, rows), keys.narrow(2, 0, seen), values.narrow(2, 0, seen),
          out.narrow(2, first, rows), state, holder->sizes[i], holder->scale, grad_all.select(0, 0).narrow(2, 0, seen),
          grad_all.select(0, 1).narrow(2, 0, seen)));
    }
    all = keys = values = at::Tensor();  // gone before the gradients are laid out by rank
    const auto grad_local = scattered_from_order(grad_all, context);
    return {at::cat(grad_q, 2), grad_local.select(0, 0), grad_local.select(0, 1), at::Tensor()};
  }
};

// The all-to-all form's exchanges. Each tensor of a list, [B, heads, ., Hd], travels in
// one collective: [cp, B, Σ shares, L, Hd], chunk j for rank j.
struct HeadExchange : torch::CustomClassHolder {
  HeadExchange(std::shared_ptr<TensorParallelGroup> g, std::vector<int64_t> h)
      : group(std::move(g)), heads(std::move(h)) {}
  std::shared_ptr<TensorParallelGroup> group;
  std::vector<int64_t> heads;  // each tensor's heads on this rank's tokens
};

// This rank's tokens of every head → the whole sequence of its share of the heads, each
// [B, count, T, Hd] in position order.
std::vector<at::Tensor> heads_from_tokens(const std::vector<at::Tensor>& xs, const HeadExchange& ex) {
  const int n = ex.group->size(), me = ex.group->rank();
  const int64_t b = xs[0].size(0), l = xs[0].size(2), hd = xs[0].size(3);
  int64_t width = 0;
  for (const int64_t h : ex.heads) width += context_head_share(h, me, n).count;
  auto send = at::empty({n, b, width, l, hd}, xs[0].options());
  for (int j = 0; j < n; ++j) {
    int64_t offset = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const HeadShare share = context_head_share(ex.heads[i], j, n);
      send.select(0, j).narrow(1, offset, share.count).copy_(xs[i].narrow(1, share.first, share.count));
      offset += share.count;
    }
  }
  // [cp, B, width, L, Hd]: rank i's tokens of this rank's heads at i.
  const auto received = ex.group->all_to_all(send, "context-parallel heads (all-to-all)");
  send = at::Tensor();
  std::vector<at::Tensor> out;
  int64_t offset = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const int64_t count = context_head_share(ex.heads[i], me, n).count;
    out.push_back(in_position_order(received.narrow(2, offset, count), 2));
    offset += count;
  }
  return out;
}

// heads_from_tokens' reverse: each [B, count, T, Hd] of this rank's share of the heads →
// [B, heads, L, Hd] of its tokens, over [B, L, heads, Hd] memory. A head that several
// ranks hold (fewer key/value heads than ranks) gets the sum of theirs: used for
// gradients, where each rank's is a part.
std::vector<at::Tensor> tokens_from_heads(const std::vector<at::Tensor>& xs, const HeadExchange& ex) {
  const int n = ex.group->size();
  const int64_t b = xs[0].size(0), hd = xs[0].size(3), l = xs[0].size(2) / n;
  int64_t width = 0;
  for (const auto& x : xs) width += x.size(1);
  auto send = at::empty({n, b, width, l, hd}, xs[0].options());
  int64_t sent = 0;
  for (const auto& x : xs) {
    write_by_rank(send.narrow(2, sent, x.size(1)), x, 2);
    sent += x.size(1);
  }
  // [cp, B, width, L, Hd]: rank i's share of the heads for this rank's tokens at i.
  const auto received = ex.group->all_to_all(send, "context-parallel tokens (all-to-all)");
  send = at::Tensor();
  std::vector<at::Tensor> out;
  int64_t offset = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const int64_t heads = ex.heads[i], count = xs[i].size(1);
    const auto part = received.narrow(2, offset, count);  // [cp, B, count, L, Hd]
    at::Tensor whole;
    if (heads % n == 0) {
      whole = at::empty({b, l, heads, hd}, xs[i].options());
      whole.view({b, l, n, count, hd}).permute({2, 0, 3, 1, 4}).copy_(part);
    } else {
      whole = at::zeros({b, l, heads, hd}, xs[i].options());
      for (int j = 0; j < n; ++j)
        whole.narrow(2, context_head_share(heads, j, n).first, count).add_(part.select(0, j).transpose(1, 2));
    }
    out.push_back(whole.transpose(1, 2));
    offset += count;
  }
  return out;
}

struct SequenceOfHeads : torch::autograd::Function<SequenceOfHeads> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                                                const at::Tensor& k, const at::Tensor& v,
                                                const c10::intrusive_ptr<HeadExchange>& ex) {
    ctx->saved_data["exchange"] = c10::IValue::make_capsule(ex);
    return heads_from_tokens({q, k, v}, *ex);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto ex = c10::static_intrusive_pointer_cast<HeadExchange>(ctx->saved_data["exchange"].toCapsule());
    auto g = tokens_from_heads({grads[0], grads[1], grads[2]}, *ex);
    return {g[0], g[1], g[2], at::Tensor()};
  }
};

struct TokensOfHeads : torch::autograd::Function<TokensOfHeads> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& out,
                            const c10::intrusive_ptr<HeadExchange>& ex) {
    ctx->saved_data["exchange"] = c10::IValue::make_capsule(ex);
    return tokens_from_heads({out}, *ex)[0];
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto ex = c10::static_intrusive_pointer_cast<HeadExchange>(ctx->saved_data["exchange"].toCapsule());
    return {heads_from_tokens({grads[0]}, *ex)[0], at::Tensor()};
  }
};
}  // namespace

HeadShare context_head_share(int64_t heads, int rank, int size) {
  TORCH_CHECK(heads % size == 0 || size % heads == 0, heads, " heads do not split over ", size,
              " context-parallel ranks (the all-to-all form needs one to divide the other)");
  return {rank * heads / size, heads % size == 0 ? heads / size : 1};
}

SequenceHeads sequence_of_heads(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const ContextParallel& cp) {
  TORCH_CHECK(cp.by_heads(), "sequence_of_heads without all-to-all context parallelism");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.sizes() == k.sizes() && q.size(2) == k.size(2) && q.size(2) % 2 == 0 &&
                  context_heads_split(q.size(1), k.size(1), cp.size()),
              "all-to-all context attention over ", cp.size(), " ranks given q ", q.sizes(), ", k ", k.sizes(),
              " and v ", v.sizes());
  auto ex = c10::make_intrusive<HeadExchange>(cp.group, std::vector<int64_t>{q.size(1), k.size(1), k.size(1)});
  auto out = SequenceOfHeads::apply(q, k, v, ex);
  return {out[0], out[1], out[2]};
}

at::Tensor tokens_of_heads(const at::Tensor& out, const ContextParallel& cp) {
  TORCH_CHECK(cp.by_heads(), "tokens_of_heads without all-to-all context parallelism");
  TORCH_CHECK(out.dim() == 4 && out.size(2) % (2 * static_cast<int64_t>(cp.size())) == 0,
              "all-to-all context attention over ", cp.size(), " ranks given an output of ", out.sizes());
  const auto ex = c10::make_intrusive<HeadExchange>(cp.group, std::vector<int64_t>{out.size(1) * cp.size()});
  return TokensOfHeads::apply(out, ex);
}

bool ContextAttention::unmasked() const {
  return std::all_of(chunks.begin(), chunks.end(), [](const ContextChunk& c) { return !c.part.mask.defined(); });
}

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
  out.options = options;
  out.positions = context_positions(t, rank, size, options.device());
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
  check_local(q, k, v, context);
  // Keys and values in one collective, read in position order: [2, B, K, T, Hd].
  const auto all = GatherInOrder::apply(at::stack({k, v}), c10::make_intrusive<ContextHolder>(context));
  const auto keys = all.select(0, 0), values = all.select(0, 1);
  std::vector<at::Tensor> outs;
  outs.reserve(context.chunks.size());
  for (const ContextChunk& chunk : context.chunks) {
    const WindowPart& p = chunk.part;
    outs.push_back(attend(q.narrow(2, chunk.local_first, p.rows), keys.narrow(2, p.keys_first, p.keys()),
                          values.narrow(2, p.keys_first, p.keys()), p.mask));
  }
  return at::cat(outs, 2);
}

at::Tensor unmasked_context_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const ContextAttention& context, double scale) {
  check_local(q, k, v, context);
  TORCH_CHECK(context.unmasked(), "unmasked context attention given chunks with masks");
  return UnmaskedContextAttention::apply(q, k, v, c10::make_intrusive<ContextHolder>(context, scale));
}

}  // namespace tide
