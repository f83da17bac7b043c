// When a run's steps are captured as CUDA graphs, and the sentence the run log gives when
// they are not. Captured training itself is compared with uncaptured training by the
// CUDA tests (cuda_test.cpp).
#include <string>

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include "../../engine/src/train/step_graphs.h"

namespace tide {
namespace {

RunConfig cuda_run() {
  RunConfig c;
  c.device = "cuda";
  return c;
}

StepCaptureFacts capturable() {
  StepCaptureFacts f;
  f.cuda_build = true;
  f.optimizer_on_device = true;
  return f;
}

// The reason given, or "" where the steps are captured.
std::string reason(const RunConfig& c, const StepCaptureFacts& f) {
  return why_steps_run_uncaptured(c, f).value_or("");
}

TEST(StepGraphs, AOneProcessCudaRunWithTheFusedUpdateIsCaptured) {
  EXPECT_EQ(reason(cuda_run(), capturable()), "");
  RunConfig c = cuda_run();
  c.model.activation_checkpointing = true;  // recomputation replays as the rest does
  c.batch.global_batch = 4 * c.batch.micro_batch;
  EXPECT_EQ(reason(c, capturable()), "");
}

TEST(StepGraphs, EachSettingThatNeedsTheHostInsideAStepIsNamed) {
  RunConfig cpu = cuda_run();
  cpu.device = "cpu";
  EXPECT_EQ(reason(cpu, capturable()), "device = cpu, not cuda");

  RunConfig off = cuda_run();
  off.cuda_graphs = false;
  EXPECT_EQ(reason(off, capturable()), "cuda_graphs = false");

  StepCaptureFacts f = capturable();
  f.cuda_build = false;
  EXPECT_EQ(reason(cuda_run(), f), "this LibTorch has no CUDA graphs");

  f = capturable();
  f.distributed = true;
  EXPECT_EQ(reason(cuda_run(), f), "the run has ranks, whose collectives are not captured");

  RunConfig offload = cuda_run();
  offload.parallel.offload_optimizer = true;
  EXPECT_EQ(reason(offload, capturable()), "parallel.offload_optimizer = true: the update runs on the host");

  f = capturable();
  f.optimizer_on_device = false;
  EXPECT_EQ(reason(cuda_run(), f), "the optimizer reads its gate on the host");

  RunConfig dropout = cuda_run();
  dropout.model.dropout = 0.1;
  EXPECT_EQ(reason(dropout, capturable()).rfind("model.dropout = 0.1: ", 0), 0u) << reason(dropout, capturable());

  f = capturable();
  f.anomaly_policy = true;
  EXPECT_EQ(reason(cuda_run(), f), "the recipe's on_anomaly policy judges each step before its update");

  f = capturable();
  f.loss_tap = true;
  EXPECT_EQ(reason(cuda_run(), f), "a loss tap reads each micro-batch's loss on the host");
}

TEST(StepGraphs, OnTheCpuEveryStepRunsAsCalledAndNoneIsCounted) {
  // Each call is the work itself, once; nothing is replayed.
  auto log = spdlog::default_logger();
  StepGraphs graphs(c10::Device(c10::DeviceType::CPU), why_steps_run_uncaptured(RunConfig{}, capturable()), *log);
  int forward_backward = 0, update = 0;
  for (int step = 0; step < 6; ++step) {
    graphs.forward_backward({}, [&](const std::vector<Batch>&) {
      ++forward_backward;
      return StepValues{};
    });
    graphs.update([&] {
      ++update;
      return at::Tensor();
    });
  }
  graphs.reset("a setting changed");
  EXPECT_EQ(forward_backward, 6);
  EXPECT_EQ(update, 6);
  EXPECT_EQ(graphs.replayed_steps(), 0);
}

}  // namespace
}  // namespace tide
