#include "tide/worker/progress_report.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

namespace tide::worker {
namespace {
constexpr auto kRedraw = std::chrono::milliseconds(200);
constexpr auto kLogLine = std::chrono::seconds(10);
constexpr auto kFileWrite = std::chrono::milliseconds(500);
}  // namespace

std::string describe_byte_progress(const std::string& stage, int64_t done, int64_t total) {
  // Both figures in the total's unit: "0.40 of 3.40 GiB" reads at a glance.
  const bool gib = total >= int64_t{1} << 30, mib = total >= int64_t{1} << 20;
  const double scale = gib ? 1 << 30 : mib ? 1 << 20 : 1 << 10;
  const double pct = total > 0 ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0;
  return fmt::format("{} {:.{}f} of {:.{}f} {} ({:.0f}%)", stage, static_cast<double>(done) / scale, gib ? 2 : 1,
                     static_cast<double>(total) / scale, gib ? 2 : 1,
                     gib   ? "GiB"
                     : mib ? "MiB"
                           : "KiB",
                     pct);
}

ProgressReport::ProgressReport(std::string file) : file_(std::move(file)), tty_(::isatty(STDERR_FILENO) != 0) {}

Progress ProgressReport::progress() {
  return [this](const std::string& stage, int64_t done, int64_t total) { update(stage, done, total); };
}

void ProgressReport::update(const std::string& stage, int64_t done, int64_t total) {
  const auto now = std::chrono::steady_clock::now();
  const bool new_stage = stage != stage_, finished = done >= total;
  stage_ = stage;
  if (!file_.empty() && (new_stage || finished || now - written_ >= kFileWrite)) {
    write_file(stage, done, total);
    written_ = now;
  }
  if (tty_) {
    if (!new_stage && !finished && now - shown_ < kRedraw) return;
    std::fprintf(stderr, "\r\033[2K%s%s", describe_byte_progress(stage, done, total).c_str(), finished ? "\n" : "");
  } else {
    if (!new_stage && !finished && now - shown_ < kLogLine) return;
    spdlog::info("{}", describe_byte_progress(stage, done, total));
  }
  shown_ = now;
}

void ProgressReport::write_file(const std::string& stage, int64_t done, int64_t total) {
  if (file_failed_) return;
  const std::string tmp = file_ + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << nlohmann::json{{"stage", stage}, {"done", done}, {"total", total}}.dump() << '\n';
    out.flush();
    if (out) {
      std::error_code ec;
      std::filesystem::rename(tmp, file_, ec);
      if (!ec) return;
    }
  }
  // Progress is a courtesy: the work goes on without it.
  file_failed_ = true;
  spdlog::warn("cannot write the progress file {}; the job goes on without it", file_);
}

}  // namespace tide::worker
