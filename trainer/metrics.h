// What a run reports as it goes: the progress bar on a terminal, the JSONL metrics file, and
// the log lines of steps and evaluations.
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "trainer/config.h"
#include "trainer/evaluate.h"
#include "trainer/run_lock.h"
#include "trainer/tensorboard.h"

namespace dhp {

// One training step as the metrics file and the log report it.
struct StepRecord {
  int64_t step = 0;
  double loss = 0.0;
  double lr = 0.0;
  double grad_norm = 0.0;
  double tokens_per_s = 0.0;
  double samples_per_s = 0.0;
  double elapsed_s = 0.0;
  double loader_wait_s = 0.0;
  int64_t groups = 0;        // groups of the step's plan (all ranks)
  int max_degree = 1;        // the widest ring of the plan
  std::vector<int> degrees;  // ring degree of every group of the plan, widest first
  double plan_s = 0.0;       // planner wall time
  double predicted_s = 0.0;  // the plan's predicted makespan
  double measured_s = 0.0;   // the plan's schedule replayed with the measured group times
  double cost_error = 0.0;   // mean |predicted - measured| / measured over the step's groups
  double busy_s = 0.0;       // this rank's compute time (thread CPU time, waits left out)
  std::vector<double> rank_busy_s;  // every rank's busy_s
  double ring_wait_s = 0.0;  // this rank's time waiting for ring neighbours
  double step_s = 0.0;
  // Model FLOPs of the step over step_s x ranks x the device's dense peak (CostModel::model_flops,
  // DeviceProfile::peak_flops); on the CPU the peak is its profile's measured GEMM rate.
  double mfu = 0.0;
  bool mfu_of_measured = false;
  double imbalance = 1.0;  // slowest rank's compute time over the mean of all ranks
  int threads = 0;         // compute threads this rank used for the step
  // Every rank's device memory: the high-water mark its buffers reached during the step
  // (Backend::peak_bytes), and what the planner's memory model predicted for its groups.
  std::vector<double> rank_mem_peak_mb, rank_mem_predicted_mb;
  // Every group of the plan, predicted next to measured, with what its price depends on, so
  // that the cost model's error can be broken down by ring degree and piece size
  // (scripts/cost_error.py).
  struct GroupCost {
    int degree = 1;
    int first_rank = 0;        // the group runs on ranks first_rank .. first_rank + degree - 1
    int seqs = 0;
    int64_t tokens = 0;        // decoder tokens of the whole micro-batch
    int64_t piece_tokens = 0;  // the most decoder tokens one ring member holds
    int64_t pieces = 0;        // zigzag ranges the busiest member holds
    int images = 0;
    int64_t image_tokens = 0;  // merged image tokens (what the image exchange routes)
    int64_t max_image_tokens = 0;  // the largest image's merged tokens
    double predicted_s = 0.0, measured_s = 0.0;
  };
  std::vector<GroupCost> group_costs;
  std::string candidate;  // the search whose plan ran (dhp's portfolio)
  std::string rule;       // what decided between the candidates (dhp's robust choice)
};

// The step's line of the metrics file. busy_s is left out: rank_busy_s holds every rank's.
void to_json(nlohmann::json& j, const StepRecord& r);

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
  // interrupted run wrote after its checkpoint, which this run writes again; a fresh run moves
  // an earlier run's records to PATH.1. The file is locked for the run (PATH.lock), and
  // anything at PATH that is not a dhp metrics file (a device, a folder, another program's
  // data) is refused, never truncated.
  MetricsFile(const std::string& path, bool enabled, int64_t resumed_step);
  // A failed write is reported once and ends the file; training goes on without it.
  void write(const nlohmann::json& j);

 private:
  std::optional<RunLock> lock_;
  std::ofstream out_;
  std::string path_;
};

// Logs an evaluation (and its blanked-image twin, when given); returns its metrics record.
nlohmann::json log_eval(const char* what, int64_t step, const EvalResult& r, const EvalResult* blank);

// What a training run reports, from rank 0 only: every step in the metrics file, a log line
// every log.every steps (and the first and last), the progress bar, and the evaluations.
class RunReport {
 public:
  RunReport(const Config& cfg, bool rank0);
  // Opens the metrics file once the step the run starts from is known: a resumed run keeps
  // the lines its interrupted run wrote up to that step.
  void start(int64_t first_step);
  void step(const StepRecord& rec);
  void eval(int64_t step, const EvalResult& r, const EvalResult* blank);
  // Clears the progress bar so that a log line can take its row.
  void clear() { bar_.clear(); }

 private:
  using Clock = std::chrono::steady_clock;
  const Config& cfg_;
  const bool rank0_;
  ProgressBar bar_;
  std::optional<MetricsFile> metrics_;
  std::optional<TensorBoardWriter> tensorboard_;
  Clock::time_point t_start_;
  int64_t first_step_ = 0;
};

}  // namespace dhp
