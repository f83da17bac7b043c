// bf16 compute: the working copy of the weights made once per optimizer step, gradients
// that still reach every fp32 weight, and a recomputation (activation checkpointing) in
// the precision of the forward it repeats.
#include <algorithm>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <thread>

#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/types.h>

#include "tide/engine/model/compute_dtype.h"
#include "tide/engine/model/parameter_units.h"
#include "tide/engine/model/transformer.h"
#include "tide/engine/optim/adamw.h"
#include "tide/engine/optim/flat_parameters.h"
#include "tiny_models.h"

namespace tide {
namespace {

struct MicroBatch {
  torch::Tensor tokens, targets;
};

std::vector<MicroBatch> micro_batches(const ModelConfig& c, int n) {
  torch::manual_seed(5);
  std::vector<MicroBatch> out;
  for (int i = 0; i < n; ++i)
    out.push_back({torch::randint(0, c.vocab_size, {2, 16}), torch::randint(0, c.vocab_size, {2, 16})});
  return out;
}

// Counts the casts of the model's weights to another dtype on this thread while it lives
// (a record-function callback is a plain function: its state is thread-local).
class WeightCasts {
 public:
  explicit WeightCasts(torch::nn::Module& m) {
    weights().clear();
    for (const auto& p : m.parameters()) weights().insert(p.unsafeGetTensorImpl());
    count() = 0;
    handle_ = at::addThreadLocalCallback(at::RecordFunctionCallback(&on_start).needsInputs(true).scopes({}));
  }
  ~WeightCasts() { at::removeCallback(handle_); }
  WeightCasts(const WeightCasts&) = delete;
  WeightCasts& operator=(const WeightCasts&) = delete;
  static int& count() {
    thread_local int n = 0;
    return n;
  }

 private:
  static std::set<const c10::TensorImpl*>& weights() {
    thread_local std::set<const c10::TensorImpl*> w;
    return w;
  }
  static std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
    if (std::string(fn.name()) != "aten::_to_copy") return nullptr;
    const auto inputs = fn.inputs();
    if (!inputs.empty() && inputs[0].isTensor() && weights().count(inputs[0].toTensor().unsafeGetTensorImpl()))
      ++count();
    return nullptr;
  }
  at::CallbackHandle handle_;
};

// The gradients of `batches` accumulated as one optimizer step does, bf16 compute.
std::vector<torch::Tensor> step_gradients(Transformer& m, const std::vector<MicroBatch>& batches, bool scope) {
  for (auto& p : m->parameters()) p.mutable_grad() = torch::Tensor();
  {
    const WeightCastScope working_copy(scope);
    for (const auto& b : batches)
      with_compute_dtype(DType::BFloat16, [&] { return m->loss(b.tokens, b.targets); }).backward();
  }
  std::vector<torch::Tensor> grads;
  for (const auto& p : m->parameters()) grads.push_back(p.grad().clone());
  return grads;
}

void expect_identical(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(a[i].defined() && b[i].defined()) << "parameter " << i << " got no gradient";
    EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
  }
}

TEST(ComputeDtype, AStepCastsEachWeightOnceAndEveryWeightGetsItsGradient) {
  const ModelConfig c = testing::tiny_llama();
  torch::manual_seed(1);
  Transformer m(c);
  const auto batches = micro_batches(c, 3);
  // Forward and backward of every micro-batch (on the host, backward runs on this thread).
  auto casts_in = [&](bool scope) {
    int casts = 0;
    {
      WeightCasts counter(*m);
      const WeightCastScope working_copy(scope);
      for (const auto& b : batches)
        with_compute_dtype(DType::BFloat16, [&] { return m->loss(b.tokens, b.targets); }).backward();
      casts = WeightCasts::count();
    }
    return casts;
  };
  const int unscoped = casts_in(false), per_step = casts_in(true);
  // Every matrix but the embedding table (a lookup, not a product) is multiplied in bf16.
  int matrices = 0;
  for (const auto& p : m->named_parameters())
    matrices += p.value().dim() == 2 && p.key() != "model.embed_tokens.weight";
  EXPECT_EQ(per_step, matrices) << "each weight cast once in a step, forward and backward";
  // Without a scope each block's matrix is cast in its forward and again in its backward;
  // the head's in the fused loss's forward only (its gradients are made there).
  EXPECT_EQ(unscoped, 3 * (2 * (matrices - 1) + 1)) << "every micro-batch casts every weight again";

  // The copies reused by later micro-batches still lead back to their weights: the
  // gradients are those of casting afresh every time, bit for bit.
  expect_identical(step_gradients(m, batches, true), step_gradients(m, batches, false));
}

TEST(ComputeDtype, AScopesWorkingCopyServesEveryThreadUntilTheScopeEndsOrTheWeightChanges) {
  const auto w = torch::randn({8, 4}).requires_grad_();
  const auto data_of = [](const torch::Tensor& t) { return t.data_ptr(); };
  const auto elsewhere = [&] {  // as autograd's device threads ask, holding no scope
    torch::Tensor got;
    std::thread([&] { got = working_copy(w, torch::kBFloat16); }).join();
    return got;
  };
  {
    const WeightCastScope step(true);
    const auto copy = working_copy(w, torch::kBFloat16);
    EXPECT_EQ(copy.scalar_type(), torch::kBFloat16);
    EXPECT_FALSE(copy.requires_grad()) << "the node computes the weight's gradient itself";
    EXPECT_TRUE(torch::equal(copy, w.detach().to(torch::kBFloat16)));
    EXPECT_EQ(data_of(working_copy(w, torch::kBFloat16)), data_of(copy));
    EXPECT_EQ(data_of(elsewhere()), data_of(copy)) << "another thread gets the step's copy";
    EXPECT_EQ(data_of(working_copy(w, torch::kFloat32)), data_of(w)) << "the weight's own dtype needs no copy";
    {
      torch::NoGradGuard no_grad;
      w.add_(1.0);  // a weight that changes in the scope is cast again
    }
    const auto after = working_copy(w, torch::kBFloat16);
    EXPECT_NE(data_of(after), data_of(copy));
    EXPECT_TRUE(torch::equal(after, w.detach().to(torch::kBFloat16)));
  }
  // The scope has ended: nothing is kept, on any thread.
  const auto a = working_copy(w, torch::kBFloat16);
  EXPECT_NE(data_of(working_copy(w, torch::kBFloat16)), data_of(a));
  EXPECT_NE(data_of(elsewhere()), data_of(a));
  {
    const WeightCastScope zero3(false);  // inactive: keeps nothing either
    const auto b = working_copy(w, torch::kBFloat16);
    EXPECT_NE(data_of(working_copy(w, torch::kBFloat16)), data_of(b));
  }
}

// A model trained in bf16 by the host AdamW, with or without the working copy the update
// writes.
struct Bf16Run {
  Transformer model;
  std::unique_ptr<FlatParameters> flat;
  std::unique_ptr<AdamW> adam;
  bool kept = false;

  explicit Bf16Run(bool standing_copy, bool offload = false) : model(testing::tiny_llama()) {
    model->reset_parameters(4);
    OptimConfig o;
    o.lr = 1e-2;
    o.weight_decay = 0.1;
    flat = std::make_unique<FlatParameters>(*model, o);
    adam = std::make_unique<AdamW>(*flat, o, offload, offload ? AdamWKernel::automatic : AdamWKernel::host);
    if (standing_copy) kept = adam->keep_working_copy(torch::kBFloat16, flat->slots());
  }

  // One optimizer step of `batches`; the loss of each, and the weights' casts made.
  std::pair<std::vector<double>, int> step(const std::vector<MicroBatch>& batches) {
    std::vector<double> losses;
    int casts = 0;
    flat->zero_grad();
    {
      WeightCasts counter(*model);
      const WeightCastScope working_copy(true);
      for (const auto& b : batches) {
        auto loss = with_compute_dtype(DType::BFloat16, [&] { return model->loss(b.tokens, b.targets); });
        loss.backward();
        losses.push_back(loss.item<double>());
      }
      casts = WeightCasts::count();
    }
    adam->step(1e-2);
    return {losses, casts};
  }
};

TEST(ComputeDtype, TheWorkingCopyTheUpdateWritesTrainsAsCastingEveryStepDoes) {
  const auto batches = micro_batches(testing::tiny_llama(), 2);
  Bf16Run cast(false), standing(true);
  ASSERT_TRUE(standing.kept) << "one process, not offloaded: the host kernel writes the copy";
  EXPECT_FALSE(cast.kept);
  for (int s = 0; s < 4; ++s) {
    const auto [cast_losses, cast_casts] = cast.step(batches);
    const auto [losses, casts] = standing.step(batches);
    EXPECT_EQ(losses, cast_losses) << "step " << s << ": the same bf16 bits, rounded to nearest even both ways";
    EXPECT_GT(cast_casts, 0);
    EXPECT_EQ(casts, 0) << "step " << s << ": the update's copy serves every weight, nothing is cast";
  }
  const auto a = cast.flat->data(), b = standing.flat->data();
  EXPECT_TRUE(torch::equal(a, b));
}

TEST(ComputeDtype, AWeightChangedOutsideTheUpdateIsCastUntilTheCopyIsTakenAgain) {
  Bf16Run run(true);
  ASSERT_TRUE(run.kept);
  const auto& slot = *std::find_if(run.flat->slots().begin(), run.flat->slots().end(),
                                   [](const auto& s) { return s.name == "model.layers.0.mlp.down_proj.weight"; });
  const auto served = working_copy(slot.param, torch::kBFloat16);
  EXPECT_TRUE(torch::equal(served, slot.param.detach().to(torch::kBFloat16)));
  EXPECT_EQ(working_copy(slot.param, torch::kBFloat16).data_ptr(), served.data_ptr()) << "the standing copy";
  {
    torch::NoGradGuard no_grad;
    run.flat->data().mul_(0.5);  // as a checkpoint's values are loaded into the buffer
  }
  const auto after = working_copy(slot.param, torch::kBFloat16);
  EXPECT_NE(after.data_ptr(), served.data_ptr()) << "a stale copy must not be served";
  EXPECT_TRUE(torch::equal(after, slot.param.detach().to(torch::kBFloat16)));
  {
    torch::NoGradGuard no_grad;
    slot.param.add_(1.0);  // through the weight itself
  }
  EXPECT_TRUE(torch::equal(working_copy(slot.param, torch::kBFloat16), slot.param.detach().to(torch::kBFloat16)));
  run.adam->restore(0);  // what a resume does after loading
  const auto again = working_copy(slot.param, torch::kBFloat16);
  EXPECT_EQ(again.data_ptr(), served.data_ptr()) << "restore takes the copy again into its buffer";
  EXPECT_TRUE(torch::equal(again, slot.param.detach().to(torch::kBFloat16)));
  // The optimizer gone, its copies are no longer offered.
  run.adam.reset();
  EXPECT_NE(working_copy(slot.param, torch::kBFloat16).data_ptr(), served.data_ptr());
}

TEST(ComputeDtype, OnlyAnOptimizerThatUpdatesEveryWeightKeepsTheirCopy) {
  EXPECT_FALSE(Bf16Run(true, /*offload=*/true).kept) << "offload updates a host copy";
  Transformer m(testing::tiny_llama());
  m->reset_parameters(4);
  FlatParameters::Options options;
  options.pad_to = 2;
  options.unit_of = block_unit;
  FlatParameters flat(*m, OptimConfig{}, options);
  AdamW shard(flat.data(), flat.grad(), flat.shard_segments(0, 2, false, false), OptimConfig{}, false,
              AdamWKernel::host);
  EXPECT_FALSE(shard.keep_working_copy(torch::kBFloat16, flat.slots())) << "a ZeRO rank updates its piece only";
  AdamW fused(flat, OptimConfig{}, false, AdamWKernel::fused);
  EXPECT_FALSE(fused.keep_working_copy(torch::kBFloat16, flat.slots())) << "PyTorch's kernel writes no copy";
  AdamW whole(flat, OptimConfig{}, false, AdamWKernel::host);
  EXPECT_TRUE(whole.keep_working_copy(torch::kBFloat16, flat.slots()));
  EXPECT_THROW(whole.keep_working_copy(torch::kFloat32, flat.slots()), c10::Error);
}

TEST(ComputeDtype, ActivationCheckpointingRecomputesInTheForwardsPrecision) {
  ModelConfig c = testing::tiny_llama();
  torch::manual_seed(2);
  Transformer plain(c);
  c.activation_checkpointing = true;
  Transformer recomputed(c);
  {
    torch::NoGradGuard ng;
    auto from = plain->named_parameters();
    for (auto& p : recomputed->named_parameters()) p.value().copy_(from[p.key()]);
  }
  const auto batches = micro_batches(c, 2);
  // The same bf16 operations on the same inputs: the same gradients, bit for bit, with or
  // without the working-copy scope (a recomputation in fp32 would differ in the low bits).
  const auto want = step_gradients(plain, batches, true);
  expect_identical(step_gradients(recomputed, batches, true), want);
  expect_identical(step_gradients(recomputed, batches, false), want);
}

TEST(ComputeDtype, AutoIsBf16OnCudaAndFp32OnTheCpuAndMustBeResolved) {
  const c10::Device cpu(c10::kCPU), cuda(c10::kCUDA, 0);
  EXPECT_EQ(resolve_compute_dtype(DType::Auto, cuda), DType::BFloat16);
  EXPECT_EQ(resolve_compute_dtype(DType::Auto, cpu), DType::Float32);
  EXPECT_EQ(resolve_compute_dtype(DType::Float32, cuda), DType::Float32) << "a recipe's fp32 stands";
  EXPECT_EQ(resolve_compute_dtype(DType::BFloat16, cpu), DType::BFloat16) << "a recipe's bf16 stands";
  EXPECT_THROW(with_compute_dtype(DType::Auto, [] { return torch::ones({1}); }), std::logic_error);
}

TEST(ComputeDtype, TheHostsBf16InstructionsAreItsCpuinfoFlags) {
  // Whatever this machine is: the answer names a flag /proc/cpuinfo lists, AMX first, or
  // is empty when it lists neither.
  std::ifstream in("/proc/cpuinfo");
  const std::string cpuinfo((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto lists = [&](const std::string& flag) {
    return cpuinfo.find(" " + flag + " ") != std::string::npos || cpuinfo.find(" " + flag + "\n") != std::string::npos;
  };
  const std::string want = lists("amx_bf16") ? "amx_bf16" : lists("avx512_bf16") ? "avx512_bf16" : "";
  EXPECT_EQ(host_bf16_instructions(), want);
}

}  // namespace
}  // namespace tide
