// Soft-capped attention a block of queries at a time (flash attention's shape, in LibTorch
// ops): forward keeps the output and each row's log-sum-exp, never the T x T scores;
// backward makes each block's scores again. With dropout the scores are written out
// whole and autograd differentiates them (the dropped probabilities must be kept).
//
// Shape legend: B batch, K key/value heads, G = H / K query heads a key/value head
// serves, T the queries, S the keys (T <= S: the queries are the last T of the keys'
// positions), Tq a block's queries, Tk the keys they may see (causal: up to the block's
// last query), Hd head width.
#include "tide/engine/model/softcapped_attention.h"

#include <algorithm>
#include <limits>

#include <torch/csrc/autograd/custom_function.h>
#include <torch/types.h>

namespace tide {
namespace {

// Queries a block: its fp32 scores [B, H, Tq, S] within about 64 MiB (a handful of such
// temporaries live at once in backward), at least 16 rows.
int64_t query_block(int64_t b, int64_t h, int64_t t, int64_t s) {
  constexpr int64_t kBlockBytes = int64_t{64} << 20;
  const int64_t row_bytes = std::max<int64_t>(1, b * h * s * 4);
  return std::clamp<int64_t>(kBlockBytes / row_bytes, 16, std::max<int64_t>(t, 1));
}

struct Geometry {
  int64_t b, h, kv, g, t, s, hd;
  int64_t offset() const { return s - t; }  // query i sits at key i + offset
};

// fp32, or fp64 for fp64 inputs: what the cap, the softmax and the sums run in.
at::ScalarType wide(const at::Tensor& q) { return at::promote_types(q.scalar_type(), at::kFloat); }

Geometry geometry_of(const at::Tensor& q, const at::Tensor& k) {
  const int64_t h = q.size(1), kv = k.size(1);
  return {q.size(0), h, kv, h / kv, q.size(2), k.size(2), q.size(3)};
}

// The capped scores of queries [first, first + rows) against keys [0, first + rows + offset), fp32,
// [B, K, G, Tq, Tk], -inf where a query may not look; with `squashed`, also tanh(s / cap)
// there (for the cap's slope).
at::Tensor block_scores(const at::Tensor& q5, const at::Tensor& k5, const at::Tensor& bias, const Geometry& d,
                        int64_t first, int64_t rows, double scale, double cap, at::Tensor* squashed) {
  const int64_t keys = first + rows + d.offset();
  const auto qb = q5.narrow(3, first, rows);                   // [B, K, G, Tq, Hd]
  const auto kb = k5.narrow(3, 0, keys);                       // [B, K, 1, Tk, Hd]
  auto t = at::matmul(qb, kb.transpose(-2, -1)).to(wide(q5));  // [B, K, G, Tq, Tk]
  t = t.mul_(scale / cap).tanh_();
  if (squashed) *squashed = t;
  auto s = t.mul(cap);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  if (!bias.defined()) {
    // Query first + i sees keys up to first + i + offset.
    const auto future = at::ones({rows, keys}, q5.options().dtype(at::kBool)).triu(first + d.offset() + 1);
    s.masked_fill_(future, neg_inf);
  } else {
    const auto part = bias.narrow(2, first, rows).narrow(3, 0, keys);  // [1 or B, 1 or H, Tq, Tk]
    const int64_t heads = part.size(1);
    const auto grouped = heads == 1 ? part.unsqueeze(1) : part.reshape({part.size(0), d.kv, d.g, rows, keys});
    if (bias.scalar_type() == at::kBool)
      s.masked_fill_(grouped.logical_not(), neg_inf);
    else
      s.add_(grouped.to(s.scalar_type()));
  }
  return s;
}

// The mask or bias, held apart from the node's differentiable inputs (it may be undefined,
// and it takes no gradient).
struct Mask {
  at::Tensor bias;
};

struct BlockedSoftcappedAttention : torch::autograd::Function<BlockedSoftcappedAttention> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const Mask& mask, double scale, double cap, int64_t block) {
    const at::Tensor& bias = mask.bias;
    const Geometry d = geometry_of(q, k);
    const auto q5 = q.reshape({d.b, d.kv, d.g, d.t, d.hd});
    const auto k5 = k.unsqueeze(2), v5 = v.unsqueeze(2);  // [B, K, 1, T, Hd]
    auto out = at::empty({d.b, d.h, d.t, d.hd}, q.options());
    auto out5 = out.view({d.b, d.kv, d.g, d.t, d.hd});
    auto lse = at::empty({d.b, d.kv, d.g, d.t}, q.options().dtype(wide(q)));
    for (int64_t first = 0; first < d.t; first += block) {
      const int64_t rows = std::min(block, d.t - first), keys = first + rows + d.offset();
      const auto s = block_scores(q5, k5, bias, d, first, rows, scale, cap, nullptr);
      const auto row_lse = at::logsumexp(s, -1);  // every row sees its own key: finite
      lse.narrow(3, first, rows).copy_(row_lse);
      const auto p = s.sub_(row_lse.unsqueeze(-1)).exp_().to(v.scalar_type());
      out5.narrow(3, first, rows).copy_(at::matmul(p, v5.narrow(3, 0, keys)));
    }
    ctx->save_for_backward({q, k, v, out, lse});
    if (bias.defined()) ctx->saved_data["bias"] = bias;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["cap"] = cap;
    ctx->saved_data["block"] = block;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const at::Tensor bias = ctx->saved_data.count("bias") ? ctx->saved_data["bias"].toTensor() : at::Tensor();
    const double scale = ctx->saved_data["scale"].toDouble(), cap = ctx->saved_data["cap"].toDouble();
    const Geometry d = geometry_of(q, k);
    const auto q5 = q.reshape({d.b, d.kv, d.g, d.t, d.hd});
    const auto k5 = k.unsqueeze(2), v5 = v.unsqueeze(2);
    // In the products' dtype, whatever the node after handed back.
    const auto dout = grads[0].to(q.scalar_type()).reshape({d.b, d.kv, d.g, d.t, d.hd});
    // D_i = sum_j P_ij dP_ij = dO_i . O_i: the softmax's backward needs it per row.
    const auto out5 = out.view({d.b, d.kv, d.g, d.t, d.hd});
    const auto row_dot = (dout.to(wide(q)) * out5.to(wide(q))).sum(-1);  // [B, K, G, T]
    auto dq = at::empty({d.b, d.kv, d.g, d.t, d.hd}, q.options());
    auto dk = at::zeros({d.b, d.kv, d.s, d.hd}, q.options().dtype(wide(q)));
    auto dv = at::zeros({d.b, d.kv, d.s, d.hd}, q.options().dtype(wide(q)));
    const int64_t block = ctx->saved_data["block"].toInt();
    for (int64_t first = 0; first < d.t; first += block) {
      const int64_t rows = std::min(block, d.t - first), keys = first + rows + d.offset();
      at::Tensor squashed;
      const auto s = block_scores(q5, k5, bias, d, first, rows, scale, cap, &squashed);
      const auto p = s.sub_(lse.narrow(3, first, rows).unsqueeze(-1)).exp_();  // 0 where masked
      const auto dout_b = dout.narrow(3, first, rows);                         // [B, K, G, Tq, Hd]
      // dV = P^T dO, summed over the query heads of each key/value head.
      dv.narrow(2, 0, keys).add_(at::matmul(p.to(v.scalar_type()).transpose(-2, -1), dout_b).sum(2));
      // dP = dO V^T; dC = P (dP - D); dS = dC (1 - tanh^2), then the scale.
      auto ds = at::matmul(dout_b, v5.narrow(3, 0, keys).transpose(-2, -1)).to(wide(q));
      ds.sub_(row_dot.narrow(3, first, rows).unsqueeze(-1)).mul_(p);
      ds.mul_(squashed.mul_(squashed).neg_().add_(1.0)).mul_(scale);
      const auto ds_c = ds.to(q.scalar_type());
      dq.narrow(3, first, rows).copy_(at::matmul(ds_c, k5.narrow(3, 0, keys)));
      dk.narrow(2, 0, keys).add_(at::matmul(ds_c.transpose(-2, -1), q5.narrow(3, first, rows)).sum(2));
    }
    return {dq.view({d.b, d.h, d.t, d.hd}),
            dk.to(k.scalar_type()),
            dv.to(v.scalar_type()),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

// The scores written out whole, differentiated by autograd: the path under dropout.
at::Tensor materialised(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias,
                        double scale, double cap, double dropout) {
  const Geometry d = geometry_of(q, k);
  const auto q5 = q.reshape({d.b, d.kv, d.g, d.t, d.hd});
  auto probs = at::softmax(block_scores(q5, k.unsqueeze(2), bias, d, 0, d.t, scale, cap, nullptr), -1);
  probs = at::dropout(probs.to(q.scalar_type()), dropout, /*train=*/true);
  return at::matmul(probs, v.unsqueeze(2)).view({d.b, d.h, d.t, d.hd});
}

}  // namespace

at::Tensor softcapped_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias,
                                double scale, double cap, double dropout, int64_t block_rows) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.sizes() == k.sizes() && q.size(0) == k.size(0) &&
                  q.size(2) <= k.size(2) && q.size(3) == k.size(3) && k.size(1) > 0 && q.size(1) % k.size(1) == 0,
              "softcapped_attention: q [B, H, T, Hd] and k, v [B, K, S, Hd] with K dividing H and T <= S, got ",
              q.sizes(), ", ", k.sizes(), " and ", v.sizes());
  TORCH_CHECK(cap > 0, "softcapped_attention: a cap of ", cap);
  TORCH_CHECK(block_rows >= 0, "softcapped_attention: blocks of ", block_rows, " queries");
  // The products in q's dtype (a value projection may hand its output on in another).
  const auto kq = k.to(q.scalar_type()), vq = v.to(q.scalar_type());
  if (dropout > 0) return materialised(q, kq, vq, bias, scale, cap, dropout);
  const int64_t block = block_rows > 0 ? block_rows : query_block(q.size(0), q.size(1), q.size(2), k.size(2));
  return BlockedSoftcappedAttention::apply(q, kq, vq, Mask{bias}, scale, cap, block);
}

}  // namespace tide
