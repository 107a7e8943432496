// Long work measured in bytes (importing a checkpoint folder, saving a checkpoint, exporting,
// building shards): on a terminal a line that redraws itself with the bytes done, the rate and
// an ETA; elsewhere (a log file, a launcher's pipe) a log line every `every_s` seconds. Work
// that ends within the first second on a terminal, or the first interval elsewhere, shows
// nothing, so short work and tests stay quiet.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace dhp {

// "42s", "7m05s", "3h02m": a duration as a person reads it at a glance; "?" when unknown.
std::string duration_text(double seconds);

class ByteProgress {
 public:
  // `enabled` = false makes every call a no-op (the ranks that do not report).
  ByteProgress(std::string what, int64_t total_bytes, bool enabled = true, double every_s = 5.0);
  ~ByteProgress();
  ByteProgress(const ByteProgress&) = delete;
  ByteProgress& operator=(const ByteProgress&) = delete;
  void add(int64_t bytes);
  // "1.20 of 3.40 GB (35%), 118 MB/s, eta 19s": what the line says now.
  std::string text() const;

 private:
  using Clock = std::chrono::steady_clock;
  std::string what_;
  int64_t total_ = 0, done_ = 0;
  bool on_ = false, terminal_ = false, drawn_ = false;
  double every_s_ = 5.0, next_s_ = 0.0;
  Clock::time_point start_ = Clock::now();
};

}  // namespace dhp
