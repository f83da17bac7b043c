#include "event_bus.h"

#include <chrono>

#include "tide/ipc/protocol.h"

namespace tide::ipc {
using json = nlohmann::json;

double unix_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

EventBus::EventBus(zmq::context_t& ctx, std::string epoch)
    : socket_(ctx, zmq::socket_type::xpub), epoch_(std::move(epoch)) {
  socket_.set(zmq::sockopt::linger, 0);
  // Every subscription reaches us (for the snapshot), and a subscriber that does not
  // read loses messages beyond this many instead of slowing anything down.
  socket_.set(zmq::sockopt::xpub_verbose, 1);
  socket_.set(zmq::sockopt::sndhwm, 10000);
}

void EventBus::publish(const std::string& run, const std::string& kind, json body, bool snapshot) {
  const int64_t n = snapshot ? seq_[run] : ++seq_[run];
  json event = {{"v", kProtocolVersion},  {"run", run},         {"seq", n},
                {"kind", kind},           {"time", unix_now()}, {"epoch", epoch_},
                {"body", std::move(body)}};
  if (snapshot) event["snapshot"] = true;
  if (!snapshot)
    for (const auto& observe : observers_) observe(run, kind, event["body"]);
  const std::string topic = run_topic(run, kind);
  const std::string text = event.dump(-1, ' ', false, json::error_handler_t::replace);
  (void)socket_.send(zmq::buffer(topic), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  (void)socket_.send(zmq::buffer(text), zmq::send_flags::dontwait);
}

void EventBus::serve_subscriptions(const std::function<void(const std::string&)>& on_subscribe) {
  zmq::message_t msg;
  while (socket_.recv(msg, zmq::recv_flags::dontwait)) {
    const auto data = msg.to_string_view();
    if (!data.empty() && data[0] == 1) on_subscribe(std::string(data.substr(1)));
  }
}

}  // namespace tide::ipc
