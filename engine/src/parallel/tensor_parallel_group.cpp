#include "tensor_parallel_group.h"

#include <limits>

#include <torch/torch.h>

#include "tide/engine/parallel/comm.h"

namespace tide {
namespace {
Comm& comm_of(torch::autograd::AutogradContext* ctx) {
  return *reinterpret_cast<Comm*>(ctx->saved_data["comm"].toInt());
}
int64_t address(Comm& c) { return static_cast<int64_t>(reinterpret_cast<intptr_t>(&c)); }

torch::Tensor all_reduced(const torch::Tensor& x, Comm& c, const char* what) {
  auto y = x.contiguous().clone();
  c.all_reduce_sum(y, what);
  return y;
}

// [B, T/n, ...] on each rank → [B, T, ...], rank j's part at sequence chunk j.
torch::Tensor gathered_sequence(const torch::Tensor& x, Comm& c, const char* what) {
  const int n = c.size();
  auto in = x.contiguous();
  auto out = torch::empty({n * in.numel()}, in.options());
  c.all_gather(in, out, what);
  auto sizes = in.sizes().vec();
  std::vector<int64_t> split{n};
  split.insert(split.end(), sizes.begin(), sizes.end());  // [n, B, T/n, ...]
  auto y = out.view(split).transpose(0, 1);               // [B, n, T/n, ...]
  sizes[1] *= n;
  return y.reshape(sizes);
}

// [B, T, ...] → [B, T/n, ...], summed over ranks.
torch::Tensor scattered_sequence(const torch::Tensor& x, Comm& c, const char* what) {
  const int n = c.size();
  auto sizes = x.sizes().vec();
  TORCH_CHECK(sizes[1] % n == 0, "sequence of ", sizes[1], " does not split into ", n, " parts");
  std::vector<int64_t> split{sizes[0], n, sizes[1] / n};
  split.insert(split.end(), sizes.begin() + 2, sizes.end());
  auto by_rank = x.reshape(split).transpose(0, 1).contiguous();  // [n, B, T/n, ...]
  sizes[1] /= n;
  auto out = torch::empty(sizes, x.options());
  c.reduce_scatter_sum(by_rank.view({-1}), out, what);
  return out;
}

struct CopyToTp : torch::autograd::Function<CopyToTp> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, int64_t comm) {
    ctx->saved_data["comm"] = comm;
    return x;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    return {all_reduced(g[0], comm_of(ctx), "tensor-parallel input gradient"), torch::Tensor()};
  }
};

struct ReduceFromTp : torch::autograd::Function<ReduceFromTp> {
  static torch::Tensor forward(torch::autograd::AutogradContext*, const torch::Tensor& x, int64_t comm) {
    return all_reduced(x, *reinterpret_cast<Comm*>(comm), "tensor-parallel output");
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*, torch::autograd::variable_list g) {
    return {g[0], torch::Tensor()};
  }
};

struct GatherSequence : torch::autograd::Function<GatherSequence> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, int64_t comm) {
    ctx->saved_data["comm"] = comm;
    return gathered_sequence(x, *reinterpret_cast<Comm*>(comm), "sequence all-gather");
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    return {scattered_sequence(g[0], comm_of(ctx), "sequence reduce-scatter (backward)"), torch::Tensor()};
  }
};

struct ReduceScatterSequence : torch::autograd::Function<ReduceScatterSequence> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, int64_t comm) {
    ctx->saved_data["comm"] = comm;
    return scattered_sequence(x, *reinterpret_cast<Comm*>(comm), "sequence reduce-scatter");
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    return {gathered_sequence(g[0], comm_of(ctx), "sequence all-gather (backward)"), torch::Tensor()};
  }
};

struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& targets, int64_t first, int64_t valid, int64_t comm) {
    Comm& c = *reinterpret_cast<Comm*>(comm);
    const int64_t n = logits.size(0), local = logits.size(1);
    auto l = logits.to(torch::kFloat32).contiguous();
    if (valid < local) {
      l = l.clone();
      l.narrow(1, valid, local - valid).fill_(-std::numeric_limits<float>::infinity());
    }
    auto m = std::get<0>(l.max(1));  // [N]
    c.all_reduce_max(m, "cross-entropy max");
    auto e = (l - m.unsqueeze(1)).exp_();  // [N, V/tp]
    auto s = e.sum(1);
    c.all_reduce_sum(s, "cross-entropy sum");
    const auto mine = targets.ge(first).logical_and_(targets.lt(first + valid));
    const auto index = (targets - first).clamp_(0, local - 1);
    auto target_logit = l.gather(1, index.unsqueeze(1)).squeeze(1).masked_fill_(mine.logical_not(), 0.0);
    c.all_reduce_sum(target_logit, "cross-entropy target logit");
    const auto loss = (s.log() + m - target_logit).mean();
    e.div_(s.unsqueeze(1));  // softmax over the whole vocabulary, this rank's columns
    ctx->save_for_backward({e, index, mine});
    ctx->saved_data["n"] = n;
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    return loss;  // fp32 whatever the logits' dtype: a bf16 loss keeps three digits
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    const auto saved = ctx->get_saved_variables();
    auto grad = saved[0].clone();  // d loss_i / d logits = softmax - one_hot(target)
    grad.scatter_add_(1, saved[1].unsqueeze(1), -saved[2].to(grad.scalar_type()).unsqueeze(1));
    grad.mul_(g[0].to(torch::kFloat32) / static_cast<double>(ctx->saved_data["n"].toInt()));
    const auto dtype = static_cast<c10::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {grad.to(dtype), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

class CommTensorParallelGroup : public TensorParallelGroup {
 public:
  explicit CommTensorParallelGroup(Comm& comm) : comm_(comm) {}
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  at::Tensor copy_to(const at::Tensor& x) override { return CopyToTp::apply(x, address(comm_)); }
  at::Tensor reduce_from(const at::Tensor& x) override { return ReduceFromTp::apply(x, address(comm_)); }
  at::Tensor gather_sequence(const at::Tensor& x) override { return GatherSequence::apply(x, address(comm_)); }
  at::Tensor reduce_scatter_sequence(const at::Tensor& x) override {
    return ReduceScatterSequence::apply(x, address(comm_));
  }
  at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, int64_t first,
                                          int64_t valid) override {
    return VocabParallelCrossEntropy::apply(logits, targets, first, valid, address(comm_));
  }
  at::Tensor all_gather(const at::Tensor& local, const std::string& what) override {
    const auto in = local.contiguous().view({-1});
    auto all = torch::empty({in.numel() * comm_.size()}, in.options());
    comm_.all_gather(in, all, what);
    return all;
  }

 private:
  Comm& comm_;
};
}  // namespace

std::shared_ptr<TensorParallelGroup> tensor_parallel_group(Comm& comm) {
  return std::make_shared<CommTensorParallelGroup>(comm);
}

}  // namespace tide
