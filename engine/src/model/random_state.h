// The states of the random generators that work on one device draws from, saved and
// put back: for recomputation (the same dropout masks a second time) and checkpoints
// (a resumed run draws what the uninterrupted one would have).
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace tide {

struct GeneratorState {
  std::string device;  // "cpu", "cuda": whose default generator
  at::Tensor state;    // its get_state(): bytes on the CPU
};

// The CPU's default generator, and the device's own where it is not the CPU (CUDA
// draws dropout masks from its Philox generator, not from the CPU's). Reading a CUDA
// generator's state is refused while a CUDA graph is being captured.
std::vector<GeneratorState> save_generators(c10::Device device);

// Puts back the states saved for the same kind of device; a state for another kind (a
// CUDA checkpoint resumed on the CPU) has no generator here and is left out.
void restore_generators(const std::vector<GeneratorState>& states, c10::Device device);

}  // namespace tide
