#include "tide/engine/parallel/comm.h"

#include <cstring>
#include <functional>
#include <numeric>

#include <c10/util/accumulate.h>
#include <fmt/format.h>
#include <torch/types.h>

#include "comm_impl.h"

namespace tide {

Comm::Comm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Comm::~Comm() = default;

const std::string& Comm::name() const { return impl_->name; }
int Comm::rank() const { return impl_->group_rank; }
int Comm::size() const { return static_cast<int>(impl_->ranks.size()); }
const std::vector<int>& Comm::ranks() const { return impl_->ranks; }
int64_t Comm::bytes_sent() const { return impl_->bytes_sent; }
double Comm::wait_seconds() const { return impl_->wait_seconds; }

void Comm::Impl::wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& op, const std::string& what) {
  if (progress) {
    std::lock_guard<std::mutex> lock(progress->mu);
    progress->waiting = fmt::format("{} ({}) on group {}", op, what, name);
  }
  const auto began = std::chrono::steady_clock::now();
  try {
    // NCCL's wait with a timeout blocks the host until the collective has run; without one
    // it orders this rank's stream after it and returns, so the host goes on queueing the
    // step. The group's own watchdog (Options::timeout) still ends a collective that hangs.
    if (!work->wait(gloo ? timeout : ::kNoTimeout))
      throw std::runtime_error(fmt::format("did not complete within {} s", timeout.count() / 1000.0));
  } catch (const std::exception& e) {
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);  // its what() carries a backtrace
    const std::string reason = c10_error ? c10_error->what_without_backtrace() : e.what();
    const std::string peers = diagnose ? diagnose(ranks) : std::string();
    throw CommError(fmt::format("{} ({}) on group {} (ranks {}) failed on rank {}: {}{}", op, what, name,
                                fmt::join(ranks, ","), ranks.at(static_cast<size_t>(group_rank)), reason,
                                peers.empty() ? "" : "; " + peers));
  }
  wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  if (progress) {
    ++progress->completed;
    std::lock_guard<std::mutex> lock(progress->mu);
    progress->waiting.clear();
  }
}

namespace {
int64_t nbytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// c10d's flat collectives take 1-D tensors (Gloo checks the first dimension) and write a
// contiguous tensor of their input's type: the output itself where it is one, else a
// buffer copied into it once the collective completes. (The pending work holds the input
// and the buffer until then.)
at::Tensor staging(const at::Tensor& output, const at::Tensor& input) {
  if (output.is_contiguous() && output.scalar_type() == input.scalar_type() && output.device() == input.device())
    return output;
  return at::empty(output.sizes(), input.options());
}
}  // namespace

// Gloo moves host memory, NCCL device memory; a tensor elsewhere travels through a copy
// on the group's device, written back once the collective completes. So a Gloo group
// takes the CUDA tensors of ranks that share a GPU (where NCCL refuses; Gloo's own CUDA
// paths cover some collectives only, and copy through host memory anyway), and an NCCL
// group the small host tensors of the trainer and of live control.
at::Tensor Comm::Impl::staged(const at::Tensor& t) const { return t.device() == device ? t : t.to(device); }

namespace {
// The collective's result, from the copy staged(t) made (if it made one), into t.
void unstage(at::Tensor& t, const at::Tensor& staged) {
  if (!staged.is_same(t)) t.copy_(staged);
}
}  // namespace

void Comm::Impl::all_reduce(Comm& c, at::Tensor& t, c10d::ReduceOp op, const std::string& name,
                            const std::string& what) {
  if (c.size() == 1) return;
  std::vector<at::Tensor> v{staged(t)};
  wait(pg->allreduce(v, c10d::AllreduceOptions{op}), name, what);
  unstage(t, v[0]);
  bytes_sent += 2 * nbytes(t) * (c.size() - 1) / c.size();  // ring: reduce-scatter + all-gather
}

void Comm::all_reduce_sum(at::Tensor& t, const std::string& what) {
  impl_->all_reduce(*this, t, c10d::ReduceOp::SUM, "all_reduce", what);
}

void Comm::all_reduce_max(at::Tensor& t, const std::string& what) {
  impl_->all_reduce(*this, t, c10d::ReduceOp::MAX, "all_reduce(max)", what);
}

namespace {
// A started collective, and what must follow it on this rank once it has completed
// (copying a staging buffer into the output).
struct PendingWork : PendingCollective {
  PendingWork(Comm::Impl* i, c10::intrusive_ptr<c10d::Work> w, std::string o, std::string wh,
              std::function<void()> f = {})
      : impl(i), work(std::move(w)), op(std::move(o)), what(std::move(wh)), finish(std::move(f)) {}
  void wait() override {
    if (work) impl->wait(work, op, what);
    work.reset();
    if (finish) finish();
    finish = nullptr;
  }
  Comm::Impl* impl;
  c10::intrusive_ptr<c10d::Work> work;
  std::string op, what;
  std::function<void()> finish;
};
}  // namespace

std::unique_ptr<PendingCollective> Comm::all_reduce_sum_async(at::Tensor t, const std::string& what) {
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble,
              "all_reduce_sum_async takes fp32 or fp64 tensors, got ", t.scalar_type());
  if (size() == 1) return std::make_unique<PendingWork>(impl_.get(), c10::intrusive_ptr<c10d::Work>(), "all_reduce", what);
  std::vector<at::Tensor> v{impl_->staged(t)};
  auto work = impl_->pg->allreduce(v, c10d::AllreduceOptions{c10d::ReduceOp::SUM});
  impl_->bytes_sent += 2 * nbytes(t) * (size() - 1) / size();
  return std::make_unique<PendingWork>(impl_.get(), std::move(work), "all_reduce", what,
                                       [t, h = v[0]]() mutable { unstage(t, h); });
}

void Comm::broadcast(at::Tensor& t, int root, const std::string& what) {
  if (size() == 1) return;
  std::vector<at::Tensor> v{impl_->staged(t)};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  impl_->wait(impl_->pg->broadcast(v, opts), "broadcast", what);
  unstage(t, v[0]);
  if (rank() == root) impl_->bytes_sent += nbytes(t);
}

std::string Comm::broadcast_text(const std::string& text, int root, const std::string& what) {
  if (size() == 1) return text;
  const auto device = impl_->device;
  const bool is_root = rank() == root;
  auto length = torch::tensor({static_cast<int64_t>(is_root ? text.size() : 0)}, torch::kInt64).to(device);
  broadcast(length, root, what);
  const int64_t n = length.item<int64_t>();
  if (n == 0) return {};
  auto bytes = torch::empty({n}, torch::kUInt8);
  if (is_root) std::memcpy(bytes.data_ptr(), text.data(), static_cast<size_t>(n));
  bytes = bytes.to(device);
  broadcast(bytes, root, what);
  bytes = bytes.cpu();
  return std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(n));
}

void Comm::reduce_scatter_sum(const at::Tensor& input, at::Tensor& output, const std::string& what) {
  reduce_scatter_sum_async(input, output, what)->wait();
}

void Comm::all_gather(const at::Tensor& input, at::Tensor& output, const std::string& what) {
  all_gather_async(input, output, what)->wait();
}

std::unique_ptr<PendingCollective> Comm::reduce_scatter_sum_async(const at::Tensor& input, at::Tensor output,
                                                                  const std::string& what) {
  const int n = size();
  TORCH_CHECK(input.numel() == output.numel() * n, "reduce_scatter: input has ", input.numel(),
              " elements, expected ", output.numel() * n);
  if (n == 1) {
    if (!output.is_same(input)) output.copy_(input.view_as(output));
    return std::make_unique<PendingWork>(impl_.get(), c10::intrusive_ptr<c10d::Work>(), "reduce_scatter", what);
  }
  impl_->bytes_sent += nbytes(input) * (n - 1) / n;
  auto in = impl_->staged(input.contiguous().view({-1}));
  auto target = staging(output, in);
  auto flat = target.view({-1});
  return std::make_unique<PendingWork>(impl_.get(), impl_->pg->_reduce_scatter_base(flat, in), "reduce_scatter",
                                       what, [in, target, output]() mutable {
                                         if (!target.is_same(output)) output.copy_(target.view_as(output));
                                       });
}

std::unique_ptr<PendingCollective> Comm::all_gather_async(const at::Tensor& input, at::Tensor output,
                                                          const std::string& what) {
  const int n = size();
  TORCH_CHECK(output.numel() == input.numel() * n, "all_gather: output has ", output.numel(),
              " elements, expected ", input.numel() * n);
  if (n == 1) {
    output.view_as(input).copy_(input);
    return std::make_unique<PendingWork>(impl_.get(), c10::intrusive_ptr<c10d::Work>(), "all_gather", what);
  }
  impl_->bytes_sent += nbytes(input) * (n - 1);
  auto in = impl_->staged(input.contiguous().view({-1}));
  auto target = staging(output, in);
  auto flat = target.view({-1});
  return std::make_unique<PendingWork>(impl_.get(), impl_->pg->_allgather_base(flat, in), "all_gather", what,
                                       [in, target, output]() mutable {
                                         if (!target.is_same(output)) output.copy_(target.view_as(output));
                                       });
}

void Comm::all_to_all(const at::Tensor& input, at::Tensor& output, const std::string& what) {
  const int n = size();
  TORCH_CHECK(input.numel() == output.numel() && input.numel() % n == 0, "all_to_all (", what, "): input of ",
              input.numel(), " elements and output of ", output.numel(), " do not split into ", n, " equal chunks");
  if (n == 1) {
    output.copy_(input.view_as(output));
    return;
  }
  impl_->bytes_sent += nbytes(input) * (n - 1) / n;
  auto in = impl_->staged(input.contiguous().view({-1}));
  auto target = staging(output, in);
  auto flat = target.view({-1});
  std::vector<int64_t> equal_splits;  // empty: size() equal chunks each way
  impl_->wait(impl_->pg->alltoall_base(flat, in, equal_splits, equal_splits), "all_to_all", what);
  if (!target.is_same(output)) output.copy_(target.view_as(output));
}

void Comm::all_to_all_rows(const at::Tensor& input, at::Tensor& output, const std::vector<int64_t>& send_rows,
                           const std::vector<int64_t>& recv_rows, const std::string& what) {
  const auto n = static_cast<size_t>(size());
  const auto sum = [](const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); };
  TORCH_CHECK(send_rows.size() == n && recv_rows.size() == n, "all_to_all_rows (", what, "): ", send_rows.size(),
              " send and ", recv_rows.size(), " receive counts for a group of ", n);
  TORCH_CHECK(
      input.dim() >= 1 && output.dim() >= 1 && input.size(0) == sum(send_rows) && output.size(0) == sum(recv_rows),
      "all_to_all_rows (", what, "): ", input.dim() >= 1 ? input.size(0) : 0, " input and ",
      output.dim() >= 1 ? output.size(0) : 0, " output rows, but the counts sum to ", sum(send_rows), " and ",
      sum(recv_rows));
  if (n == 1) {
    output.copy_(input);
    return;
  }
  // Flat, the chunks counted in elements: a side with no rows has no row size to infer.
  const int64_t row = c10::multiply_integers(input.sizes().slice(1));
  TORCH_CHECK(c10::multiply_integers(output.sizes().slice(1)) == row, "all_to_all_rows (", what, "): rows of ",
              input.sizes().slice(1), " sent, of ", output.sizes().slice(1), " received");
  impl_->bytes_sent +=
      (sum(send_rows) - send_rows[static_cast<size_t>(rank())]) * row * static_cast<int64_t>(input.element_size());
  auto in = impl_->staged(input.contiguous().view({-1}));
  auto target = staging(output, in);
  auto flat = target.view({-1});
  std::vector<int64_t> out_splits, in_splits;
  for (size_t j = 0; j < n; ++j) {
    out_splits.push_back(recv_rows[j] * row);
    in_splits.push_back(send_rows[j] * row);
  }
  impl_->wait(impl_->pg->alltoall_base(flat, in, out_splits, in_splits), "all_to_all", what);
  if (!target.is_same(output)) output.copy_(target);
}

std::unique_ptr<PendingCollective> Comm::send(const at::Tensor& t, int dst, int tag, const std::string& what) {
  TORCH_CHECK(t.is_contiguous(), "send: ", what, " is not contiguous");
  std::vector<at::Tensor> v{impl_->staged(t)};
  auto work = impl_->pg->send(v, dst, tag);
  impl_->bytes_sent += nbytes(t);
  return std::make_unique<PendingWork>(impl_.get(), std::move(work), fmt::format("send to group rank {}", dst), what,
                                       [t, h = v[0]] {});
}

void Comm::recv(at::Tensor& t, int src, int tag, const std::string& what) {
  TORCH_CHECK(t.is_contiguous(), "recv: ", what, " is not contiguous");
  std::vector<at::Tensor> v{impl_->staged(t)};
  impl_->wait(impl_->pg->recv(v, src, tag), fmt::format("recv from group rank {}", src), what);
  unstage(t, v[0]);
}

void Comm::barrier(const std::string& what) {
  if (size() == 1) return;
  impl_->wait(impl_->pg->barrier(), "barrier", what);
}

}  // namespace tide
