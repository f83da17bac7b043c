#include "live_control.h"

#include <chrono>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "tide/engine/live_change.h"
#include "tide/engine/io/json_input.h"
#include "tide/engine/parallel/comm.h"

namespace tide {
using json = nlohmann::json;

namespace {
// While paused, rank 0 looks for commands this often; the other ranks wait in the
// broadcast, well inside any collective timeout.
constexpr auto kPausePoll = std::chrono::milliseconds(100);
}  // namespace

LiveControl::LiveControl(Comm* world, Take take, Emit emit, BatchLayout batch)
    : world_(world),
      leader_(!world || world->rank() == 0),
      take_(std::move(take)),
      emit_(std::move(emit)),
      batch_(batch) {}

std::string LiveControl::receive() {
  std::string text = leader_ && take_ ? take_() : std::string();
  return world_ ? world_->broadcast_text(text, 0, "control commands") : text;
}

BoundaryActions LiveControl::at_boundary(int64_t step, RunConfig& cfg, const std::function<void()>& before_commands) {
  BoundaryActions out;
  bool first = true;
  while (true) {
    const std::string text = receive();
    if (!text.empty()) {
      if (first && before_commands) before_commands();
      first = false;
      const json commands = parse_json_or_discard(text);
      if (!commands.is_array()) {
        spdlog::error("control: ignoring commands that are not a JSON array: {}", text);
      } else {
        for (const auto& c : commands) apply(c, step, cfg, out);
      }
    }
    if (!paused_ || out.stop) return out;
    if (leader_) std::this_thread::sleep_for(kPausePoll);
  }
}

void LiveControl::apply(const json& command, int64_t step, RunConfig& cfg, BoundaryActions& out) {
  const std::string op = command.is_object() ? command.value("op", "") : "";
  const json id = command.is_object() && command.contains("id") ? command["id"] : json(nullptr);
  auto emit = [&](const std::string& kind, json body) {
    if (!leader_ || !emit_) return;
    body["step"] = step;
    if (!id.is_null()) body["id"] = id;
    emit_(kind, body);
  };
  if (op == "pause") {
    if (!paused_) emit("paused", json::object());
    paused_ = true;
  } else if (op == "resume") {
    if (paused_) emit("resumed", json::object());
    paused_ = false;
  } else if (op == "stop") {
    out.stop = true;
    emit("stopping", json::object());
  } else if (op == "checkpoint") {
    out.checkpoint = true;
  } else if (op == "set") {
    try {
      LiveChange change = check_live_change(cfg, command.value("values", json::object()), batch_);
      cfg = std::move(change.next);
      json applied = json::object();
      for (const auto& f : change.fields) {
        applied[f.path] = f.value;
        out.changes.emplace_back(f.path, f.value.dump());
        out.effects.push_back(f.effect);
      }
      emit("applied", {{"values", applied}});
    } catch (const std::exception& e) {
      spdlog::warn("control: set refused at step {}: {}", step, e.what());
      emit("rejected", {{"error", e.what()}});
    }
  } else {
    spdlog::warn("control: unknown command '{}' ignored", command.dump());
    emit("rejected", {{"error", fmt::format("unknown command '{}'", command.dump())}});
  }
}

}  // namespace tide
