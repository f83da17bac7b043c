#include <algorithm>
#include <cmath>

#include <gtest/gtest.h>
#include <torch/optim/adamw.h>
#include <torch/types.h>

#include "tide/engine/model/parameter_units.h"
#include "tide/engine/model/transformer.h"
#include "tide/engine/optim/adamw.h"
#include "tide/engine/optim/flat_parameters.h"
#include "tide/engine/optim/lr_schedule.h"
#include "tide/engine/optim/weight_decay.h"
#include "tiny_models.h"

namespace tide {
namespace {

TEST(FlatParameters, ParametersAndGradsAreViewsOfTwoBuffers) {
  Transformer m(testing::tiny_llama());
  m->reset_parameters(1);
  const auto before = m->named_parameters()["model.layers.0.self_attn.q_proj.weight"].clone();
  OptimConfig o;
  FlatParameters flat(*m, o);
  EXPECT_EQ(flat.numel(), parameter_count(testing::tiny_llama()));
  const torch::Tensor q = m->named_parameters()["model.layers.0.self_attn.q_proj.weight"];
  EXPECT_TRUE(torch::equal(q, before));  // values preserved
  // One unit by default; decayed (2-D, non-embedding) parameters form its prefix.
  ASSERT_EQ(flat.units().size(), 1u);
  for (const auto& s : flat.slots()) EXPECT_EQ(s.decayed, s.offset < flat.units()[0].decay_numel) << s.name;
  for (const auto& s : flat.slots()) {
    if (s.name.find("embed") != std::string::npos || s.shape.size() == 1) {
      EXPECT_FALSE(s.decayed) << s.name;
    }
  }
  // Backward writes straight into the flat gradient buffer.
  const auto tokens = torch::randint(0, 97, {2, 8}, torch::kInt64);
  m->loss(tokens, tokens).backward();
  EXPECT_GT(flat.grad().abs().sum().item<double>(), 0.0);
  EXPECT_EQ(q.grad().data_ptr<float>(),
            flat.grad().data_ptr<float>() + [&] {
              for (const auto& s : flat.slots())
                if (s.name == "model.layers.0.self_attn.q_proj.weight") return s.offset;
              return int64_t{-1};
            }());
}

TEST(FlatParameters, UnitsArePaddedAndShardedWithoutGapsOrOverlap) {
  Transformer m(testing::tiny_llama());
  m->reset_parameters(1);
  OptimConfig o;
  FlatParameters::Options options;
  options.pad_to = 4;
  const ParameterUnitLayout layout = parameter_unit_layout(testing::tiny_llama());
  ASSERT_FALSE(layout.tied);
  options.unit_of = [layout](const std::string& name) { return layout.unit_of(name); };
  FlatParameters flat(*m, o, options);
  const int64_t n_layers = testing::tiny_llama().n_layers;
  ASSERT_EQ(static_cast<int64_t>(flat.units().size()), n_layers + 2);
  for (const auto& u : flat.units()) EXPECT_EQ(u.numel % 4, 0);
  for (const auto& s : flat.slots()) {
    const auto& u = flat.units()[static_cast<size_t>(s.unit)];
    EXPECT_GE(s.offset, u.offset);
    EXPECT_LE(s.offset + s.numel, u.offset + u.numel);
    EXPECT_EQ(s.decayed, s.offset < u.offset + u.decay_numel) << s.name;
    const bool head = s.name == "lm_head.weight" || s.name == "model.norm.weight";
    const int block =
        s.name.find("layers.") == std::string::npos ? -1 : std::stoi(s.name.substr(s.name.find("layers.") + 7));
    EXPECT_EQ(s.unit, head ? n_layers + 1 : 1 + block) << s.name;
  }
  // The four ranks' pieces cover every element once, with the decay of its parameter.
  std::vector<int> seen(static_cast<size_t>(flat.numel()), 0);
  int64_t local_total = 0;
  for (int r = 0; r < 4; ++r) {
    int64_t local = 0;
    for (const auto& seg : flat.shard_segments(r, 4, true, false)) {
      EXPECT_EQ(seg.param_offset, local);
      local += seg.numel;
      for (int64_t i = seg.grad_offset; i < seg.grad_offset + seg.numel; ++i) {
        ++seen[static_cast<size_t>(i)];
        const auto& u = *std::find_if(flat.units().begin(), flat.units().end(),
                                      [&](const auto& x) { return i >= x.offset && i < x.offset + x.numel; });
        EXPECT_EQ(seg.decayed, i < u.offset + u.decay_numel);
      }
    }
    EXPECT_EQ(local, flat.shard_numel(4));
    local_total += local;
  }
  EXPECT_EQ(local_total, flat.numel());
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
}

// Both kernels: the host's (CPU parameters) and PyTorch's fused one that CUDA parameters
// get, run here on the CPU.
class AdamWKernels : public ::testing::TestWithParam<AdamWKernel> {};

TEST_P(AdamWKernels, MatchTorchAdamWWithParameterGroups) {
  Transformer ours(testing::tiny_llama()), ref(testing::tiny_llama());
  ours->reset_parameters(3);
  ref->reset_parameters(3);
  OptimConfig o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  o.beta1 = 0.9;
  o.beta2 = 0.95;
  o.eps = 1e-8;
  FlatParameters flat(*ours, o);
  AdamW adam(flat, o, false, GetParam());

  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& item : ref->named_parameters())
    (is_decayed(item.key(), item.value(), false, false) ? decay : no_decay).push_back(item.value());
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                 torch::optim::AdamWOptions(o.lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                    torch::optim::AdamWOptions(o.lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.0)));
  torch::optim::AdamW torch_adam(groups, torch::optim::AdamWOptions(o.lr));

  // The same gradients for both, of unit scale: Adam normalises each element by its
  // running RMS, so gradients near zero would turn rounding into visible differences.
  torch::manual_seed(11);
  auto rp = ref->named_parameters();
  for (int step = 0; step < 5; ++step) {
    for (const auto& s : flat.slots()) {
      const auto g = torch::randn(s.shape);
      flat.grad().narrow(0, s.offset, s.numel).copy_(g.view({-1}));
      rp[s.name].mutable_grad() = g.clone();
    }
    adam.step(o.lr);
    torch_adam.step();
  }
  for (const auto& item : ours->named_parameters())
    EXPECT_TRUE(torch::allclose(item.value(), rp[item.key()], 1e-5, 1e-6)) << item.key();
}

INSTANTIATE_TEST_SUITE_P(HostAndFused, AdamWKernels, ::testing::Values(AdamWKernel::host, AdamWKernel::fused),
                         [](const auto& info) { return info.param == AdamWKernel::host ? "host" : "fused"; });

TEST_P(AdamWKernels, ASkippedStepLeavesEverythingAsItWas) {
  // The gate skips on the device; what follows a skipped step is what would have
  // followed without it, bit for bit (the bias correction did not advance).
  auto make = [&] {
    auto p = torch::linspace(-1.0, 1.0, 1000), g = torch::zeros(1000);
    std::vector<OptimSegment> segs{{0, 0, 600, true, true}, {600, 600, 400, false, true}};
    return std::make_tuple(p, g, segs);
  };
  OptimConfig o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  auto [p1, g1, s1] = make();
  auto [p2, g2, s2] = make();
  AdamW with_skip(p1, g1, s1, o, false, GetParam()), without(p2, g2, s2, o, false, GetParam());
  torch::manual_seed(5);
  const auto first = torch::randn(1000), second = torch::randn(1000);
  g1.copy_(first);
  g2.copy_(first);
  with_skip.step(o.lr);
  without.step(o.lr);
  const auto p_before = p1.clone(), m_before = with_skip.exp_avg().clone(), v_before = with_skip.exp_avg_sq().clone();
  g1.copy_(second * 1e6);  // a step the gate refuses
  with_skip.step(o.lr, {{}, torch::full({}, true)});
  EXPECT_TRUE(torch::equal(p1, p_before));
  EXPECT_TRUE(torch::equal(with_skip.exp_avg(), m_before));
  EXPECT_TRUE(torch::equal(with_skip.exp_avg_sq(), v_before));
  EXPECT_EQ(with_skip.steps_taken(), 1);
  g1.copy_(second);
  g2.copy_(second);
  with_skip.step(o.lr, {{}, torch::full({}, false)});
  without.step(o.lr);
  EXPECT_EQ(with_skip.steps_taken(), 2);
  EXPECT_TRUE(torch::equal(p1, p2));
  EXPECT_TRUE(torch::equal(with_skip.exp_avg(), without.exp_avg()));
}

TEST_P(AdamWKernels, ClippingIsTheStepOnScaledGradients) {
  // The clip factor the gate carries scales the gradients inside the update.
  OptimConfig o;
  o.lr = 1e-2;
  torch::manual_seed(6);
  const auto g = torch::randn(500) * 3;
  auto pa = torch::linspace(-1.0, 1.0, 500), pb = pa.clone(), ga = g.clone(), gb = g * 0.25;
  std::vector<OptimSegment> segs{{0, 0, 500, true, true}};
  AdamW clipped(pa, ga, segs, o, false, GetParam()), scaled(pb, gb, segs, o, false, GetParam());
  for (int i = 0; i < 3; ++i) {
    ga.copy_(g);  // the fused kernel leaves the gradients it was given scaled
    clipped.step(o.lr, {torch::full({}, 0.25, torch::kFloat64), {}});
    scaled.step(o.lr);
  }
  // The host kernel forms g * 0.25, the fused one g / (1 / 0.25): a power of two either
  // way, so the same bits as gradients scaled beforehand.
  EXPECT_TRUE(torch::equal(pa, pb));
}

TEST_P(AdamWKernels, ALearningRateTensorStepsAsItsNumberDoes) {
  // The rate as a device scalar (what a captured update reads at each replay) against the
  // same rate as a number, over steps whose rate changes, clipped and skipped: 2^-k is
  // exact in fp32, as which the fused kernel reads a tensor, so the bits must agree.
  OptimConfig o;
  o.weight_decay = 0.1;
  torch::manual_seed(8);
  auto pa = torch::linspace(-1.0, 1.0, 700), pb = pa.clone(), ga = torch::zeros(700), gb = torch::zeros(700);
  std::vector<OptimSegment> segs{{0, 0, 400, true, true}, {400, 400, 300, false, true}};
  AdamW by_number(pa, ga, segs, o, false, GetParam()), by_tensor(pb, gb, segs, o, false, GetParam());
  const auto lr = torch::empty({}, torch::kFloat64);
  for (int i = 0; i < 4; ++i) {
    const double rate = std::ldexp(1.0, -6 - i);
    const auto g = torch::randn(700);
    ga.copy_(g);
    gb.copy_(g);
    const UpdateGate gate{torch::full({}, 0.5, torch::kFloat64), torch::full({}, i == 2)};
    lr.fill_(rate);
    by_number.step(rate, gate);
    by_tensor.step(lr, gate);
  }
  EXPECT_EQ(by_tensor.steps_taken(), 3);
  EXPECT_TRUE(torch::equal(pa, pb));
  EXPECT_TRUE(torch::equal(by_number.exp_avg(), by_tensor.exp_avg()));
  EXPECT_TRUE(torch::equal(by_number.exp_avg_sq(), by_tensor.exp_avg_sq()));
  EXPECT_THROW(by_tensor.step(torch::ones({2})), c10::Error);  // not a scalar
  EXPECT_THROW(by_tensor.step(torch::ones({}, torch::kInt64)), c10::Error);
}

TEST(AdamW, OffloadAndShardsGiveTheSameBits) {
  // The whole range on the device, the whole range offloaded, and two offloaded
  // halves (ZeRO-1 with offload on two ranks) must update every element identically.
  std::vector<Transformer> models;
  std::vector<std::unique_ptr<FlatParameters>> flats;
  for (int i = 0; i < 3; ++i) {
    models.emplace_back(testing::tiny_llama());
    models.back()->reset_parameters(3);
    FlatParameters::Options options;
    options.pad_to = 2;
    options.unit_of = block_unit;
    flats.push_back(std::make_unique<FlatParameters>(*models.back(), OptimConfig{}, options));
  }
  OptimConfig o;
  o.lr = 1e-2;
  auto& f = *flats[2];
  AdamW plain(*flats[0], o), offloaded(*flats[1], o, true);
  AdamW first(f.data(), f.grad(), f.shard_segments(0, 2, false, false), o, true);
  AdamW second(f.data(), f.grad(), f.shard_segments(1, 2, false, false), o, true);
  torch::manual_seed(12);
  for (int step = 0; step < 4; ++step) {
    const auto g = torch::randn({flats[0]->numel()});
    for (auto& f : flats) f->grad().copy_(g);
    plain.step(o.lr);
    offloaded.step(o.lr);
    first.step(o.lr);
    second.step(o.lr);
  }
  EXPECT_TRUE(torch::equal(flats[0]->data(), flats[1]->data()));
  EXPECT_TRUE(torch::equal(flats[0]->data(), flats[2]->data()));
  EXPECT_FALSE(torch::equal(flats[0]->data(), torch::zeros_like(flats[0]->data())));
}

TEST(UpdateGate, ClipsToTheMaximumAndSkipsWhatIsNotFinite) {
  const auto f64 = [](double x) { return torch::full({}, x, torch::kFloat64); };
  auto gate = gate_update(f64(6.0), 1.5);
  EXPECT_DOUBLE_EQ(gate.clip.item<double>(), 1.5 / (6.0 + 1e-6));
  EXPECT_FALSE(gate.skip.item<bool>());
  EXPECT_DOUBLE_EQ(gate_update(f64(1.0), 1.5).clip.item<double>(), 1.0);  // under the limit
  EXPECT_FALSE(gate_update(f64(6.0), 0.0).clip.defined());                // no clipping asked
  for (const double bad : {std::nan(""), static_cast<double>(INFINITY)}) {
    gate = gate_update(f64(bad), 1.5);
    EXPECT_TRUE(gate.skip.item<bool>()) << bad;
    EXPECT_DOUBLE_EQ(gate.clip.item<double>(), 1.0) << bad;
  }
  EXPECT_TRUE(gate_update(f64(1.0), 1.5, torch::full({}, true)).skip.item<bool>());
  EXPECT_FALSE(gate_update(f64(1.0), 1.5, torch::full({}, false)).skip.item<bool>());
}

TEST(LrSchedule, WarmupThenDecay) {
  ScheduleConfig s;
  s.steps = 110;
  s.warmup_steps = 10;
  s.min_lr = 0.1;
  s.decay = DecayKind::Cosine;
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 1.0, 0), 0.1);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 1.0, 9), 1.0);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 1.0, 10), 1.0);
  EXPECT_NEAR(scheduled_lr(s, 1.0, 60), 0.55, 1e-12);  // halfway: (1 + 0.1) / 2
  EXPECT_NEAR(scheduled_lr(s, 1.0, 110), 0.1, 1e-12);
  s.decay = DecayKind::Linear;
  EXPECT_NEAR(scheduled_lr(s, 1.0, 60), 0.55, 1e-12);
  EXPECT_NEAR(scheduled_lr(s, 1.0, 35), 1.0 - 0.9 * 0.25, 1e-12);
  s.decay = DecayKind::Constant;
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 1.0, 100), 1.0);
}

}  // namespace
}  // namespace tide
