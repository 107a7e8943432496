#include "core/progress.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace dhp {

namespace {

std::string bytes_text(double b, double scale_of) {
  // Both figures of a line in the unit of the larger, so they read against each other.
  if (scale_of >= 1e9) return fmt::format("{:.2f}", b / 1e9);
  if (scale_of >= 1e6) return fmt::format("{:.1f}", b / 1e6);
  return fmt::format("{:.0f}", b / 1e3);
}

const char* unit_of(double b) { return b >= 1e9 ? "GB" : b >= 1e6 ? "MB" : "kB"; }

}  // namespace

std::string duration_text(double s) {
  if (!(s >= 0) || s > 1e8) return "?";
  const int64_t t = int64_t(s + 0.5);
  if (t < 60) return fmt::format("{}s", t);
  if (t < 3600) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}h{:02}m", t / 3600, t / 60 % 60);
}

ByteProgress::ByteProgress(std::string what, int64_t total_bytes, bool enabled, double every_s)
    : what_(std::move(what)),
      total_(std::max<int64_t>(total_bytes, 0)),
      on_(enabled && spdlog::should_log(spdlog::level::info)),
      terminal_(isatty(STDERR_FILENO) != 0),
      every_s_(every_s),
      next_s_(terminal_ ? std::min(1.0, every_s) : every_s) {}

ByteProgress::~ByteProgress() {
  if (drawn_) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  }
}

std::string ByteProgress::text() const {
  const double s = std::chrono::duration<double>(Clock::now() - start_).count();
  const double rate = s > 0 ? double(done_) / s : 0.0;
  const double scale = double(std::max(total_, done_));
  std::string out = fmt::format("{} of {} {}", bytes_text(double(done_), scale), bytes_text(double(total_), scale),
                                unit_of(scale));
  if (total_ > 0) out += fmt::format(" ({:.0f}%)", 100.0 * double(done_) / double(total_));
  out += fmt::format(", {:.0f} MB/s", rate / 1e6);
  if (rate > 0 && total_ > done_) out += ", eta " + duration_text(double(total_ - done_) / rate);
  return out;
}

void ByteProgress::add(int64_t bytes) {
  if (!on_) return;
  done_ += bytes;
  const double s = std::chrono::duration<double>(Clock::now() - start_).count();
  if (s < next_s_) return;
  if (terminal_) {
    std::fprintf(stderr, "\r%s: %s\033[K", what_.c_str(), text().c_str());
    std::fflush(stderr);
    drawn_ = true;
    next_s_ = s + 0.25;
  } else {
    spdlog::info("{}: {}", what_, text());
    next_s_ = s + every_s_;
  }
}

}  // namespace dhp
