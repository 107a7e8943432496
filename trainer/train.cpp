#include "trainer/train.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <filesystem>
#include <mutex>
#include <functional>
#include <future>
#include <memory>
#include <optional>

#include "core/check.h"
#include "core/log.h"
#include "data/dataset.h"
#include "data/sampler.h"
#include "data/tokenizer.h"
#include "kernels/backend.h"
#include "model/model.h"
#include "parallel/planner.h"
#include "trainer/checkpoint.h"
#include "trainer/evaluate.h"
#include "trainer/executor.h"
#include "trainer/limits.h"
#include "trainer/metrics.h"
#include "trainer/optimizer.h"
#include "trainer/run_lock.h"
#include "trainer/weights.h"

namespace dhp {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Everything a training run holds between steps. train() below is the loop over steps; the
// pieces it calls are the methods: plan, step (load, micro-steps, reduce, update), record,
// evaluate and save.
class Run {
 public:
  Run(const Config& cfg, Communicator& comm, const TrainOptions& topt);
  int64_t first_step() const { return first_step_; }
  std::shared_ptr<const Planner> planner() const {
    std::lock_guard lk(planner_mu_);
    return planner_;
  }
  // This rank's share of the global batch of `step`, decided from sample lengths alone. Every
  // rank must plan a step with the same planner (see train()).
  StepWork plan(int64_t step, const Planner& planner) const;
  void submit(const StepWork& work) { exec_.submit(work, false); }
  // One optimizer step over `work` (submitted earlier).
  StepRecord step(int64_t step, const StepWork& work);
  void record(const StepRecord& rec);
  // Measured group times against the plan's prediction, and the online refit.
  void learn_costs(const StepWork& work, StepRecord& rec);
  // A resumed run plans with the coefficients and observations its checkpoint carries, when
  // they refine the same cost profile.
  void restore_costs(const std::string& saved);
  void evaluate(int64_t step, TrainResult* out);
  // The save a run ends with (last) must succeed; a periodic one that fails (a full disk)
  // warns, and training goes on to try again at the next interval.
  std::string save(int64_t step, bool last);
  void clear_bar() { bar_.clear(); }

 private:
  const Config& cfg_;
  Communicator& comm_;
  const bool rank0_;
  const Clock::time_point t_start_ = Clock::now();
  std::optional<RunLock> lock_;  // rank 0 holds the checkpoint folder for the run's lifetime
  std::unique_ptr<Backend> backend_;
  Tokenizer tokenizer_;
  std::unique_ptr<Dataset> train_set_, val_set_;
  Model model_;
  AdamW opt_;
  // The planner of the current cost model; replaced (never modified) by the online refit, so
  // a plan being made on the background thread keeps the one it started with.
  mutable std::mutex planner_mu_;
  std::shared_ptr<const Planner> planner_;
  std::deque<TimingObservation> observed_;  // the latest groups' measured times
  int64_t first_step_ = 0;
  std::optional<Sampler> sampler_;
  int64_t first_position_ = 0;  // stream position of the first sample of first_step_
  Executor exec_;
  std::optional<MetricsFile> metrics_;  // opened once the resumed step is known
  ProgressBar bar_;
  Clock::time_point t_train_;

  int64_t position_of(int64_t step) const {
    return first_position_ + (step - first_step_) * cfg_.train.batch_size;
  }
};

std::unique_ptr<Dataset> open_train_set(const Config& cfg, const Tokenizer& tok,
                                        const volatile int* stop) {
  DHP_CHECK(tok.vocab_size() <= cfg.model.vocab_size,
            "{}: model.vocab_size ({}) is smaller than the tokenizer's vocabulary ({} in {})",
            cfg.source, cfg.model.vocab_size, tok.vocab_size(), cfg.data.tokenizer);
  auto set = open_dataset(cfg.data.train, cfg.data, tok, cfg.model.vision, stop);
  DHP_CHECK(set->size() > 0, "data.train '{}' holds no usable sample", cfg.data.train);
  check_batch_fits(cfg, *set, available_memory_bytes());
  return set;
}

Run::Run(const Config& cfg, Communicator& comm, const TrainOptions& topt)
    : cfg_(cfg),
      comm_(comm),
      rank0_(comm.rank() == 0),
      lock_([&]() -> std::optional<RunLock> {
        if (rank0_) return std::optional<RunLock>(std::in_place, cfg.checkpoint.dir);
        return std::nullopt;
      }()),
      backend_(make_backend(cfg.train.device, backend_options(cfg))),
      tokenizer_(cfg.data.tokenizer),
      train_set_(open_train_set(cfg, tokenizer_, topt.stop_flag)),
      val_set_(cfg.data.val.empty() ? nullptr
                                    : open_dataset(cfg.data.val, cfg.data, tokenizer_,
                                                   cfg.model.vision, topt.stop_flag)),
      model_(cfg.model, *backend_),
      opt_(model_.table(), cfg.optim, *backend_,
           cfg.parallel.zero1 ? OptimizerShard{comm.rank(), comm.size()} : OptimizerShard{}),
      planner_(std::make_shared<const Planner>(cfg.model, cfg.parallel, comm.size())),
      exec_(model_, *train_set_, cfg.data.workers, comm),
      bar_(cfg.train.steps, rank0_ && cfg.log.progress) {
  comm.set_timeout(cfg.parallel.timeout_s);
  comm.follow(*backend_);
  if (cfg.parallel.overlap_grads && comm.size() > 1 && comm.overlapping_collectives())
    opt_.set_overlap(int64_t(cfg.parallel.bucket_mb * double(1 << 20)) / int64_t(sizeof(float)));
  model_.initialise(cfg.train.seed);
  std::optional<SamplerState> resumed_sampler;
  // `--resume auto` on a folder without a checkpoint yet starts afresh, so a job killed
  // before its first save is resubmitted with the same command.
  const bool resuming =
      !topt.resume.empty() &&
      (topt.resume != "auto" || !std::filesystem::is_directory(cfg.checkpoint.dir) ||
       !list_checkpoints(cfg.checkpoint.dir).empty());
  if (!topt.resume.empty() && !resuming && rank0_)
    spdlog::info("--resume auto: '{}' holds no checkpoint yet; starting a fresh run",
                 cfg.checkpoint.dir);
  if (resuming) {
    const std::string path = resolve_checkpoint(topt.resume, cfg.checkpoint.dir);
    check_same_model(checkpoint_config(path), cfg, path);
    TrainState st = load_checkpoint(path, model_, &opt_);
    check_tokenizer(path, st.tokenizer_hash, tokenizer_);
    DHP_CHECK(st.seed == cfg.train.seed,
              "cannot resume from '{}': it was trained with train.seed = {}, this run has {}; "
              "the weights and the sample order come from the seed",
              path, st.seed, cfg.train.seed);
    DHP_CHECK(st.dataset_size == train_set_->size(),
              "cannot resume from '{}': its run sampled from {} training samples, data.train "
              "'{}' now holds {}; the sample order would not continue",
              path, st.dataset_size, cfg.data.train, train_set_->size());
    resumed_sampler = st.sampler;
    if (st.batch_size != cfg.train.batch_size && rank0_)
      spdlog::info("train.batch_size changes from {} to {}; the sample stream continues where "
                   "it stopped", st.batch_size, cfg.train.batch_size);
    first_step_ = st.step;
    restore_costs(st.cost_state);
    DHP_CHECK(topt.stop_after < 0 || topt.stop_after > first_step_,
              "--stop-after {} is not after step {}, where this run resumes", topt.stop_after,
              first_step_);
    if (rank0_) spdlog::info("resumed from {} at step {}", path, first_step_);
  } else {
    const auto existing = list_checkpoints(cfg.checkpoint.dir);
    DHP_CHECK(existing.empty(),
              "checkpoint.dir '{}' already holds checkpoints of another run (newest: {}); "
              "continue that run with --resume auto, or set checkpoint.dir to a new folder",
              cfg.checkpoint.dir, existing.back());
  }
  if (!resuming && !topt.init.empty()) {
    load_weights(topt.init, model_);
    if (rank0_) spdlog::info("initialised weights from {}", topt.init);
  }
  // The metrics file keeps what the interrupted run wrote up to the resumed step.
  metrics_.emplace(cfg.log.metrics, rank0_, first_step_);
  sampler_.emplace(train_set_->size(), cfg.train.seed);
  first_position_ = resumed_sampler ? sampler_->resume(*resumed_sampler) : 0;
  if (rank0_) {
    const double mib = double(1 << 20), full = 2.0 * 4.0 * double(model_.n_params()) / mib;
    spdlog::info("optimizer state: {:.2f} MiB per rank{}", double(opt_.state_bytes()) / mib,
                 opt_.sharded() ? fmt::format(" (ZeRO-1 over {} ranks; {:.2f} MiB unsharded)",
                                              comm.size(), full)
                                : "");
    if (comm.size() > 1)
      spdlog::info("gradients: {}", opt_.overlaps()
                                        ? fmt::format("summed in {} buckets of ~{} MiB while backward runs",
                                                      opt_.buckets(), cfg.parallel.bucket_mb)
                                        : fmt::format("summed after backward ({})",
                                                      cfg.parallel.overlap_grads
                                                          ? comm.name() + " cannot overlap collectives"
                                                          : "parallel.overlap_grads = false"));
  }
  if (rank0_)
    spdlog::info("model: {:.3f} M parameters; train: {} samples; val: {} samples; {} rank(s); "
                 "{} backend, {} storage, {} compute thread(s)",
                 double(model_.n_params()) / 1e6, train_set_->size(),
                 val_set_ ? val_set_->size() : 0, comm.size(), backend_->name(),
                 dtype_name(backend_->ops().dtype()), backend_->threads());
  t_train_ = Clock::now();
}

StepWork Run::plan(int64_t step, const Planner& planner) const {
  const std::vector<int64_t> ids = sampler_->batch_at(position_of(step), cfg_.train.batch_size);
  return plan_step(planner, *train_set_, ids, comm_.rank());
}

// The plan's schedule replayed with measured group times: each rank runs its groups in start
// order (the plan's order) and a group starts when the last of its ranks is free.
double rebuilt_makespan(const Plan& plan, const std::vector<double>& seconds) {
  std::vector<PlanGroup> groups = plan.groups();
  for (size_t g = 0; g < groups.size(); ++g) groups[g].time_ns = int64_t(seconds[g] * 1e9 + 0.5);
  std::stable_sort(groups.begin(), groups.end(),
                   [](const PlanGroup& x, const PlanGroup& y) { return x.start_ns < y.start_ns; });
  return double(retime_asap(groups, plan.world())) * 1e-9;
}

void Run::learn_costs(const StepWork& work, StepRecord& rec) {
  // Every group's time is its slowest member's busy time; the same numbers reach every rank,
  // so every rank refits to the same coefficients and keeps planning identically.
  const auto& groups = work.plan.groups();
  std::vector<double> measured(groups.size(), 0.0);
  for (const GroupTiming& t : exec_.last_timings()) measured[size_t(t.group)] = t.busy_seconds;
  comm_.all_reduce_max(measured.data(), int64_t(measured.size()));
  double err = 0.0;
  int counted = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (measured[g] <= 0.0) continue;
    err += std::abs(double(groups[g].time_ns) * 1e-9 - measured[g]) / measured[g];
    ++counted;
    TimingObservation o;
    for (int32_t s : groups[g].seqs) o.seqs.push_back(work.plan.seqs()[size_t(s)]);
    o.degree = groups[g].cp;
    // Priced at inter-node bandwidth when its ring spans nodes, as the plan priced it.
    const int rpn = std::max(1, cfg_.parallel.ranks_per_node);
    o.inter = groups[g].cp > rpn || groups[g].first_rank / rpn != (groups[g].first_rank + groups[g].cp - 1) / rpn;
    o.seconds = measured[g];
    observed_.push_back(std::move(o));
  }
  rec.cost_error = counted ? err / counted : 0.0;
  rec.measured_s = rebuilt_makespan(work.plan, measured);
  while (int(observed_.size()) > cfg_.parallel.refit_window) observed_.pop_front();
  if (!cfg_.parallel.refit || observed_.empty()) return;
  const std::shared_ptr<const Planner> cur = planner();
  CostModel cost = cur->cost();
  cost.set_coeffs(refit(cost, {observed_.begin(), observed_.end()}));
  auto next = std::make_shared<const Planner>(cost, cfg_.parallel, comm_.size());
  std::lock_guard lk(planner_mu_);
  planner_ = std::move(next);
}

void Run::restore_costs(const std::string& saved) {
  if (!cfg_.parallel.refit) return;
  if (saved.empty()) {
    if (rank0_) spdlog::info("cost model: the checkpoint carries no refit; starting from the '{}' profile",
                             cfg_.parallel.cost_profile);
    return;
  }
  const nlohmann::json j = nlohmann::json::parse(saved, nullptr, false);
  DHP_CHECK(!j.is_discarded(), "the checkpoint's /cost_model is not JSON (damaged checkpoint)");
  CostState st = CostState::from_json(j);
  if (st.device != cfg_.parallel.cost_profile) {
    if (rank0_) spdlog::info("cost model: the checkpoint's refit is for parallel.cost_profile = '{}', this run "
                             "uses '{}'; starting from its profile", st.device, cfg_.parallel.cost_profile);
    return;
  }
  CostModel cost = planner()->cost();
  cost.set_coeffs(st.coeffs);
  while (int(st.window.size()) > cfg_.parallel.refit_window) st.window.erase(st.window.begin());
  observed_.assign(st.window.begin(), st.window.end());
  {
    std::lock_guard lk(planner_mu_);
    planner_ = std::make_shared<const Planner>(cost, cfg_.parallel, comm_.size());
  }
  if (rank0_) spdlog::info("cost model: refitted coefficients and {} observed groups restored",
                           observed_.size());
}

StepRecord Run::step(int64_t step, const StepWork& work) {
  const auto t_step = Clock::now();
  model_.zero_grads();
  const float scale = 1.0f / float(std::max<int64_t>(1, work.loss_tokens));
  GradsFinal final;
  if (opt_.overlaps()) {
    opt_.begin_overlap(model_.grads(), comm_);
    final = [this](int64_t offset) { opt_.grads_final_from(offset); };
  }
  const StepStats local = exec_.run(work, scale, true, {}, final);
  // Gradients summed over the ranks (reduce-scattered to each rank's block under ZeRO-1).
  // First: the buckets already in flight must meet every rank's same collectives in the
  // same order, so no other collective may come between.
  const double norm = opt_.reduce(model_.grads(), comm_);
  // Every rank's busy time, to show how unevenly the step's work was spread.
  double mine = 0.0, waited = 0.0;
  for (const GroupTiming& t : exec_.last_timings()) mine += t.busy_seconds, waited += t.wait_seconds;
  std::vector<double> rank_time(size_t(comm_.size()), 0.0);
  comm_.all_gather(&mine, rank_time.data(), 1, DataType::F64);
  double sums[2] = {local.loss_sum, double(local.targets)};  // loss, targets
  comm_.all_reduce_sum(sums, 2);
  const double loss_sum = sums[0];
  DHP_CHECK(sums[1] > 0, "step {}: none of its {} samples could be used (all were skipped as "
            "bad data: see the warnings above); fix the data or set data.on_error = \"fail\" "
            "to stop at the first bad sample", step + 1, work.samples);

  DHP_CHECK(std::isfinite(norm), "step {}: the gradient norm is not finite ({}); lower optim.lr",
            step, norm);
  const double lr = learning_rate(cfg_.optim, step, cfg_.train.steps);
  opt_.apply(model_.params(), model_.grads(), lr, norm, comm_);
  const int threads = backend_->threads();
  backend_->adapt_to_load();

  const double dt = seconds_since(t_step);
  const double slowest = *std::max_element(rank_time.begin(), rank_time.end());
  double mean = 0.0;
  for (double t : rank_time) mean += t / double(rank_time.size());
  StepRecord rec;
  rec.step = step + 1;
  rec.loss = loss_sum * scale;
  rec.lr = lr;
  rec.grad_norm = norm;
  rec.tokens_per_s = double(work.tokens) / dt;
  rec.samples_per_s = double(work.samples) / dt;
  rec.elapsed_s = seconds_since(t_start_);
  rec.loader_wait_s = exec_.last_wait_seconds();
  rec.groups = int64_t(work.plan.groups().size());
  for (const auto& g : work.plan.groups()) rec.degrees.push_back(g.cp);
  std::sort(rec.degrees.begin(), rec.degrees.end(), std::greater<>());
  rec.max_degree = rec.degrees.empty() ? 1 : rec.degrees.front();
  rec.plan_s = work.plan_seconds;
  rec.predicted_s = double(work.plan.makespan_ns()) * 1e-9;
  rec.busy_s = mine;
  rec.rank_busy_s = rank_time;
  rec.ring_wait_s = waited;
  learn_costs(work, rec);
  rec.step_s = dt;
  rec.imbalance = mean > 0.0 ? slowest / mean : 1.0;
  rec.threads = threads;
  return rec;
}

void Run::record(const StepRecord& rec) {
  if (!rank0_) return;
  metrics_->write({{"step", rec.step}, {"loss", rec.loss}, {"lr", rec.lr},
                  {"grad_norm", rec.grad_norm}, {"tokens_per_s", rec.tokens_per_s},
                  {"samples_per_s", rec.samples_per_s}, {"elapsed_s", rec.elapsed_s},
                  {"loader_wait_s", rec.loader_wait_s}, {"groups", rec.groups},
                  {"max_degree", rec.max_degree}, {"degrees", rec.degrees},
                  {"plan_s", rec.plan_s},
                  {"predicted_s", rec.predicted_s}, {"measured_s", rec.measured_s},
                  {"cost_error", rec.cost_error}, {"rank_busy_s", rec.rank_busy_s},
                  {"ring_wait_s", rec.ring_wait_s},
                  {"step_s", rec.step_s}, {"imbalance", rec.imbalance},
                  {"threads", rec.threads}});
  if (rec.step % cfg_.log.every == 0 || rec.step == cfg_.train.steps || rec.step == 1) {
    bar_.clear();
    spdlog::info("step {:>5}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {:.0f} tok/s | "
                 "{:.1f} samples/s | wait {:.0f} ms | {} groups, degrees {} | plan {:.1f} ms, "
                 "predicted {:.3f}s, measured {:.3f}s (cost model error {:.0f}%) | {:.1f}s",
                 rec.step, cfg_.train.steps, rec.loss, rec.lr, rec.grad_norm, rec.tokens_per_s,
                 rec.samples_per_s, 1e3 * rec.loader_wait_s, rec.groups, fmt::join(rec.degrees, ","),
                 1e3 * rec.plan_s, rec.predicted_s, rec.measured_s, 100 * rec.cost_error,
                 rec.elapsed_s);
  }
  bar_.draw(rec.step, seconds_since(t_train_), rec.loss);
}

void Run::evaluate(int64_t step, TrainResult* out) {
  if (!val_set_ || val_set_->size() == 0) return;
  EvalOptions o{cfg_.train.batch_size, cfg_.eval.max_samples, false, cfg_.data.workers};
  o.exact_match = out && cfg_.eval.exact_match;  // generation only at the final evaluation
  const std::shared_ptr<const Planner> planner = this->planner();
  const EvalResult r = dhp::evaluate(model_, *val_set_, o, comm_, *planner);
  EvalResult b;
  if (cfg_.eval.blank_images) {
    EvalOptions ob = o;
    ob.blank_images = true;
    b = dhp::evaluate(model_, *val_set_, ob, comm_, *planner);
  }
  bar_.clear();
  if (rank0_) log_eval("val", step, r, cfg_.eval.blank_images ? &b : nullptr, *metrics_);
  if (!out) return;
  out->final_loss = r.loss;
  out->final_accuracy = r.accuracy;
  out->final_blank_accuracy = cfg_.eval.blank_images ? b.accuracy : -1.0;
  out->final_exact_match = r.exact_match;
  out->final_blank_exact_match = cfg_.eval.blank_images ? b.exact_match : -1.0;
}

std::string Run::save(int64_t step, bool last) {
  TrainState st{step, cfg_.train.seed, cfg_.train.batch_size,
                sampler_->state_at(position_of(step)), train_set_->size(), tokenizer_.hash(), ""};
  if (cfg_.parallel.refit)
    st.cost_state = CostState{cfg_.parallel.cost_profile, planner()->cost().coeffs(),
                              {observed_.begin(), observed_.end()}}.to_json().dump();
  std::string path;
  opt_.gather_moments(comm_);  // a checkpoint holds the full state, whatever the sharding
  if (rank0_) {
    bar_.clear();
    try {
      path = save_checkpoint(cfg_, model_, &opt_, st);
      spdlog::info("checkpoint saved: {}", path);
    } catch (const Error& e) {
      if (last) throw;
      spdlog::warn("{}; training goes on and saves again at the next interval", e.what());
    }
  }
  comm_.barrier();
  return path;
}

}  // namespace

TrainResult train(const Config& cfg, Communicator& comm, const TrainOptions& topt) {
  const auto t_start = Clock::now();
  const bool rank0 = comm.rank() == 0;
  Run run(cfg, comm, topt);
  const int64_t first = run.first_step();
  TrainResult result;
  result.last_step = first;

  // The plan of step s+1 is made, and its samples start decoding, on a background thread
  // while step s computes.
  auto plan_ahead = [&](int64_t step) {
    // The planner is taken here, on the training thread, between the same two steps on every
    // rank: a refit that lands while the plan is being made does not change this plan.
    return std::async(std::launch::async, [&run, step, planner = run.planner()] {
      StepWork w = run.plan(step, *planner);
      run.submit(w);
      return w;
    });
  };
  std::future<StepWork> next;
  if (first < cfg.train.steps) next = plan_ahead(first);
  for (int64_t step = first; step < cfg.train.steps; ++step) {
    const StepWork cur = next.get();
    if (step + 1 < cfg.train.steps) next = plan_ahead(step + 1);
    const StepRecord rec = run.step(step, cur);
    result.steps.push_back(rec);
    result.last_step = rec.step;
    run.record(rec);

    if (cfg.eval.every > 0 && rec.step % cfg.eval.every == 0 && rec.step < cfg.train.steps)
      run.evaluate(rec.step, nullptr);
    // A signal reaches the ranks at slightly different moments: they agree to stop after the
    // same step, so that all of them take part in the one checkpoint.
    int32_t stop = topt.stop_flag && *topt.stop_flag ? 1 : 0;
    comm.all_reduce_max(&stop, 1);
    const bool interrupted = stop != 0;
    if (interrupted || rec.step == topt.stop_after) {
      result.checkpoint = run.save(rec.step, true);
      if (rank0)
        spdlog::info("stopping after step {}{}; resume with --resume auto", rec.step,
                     interrupted ? " (signal)" : "");
      return result;
    }
    if (cfg.checkpoint.every > 0 && rec.step % cfg.checkpoint.every == 0 &&
        rec.step < cfg.train.steps) {
      const std::string saved = run.save(rec.step, false);
      if (!saved.empty()) result.checkpoint = saved;
    }
  }
  run.clear_bar();
  if (result.last_step > first || first == 0) result.checkpoint = run.save(result.last_step, true);
  run.evaluate(result.last_step, &result);
  if (rank0) spdlog::info("done in {:.1f}s", seconds_since(t_start));
  return result;
}

}  // namespace dhp
