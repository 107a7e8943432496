#include "trainer/metrics.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/files.h"
#include "core/log.h"
#include "core/progress.h"

namespace dhp {

void to_json(nlohmann::json& j, const StepRecord& r) {
  j = {{"step", r.step},
       {"loss", r.loss},
       {"lr", r.lr},
       {"grad_norm", r.grad_norm},
       {"tokens_per_s", r.tokens_per_s},
       {"samples_per_s", r.samples_per_s},
       {"elapsed_s", r.elapsed_s},
       {"loader_wait_s", r.loader_wait_s},
       {"groups", r.groups},
       {"max_degree", r.max_degree},
       {"degrees", r.degrees},
       {"plan_s", r.plan_s},
       {"predicted_s", r.predicted_s},
       {"measured_s", r.measured_s},
       {"cost_error", r.cost_error},
       {"rank_busy_s", r.rank_busy_s},
       {"rank_mem_peak_mb", r.rank_mem_peak_mb},
       {"rank_mem_predicted_mb", r.rank_mem_predicted_mb},
       {"ring_wait_s", r.ring_wait_s},
       {"step_s", r.step_s},
       {"mfu", r.mfu},
       {"imbalance", r.imbalance},
       {"threads", r.threads}};
  if (!r.candidate.empty()) j["candidate"] = r.candidate;
  if (!r.rule.empty()) j["rule"] = r.rule;
  nlohmann::json groups = nlohmann::json::array();
  for (const auto& g : r.group_costs)
    groups.push_back({{"d", g.degree},
                      {"rank", g.first_rank},
                      {"seqs", g.seqs},
                      {"tokens", g.tokens},
                      {"piece", g.piece_tokens},
                      {"pieces", g.pieces},
                      {"images", g.images},
                      {"image_tokens", g.image_tokens},
                      {"max_image_tokens", g.max_image_tokens},
                      {"pred", g.predicted_s},
                      {"meas", g.measured_s}});
  j["group_costs"] = std::move(groups);
}

ProgressBar::ProgressBar(int64_t total, bool enabled)
    : total_(total), on_(enabled && isatty(STDERR_FILENO)) {}

void ProgressBar::draw(int64_t done, double elapsed, double loss) {
  if (!on_) return;
  const int width = 30;
  const int fill = int(width * done / std::max<int64_t>(1, total_));
  const double eta = done > 0 ? elapsed / double(done) * double(total_ - done) : 0.0;
  fmt::print(stderr, "\r[{:=<{}}{:<{}}] {}/{} loss {:.3f} eta {:.0f}s\033[K", "", fill, "",
             width - fill, done, total_, loss, eta);
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::clear() {
  if (on_ && drawn_) fmt::print(stderr, "\r\033[K");
  drawn_ = false;
}

namespace {

// A file of dhp metrics: its first line is a JSON object with a step (an empty file counts).
bool holds_metrics(const std::string& path) {
  const std::string head = read_head(path, 1 << 20);
  const std::string first = head.substr(0, head.find('\n'));
  if (first.empty()) return head.empty();
  const auto j = nlohmann::json::parse(first, nullptr, false);
  return j.is_object() && j.contains("step");
}

// The lines of an earlier run's file up to `step`: later lines are this run's to write again.
// Lines that do not parse stay (a damaged line is no reason to lose the ones after it).
std::string lines_up_to(const std::string& path, int64_t step) {
  std::ifstream in(path, std::ios::binary);
  std::string kept;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.value("step", int64_t(0)) > step) continue;
    kept += line + "\n";
  }
  return kept;
}

}  // namespace

MetricsFile::MetricsFile(const std::string& path, bool enabled, int64_t resumed_step) {
  if (!enabled || path.empty()) return;
  auto parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  DHP_CHECK(!ec, "log.metrics: cannot create the folder of '{}': {}", path, ec.message());
  // Never a device, FIFO, folder or link, and never another program's file.
  check_output_path(path, "log.metrics", holds_metrics, false);
  // One run per metrics file, as per checkpoint folder: two runs appending to one file
  // interleave and truncate each other's records.
  lock_.emplace(path + ".lock", fmt::format("log.metrics '{}'", path));
  std::string kept;
  if (resumed_step > 0) {
    kept = lines_up_to(path, resumed_step);
  } else if (std::filesystem::file_size(path, ec) > 0 && !ec) {
    // A fresh run keeps an earlier run's records: moved aside, never truncated.
    const std::string old = path + ".1";
    check_output_path(old, "log.metrics (the earlier run's records)", holds_metrics, false);
    commit_rename(path, old);
    spdlog::warn("log.metrics: '{}' held an earlier run's metrics; they are now in '{}'", path, old);
  }
  write_file_atomic(path, kept);
  out_.open(path, std::ios::app);
  DHP_CHECK(out_.good(), "log.metrics: cannot write '{}': {}", path, std::strerror(errno));
  path_ = path;
}

void MetricsFile::write(const nlohmann::json& j) {
  if (!out_.is_open()) return;
  out_ << j.dump() << '\n';
  out_.flush();
  if (out_.good()) return;
  spdlog::warn("log.metrics: writing '{}' failed ({}); no more metrics are recorded in it",
               path_, std::strerror(errno));
  out_.close();
}

nlohmann::json log_eval(const char* what, int64_t step, const EvalResult& r, const EvalResult* blank) {
  std::string line = fmt::format("eval {} step {}: loss {:.4f} ppl {:.2f} caption token accuracy "
                                 "{:.2f}%", what, step, r.loss, r.perplexity, 100 * r.accuracy);
  if (r.exact_match >= 0) line += fmt::format(", exact match {:.1f}%", 100 * r.exact_match);
  if (blank) {
    line += fmt::format(" | images blanked: loss {:.4f} accuracy {:.2f}%", blank->loss,
                        100 * blank->accuracy);
    if (blank->exact_match >= 0) line += fmt::format(", exact match {:.1f}%", 100 * blank->exact_match);
  }
  spdlog::info("{} ({} samples, {} caption tokens)", line, r.samples, r.targets);
  nlohmann::json j = {{"eval", what}, {"step", step}, {"loss", r.loss},
                      {"perplexity", r.perplexity}, {"accuracy", r.accuracy},
                      {"samples", r.samples}, {"targets", r.targets}};
  if (r.exact_match >= 0) j["exact_match"] = r.exact_match;
  if (blank) {
    j["blank_loss"] = blank->loss;
    j["blank_accuracy"] = blank->accuracy;
    if (blank->exact_match >= 0) j["blank_exact_match"] = blank->exact_match;
  }
  return j;
}

RunReport::RunReport(const Config& cfg, bool rank0)
    : cfg_(cfg), rank0_(rank0), bar_(cfg.train.steps, rank0 && cfg.log.progress) {}

void RunReport::start(int64_t first_step) {
  metrics_.emplace(cfg_.log.metrics, rank0_, first_step);
  if (rank0_ && !cfg_.log.tensorboard.empty()) {
    tensorboard_.emplace(cfg_.log.tensorboard, first_step);
    // The whole resolved configuration, as TOML in a Markdown code block.
    const std::string toml = to_toml(cfg_);
    std::string md;
    for (std::string_view rest = toml; !rest.empty();) {
      const size_t eol = std::min(rest.find('\n'), rest.size());
      md += "    " + std::string(rest.substr(0, eol)) + "\n";
      rest.remove_prefix(std::min(eol + 1, rest.size()));
    }
    tensorboard_->text(first_step, "config", md);
  }
  t_start_ = Clock::now();
  first_step_ = first_step;
}

namespace {

// Every number of a metrics record but its step, as TensorBoard scalars under `prefix`: the
// curves are the metrics file's figures, no more and no fewer.
TensorBoardValues scalars_of(const nlohmann::json& j, const std::string& prefix) {
  TensorBoardValues v;
  for (const auto& [key, value] : j.items())
    if (value.is_number() && key != "step") v.scalars.emplace_back(prefix + key, value.get<double>());
  return v;
}

// The rank whose memory high-water mark was highest this step, or -1 without the figures.
int busiest_rank(const StepRecord& r) {
  if (r.rank_mem_peak_mb.empty() || r.rank_mem_peak_mb.size() != r.rank_mem_predicted_mb.size()) return -1;
  return int(std::max_element(r.rank_mem_peak_mb.begin(), r.rank_mem_peak_mb.end()) - r.rank_mem_peak_mb.begin());
}

// The busiest rank's memory high-water mark this step and what the planner's model predicted
// for it; "" without the figures.
std::string memory_text(const StepRecord& r) {
  const int k = busiest_rank(r);
  if (k < 0) return "";
  return fmt::format(" | mem {:.0f} MB (predicted {:.0f}{})", r.rank_mem_peak_mb[size_t(k)],
                     r.rank_mem_predicted_mb[size_t(k)], r.rank_mem_peak_mb.size() > 1 ? fmt::format(", rank {}", k) : "");
}

}  // namespace

void RunReport::step(const StepRecord& rec) {
  if (!rank0_) return;
  const nlohmann::json j = rec;
  metrics_->write(j);
  if (tensorboard_) {
    TensorBoardValues v = scalars_of(j, "train/");
    // The step line's figures: the busiest rank's peak, and the prediction for that rank.
    if (const int k = busiest_rank(rec); k >= 0) {
      v.scalars.emplace_back("memory/peak_mb", rec.rank_mem_peak_mb[size_t(k)]);
      v.scalars.emplace_back("memory/predicted_mb", rec.rank_mem_predicted_mb[size_t(k)]);
    }
    v.histograms.emplace_back("plan/ring_degrees", rec.degrees);
    tensorboard_->write(rec.step, v);
  }
  if (rec.step % cfg_.log.every == 0 || rec.step == cfg_.train.steps || rec.step == 1) {
    bar_.clear();
    // The run's pace so far (this process's steps only: a resumed run's earlier steps are not
    // its own) for the steps left.
    const double run_s = std::chrono::duration<double>(Clock::now() - t_start_).count();
    const int64_t done = rec.step - first_step_, left = cfg_.train.steps - rec.step;
    const std::string eta = done > 0 && left > 0 ? " | eta " + duration_text(run_s / double(done) * double(left)) : "";
    spdlog::info("step {:>5}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {:.0f} tok/s | "
                 "{:.1f} samples/s | wait {:.0f} ms | {} groups, ring degrees {} | plan {:.1f} ms, "
                 "predicted {:.3f}s, measured {:.3f}s (cost model error {:.0f}%){} | {}{} | elapsed {}{}",
                 rec.step, cfg_.train.steps, rec.loss, rec.lr, rec.grad_norm, rec.tokens_per_s,
                 rec.samples_per_s, 1e3 * rec.loader_wait_s, rec.groups, fmt::join(rec.degrees, ","),
                 1e3 * rec.plan_s, rec.predicted_s, rec.measured_s, 100 * rec.cost_error,
                 rec.candidate.empty() ? "" : fmt::format(" | {}{}", rec.candidate, rec.rule.empty() ? "" : ": " + rec.rule),
                 fmt::format("MFU {:.1f}%{}", 100 * rec.mfu, rec.mfu_of_measured ? " of the measured GEMM rate" : ""),
                 memory_text(rec), duration_text(rec.elapsed_s), eta);
  }
  bar_.draw(rec.step, std::chrono::duration<double>(Clock::now() - t_start_).count(), rec.loss);
}

void RunReport::eval(int64_t step, const EvalResult& r, const EvalResult* blank) {
  bar_.clear();
  if (!rank0_) return;
  const nlohmann::json j = log_eval("val", step, r, blank);
  metrics_->write(j);
  if (tensorboard_) tensorboard_->write(step, scalars_of(j, "eval/val/"));
}

}  // namespace dhp
