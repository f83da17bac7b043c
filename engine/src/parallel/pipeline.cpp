#include "tide/engine/parallel/pipeline.h"

#include <fmt/format.h>
#include <torch/types.h>

#include "tide/engine/model/compute_dtype.h"
#include "tide/engine/model/loss_sum.h"
#include "tide/engine/parallel/comm.h"

namespace tide {

std::vector<int64_t> pipeline_schedule(const std::string& kind, int stage, int stages, int64_t micro_batches) {
  std::vector<int64_t> ops;
  if (kind == "gpipe") {
    for (int64_t m = 0; m < micro_batches; ++m) ops.push_back(m + 1);
    for (int64_t m = 0; m < micro_batches; ++m) ops.push_back(-(m + 1));
    return ops;
  }
  TORCH_CHECK(kind == "1f1b", "unknown pipeline schedule '", kind, "' (gpipe or 1f1b)");
  const int64_t warmup = std::min<int64_t>(stages - stage - 1, micro_batches);
  int64_t forward = 0, backward = 0;
  for (; forward < warmup; ++forward) ops.push_back(forward + 1);
  while (forward < micro_batches) {
    ops.push_back(++forward);
    ops.push_back(-(++backward));
  }
  while (backward < micro_batches) ops.push_back(-(++backward));
  return ops;
}

Pipeline::Pipeline(Comm& pp, Transformer model, std::string schedule, std::vector<int64_t> activation, DType compute,
                   Comm* tied_embeddings)
    : pp_(pp),
      model_(std::move(model)),
      schedule_(std::move(schedule)),
      activation_(std::move(activation)),
      compute_(compute),
      tied_embeddings_(tied_embeddings),
      wire_(torch::TensorOptions()
                .dtype(compute == DType::BFloat16 ? torch::kBFloat16 : torch::kFloat32)
                .device(model_->parameters()[0].device())) {}

namespace {
// Tags keep a step's messages apart: forward activations and backward gradients of
// each micro-batch, and evaluation's activations in a range of their own.
int forward_tag(int64_t m) { return static_cast<int>(2 * m); }
int backward_tag(int64_t m) { return static_cast<int>(2 * m + 1); }
constexpr int kEvalTags = 1 << 24;
}  // namespace

at::Tensor Pipeline::train(const std::vector<Batch>& batches, double loss_scale,
                           const std::function<void(int64_t)>& before_backward,
                           const std::function<at::Tensor(int64_t, at::Tensor)>& on_loss) {
  const int stage = pp_.rank(), stages = pp_.size();
  const bool first = stage == 0, last = stage == stages - 1;
  const auto n = static_cast<int64_t>(batches.size());
  std::vector<torch::Tensor> inputs(static_cast<size_t>(n)), outputs(static_cast<size_t>(n));
  std::vector<std::unique_ptr<PendingCollective>> sends;
  LossSum loss_sum;
  for (const int64_t op : pipeline_schedule(schedule_, stage, stages, n)) {
    const int64_t m = std::abs(op) - 1;
    const auto i = static_cast<size_t>(m);
    const Batch& b = batches[i];
    if (op > 0) {
      torch::Tensor in = b.tokens;
      if (!first) {
        in = torch::empty(activation_, wire_);
        pp_.recv(in, stage - 1, forward_tag(m), fmt::format("activations of micro-batch {}", m));
        in.requires_grad_(true);
      }
      auto out = with_compute_dtype(compute_, [&] { return model_->stage_forward(in, b.targets); });
      if (last) {
        out = on_loss(m, out);
        loss_sum.add(out);
      } else {
        sends.push_back(pp_.send(out.detach().to(wire_.dtype()).contiguous(), stage + 1, forward_tag(m),
                                 fmt::format("activations of micro-batch {}", m)));
      }
      inputs[i] = in;
      outputs[i] = out;
    } else {
      before_backward(m);
      if (last) {
        (outputs[i] * loss_scale).backward();
      } else {
        auto grad = torch::empty(activation_, wire_);
        pp_.recv(grad, stage + 1, backward_tag(m), fmt::format("gradients of micro-batch {}", m));
        outputs[i].backward(grad.to(outputs[i].scalar_type()));
      }
      if (!first)
        sends.push_back(pp_.send(inputs[i].grad().to(wire_.dtype()).contiguous(), stage - 1, backward_tag(m),
                                 fmt::format("gradients of micro-batch {}", m)));
      inputs[i] = torch::Tensor();  // this micro-batch's activations can go
      outputs[i] = torch::Tensor();
    }
  }
  for (auto& s : sends) s->wait();
  if (tied_embeddings_) {
    auto g = model_->tok_embeddings.grad();
    tied_embeddings_->all_reduce_sum(g, "tied embedding gradients");
  }
  return loss_sum.total(wire_.device());
}

double Pipeline::forward_loss(const Batch& b) {
  torch::NoGradGuard no_grad;
  const int stage = pp_.rank(), stages = pp_.size();
  const int tag = kEvalTags + (eval_tag_++ % kEvalTags);
  torch::Tensor in = b.tokens;
  if (stage > 0) {
    in = torch::empty(activation_, wire_);
    pp_.recv(in, stage - 1, tag, "evaluation activations");
  }
  auto out = with_compute_dtype(compute_, [&] { return model_->stage_forward(in, b.targets); });
  if (stage == stages - 1) return out.item<double>();
  pp_.send(out.to(wire_.dtype()).contiguous(), stage + 1, tag, "evaluation activations")->wait();
  return 0.0;
}

}  // namespace tide
