#include "tide/engine/live_change.h"

#include <fmt/format.h>

namespace tide {

LiveChange check_live_change(const RunConfig& current, const nlohmann::json& values, const BatchLayout& started) {
  if (!values.is_object() || values.empty()) throw ConfigError("", "a live change needs an object of field: value");
  LiveChange change{current, {}};
  for (const auto& [path, value] : values.items()) {
    const FieldSpec* f = find_field(path);
    if (!f) throw ConfigError(path, "no such recipe field");
    if (f->live == LiveEffect::None)
      throw ConfigError(path, "cannot change while the run trains; live fields: see `tide recipe fields`");
    if (f->live == LiveEffect::LrSchedule && current.schedule.decay == DecayKind::Lua)
      throw ConfigError(path, "the learning rate comes from schedule.lr, a function of the step in the recipe; "
                              "optimizer.lr_scale multiplies it");
    f->set(change.next, value);
  }
  validate(change.next);
  check_global_batch(change.next.batch.global_batch, started);
  for (const auto& [path, value] : values.items()) {
    const FieldSpec* f = find_field(path);
    change.fields.push_back({path, f->live, f->get(change.next)});
  }
  return change;
}

}  // namespace tide
