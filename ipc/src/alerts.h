// Alerts (docs/dashboard.md, "Alerts"): what needs a person — an anomaly that triggered an
// action, a fault that restarts a run, a run that failed, a failed checkpoint, a run that
// stopped stepping — posted as JSON to webhooks and given to commands named in tided's
// configuration, and posted to the webhooks a run's recipe names (alerts.webhooks; never
// commands: a recipe's submitter must not run programs as tided's user). The controller's thread only decides and
// queues; a thread of its own delivers, with retries, so a slow or dead receiver never holds the controller (and the
// workers, which train, never wait on either).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tide::ipc {

struct AlertOptions {
  std::vector<std::string> webhooks;  // http:// or https:// URLs, each sent a POST
  std::vector<std::string> commands;  // run by /bin/sh with the alert's JSON as $1
  // A running run is stalled when no step has come for stall_factor × its median step
  // interval, and at least stall_min_s.
  double stall_factor = 10;
  double stall_min_s = 60;
  std::string dashboard_url;  // "http://127.0.0.1:7453/": alerts link to the run's page
  // The webhooks a run's recipe names (checked when it was submitted); none given: recipes'
  // webhooks are not used.
  std::function<std::vector<std::string>(const std::string& run)> run_webhooks;
};

class Alerts {
 public:
  // Throws std::invalid_argument naming a webhook that is not an http(s) URL.
  explicit Alerts(AlertOptions options);
  ~Alerts();  // delivers what is queued for up to 5 s, then drops the rest, said in the log
  Alerts(const Alerts&) = delete;
  Alerts& operator=(const Alerts&) = delete;

  // On the controller's thread: each event the controller publishes (not snapshots),
  // and a regular tick for stalls (`now`: Unix seconds).
  void on_event(const std::string& run, const std::string& kind, const nlohmann::json& body, double now);
  void tick(double now);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tide::ipc
