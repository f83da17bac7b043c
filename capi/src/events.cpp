// Subscriptions: events polled by the caller, or delivered to a callback on a thread of
// the library.
#include <atomic>
#include <cmath>
#include <limits>
#include <thread>

#include <spdlog/spdlog.h>

#include "engine.h"
#include "tide/ipc/run_registry.h"

using json = nlohmann::json;
using tide::capi::Failure;

struct tide_subscription {
  std::unique_ptr<tide::ipc::Subscriber> subscriber;
  std::string kind;  // "" for every kind
  // The event handed out last, and the strings it points into.
  tide_event event{};
  std::string run, event_kind, body;
  // Callback delivery.
  tide_event_fn callback = nullptr;
  void* user_data = nullptr;
  std::atomic<bool> stopping{false};
  std::thread thread;

  // The next event of the wanted kind within `timeout`; false if none came.
  bool next(std::chrono::milliseconds timeout);
};

namespace {
tide::capi::Handles<tide_subscription>& subscriptions() {
  static tide::capi::Handles<tide_subscription> handles;
  return handles;
}
// The thread delivering a subscription's callbacks, to refuse closing it from inside.
thread_local const tide_subscription* delivering = nullptr;
}  // namespace

bool tide_subscription::next(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    auto e = subscriber->next(std::max(left, std::chrono::milliseconds(0)));
    if (!e) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      continue;
    }
    const json& m = e->message;
    if (!kind.empty() && m.value("kind", "") != kind) continue;
    run = m.value("run", "");
    event_kind = m.value("kind", "");
    const json b = m.value("body", json::object());
    body = b.dump();
    event = tide_event{};
    event.version = 1;
    event.run = run.c_str();
    event.kind = event_kind.c_str();
    event.seq = m.value("seq", int64_t{0});
    event.time = m.value("time", 0.0);
    event.step = -1;
    event.loss = std::numeric_limits<double>::quiet_NaN();
    if (event_kind == "metrics") {
      event.step = b.value("step", int64_t{-1});
      if (b.contains("loss") && b["loss"].is_number()) event.loss = b["loss"].get<double>();
    }
    if (event_kind == "state")
      if (const auto s = tide::ipc::state_from_name(b.value("state", ""))) event.state = static_cast<int32_t>(*s) + 1;
    event.snapshot = m.value("snapshot", false) ? 1 : 0;
    event.body_json = body.c_str();
    return true;
  }
}

namespace {
int subscribe(const char* function, tide_engine* engine, const char* run_id, const char* kind, tide_event_fn callback,
              void* user_data, tide_subscription** out) {
  return tide::capi::guarded(function, [&] {
    auto e = tide::capi::engines().get(engine, "engine");
    tide::capi::require(out, "out");
    *out = nullptr;
    if (run_id && !*run_id) throw Failure(TIDE_ERR_INVALID_ARGUMENT, "run_id is empty (NULL: every run)");
    if (kind && !*kind) throw Failure(TIDE_ERR_INVALID_ARGUMENT, "kind is empty (NULL: every kind)");
    auto sub = std::make_shared<tide_subscription>();
    const std::string prefix = run_id ? fmt::format("run.{}.{}", run_id, kind ? kind : "") : "run.";
    sub->kind = kind ? kind : "";
    sub->subscriber = std::make_unique<tide::ipc::Subscriber>(e->event_endpoint, std::vector<std::string>{prefix},
                                                              e->curve);
    if (callback) {
      sub->callback = callback;
      sub->user_data = user_data;
      tide_subscription* raw = sub.get();
      sub->thread = std::thread([raw] {
        delivering = raw;
        while (!raw->stopping.load()) {
          try {
            if (raw->next(std::chrono::milliseconds(100))) raw->callback(&raw->event, raw->user_data);
          } catch (const std::exception& e) {
            // Nothing may escape a library thread; a broken message is skipped.
            spdlog::warn("tide subscription: an event was dropped: {}", e.what());
          }
        }
      });
    }
    *out = subscriptions().add(std::move(sub));
    return TIDE_OK;
  });
}
}  // namespace

extern "C" {

int tide_subscribe(tide_engine* engine, const char* run_id, const char* kind, tide_subscription** out) {
  return subscribe("tide_subscribe", engine, run_id, kind, nullptr, nullptr, out);
}

int tide_subscribe_callback(tide_engine* engine, const char* run_id, const char* kind, tide_event_fn callback,
                            void* user_data, tide_subscription** out) {
  return tide::capi::guarded("tide_subscribe_callback", [&] {
    tide::capi::require(reinterpret_cast<const void*>(callback), "callback");
    return subscribe("tide_subscribe_callback", engine, run_id, kind, callback, user_data, out);
  });
}

int tide_subscription_poll(tide_subscription* subscription, int32_t timeout_ms, tide_event* event) {
  return tide::capi::guarded("tide_subscription_poll", [&] {
    auto s = subscriptions().get(subscription, "subscription");
    tide::capi::require(event, "event");
    if (s->callback) throw Failure(TIDE_ERR_INVALID_STATE, "this subscription delivers to its callback");
    if (timeout_ms < -1) throw Failure(TIDE_ERR_INVALID_ARGUMENT, fmt::format("timeout_ms {} < -1", timeout_ms));
    const auto timeout = timeout_ms < 0 ? std::chrono::milliseconds(std::numeric_limits<int32_t>::max())
                                        : std::chrono::milliseconds(timeout_ms);
    if (!s->next(timeout)) throw Failure(TIDE_ERR_TIMEOUT, fmt::format("no event within {} ms", timeout_ms));
    *event = s->event;
    return TIDE_OK;
  });
}

int tide_subscription_close(tide_subscription* subscription) {
  if (!subscription) return TIDE_OK;
  return tide::capi::guarded("tide_subscription_close", [&] {
    if (delivering == subscription)
      throw Failure(TIDE_ERR_REENTRANT, "a subscription cannot be closed from inside its own callback");
    auto s = subscriptions().take(subscription);
    if (!s) throw Failure(TIDE_ERR_INVALID_HANDLE, "subscription is closed or was not made by this library");
    s->stopping = true;
    if (s->thread.joinable()) s->thread.join();
    return TIDE_OK;
  });
}

}  // extern "C"
