// Where a profiled stretch of steps spent its time, from the profiler's events (internal):
// the host operators by self time, the device kernels by time, the device's time by the
// operator that launched it, and how busy the device was.
// No LibTorch: step_profiler.cpp turns Kineto's events into ProfiledEvent.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tide {

struct ProfiledEvent {
  enum class Kind {
    HostOp,      // an operator or a runtime call on a host thread
    Annotation,  // a user scope (ProfilerStep#N, tide::update): nests operators, not one itself
    Device,      // a kernel, copy or memset on the device
  };
  std::string name;
  Kind kind = Kind::HostOp;
  uint64_t thread = 0;  // host events nest within a thread; device events within a stream
  uint64_t start_ns = 0, end_ns = 0;
  uint64_t flops = 0;  // counted by LibTorch for matmuls; 0 elsewhere
  // An operator's or annotation's id in the profiler (0: none), which names it in the
  // device events it launched; a device event's `launched_by` is that id (0: unknown).
  uint64_t correlation = 0;
  uint64_t launched_by = 0;
};

struct ProfileRow {
  std::string name;
  int64_t calls = 0;
  double seconds = 0;  // self time (host operators) or time (device)
  uint64_t flops = 0;
};

struct ProfileSummary {
  double wall_seconds = 0;               // from the first event's start to the last one's end
  std::vector<ProfileRow> host;          // by self time, most first
  std::vector<ProfileRow> device;        // by time, most first
  // Device time by the operator that launched it, named "outermost > innermost" (the
  // outermost operator of the launch's thread, the innermost one the launch was made in;
  // one name where they are one), by time, most first.
  std::vector<ProfileRow> launched_by;
  double outside_operators_seconds = 0;  // inside the annotations' threads' scopes, in no operator
  double device_busy_seconds = 0;        // the union of the device events' intervals
};

// Self time: an operator's time less the time of the host operators nested directly in
// it on its thread (events sorted by start; a child ends within its parent).
ProfileSummary summarize_profile(const std::vector<ProfiledEvent>& events);

// The summary as the run log and the summary file show it: `top` rows of each table.
std::string format_profile_summary(const ProfileSummary& s, int64_t steps, size_t top);

}  // namespace tide
