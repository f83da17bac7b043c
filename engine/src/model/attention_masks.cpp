// The masks of attention_masks.h, and a window's parts attended through one call each.
#include "tide/engine/model/attention_masks.h"

#include <torch/types.h>

namespace tide {
namespace {

// The mask laid out with every stride but the last a multiple of 8 elements: CUDA's
// memory-efficient attention kernel wants that, and copies (pads) a mask that is not so
// at every call. The padding columns are never read.
at::Tensor rows_aligned(const at::Tensor& mask) {
  const int64_t keys = mask.size(-1), padded = (keys + 7) / 8 * 8;
  if (keys == padded) return mask;
  auto sizes = mask.sizes().vec();
  sizes.back() = padded;
  auto out = at::empty(sizes, mask.options()).narrow(-1, 0, keys);
  out.copy_(mask);
  return out;
}

// x [B, K, T, Hd] as the part's blocks of keys, [B n, K, S, Hd]: block i's keys start
// `rows` after block i - 1's, so the blocks overlap by S - R keys (a copy; autograd sums
// a key's gradient over the blocks that read it).
at::Tensor stacked_keys(const at::Tensor& x, const WindowPart& p) {
  const int64_t n = p.blocks, s = p.keys();
  return x.narrow(2, p.keys_first, (n - 1) * p.rows + s)
      .unfold(2, s, p.rows)      // [B, K, n, Hd, S]
      .permute({0, 2, 1, 4, 3})  // [B, n, K, S, Hd]
      .reshape({x.size(0) * n, x.size(1), s, x.size(3)});
}

}  // namespace

at::Tensor part_mask(const WindowPart& p, int64_t window, const at::Tensor& documents, const at::Tensor& slopes,
                     const at::TensorOptions& options) {
  const int64_t n = p.blocks, r = p.rows, s = p.keys();
  auto allowed = allowed_keys(r, s, window, options.device()).view({1, 1, r, s});  // the same in every block
  if (documents.defined()) {
    const int64_t b = documents.size(0);
    const auto queries = documents.narrow(1, p.first, n * r).view({b, n, r, 1});
    const auto keys = documents.narrow(1, p.keys_first, (n - 1) * r + s).unfold(1, s, r).view({b, n, 1, s});
    allowed = queries.eq(keys).logical_and_(allowed).view({b * n, 1, r, s});
  }
  if (!slopes.defined()) return rows_aligned(additive_mask(allowed, options));
  const auto bias = alibi_distances(slopes, r, s, options.device());  // [1, H, R, S]
  return rows_aligned(at::where(allowed, bias, at::scalar_tensor(kMaskedScore, bias.options())).to(options.dtype()));
}

at::Tensor allowed_keys(int64_t rows, int64_t keys, int64_t window, const at::Device& device) {
  // Query r sits at key keys - rows + r: it sees keys j <= that, and within the window
  // those above it less w.
  auto band = at::ones({rows, keys}, at::TensorOptions().dtype(at::kBool).device(device)).tril(keys - rows);
  if (window > 0) band = band.triu(keys - rows - window + 1);
  return band;
}

at::Tensor additive_mask(const at::Tensor& allowed, const at::TensorOptions& options) {
  return at::zeros(allowed.sizes(), options.requires_grad(false)).masked_fill_(allowed.logical_not(), kMaskedScore);
}

at::Tensor alibi_distances(const at::Tensor& slopes, int64_t rows, int64_t keys, const at::Device& device) {
  // Made in fp32 and rounded once to the stream's dtype by the caller (bf16 holds
  // integers exactly only up to 256, so j - i itself would round).
  const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(device);
  const auto key = at::arange(keys, fp32), query = at::arange(rows, fp32).add_(static_cast<double>(keys - rows));
  const auto distance = key.unsqueeze(0) - query.unsqueeze(1);  // [rows, keys]: j - i
  return slopes.to(device, at::kFloat).view({1, -1, 1, 1}) * distance.view({1, 1, rows, keys});
}

WindowedAttention windowed_attention_parts(int64_t t, int64_t window, int64_t rows, const at::Tensor& documents,
                                           const at::Tensor& slopes, const at::TensorOptions& options) {
  TORCH_CHECK(window > 0 && t > window && rows > 0, "windowed attention over ", t, " tokens with a window of ", window,
              " in blocks of ", rows, " queries");
  const auto opts = options.requires_grad(false);
  WindowedAttention out;
  out.t = t;
  // The first w queries: every key before them is in the window.
  WindowPart head;
  head.rows = window;
  const bool plain = !documents.defined() && !slopes.defined();
  if (!plain) head.mask = part_mask(head, 0, documents, slopes, opts);
  out.parts.push_back(head);
  // Then whole blocks of `rows`, each reading the w keys before its first query on.
  const int64_t blocks = (t - window) / rows;
  if (blocks > 0) {
    WindowPart body;
    body.first = window;
    body.blocks = blocks;
    body.rows = rows;
    body.keys_first = 0;
    body.mask = part_mask(body, window, documents, slopes, opts);
    out.parts.push_back(body);
  }
  if (const int64_t left = t - window - blocks * rows; left > 0) {
    WindowPart tail;
    tail.first = t - left;
    tail.rows = left;
    tail.keys_first = tail.first - window;
    tail.mask = part_mask(tail, window, documents, slopes, opts);
    out.parts.push_back(tail);
  }
  return out;
}

at::Tensor windowed_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const WindowedAttention& parts, const PartAttention& attend) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && q.size(2) == parts.t && k.size(2) == parts.t,
              "windowed attention made for ", parts.t, " tokens given q ", q.sizes(), " and k ", k.sizes());
  const int64_t b = q.size(0), h = q.size(1), hd = q.size(3);
  // Each part's output [B, rows, H, Hd], joined along time: the caller's [B, T, H Hd] is a
  // view of it.
  std::vector<at::Tensor> outs;
  outs.reserve(parts.parts.size());
  for (const WindowPart& p : parts.parts) {
    if (p.blocks == 1) {
      // Copies, not views: a view kept for backward would keep all of q, k or v.
      const auto out =
          attend(q.narrow(2, p.first, p.rows).contiguous(), k.narrow(2, p.keys_first, p.keys()).contiguous(),
                 v.narrow(2, p.keys_first, p.keys()).contiguous(), p.mask);
      outs.push_back(out.transpose(1, 2));
      continue;
    }
    const int64_t n = p.blocks, r = p.rows;
    const auto queries = q.narrow(2, p.first, n * r).view({b, h, n, r, hd}).transpose(1, 2).reshape({b * n, h, r, hd});
    const auto out = attend(queries, stacked_keys(k, p), stacked_keys(v, p), p.mask);  // [B n, H, R, Hd]
    outs.push_back(out.view({b, n, h, r, hd}).permute({0, 1, 3, 2, 4}).reshape({b, n * r, h, hd}));
  }
  return at::cat(outs, 1).transpose(1, 2);
}

}  // namespace tide
