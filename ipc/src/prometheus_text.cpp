#include "prometheus_text.h"

#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <map>
#include <sstream>

namespace tide::ipc {
using json = nlohmann::json;

namespace {
using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily family(std::string name, std::string help, MetricType type = MetricType::Gauge) {
  return MetricFamily{std::move(name), std::move(help), type, {}};
}

void add(MetricFamily& f, std::vector<ClientMetric::Label> labels, double value) {
  ClientMetric m;
  m.label = std::move(labels);
  if (f.type == MetricType::Counter)
    m.counter.value = value;
  else
    m.gauge.value = value;
  f.metric.push_back(std::move(m));
}

double number(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

// A metrics row's field → a gauge per run; scale turns MiB into bytes.
struct RowGauge {
  const char* field;
  const char* name;
  const char* help;
  double scale = 1.0;
};
constexpr double kMiB = 1024.0 * 1024.0;
const RowGauge kRowGauges[] = {
    {"loss", "tide_run_loss", "Training loss of the run's latest step"},
    {"lr", "tide_run_learning_rate", "Learning rate of the latest step"},
    {"grad_norm", "tide_run_grad_norm", "Gradient norm of the latest step (before clipping)"},
    {"tokens_per_second", "tide_run_tokens_per_second", "Training throughput of the latest step"},
    {"mfu", "tide_run_mfu", "Model FLOPs utilisation of the latest step (0..1)"},
    {"step_seconds", "tide_run_step_seconds", "Wall time of the latest step"},
    {"data_seconds", "tide_run_data_seconds", "Of the latest step, rank 0's time blocked on the data loader"},
    {"comm_seconds", "tide_run_communication_seconds", "Of the latest step, rank 0's time blocked on collectives"},
    {"checkpoint_seconds", "tide_run_checkpoint_stall_seconds", "Time saves held training just before the latest step"},
    {"tokens", "tide_run_tokens", "Tokens trained so far"},
    {"comm_bytes", "tide_run_communication_bytes", "Bytes rank 0 sent in collectives in the latest step"},
    {"rss_mb", "tide_run_resident_bytes", "Resident memory of rank 0", kMiB},
    {"peak_rss_mb", "tide_run_peak_resident_bytes", "Peak resident memory of rank 0", kMiB},
    {"peak_gpu_mb", "tide_run_peak_device_bytes", "Peak device memory rank 0's allocator handed out", kMiB},
};
// A rank's own figures of its latest step (status "ranks") → a gauge per run and rank.
const RowGauge kRankGauges[] = {
    {"step", "tide_rank_step", "Latest step the rank reported"},
    {"step_seconds", "tide_rank_step_seconds", "Wall time of the rank's latest step"},
    {"data_seconds", "tide_rank_data_seconds", "Of it, time blocked on the data loader"},
    {"comm_seconds", "tide_rank_communication_seconds", "Of it, time blocked on collectives"},
    {"checkpoint_seconds", "tide_rank_checkpoint_stall_seconds", "Time saves held the rank just before the step"},
    {"comm_bytes", "tide_rank_communication_bytes", "Bytes the rank sent in collectives in the step"},
    {"rss_mb", "tide_rank_resident_bytes", "Resident memory of the rank", kMiB},
    {"peak_rss_mb", "tide_rank_peak_resident_bytes", "Peak resident memory of the rank", kMiB},
    {"peak_gpu_mb", "tide_rank_peak_device_bytes", "Peak device memory the rank's allocator handed out", kMiB},
};

// Each gauge of `table` that `row` has, labelled.
template <size_t N>
void add_row(std::vector<MetricFamily>& families, const RowGauge (&table)[N], const json& row,
             const std::vector<ClientMetric::Label>& labels) {
  for (size_t i = 0; i < N; ++i)
    if (row.contains(table[i].field) && row[table[i].field].is_number())
      add(families[i], labels, number(row, table[i].field) * table[i].scale);
}
}  // namespace

std::string prometheus_text(const json& info, const json& runs) {
  std::vector<MetricFamily> out;
  auto state = family("tide_run_state", "1 for the run's current state");
  auto step = family("tide_run_step", "Latest step the run reported");
  auto total = family("tide_run_total_steps", "Steps the run's schedule trains");
  auto attempts = family("tide_run_restarts_total", "Restarts of the run after faults", MetricType::Counter);
  std::vector<MetricFamily> rows, ranks;
  for (const auto& g : kRowGauges) rows.push_back(family(g.name, g.help));
  for (const auto& g : kRankGauges) ranks.push_back(family(g.name, g.help));
  auto saved = family("tide_run_checkpoints_total", "Checkpoints committed under this daemon", MetricType::Counter);
  auto failed = family("tide_run_checkpoint_failures_total", "Checkpoint saves that failed under this daemon",
                       MetricType::Counter);
  auto save_seconds = family("tide_run_checkpoint_seconds", "Seconds the latest committed save took, start to commit");
  auto validation = family("tide_run_validation_loss", "Validation loss at the run's latest evaluation");
  auto by_dataset = family("tide_run_dataset_validation_loss",
                           "Under a data blend, each dataset's validation loss at the run's latest evaluation");
  std::map<std::string, double> by_state;
  for (const auto& r : runs) {
    const std::string id = r.value("id", ""), s = r.value("state", "");
    by_state[s] += 1;
    add(state, {{"run", id}, {"state", s}}, 1);
    add(step, {{"run", id}}, number(r, "last_step"));
    add(total, {{"run", id}}, number(r, "total_steps"));
    add(attempts, {{"run", id}}, number(r, "restarts"));
    add_row(rows, kRowGauges, r.value("metrics", json::object()), {{"run", id}});
    const json by_rank = r.value("ranks", json::object());
    for (const auto& [rank, figures] : by_rank.items())
      add_row(ranks, kRankGauges, figures, {{"run", id}, {"rank", rank}});
    const json evaluated = r.value("validation", json());
    if (evaluated.is_object() && evaluated.value("val_loss", json()).is_number()) {
      add(validation, {{"run", id}}, number(evaluated, "val_loss"));
      const json by_name = evaluated.value("val_losses", json::object());
      for (const auto& [name, loss] : by_name.items())
        if (loss.is_number()) add(by_dataset, {{"run", id}, {"dataset", name}}, loss.get<double>());
    }
    const json stats = r.value("checkpoint_stats", json());
    if (stats.is_object()) {
      add(saved, {{"run", id}}, number(stats, "saved"));
      add(failed, {{"run", id}}, number(stats, "failed"));
      if (stats.value("last_seconds", json()).is_number())
        add(save_seconds, {{"run", id}}, number(stats, "last_seconds"));
    }
  }
  out.push_back(std::move(state));
  out.push_back(std::move(step));
  out.push_back(std::move(total));
  out.push_back(std::move(attempts));
  for (auto* group : {&rows, &ranks})
    for (auto& f : *group)
      if (!f.metric.empty()) out.push_back(std::move(f));
  for (auto* f : {&validation, &by_dataset, &saved, &failed, &save_seconds})
    if (!f->metric.empty()) out.push_back(std::move(*f));

  auto runs_by_state = family("tide_runs", "Runs the daemon holds, by state");
  for (const auto& [s, n] : by_state) add(runs_by_state, {{"state", s}}, n);
  out.push_back(std::move(runs_by_state));
  const json slots = info.value("slots", json::object());
  auto slots_total = family("tide_cpu_slots", "CPU worker slots of the daemon");
  add(slots_total, {}, number(slots, "total"));
  auto slots_used = family("tide_cpu_slots_used", "CPU worker slots in use");
  add(slots_used, {}, number(slots, "used"));
  out.push_back(std::move(slots_total));
  out.push_back(std::move(slots_used));
  auto requests = family("tide_requests_total", "Requests the daemon answered, by type", MetricType::Counter);
  const json counts = info.value("requests", json::object());
  for (const auto& [type, n] : counts.items())
    if (n.is_number()) add(requests, {{"type", type}}, n.get<double>());
  out.push_back(std::move(requests));

  std::ostringstream text;
  prometheus::TextSerializer().Serialize(text, out);
  return text.str();
}

}  // namespace tide::ipc
