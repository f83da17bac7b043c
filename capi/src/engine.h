// What a tide_engine handle holds: a client of a controller, and for an embedded engine
// the controller itself, serving on a thread of this process.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "handles.h"
#include "tide/ipc/client.h"
#include "tide/ipc/controller.h"
#include "tide/tide.h"

struct tide_engine {
  std::mutex mu;  // one request at a time on the client's socket
  std::unique_ptr<tide::ipc::Client> client;
  tide::ipc::CurveClient curve;
  std::string event_endpoint;
  std::unique_ptr<tide::ipc::Controller> controller;  // embedded only
  std::thread serving;

  nlohmann::json request(const std::string& type, const nlohmann::json& body = nlohmann::json::object());
  void close();
  ~tide_engine();
};

namespace tide::capi {
Handles<tide_engine>& engines();
}  // namespace tide::capi
