#include "tide/engine/train/evaluate.h"

#include <cmath>
#include <unordered_map>

#include <torch/types.h>

#include "tide/engine/data/batch_loader.h"
#include "tide/engine/model/compute_dtype.h"
#include "tide/engine/model/linear_cross_entropy.h"

namespace tide {

double evaluate_loss(Transformer& model, const TokenSplit& split, int64_t seq_len, int64_t micro_batch,
                     int64_t n_batches, const BatchContents& contents) {
  return evaluate_losses(model, split, seq_len, micro_batch, n_batches, 0, 1, DType::Float32, contents).mean();
}

EvalLosses evaluate_losses(Transformer& model, const TokenSplit& split, int64_t seq_len, int64_t micro_batch,
                           int64_t n_batches, int64_t first, int64_t step, DType compute,
                           const BatchContents& contents) {
  const auto device = model->parameters()[0].device();
  const bool was_training = model->is_training();
  model->eval();
  const EvalLosses losses = sum_eval_losses(
      [&](const Batch& b) {
        const auto documents = b.documents.defined() ? b.documents.to(device) : at::Tensor();
        return with_compute_dtype(compute,
                                  [&] { return model->loss(b.tokens.to(device), b.targets.to(device), documents); })
            .item<double>();
      },
      [&](const at::Tensor& targets) { return model->loss_targets(targets); }, split, seq_len, micro_batch, n_batches,
      first, step, contents);
  model->train(was_training);
  return losses;
}

EvalLosses sum_eval_losses(const std::function<double(const Batch&)>& loss_of,
                           const std::function<at::Tensor(const at::Tensor&)>& loss_targets, const TokenSplit& split,
                           int64_t seq_len, int64_t micro_batch, int64_t n_batches, int64_t first, int64_t step,
                           const BatchContents& contents) {
  torch::NoGradGuard no_grad;
  EvalLosses out;
  // Every rank runs the same number of forward passes (ZeRO-3 gathers parameters in
  // lockstep): a rank short of a batch repeats one and does not count it.
  const int64_t rounds = (n_batches + step - 1) / step;
  for (int64_t k = 0, i = first; k < rounds; ++k, i += step) {
    const Batch b = make_eval_batch(split, i % n_batches, n_batches, micro_batch, seq_len, contents);
    const double loss = loss_of(b);
    if (i >= n_batches) continue;
    // The batch is on the host: counting its targets waits for nothing.
    const auto counted = static_cast<double>(loss_targets(b.targets).ne(kUncountedTarget).sum().item<int64_t>());
    out.weighted += loss * counted;
    out.counted += counted;
  }
  return out;
}

double unigram_entropy(const TokenSplit& split) {
  std::unordered_map<uint32_t, int64_t> counts;
  for (int64_t i = 0; i < split.size(); ++i) ++counts[split.at(i)];
  const double n = static_cast<double>(split.size());
  double h = 0;
  for (const auto& [id, c] : counts) {
    const double p = static_cast<double>(c) / n;
    h -= p * std::log(p);
  }
  return h;
}

std::vector<int32_t> sample(Transformer& model, const std::vector<int32_t>& prompt, const SampleOptions& opt,
                            const std::function<void(int32_t)>& on_token) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(opt.seed);
  const int64_t window = model->config().max_seq_len;
  const auto device = model->tok_embeddings.device();
  std::vector<int32_t> ids = prompt;
  if (ids.empty()) ids.push_back(opt.stop_id >= 0 ? opt.stop_id : 0);
  std::vector<int32_t> out;
  for (int64_t n = 0; n < opt.max_new_tokens; ++n) {
    const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(ids.size()) - window);
    std::vector<int64_t> ctx(ids.begin() + start, ids.end());
    const auto tokens = torch::tensor(ctx, torch::kInt64).view({1, -1}).to(device);
    const auto hidden = model->hidden(tokens).select(1, tokens.size(1) - 1);  // [1, D]
    auto logits = model->logits_of(hidden).squeeze(0).to(torch::kCPU, torch::kFloat32);
    int32_t next;
    if (opt.temperature <= 0) {
      next = static_cast<int32_t>(logits.argmax().item<int64_t>());
    } else {
      logits = logits / opt.temperature;
      if (opt.top_k > 0 && opt.top_k < logits.size(0)) {
        const auto kth = std::get<0>(logits.topk(opt.top_k)).min();
        logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
      }
      auto probs = torch::softmax(logits, 0);
      if (opt.top_p < 1.0) {
        // Nucleus: keep the smallest set of most likely tokens whose mass reaches top_p.
        const auto sorted = probs.sort(0, /*descending=*/true);
        const auto& p_sorted = std::get<0>(sorted);
        const auto cum = p_sorted.cumsum(0);
        const auto drop = (cum - p_sorted) >= opt.top_p;
        const auto dropped_ids = std::get<1>(sorted).masked_select(drop);
        probs.index_fill_(0, dropped_ids, 0.0);
      }
      next = static_cast<int32_t>(torch::multinomial(probs, 1, false, gen).item<int64_t>());
    }
    ids.push_back(next);
    out.push_back(next);
    if (on_token) on_token(next);
    if (next == opt.stop_id || (opt.end_of_turn_id >= 0 && next == opt.end_of_turn_id)) break;
  }
  return out;
}

}  // namespace tide
