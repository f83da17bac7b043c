#include "tide/engine/parallel/pipeline.h"

#include <fmt/format.h>
#include <torch/types.h>

#include "tide/engine/model/compute_dtype.h"
#include "tide/engine/model/micro_batch_losses.h"
#include "tide/engine/parallel/comm.h"

namespace tide {

Pipeline::Pipeline(Comm& pp, Transformer model, std::string schedule, std::vector<int64_t> activation, DType compute,
                   Comm* tied_embeddings)
    : pp_(pp),
      model_(std::move(model)),
      schedule_(std::move(schedule)),
      activation_(std::move(activation)),
      compute_(compute),
      tied_embeddings_(tied_embeddings),
      wire_(torch::TensorOptions().dtype(scalar_type_of(compute)).device(model_->parameters()[0].device())) {}

namespace {
// Tags keep a step's messages apart: the activations and the gradients crossing from
// virtual stage b to b + 1 for micro-batch m, and evaluation's activations in a range of
// their own.
constexpr int64_t kEvalTags = int64_t{1} << 24;
int forward_tag(int64_t boundary, int64_t m, int64_t micro_batches) {
  return static_cast<int>(2 * (boundary * micro_batches + m));
}
int backward_tag(int64_t boundary, int64_t m, int64_t micro_batches) {
  return forward_tag(boundary, m, micro_batches) + 1;
}
}  // namespace

at::Tensor Pipeline::train(const std::vector<Batch>& batches, MicroBatchLosses& losses,
                           const at::Tensor& gradient_scale, const std::function<void(int64_t, int)>& before_backward,
                           const std::function<at::Tensor(int64_t, at::Tensor)>& on_loss) {
  const int stage = pp_.rank(), stages = pp_.size();
  const int chunks = static_cast<int>(model_->pipeline_stage().chunks.size());
  const int previous = (stage + stages - 1) % stages, next = (stage + 1) % stages;
  const int64_t last_virtual = static_cast<int64_t>(chunks) * stages - 1;
  const auto n = static_cast<int64_t>(batches.size());
  TORCH_CHECK(2 * (last_virtual + 1) * n <= kEvalTags, "a pipeline step of ", n, " micro-batches through ",
              last_virtual + 1, " stages has more messages than tags");
  // Each micro-batch's input and output of each chunk, until its backward.
  std::vector<torch::Tensor> inputs(static_cast<size_t>(n * chunks)), outputs(static_cast<size_t>(n * chunks));
  std::vector<std::unique_ptr<PendingCollective>> sends;
  for (const PipelineOp& op : pipeline_schedule(schedule_, stage, stages, n, chunks)) {
    const int64_t m = op.micro_batch;
    const int64_t virtual_stage = static_cast<int64_t>(op.chunk) * stages + stage;
    const bool first = virtual_stage == 0, last = virtual_stage == last_virtual;
    const auto i = static_cast<size_t>(op.chunk * n + m);
    const Batch& b = batches[static_cast<size_t>(m)];
    if (op.forward) {
      torch::Tensor in = b.tokens;
      if (!first) {
        in = torch::empty(activation_, wire_);
        pp_.recv(in, previous, forward_tag(virtual_stage - 1, m, n), fmt::format("activations of micro-batch {}", m));
        in.requires_grad_(true);
      }
      // What this micro-batch's loss will be given in backward, wherever the loss is.
      if (model_->config().moe_experts > 0) {
        const auto share = losses.share(m, wire_.device());
        model_->set_moe_loss_gradient(gradient_scale.defined() ? share * gradient_scale : share);
      }
      auto out =
          with_compute_dtype(compute_, [&] { return model_->stage_forward(in, b.targets, op.chunk, b.documents); });
      if (last) {
        out = losses.part(on_loss(m, out), m);
      } else {
        sends.push_back(pp_.send(out.detach().to(wire_.dtype()).contiguous(), next, forward_tag(virtual_stage, m, n),
                                 fmt::format("activations of micro-batch {}", m)));
      }
      inputs[i] = in;
      outputs[i] = out;
    } else {
      before_backward(m, op.chunk);
      if (last) {
        (gradient_scale.defined() ? outputs[i] * gradient_scale : outputs[i]).backward();
      } else {
        auto grad = torch::empty(activation_, wire_);
        pp_.recv(grad, next, backward_tag(virtual_stage, m, n), fmt::format("gradients of micro-batch {}", m));
        outputs[i].backward(grad.to(outputs[i].scalar_type()));
      }
      if (!first)
        sends.push_back(pp_.send(inputs[i].grad().to(wire_.dtype()).contiguous(), previous,
                                 backward_tag(virtual_stage - 1, m, n), fmt::format("gradients of micro-batch {}", m)));
      inputs[i] = torch::Tensor();  // this micro-batch's activations of this chunk can go
      outputs[i] = torch::Tensor();
    }
  }
  for (auto& s : sends) s->wait();
  if (tied_embeddings_) {
    auto g = model_->tok_embeddings.grad();
    tied_embeddings_->all_reduce_sum(g, "tied embedding gradients");
  }
  return losses.total(wire_.device());
}

double Pipeline::forward_loss(const Batch& b) {
  torch::NoGradGuard no_grad;
  const int stage = pp_.rank(), stages = pp_.size();
  const int chunks = static_cast<int>(model_->pipeline_stage().chunks.size());
  const int64_t last_virtual = static_cast<int64_t>(chunks) * stages - 1;
  // Every rank evaluates the same batches, so each call's tags agree across ranks.
  const int64_t base = (eval_tag_++ * (last_virtual + 1)) % kEvalTags;
  const auto tag = [&](int64_t boundary) { return static_cast<int>(kEvalTags + (base + boundary) % kEvalTags); };
  std::vector<std::unique_ptr<PendingCollective>> sends;
  double loss = 0.0;
  for (int chunk = 0; chunk < chunks; ++chunk) {
    const int64_t virtual_stage = static_cast<int64_t>(chunk) * stages + stage;
    torch::Tensor in = b.tokens;
    if (virtual_stage > 0) {
      in = torch::empty(activation_, wire_);
      pp_.recv(in, (stage + stages - 1) % stages, tag(virtual_stage - 1), "evaluation activations");
    }
    auto out = with_compute_dtype(compute_, [&] { return model_->stage_forward(in, b.targets, chunk, b.documents); });
    if (virtual_stage == last_virtual)
      loss = out.item<double>();
    else
      sends.push_back(pp_.send(out.to(wire_.dtype()).contiguous(), (stage + 1) % stages, tag(virtual_stage),
                               "evaluation activations"));
  }
  for (auto& s : sends) s->wait();
  return loss;
}

}  // namespace tide
