#include "random_state.h"

#include <mutex>

#include <ATen/Context.h>
#include <c10/core/DeviceType.h>

namespace tide {
namespace {

// Each generator the work on `device` draws from, named by its device type.
std::vector<std::pair<std::string, at::Generator>> generators_of(c10::Device device) {
  std::vector<std::pair<std::string, at::Generator>> out{{"cpu", at::globalContext().defaultGenerator(c10::kCPU)}};
  if (!device.is_cpu())
    out.emplace_back(c10::DeviceTypeName(device.type(), /*lower_case=*/true),
                     at::globalContext().defaultGenerator(device));
  return out;
}

}  // namespace

std::vector<GeneratorState> save_generators(c10::Device device) {
  std::vector<GeneratorState> states;
  for (auto& [name, gen] : generators_of(device)) {
    std::lock_guard<std::mutex> lock(gen.mutex());  // another thread may be drawing
    states.push_back({name, gen.get_state()});
  }
  return states;
}

void restore_generators(const std::vector<GeneratorState>& states, c10::Device device) {
  for (auto& [name, gen] : generators_of(device)) {
    for (const auto& s : states) {
      if (s.device != name) continue;
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(s.state);
    }
  }
}

}  // namespace tide
