#include "tensorboard_log.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>

namespace tide {
namespace {

// Protocol buffer wire format: a key is (field << 3) | wire type.
enum Wire : uint32_t { kVarint = 0, kFixed64 = 1, kBytes = 2, kFixed32 = 5 };

void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}

void key(std::string& out, uint32_t field, Wire wire) { varint(out, (field << 3) | wire); }

template <typename T>
void little_endian(std::string& out, T v) {
  char bytes[sizeof v];
  std::memcpy(bytes, &v, sizeof v);  // x86-64 and aarch64 Linux: already little-endian
  out.append(bytes, sizeof v);
}

void bytes_field(std::string& out, uint32_t field, const std::string& value) {
  key(out, field, kBytes);
  varint(out, value.size());
  out += value;
}

// Event (tensorflow/core/util/event.proto): wall_time = 1, step = 2, file_version = 3,
// summary = 5, session_log = 7.
std::string event(double wall_time, int64_t step) {
  std::string e;
  key(e, 1, kFixed64);
  little_endian(e, wall_time);
  key(e, 2, kVarint);
  varint(e, static_cast<uint64_t>(step));
  return e;
}

// Summary.Value: tag = 1, simple_value = 2 (float).
std::string scalar(const std::string& tag, double value) {
  std::string v;
  bytes_field(v, 1, tag);
  key(v, 2, kFixed32);
  little_endian(v, static_cast<float>(value));
  return v;
}

double now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;  // reflected Castagnoli
      t[i] = c;
    }
    return t;
  }();
  return table;
}
}  // namespace

uint32_t crc32c(const std::string& data) {
  const auto& table = crc_table();
  uint32_t c = 0xffffffffu;
  for (unsigned char b : data) c = table[(c ^ b) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

TensorBoardLog::TensorBoardLog(const std::string& dir, int64_t resumed_step) {
  std::filesystem::create_directories(dir);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const double start = now();
  // TensorBoard reads a directory's files in name order, and the name's number is
  // seconds: a file opened within the second of an earlier one takes the next number, so
  // that an attempt always sorts after the one it resumes.
  int64_t seconds = static_cast<int64_t>(start);
  const std::string prefix = "events.out.tfevents.";
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    try {
      seconds = std::max<int64_t>(seconds, std::stoll(name.substr(prefix.size())) + 1);
    } catch (const std::exception&) {
    }
  }
  path_ = fmt::format("{}/{}{}.{}.{}", dir, prefix, seconds, host, ::getpid());
  out_.open(path_, std::ios::binary | std::ios::trunc);
  if (!out_) throw std::runtime_error(fmt::format("cannot write '{}'", path_));
  std::string first = event(start, 0);
  bytes_field(first, 3, "brain.Event:2");
  record(first);
  if (resumed_step > 0) {
    // TensorBoard keeps the steps below a start record's step: those the checkpoint holds.
    std::string restart = event(start, resumed_step + 1);
    std::string session_log;  // SessionLog: status = 1, START = 1
    key(session_log, 1, kVarint);
    varint(session_log, 1);
    bytes_field(restart, 7, session_log);
    record(restart);
  }
}

void TensorBoardLog::write(const StepMetrics& m) {
  std::string summary;
  auto add = [&summary](const std::string& tag, double value) {
    if (std::isfinite(value)) bytes_field(summary, 1, scalar(tag, value));
  };
  add("train/loss", m.loss);
  add("train/grad_norm", m.grad_norm);
  add("train/lr", m.lr);
  if (m.moe_balance) add("train/moe_balance", *m.moe_balance);
  if (m.moe_max_load) add("train/moe_max_load", *m.moe_max_load);
  if (m.moe_z) add("train/moe_z", *m.moe_z);
  if (m.moe_dropped) add("train/moe_dropped", *m.moe_dropped);
  add("speed/tokens_per_second", m.tokens_per_second);
  add("speed/mfu", m.mfu);
  add("speed/step_seconds", m.step_seconds);
  add("time/data_seconds", m.data_seconds);
  add("time/comm_seconds", m.comm_seconds);
  add("time/checkpoint_seconds", m.checkpoint_seconds);
  add("memory/rss_mb", m.rss_mb);
  add("memory/peak_gpu_mb", m.peak_gpu_mb);
  add("memory/peak_host_tensor_mb", m.peak_host_tensor_mb);
  add("comm/bytes", static_cast<double>(m.comm_bytes));
  if (m.val_loss) add("eval/loss", *m.val_loss);
  for (const auto& [name, loss] : m.val_losses) add("eval/loss/" + name, loss);
  std::string e = event(m.time > 0 ? m.time : now(), m.step);  // the row's time: the same in metrics.jsonl
  bytes_field(e, 5, summary);
  record(e);
}

void TensorBoardLog::record(const std::string& data) {
  std::string frame;
  little_endian(frame, static_cast<uint64_t>(data.size()));
  std::string length = frame;
  little_endian(frame, masked(crc32c(length)));
  frame += data;
  little_endian(frame, masked(crc32c(data)));
  out_.write(frame.data(), static_cast<std::streamsize>(frame.size()));
  out_.flush();
  if (!out_) throw std::runtime_error(fmt::format("cannot write to '{}'", path_));
}

}  // namespace tide
