// The one check of a change to a training run's recipe fields while it runs (no
// LibTorch): the daemon's `set`, the recipe policies and every rank's live control call
// it, so a change the ranks would refuse is refused where it is asked for.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tide/engine/config.h"
#include "tide/engine/config_schema.h"
#include "tide/engine/run_layout.h"

namespace tide {

struct LiveChange {
  RunConfig next;  // the configuration with the change applied
  // Each field changed, with its effect and its new value as the schema writes it.
  struct Field {
    std::string path;
    LiveEffect effect;
    nlohmann::json value;
  };
  std::vector<Field> fields;
};

// `values`: an object of field path → value. Throws ConfigError naming the field when
// one is not a field, not live, out of range, breaks validate(), does not split over
// `started` (the batch layout the job started with), or cannot take effect (a peak rate
// while schedule.lr is a recipe function). `current` is not changed.
LiveChange check_live_change(const RunConfig& current, const nlohmann::json& values, const BatchLayout& started);

}  // namespace tide
