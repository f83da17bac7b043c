#include "profile_summary.h"

#include <algorithm>
#include <limits>
#include <map>
#include <unordered_map>

#include <fmt/format.h>

namespace tide {
namespace {

double seconds(uint64_t ns) { return static_cast<double>(ns) * 1e-9; }
uint64_t duration(const ProfiledEvent& e) { return e.end_ns > e.start_ns ? e.end_ns - e.start_ns : 0; }

std::vector<ProfileRow> by_time(std::map<std::string, ProfileRow>& rows) {
  std::vector<ProfileRow> out;
  for (auto& [name, row] : rows) out.push_back(std::move(row));
  std::stable_sort(out.begin(), out.end(),
                   [](const ProfileRow& a, const ProfileRow& b) { return a.seconds > b.seconds; });
  return out;
}

// Kernel names are whole template instantiations; a table needs their start.
std::string shortened(const std::string& name, size_t most) {
  return name.size() <= most ? name : name.substr(0, most - 3) + "...";
}

// An operator's name in the launch table: without autograd's wrapper around a backward
// node's name, anonymous namespaces or an annotation's step number.
std::string launcher_name(const ProfiledEvent& e) {
  std::string n = e.name;
  const std::string wrapper = "autograd::engine::evaluate_function: ", anonymous = "(anonymous namespace)::";
  if (n.compare(0, wrapper.size(), wrapper) == 0) n.erase(0, wrapper.size());
  for (size_t at = n.find(anonymous); at != std::string::npos; at = n.find(anonymous, at))
    n.erase(at, anonymous.size());
  if (e.kind == ProfiledEvent::Kind::Annotation) {
    const size_t hash = n.rfind('#');
    if (hash != std::string::npos && hash + 1 < n.size() &&
        n.find_first_not_of("0123456789", hash + 1) == std::string::npos)
      n.erase(hash);
  }
  return n;
}

}  // namespace

ProfileSummary summarize_profile(const std::vector<ProfiledEvent>& events) {
  ProfileSummary s;
  if (events.empty()) return s;
  uint64_t first = std::numeric_limits<uint64_t>::max(), last = 0;
  for (const auto& e : events) {
    first = std::min(first, e.start_ns);
    last = std::max(last, e.end_ns);
  }
  s.wall_seconds = seconds(last - first);

  // Host events nest within their thread: walk each thread's events by start (the longer
  // first where two start together), keeping the chain of events that contain this one.
  std::vector<size_t> host, device;
  for (size_t i = 0; i < events.size(); ++i)
    (events[i].kind == ProfiledEvent::Kind::Device ? device : host).push_back(i);
  std::sort(host.begin(), host.end(), [&](size_t a, size_t b) {
    const ProfiledEvent &x = events[a], &y = events[b];
    if (x.thread != y.thread) return x.thread < y.thread;
    if (x.start_ns != y.start_ns) return x.start_ns < y.start_ns;
    return x.end_ns > y.end_ns;
  });
  std::vector<uint64_t> self(events.size());
  for (size_t i = 0; i < events.size(); ++i) self[i] = duration(events[i]);
  // Each host event's outermost operator on its thread: itself where none contains it,
  // and an annotation is its own.
  std::vector<size_t> outermost(events.size());
  std::vector<size_t> chain;
  for (size_t k = 0; k < host.size(); ++k) {
    const ProfiledEvent& e = events[host[k]];
    if (k > 0 && events[host[k - 1]].thread != e.thread) chain.clear();
    while (!chain.empty() && events[chain.back()].end_ns < e.end_ns) chain.pop_back();
    if (!chain.empty()) self[chain.back()] -= std::min(self[chain.back()], duration(e));
    outermost[host[k]] = host[k];
    if (e.kind == ProfiledEvent::Kind::HostOp) {
      const auto top = std::find_if(chain.begin(), chain.end(),
                                    [&](size_t c) { return events[c].kind == ProfiledEvent::Kind::HostOp; });
      if (top != chain.end()) outermost[host[k]] = *top;
    }
    chain.push_back(host[k]);
  }

  std::map<std::string, ProfileRow> ops, kernels;
  for (size_t i : host) {
    const ProfiledEvent& e = events[i];
    if (e.kind == ProfiledEvent::Kind::Annotation) {
      s.outside_operators_seconds += seconds(self[i]);
      continue;
    }
    ProfileRow& row = ops[e.name];
    row.name = e.name;
    ++row.calls;
    row.seconds += seconds(self[i]);
    row.flops += e.flops;
  }
  s.host = by_time(ops);

  // The device is busy while any of its events runs (streams overlap).
  std::sort(device.begin(), device.end(), [&](size_t a, size_t b) { return events[a].start_ns < events[b].start_ns; });
  uint64_t busy = 0, open_start = 0, open_end = 0;
  bool open = false;
  for (size_t i : device) {
    const ProfiledEvent& e = events[i];
    ProfileRow& row = kernels[e.name];
    row.name = e.name;
    ++row.calls;
    row.seconds += seconds(duration(e));
    if (open && e.start_ns <= open_end) {
      open_end = std::max(open_end, e.end_ns);
      continue;
    }
    if (open) busy += open_end - open_start;
    open = true;
    open_start = e.start_ns;
    open_end = std::max(e.start_ns, e.end_ns);
  }
  if (open) busy += open_end - open_start;
  s.device_busy_seconds = seconds(busy);
  s.device = by_time(kernels);

  std::unordered_map<uint64_t, size_t> by_correlation;
  for (size_t i : host)
    if (events[i].correlation != 0) by_correlation.emplace(events[i].correlation, i);
  std::map<std::string, ProfileRow> launchers;
  for (size_t i : device) {
    const auto found = by_correlation.find(events[i].launched_by);
    std::string name = "(no operator recorded)";
    if (found != by_correlation.end()) {  // 0, "unknown", is never a key
      // A backward node's wrapper and the node itself read as one name.
      const std::string inner = launcher_name(events[found->second]),
                        outer = launcher_name(events[outermost[found->second]]);
      name = outer == inner ? inner : outer + " > " + inner;
    }
    ProfileRow& row = launchers[name];
    row.name = name;
    ++row.calls;
    row.seconds += seconds(duration(events[i]));
  }
  s.launched_by = by_time(launchers);
  return s;
}

std::string format_profile_summary(const ProfileSummary& s, int64_t steps, size_t top) {
  const double wall = s.wall_seconds > 0 ? s.wall_seconds : 1;
  const auto share = [&](double x) { return 100.0 * x / wall; };
  std::string out = fmt::format("{} step{}, {:.3f} s recorded ({:.3f} s a step)\n", steps, steps == 1 ? "" : "s",
                                s.wall_seconds, s.wall_seconds / static_cast<double>(std::max<int64_t>(steps, 1)));
  // LibTorch counts FLOPs only where it records inputs (profile.shapes); on a GPU an
  // operator's host time is its launch, not its arithmetic: no rate there.
  const bool rates =
      s.device.empty() && std::any_of(s.host.begin(), s.host.end(), [](const ProfileRow& r) { return r.flops > 0; });
  out += fmt::format("host operators by self time (an operator's time less the operators it calls), {} of {}:\n",
                     std::min(top, s.host.size()), s.host.size());
  // The rate column only where there are rates.
  const auto rate_of = [&](const ProfileRow& r) -> std::string {
    if (!rates) return "";
    if (r.flops == 0 || r.seconds <= 0) return fmt::format("{:>8}  ", "");
    return fmt::format("{:>8.1f}  ", static_cast<double>(r.flops) / r.seconds / 1e9);
  };
  out += fmt::format("  {:>9}  {:>6}  {:>7}  {}operator\n", "self s", "share", "calls", rates ? " GFLOP/s  " : "");
  for (size_t i = 0; i < s.host.size() && i < top; ++i) {
    const ProfileRow& r = s.host[i];
    out += fmt::format("  {:>9.4f}  {:>5.1f}%  {:>7}  {}{}\n", r.seconds, share(r.seconds), r.calls, rate_of(r),
                       shortened(r.name, 100));
  }
  out += fmt::format("host time inside the steps in no operator (tide's own work, waits): {:.4f} s ({:.1f}%)\n",
                     s.outside_operators_seconds, share(s.outside_operators_seconds));
  if (s.device.empty()) return out;
  out += fmt::format("device busy {:.4f} s ({:.1f}%, idle {:.1f}%); kernels and copies by time, {} of {}:\n",
                     s.device_busy_seconds, share(s.device_busy_seconds), 100.0 - share(s.device_busy_seconds),
                     std::min(top, s.device.size()), s.device.size());
  // A table of device time: its column names, then `top` rows.
  const auto device_rows = [&](const std::vector<ProfileRow>& rows, const char* count, const char* name, size_t width) {
    out += fmt::format("  {:>9}  {:>6}  {:>7}  {}\n", "s", "share", count, name);
    for (size_t i = 0; i < rows.size() && i < top; ++i)
      out += fmt::format("  {:>9.4f}  {:>5.1f}%  {:>7}  {}\n", rows[i].seconds, share(rows[i].seconds), rows[i].calls,
                         shortened(rows[i].name, width));
  };
  device_rows(s.device, "calls", "kernel", 100);
  out += fmt::format(
      "device time by the operator that launched it (outermost > innermost operator of the launch), {} of {}:\n",
      std::min(top, s.launched_by.size()), s.launched_by.size());
  device_rows(s.launched_by, "events", "operator", 160);
  return out;
}

}  // namespace tide
