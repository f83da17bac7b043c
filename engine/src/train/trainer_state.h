// What Trainer's constructor sets up for the loop (internal).
#pragma once

#include <filesystem>
#include <memory>

#include <c10/core/Device.h>

#include "tide/engine/config.h"
#include "tide/engine/parallel/parallelize.h"
#include "tide/engine/run_layout.h"
#include "tide/engine/train/trainer.h"

namespace spdlog {
class logger;
}

namespace tide {

class Checkpointer;
class TrainingData;

struct Trainer::State {
  RunConfig cfg;  // follows live changes
  std::filesystem::path dir;
  TrainHooks hooks;
  Distributed* dist = nullptr;
  bool leader = true;  // writes the run directory and shows progress
  int64_t dp_rank = 0;
  BatchLayout batch;  // dp ranks and the micro-batch, fixed for the job
  std::shared_ptr<spdlog::logger> log;
  std::unique_ptr<TrainingData> data;
  c10::Device device{c10::kCPU};
  ParallelModel pm;
  std::unique_ptr<Checkpointer> checkpointer;

  State();
  ~State();
};

}  // namespace tide
