#include "trainer/train.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>

#include "data/dataset.h"
#include "data/loader.h"
#include "data/pack.h"
#include "data/sampler.h"
#include "data/tokenizer.h"
#include "kernels/check.h"
#include "kernels/log.h"
#include "model/model.h"
#include "trainer/checkpoint.h"
#include "trainer/limits.h"
#include "trainer/run_lock.h"
#include "trainer/evaluate.h"
#include "trainer/weights.h"
#include "trainer/optimizer.h"

namespace dhp {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// One line that redraws itself on a terminal; silent when stderr is not one.
class ProgressBar {
 public:
  ProgressBar(int64_t total, bool enabled) : total_(total), on_(enabled && isatty(STDERR_FILENO)) {}
  void draw(int64_t done, double elapsed, double loss) {
    if (!on_) return;
    const int width = 30;
    const int fill = int(width * done / std::max<int64_t>(1, total_));
    const double eta = done > 0 ? elapsed / done * (total_ - done) : 0.0;
    fmt::print(stderr, "\r[{:=<{}}{:<{}}] {}/{} loss {:.3f} eta {:.0f}s\033[K", "", fill, "",
               width - fill, done, total_, loss, eta);
    std::fflush(stderr);
    drawn_ = true;
  }
  // Clears the bar so a log line can take the row.
  void clear() {
    if (on_ && drawn_) fmt::print(stderr, "\r\033[K");
    drawn_ = false;
  }

 private:
  int64_t total_;
  bool on_;
  bool drawn_ = false;
};

class MetricsFile {
 public:
  // A resumed run keeps the records up to the step it resumes from and drops the ones the
  // interrupted run wrote after its checkpoint, which this run writes again.
  MetricsFile(const std::string& path, bool enabled, int64_t resumed_step) {
    if (!enabled || path.empty()) return;
    auto parent = std::filesystem::path(path).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    DHP_CHECK(!ec, "log.metrics: cannot create the folder of '{}': {}", path, ec.message());
    std::string kept;
    if (resumed_step > 0) {
      std::ifstream in(path);
      for (std::string line; std::getline(in, line);) {
        const auto j = nlohmann::json::parse(line, nullptr, false);
        if (!j.is_discarded() && j.value("step", int64_t(0)) <= resumed_step) kept += line + "\n";
      }
    }
    out_.open(path, std::ios::trunc);
    DHP_CHECK(out_.good(), "log.metrics: cannot write '{}': {}", path, std::strerror(errno));
    out_ << kept;
    path_ = path;
  }
  // A failed write is reported once and ends the file; training goes on without it.
  void write(const nlohmann::json& j) {
    if (!out_.is_open()) return;
    out_ << j.dump() << '\n';
    out_.flush();
    if (out_.good()) return;
    spdlog::warn("log.metrics: writing '{}' failed ({}); no more metrics are recorded in it",
                 path_, std::strerror(errno));
    out_.close();
  }

 private:
  std::ofstream out_;
  std::string path_;
};

void log_eval(const char* what, int64_t step, const EvalResult& r, const EvalResult* blank,
              MetricsFile& metrics) {
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
  metrics.write(j);
}

}  // namespace

TrainResult train(const Config& cfg, const Comm& comm, const TrainOptions& topt) {
  const auto t_start = Clock::now();
  const bool rank0 = comm.rank() == 0;
  auto ops = make_cpu_ops(compute_threads(cfg));
  DHP_CHECK(cfg.train.device == "cpu",
            "train.device = \"{}\": this build trains on the CPU backend only; set train.device "
            "= \"cpu\"",
            cfg.train.device);
  std::optional<RunLock> lock;  // the checkpoint folder is this run's until it returns
  if (rank0) lock.emplace(cfg.checkpoint.dir);

  Tokenizer tokenizer(cfg.data.tokenizer);
  DHP_CHECK(tokenizer.vocab_size() <= cfg.model.vocab_size,
            "{}: model.vocab_size ({}) is smaller than the tokenizer's vocabulary ({} in {})",
            cfg.source, cfg.model.vocab_size, tokenizer.vocab_size(), cfg.data.tokenizer);
  const std::unique_ptr<Dataset> train_data = open_dataset(cfg.data.train, cfg.data, tokenizer, cfg.model);
  const Dataset& train_set = *train_data;
  DHP_CHECK(train_set.size() > 0, "data.train '{}' holds no usable sample", cfg.data.train);
  check_batch_fits(cfg, train_set, available_memory_bytes());
  std::unique_ptr<Dataset> val_set;
  if (!cfg.data.val.empty())
    val_set = open_dataset(cfg.data.val, cfg.data, tokenizer, cfg.model);

  Model model(cfg.model, *ops);
  model.initialise(cfg.train.seed);
  AdamW opt(model.table(), cfg.optim, *ops);
  int64_t first_step = 0;
  std::optional<SamplerState> resumed_sampler;
  if (!topt.resume.empty()) {
    const std::string path = resolve_checkpoint(topt.resume, cfg.checkpoint.dir);
    check_same_model(checkpoint_config(path), cfg, path);
    TrainState st = load_checkpoint(path, model, &opt);
    check_tokenizer(path, st.tokenizer_hash, tokenizer);
    DHP_CHECK(st.seed == cfg.train.seed,
              "cannot resume from '{}': it was trained with train.seed = {}, this run has {}; "
              "the weights and the sample order come from the seed",
              path, st.seed, cfg.train.seed);
    DHP_CHECK(st.dataset_size == train_set.size(),
              "cannot resume from '{}': its run sampled from {} training samples, data.train "
              "'{}' now holds {}; the sample order would not continue",
              path, st.dataset_size, cfg.data.train, train_set.size());
    resumed_sampler = st.sampler;
    if (st.batch_size != cfg.train.batch_size && rank0)
      spdlog::info("train.batch_size changes from {} to {}; the sample stream continues where "
                   "it stopped", st.batch_size, cfg.train.batch_size);
    first_step = st.step;
    DHP_CHECK(topt.stop_after < 0 || topt.stop_after > first_step,
              "--stop-after {} is not after step {}, where this run resumes", topt.stop_after,
              first_step);
    if (rank0) spdlog::info("resumed from {} at step {}", path, first_step);
  } else {
    const auto existing = list_checkpoints(cfg.checkpoint.dir);
    DHP_CHECK(existing.empty(),
              "checkpoint.dir '{}' already holds checkpoints of another run (newest: {}); "
              "continue that run with --resume auto, or set checkpoint.dir to a new folder",
              cfg.checkpoint.dir, existing.back());
  }
  if (topt.resume.empty() && !topt.init.empty()) {
    load_weights(topt.init, model);
    if (rank0) spdlog::info("initialised weights from {}", topt.init);
  }
  Sampler sampler(train_set.size(), cfg.train.seed);
  // Stream position of the first sample of step `first_step`; later steps follow on.
  const int64_t first_position = resumed_sampler ? sampler.resume(*resumed_sampler) : 0;
  auto position_of = [&](int64_t step) {
    return first_position + (step - first_step) * cfg.train.batch_size;
  };
  BatchLoader loader(train_set, cfg.data.workers);
  if (rank0)
    spdlog::info("model: {:.3f} M parameters; train: {} samples; val: {} samples; {} rank(s)",
                 double(model.n_params()) / 1e6, train_set.size(), val_set ? val_set->size() : 0,
                 comm.size());

  // Packs of a step are a function of the sampled lengths only, so every rank computes the
  // same split without communication and loads just its own packs.
  struct StepPlan {
    std::vector<std::vector<int64_t>> packs;  // dataset indices per pack
    std::vector<int64_t> my_ids;              // samples this rank loads, pack after pack
    int64_t loss_tokens = 0, tokens = 0, samples = 0;
  };
  auto plan_step = [&](int64_t step) {
    StepPlan p;
    const std::vector<int64_t> ids = sampler.batch_at(position_of(step), cfg.train.batch_size);
    std::vector<int64_t> lengths;
    for (int64_t id : ids) {
      lengths.push_back(train_set.length(id));
      p.loss_tokens += train_set.loss_tokens(id);
      p.tokens += lengths.back();
    }
    p.samples = int64_t(ids.size());
    for (const auto& positions : split_micro_batches(lengths, cfg.train.micro_tokens)) {
      std::vector<int64_t> pk;
      for (int64_t pos : positions) pk.push_back(ids[pos]);
      if (int(p.packs.size() % comm.size()) == comm.rank())
        p.my_ids.insert(p.my_ids.end(), pk.begin(), pk.end());
      p.packs.push_back(std::move(pk));
    }
    return p;
  };

  MetricsFile metrics(cfg.log.metrics, rank0, first_step);
  ProgressBar bar(cfg.train.steps, rank0 && cfg.log.progress);
  EvalOptions eval_opt{cfg.train.micro_tokens, cfg.eval.max_samples, false, cfg.data.workers};
  auto run_eval = [&](int64_t step, TrainResult* out) {
    if (!val_set || val_set->size() == 0) return;
    EvalOptions o = eval_opt;
    o.exact_match = out && cfg.eval.exact_match;  // generation only at the final evaluation
    EvalResult r = evaluate(model, *val_set, o, comm);
    EvalResult b;
    if (cfg.eval.blank_images) {
      EvalOptions ob = o;
      ob.blank_images = true;
      b = evaluate(model, *val_set, ob, comm);
    }
    bar.clear();
    if (rank0) log_eval("val", step, r, cfg.eval.blank_images ? &b : nullptr, metrics);
    if (out) {
      out->final_loss = r.loss;
      out->final_accuracy = r.accuracy;
      out->final_blank_accuracy = cfg.eval.blank_images ? b.accuracy : -1.0;
      out->final_exact_match = r.exact_match;
      out->final_blank_exact_match = cfg.eval.blank_images ? b.exact_match : -1.0;
    }
  };

  TrainResult result;
  result.last_step = first_step;
  // A periodic save that fails (a full disk) warns and training goes on to try again at the
  // next interval; the save a run ends with must succeed.
  auto save = [&](int64_t step, bool last) {
    TrainState st{step, cfg.train.seed, cfg.train.batch_size, sampler.state_at(position_of(step)),
                  train_set.size(), tokenizer.hash()};
    if (rank0) {
      bar.clear();
      try {
        result.checkpoint = save_checkpoint(cfg, model, &opt, st);
        spdlog::info("checkpoint saved: {}", result.checkpoint);
      } catch (const Error& e) {
        if (last) throw;
        spdlog::warn("{}; training goes on and saves again at the next interval", e.what());
      }
    }
    comm.barrier();
  };

  StepPlan next = plan_step(first_step);
  if (first_step < cfg.train.steps) loader.submit(next.my_ids, false);
  const auto t_train = Clock::now();
  for (int64_t step = first_step; step < cfg.train.steps; ++step) {
    const auto t_step = Clock::now();
    StepPlan cur = std::move(next);
    std::vector<Sample> samples = loader.next();
    double wait = loader.last_wait_seconds();
    // Decode the next step's samples in the background while this one computes.
    if (step + 1 < cfg.train.steps) {
      next = plan_step(step + 1);
      loader.submit(next.my_ids, false);
    }

    model.zero_grads();
    const float scale = 1.0f / float(std::max<int64_t>(1, cur.loss_tokens));
    double loss_sum = 0.0, targets = 0.0;
    size_t at = 0;
    const auto t_compute = Clock::now();
    for (size_t p = 0; p < cur.packs.size(); ++p) {
      if (int(p % comm.size()) != comm.rank()) continue;
      std::vector<const Sample*> ptrs;
      for (size_t k = 0; k < cur.packs[p].size(); ++k) ptrs.push_back(&samples[at++]);
      const StepStats st = model.step(pack(ptrs, cfg.model.vision), scale, true);
      loss_sum += st.loss_sum;
      targets += double(st.targets);
    }
    // Every rank's compute time, to show how unevenly the step's work was spread.
    std::vector<double> rank_time(comm.size(), 0.0);
    rank_time[comm.rank()] = seconds_since(t_compute);
    comm.allreduce_sum(rank_time.data(), int64_t(rank_time.size()));
    comm.allreduce_sum(model.grads(), model.n_params());
    comm.allreduce_sum(&loss_sum, 1);
    comm.allreduce_sum(&targets, 1);
    DHP_CHECK(targets > 0, "step {}: none of its {} samples could be used (all were skipped as "
              "bad data: see the warnings above); fix the data or set data.on_error = \"fail\" "
              "to stop at the first bad sample", step + 1, cur.samples);

    const double norm = opt.grad_norm(model.grads());
    DHP_CHECK(std::isfinite(norm), "step {}: the gradient norm is not finite ({}); lower optim.lr",
              step, norm);
    opt.clip(model.grads(), norm);
    const double lr = learning_rate(cfg.optim, step, cfg.train.steps);
    opt.update(model.params(), model.grads(), lr);

    const double dt = seconds_since(t_step);
    const double slowest = *std::max_element(rank_time.begin(), rank_time.end());
    double mean = 0.0;
    for (double t : rank_time) mean += t / double(rank_time.size());
    StepRecord rec{step + 1,
                   loss_sum * scale,
                   lr,
                   norm,
                   double(cur.tokens) / dt,
                   double(cur.samples) / dt,
                   seconds_since(t_start),
                   wait,
                   int64_t(cur.packs.size()),
                   dt,
                   mean > 0.0 ? slowest / mean : 1.0};
    result.steps.push_back(rec);
    if (rank0) {
      metrics.write({{"step", rec.step}, {"loss", rec.loss}, {"lr", rec.lr},
                     {"grad_norm", rec.grad_norm}, {"tokens_per_s", rec.tokens_per_s},
                     {"samples_per_s", rec.samples_per_s}, {"elapsed_s", rec.elapsed_s},
                     {"loader_wait_s", rec.loader_wait_s}, {"packs", rec.packs},
                     {"step_s", rec.step_s}, {"imbalance", rec.imbalance}});
      if (rec.step % cfg.log.every == 0 || rec.step == cfg.train.steps || rec.step == 1) {
        bar.clear();
        spdlog::info("step {:>5}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {:.0f} tok/s | "
                     "{:.1f} samples/s | wait {:.0f} ms | {:.1f}s",
                     rec.step, cfg.train.steps, rec.loss, rec.lr, rec.grad_norm, rec.tokens_per_s,
                     rec.samples_per_s, 1e3 * rec.loader_wait_s, rec.elapsed_s);
      }
      bar.draw(rec.step, seconds_since(t_train), rec.loss);
    }
    result.last_step = rec.step;
    if (cfg.eval.every > 0 && rec.step % cfg.eval.every == 0 && rec.step < cfg.train.steps)
      run_eval(rec.step, nullptr);
    const bool interrupted = topt.stop_flag && *topt.stop_flag;
    if (interrupted || rec.step == topt.stop_after) {
      save(rec.step, true);
      if (rank0)
        spdlog::info("stopping after step {}{}; resume with --resume auto", rec.step,
                     interrupted ? " (signal)" : "");
      return result;
    }
    if (cfg.checkpoint.every > 0 && rec.step % cfg.checkpoint.every == 0 &&
        rec.step < cfg.train.steps)
      save(rec.step, false);
  }
  bar.clear();
  if (result.last_step > first_step || first_step == 0) save(result.last_step, true);
  run_eval(result.last_step, &result);
  if (rank0) spdlog::info("done in {:.1f}s", seconds_since(t_start));
  return result;
}

}  // namespace dhp
