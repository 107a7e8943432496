// What a run reports as it goes: the progress bar on a terminal, the JSONL metrics file, and
// the log lines of steps and evaluations.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "trainer/evaluate.h"

namespace dhp {

// One line that redraws itself on a terminal; silent when stderr is not one.
class ProgressBar {
 public:
  ProgressBar(int64_t total, bool enabled);
  void draw(int64_t done, double elapsed, double loss);
  // Clears the bar so a log line can take the row.
  void clear();

 private:
  int64_t total_;
  bool on_;
  bool drawn_ = false;
};

class MetricsFile {
 public:
  // A resumed run keeps the records up to the step it resumes from and drops the ones the
  // interrupted run wrote after its checkpoint, which this run writes again.
  MetricsFile(const std::string& path, bool enabled, int64_t resumed_step);
  // A failed write is reported once and ends the file; training goes on without it.
  void write(const nlohmann::json& j);

 private:
  std::ofstream out_;
  std::string path_;
};

// Logs an evaluation (and its blanked-image twin, when given) and records it in the metrics.
void log_eval(const char* what, int64_t step, const EvalResult& r, const EvalResult* blank,
              MetricsFile& metrics);

}  // namespace dhp
