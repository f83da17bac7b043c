// The one description of every recipe field, and the conversions derived from it.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tide/engine/config.h"

namespace tide {

// A configuration error that names the field and the offending value.
class ConfigError : public std::runtime_error {
 public:
  ConfigError(std::string field, const std::string& message)
      : std::runtime_error(field.empty() ? message : field + ": " + message),
        field_(std::move(field)) {}
  const std::string& field() const { return field_; }

 private:
  std::string field_;
};

enum class FieldType { Int, Number, Bool, String, Choice, IntList, UrlList, SourceList, ChoiceList };

// What changing a field does to a training run, declared with the field: the trainer
// acts on the effect, never on the field's name (live_change.h checks a change).
enum class LiveEffect {
  None,        // fixed for the run's life
  EachStep,    // read from the configuration at every step (batch size, clip, intervals)
  LrSchedule,  // the built-in schedule's peak rate: refused while schedule.lr is a recipe function
  Optimizer,   // the optimizer's own hyperparameters
  LogLevel,    // the run log's level
  Anomaly,     // the anomaly detector's settings
};

struct FieldSpec {
  std::string path;  // "optimizer.lr"
  FieldType type;
  std::vector<std::string> choices;  // for Choice and ChoiceList elements
  double min = 0, max = 0;           // for Int / Number / IntList elements (inclusive)
  LiveEffect live = LiveEffect::None;  // may change while a run trains, and to what effect
  std::string doc;
  std::function<void(RunConfig&, const nlohmann::json&)> set;  // checks type and range
  std::function<nlohmann::json(const RunConfig&)> get;
};

// Bumped when a field changes meaning or goes away (recorded in checkpoints).
constexpr int kConfigSchemaVersion = 1;

const std::vector<FieldSpec>& config_schema();
const FieldSpec* find_field(const std::string& path);

// Nested JSON object (as a recipe table converts to) → config. Unknown keys are errors.
// Runs validate().
RunConfig config_from_json(const nlohmann::json& j);
nlohmann::json config_to_json(const RunConfig& c);

// Applies "a.b=value" to a nested JSON object; value is parsed as JSON when it is
// valid JSON (numbers, true/false), otherwise taken as a string.
void apply_override(nlohmann::json& j, const std::string& assignment);

// The "model" object alone (as stored beside weights) → a validated ModelConfig.
ModelConfig model_config_from_json(const nlohmann::json& model);

// Cross-field checks (heads divide dim, batch divisibility, ...). Throws ConfigError.
void validate(const RunConfig& c);
void validate_model(const ModelConfig& m);

// The name recipes and messages use for a compute dtype: auto, fp32, bf16, fp16.
const char* dtype_name(DType d);

// The names recipes and messages use for anomaly actions: none, skip, rollback,
// scale_lr, stop. Parsing throws ConfigError naming `field` and the name.
const char* anomaly_action_name(AnomalyAction a);
AnomalyAction parse_anomaly_action(const std::string& name, const std::string& field);

// Markdown table of every field, for docs/recipes.md.
std::string schema_markdown();

}  // namespace tide
