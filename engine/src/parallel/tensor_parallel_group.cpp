#include "tensor_parallel_group.h"

#include <numeric>

#include <torch/csrc/autograd/custom_function.h>
#include <torch/types.h>

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
  at::Tensor sequence_all_gather(const at::Tensor& x, const std::string& what) override {
    return gathered_sequence(x, comm_, what.c_str());
  }
  at::Tensor sequence_reduce_scatter(const at::Tensor& x, const std::string& what) override {
    return scattered_sequence(x, comm_, what.c_str());
  }
  void all_reduce_max(at::Tensor& t, const std::string& what) override { comm_.all_reduce_max(t, what); }
  void all_reduce_sum(at::Tensor& t, const std::string& what) override { comm_.all_reduce_sum(t, what); }
  at::Tensor all_gather(const at::Tensor& local, const std::string& what) override {
    const auto in = local.contiguous().view({-1});
    auto all = torch::empty({in.numel() * comm_.size()}, in.options());
    comm_.all_gather(in, all, what);
    return all;
  }
  at::Tensor reduce_scatter_sum(const at::Tensor& by_rank, const std::string& what) override {
    const auto in = by_rank.contiguous().view({-1});
    TORCH_CHECK(in.numel() % comm_.size() == 0, what, ": ", in.numel(), " elements do not split into ", comm_.size(),
                " ranks' chunks");
    auto out = torch::empty({in.numel() / comm_.size()}, in.options());
    comm_.reduce_scatter_sum(in, out, what);
    return out;
  }
  at::Tensor all_to_all(const at::Tensor& by_rank, const std::string& what) override {
    auto out = torch::empty(by_rank.sizes(), by_rank.options());
    comm_.all_to_all(by_rank, out, what);
    return out;
  }
  at::Tensor all_to_all_rows(const at::Tensor& rows, const std::vector<int64_t>& send_rows,
                             const std::vector<int64_t>& recv_rows, const std::string& what) override {
    auto sizes = rows.sizes().vec();
    sizes[0] = std::accumulate(recv_rows.begin(), recv_rows.end(), int64_t{0});
    auto out = at::empty(sizes, rows.options());
    comm_.all_to_all_rows(rows, out, send_rows, recv_rows, what);
    return out;
  }

 private:
  Comm& comm_;
};
}  // namespace

std::shared_ptr<TensorParallelGroup> tensor_parallel_group(Comm& comm) {
  return std::make_shared<CommTensorParallelGroup>(comm);
}

}  // namespace tide
