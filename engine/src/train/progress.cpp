#include <unistd.h>

#include <fmt/format.h>

#include "tide/engine/train/metrics.h"

namespace tide {

std::string format_duration(double s) {
  if (!(s >= 0) || s > 1e8) return "?";
  const int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02d}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

ProgressLine::ProgressLine(std::FILE* out) : out_(out), tty_(::isatty(::fileno(out)) != 0) {}

ProgressLine::~ProgressLine() { finish(); }

std::string ProgressLine::format(const StepMetrics& m) {
  std::string s = fmt::format("step {}/{} | loss {:.4f} | lr {:.2e} | gnorm {:.3f} | {:.0f} tok/s | MFU {:.1f}% | ETA {}",
                              m.step, m.total_steps, m.loss, m.lr, m.grad_norm, m.tokens_per_second, 100.0 * m.mfu,
                              format_duration(m.eta_seconds));
  if (m.peak_gpu_mb > 0) s += fmt::format(" | GPU {:.0f} MiB", m.peak_gpu_mb);
  if (m.val_loss) s += fmt::format(" | val {:.4f}", *m.val_loss);
  if (m.moe_balance) s += fmt::format(" | balance {:.3f}", *m.moe_balance);
  if (m.moe_max_load) s += fmt::format(" | max load {:.2f}", *m.moe_max_load);
  if (m.moe_z) s += fmt::format(" | router z {:.3g}", *m.moe_z);
  if (m.moe_dropped) s += fmt::format(" | dropped {:.1f}%", *m.moe_dropped * 100);
  if (m.loss_scale > 0) s += fmt::format(" | loss scale {:g}", m.loss_scale);
  if (m.skipped) s += m.loss_scale > 0 ? " | skipped (gradients overflowed fp16)" : " | skipped (non-finite gradients)";
  return s;
}

void ProgressLine::update(const StepMetrics& m) {
  const std::string line = format(m);
  if (tty_) {
    // A validation result stays on screen; plain steps overwrite each other.
    std::fprintf(out_, "\r\033[2K%s%s", line.c_str(), m.val_loss ? "\n" : "");
    open_ = !m.val_loss;
  } else {
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
}

void ProgressLine::finish() {
  if (open_) std::fprintf(out_, "\n");
  open_ = false;
  std::fflush(out_);
}

}  // namespace tide
