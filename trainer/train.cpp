#include "trainer/train.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <future>
#include <memory>
#include <optional>

#include "core/check.h"
#include "core/log.h"
#include "data/dataset.h"
#include "data/manifest.h"
#include "data/sampler.h"
#include "data/tokenizer.h"
#include "kernels/backend.h"
#include "model/model.h"
#include "parallel/placement.h"
#include "parallel/planner.h"
#include "trainer/agreement.h"
#include "trainer/checkpoint.h"
#include "trainer/evaluate.h"
#include "trainer/executor.h"
#include "trainer/hf_checkpoint.h"
#include "trainer/layer_gather.h"
#include "trainer/limits.h"
#include "trainer/metrics.h"
#include "trainer/online_planner.h"
#include "trainer/optimizer.h"
#include "trainer/weights.h"

namespace dhp {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Everything a training run holds between steps. train() below is the loop over steps; the
// pieces it calls are the methods: plan_ahead, step (load, micro-steps, reduce, update),
// record, evaluate and save. Checkpoints, the refitted planner and the reports are members
// with jobs of their own (CheckpointManager, OnlinePlanner, RunReport).
class Run {
 public:
  Run(const Config& cfg, Communicator& comm, const TrainOptions& topt);
  int64_t first_step() const { return first_step_; }
  // Plans `step` and starts decoding this rank's samples of it on a background thread, so that
  // both overlap the step before it. Call it on the training thread, between the same two
  // steps on every rank: the plan uses the planner of that moment on every rank, whatever
  // refit lands while it is being made.
  std::future<StepWork> plan_ahead(int64_t step);
  // One optimizer step over `work` (submitted earlier).
  StepRecord step(int64_t step, const StepWork& work);
  void record(const StepRecord& rec) { report_.step(rec); }
  void evaluate(int64_t step, TrainResult* out);
  bool periodic_save(int64_t step) const { return checkpoints_.periodic(step); }
  std::string poll_save() { return checkpoints_.poll(); }
  int64_t saved_step() const { return checkpoints_.saved_step(); }
  // The save a run ends with (last) must succeed (CheckpointManager::save).
  std::string save(int64_t step, bool last);
  // After an error that stopped the run with `done` the last completed step and `saved` the
  // step the newest checkpoint holds: the state of `done` saved first where one rank can save
  // it alone, and the message saying what was kept.
  std::string rescue(int64_t done, int64_t saved, const std::string& what);
  void clear_bar() { report_.clear(); }

 private:
  // Loads the checkpoint at `path` and checks that this run continues it; returns where its
  // sample stream stopped.
  SamplerState resume(const std::string& path, const TrainOptions& topt);
  // resume() from the first of `paths` whose contents load: a damaged checkpoint (a checksum)
  // is passed over with a warning for the one before it.
  SamplerState resume_newest(const std::vector<std::string>& paths, const TrainOptions& topt);
  void log_setup() const;
  // This rank's share of the global batch of `step`, decided from sample lengths alone.
  StepWork plan(int64_t step, const Planner& planner) const;
  // Forward and backward over this rank's groups of `work`.
  StepStats compute(const StepWork& work, float loss_scale);
  // Every rank's busy time and this rank's ring waits: how unevenly the work was spread.
  void record_busy(StepRecord& rec);
  void record_memory(const StepWork& work, StepRecord& rec);
  ArenaBytes arenas_high_;  // the memory model's arenas for the groups run so far
  // The step's loss summed over the ranks, unscaled.
  double global_loss(const StepStats& local, int64_t step, const StepWork& work);

  const Config& cfg_;
  Communicator& comm_;
  const bool rank0_;
  const Clock::time_point t_start_ = Clock::now();
  CheckpointManager checkpoints_;
  std::unique_ptr<Backend> backend_;
  Tokenizer tokenizer_;
  std::unique_ptr<Dataset> train_set_, val_set_;
  Model model_;
  AdamW opt_;
  std::optional<GradReducer> sums_;  // ZeRO-2 and 3
  std::optional<LayerGather> gather_;  // ZeRO-3
  OnlinePlanner planner_;
  int64_t first_step_ = 0;
  std::optional<Sampler> sampler_;
  int64_t first_position_ = 0;  // stream position of the first sample of first_step_
  std::string start_from_;      // where the starting weights came from, for messages
  Executor exec_;
  RunReport report_;

  int64_t position_of(int64_t step) const {
    return first_position_ + (step - first_step_) * cfg_.train.batch_size;
  }
};

// A data set that lost more than data.max_skipped of its records when opened stops the run.
// Samples over data.max_tokens are the user's limit, not bad data: left out of the share.
void check_skipped(const Dataset& set, const char* key, const std::string& path, double max_share) {
  std::map<std::string, int64_t> bad;
  int64_t all = set.size(), skipped = 0;
  for (const auto& [why, n] : set.skipped()) {
    all += n;
    if (why == kTooLong) continue;
    bad[why] = n;
    skipped += n;
  }
  DHP_CHECK(double(skipped) <= max_share * double(all),
            "{} '{}': {} of its {} records were skipped ({:.1f}%, more than data.max_skipped = {:.1f}%): {}. The "
            "warnings above name the first lines; fix the data (an image folder: data.image_root) or raise "
            "data.max_skipped", key, path, skipped, all, 100.0 * double(skipped) / double(std::max<int64_t>(all, 1)),
            100.0 * max_share, format_counts(bad));
}

std::unique_ptr<Dataset> open_train_set(const Config& cfg, const Tokenizer& tok,
                                        const volatile int* stop) {
  DHP_CHECK(tok.vocab_size() <= cfg.model.vocab_size,
            "{}: model.vocab_size ({}) is smaller than the tokenizer's vocabulary ({} in {})",
            cfg.source, cfg.model.vocab_size, tok.vocab_size(), cfg.data.tokenizer);
  auto set = open_dataset(cfg.data.train, cfg.data, tok, data_geometry(cfg.model.vision), stop);
  DHP_CHECK(set->size() > 0, "data.train '{}' holds no usable sample", cfg.data.train);
  check_skipped(*set, "data.train", cfg.data.train, cfg.data.max_skipped);
  check_batch_fits(cfg, *set, available_memory_bytes());
  return set;
}

std::unique_ptr<Dataset> open_val_set(const Config& cfg, const Tokenizer& tok, const volatile int* stop) {
  if (cfg.data.val.empty()) return nullptr;
  auto set = open_dataset(cfg.data.val, cfg.data, tok, data_geometry(cfg.model.vision), stop);
  check_skipped(*set, "data.val", cfg.data.val, cfg.data.max_skipped);
  return set;
}

// The part of the optimizer state (and, in bf16, of the master weights) this rank holds.
OptimizerShard optimizer_shard(const Config& cfg, const Communicator& comm) {
  return cfg.parallel.shards_optimizer() ? OptimizerShard{comm.rank(), comm.size()} : OptimizerShard{};
}

Run::Run(const Config& cfg, Communicator& comm, const TrainOptions& topt)
    : cfg_(cfg),
      comm_(comm),
      rank0_(comm.rank() == 0),
      checkpoints_(cfg, comm),
      backend_(make_backend(cfg.train.device, backend_options(cfg))),
      tokenizer_(cfg.data.tokenizer, cfg.data.added_tokens),
      train_set_(open_train_set(cfg, tokenizer_, topt.stop_flag)),
      val_set_(open_val_set(cfg, tokenizer_, topt.stop_flag)),
      model_(cfg.model, *backend_, cfg.optim.groups, optimizer_shard(cfg, comm), cfg.parallel.shards_gradients(comm.size()),
             cfg.parallel.shards_weights(comm.size())),
      opt_(model_.table(), cfg.optim, *backend_, optimizer_shard(cfg, comm)),
      planner_(cfg, comm),
      exec_(model_, *train_set_, cfg.data.workers, comm),
      report_(cfg, rank0_) {
  comm.set_timeout(cfg.parallel.timeout_s);
  comm.follow(*backend_);
  if (cfg.parallel.shards_gradients(comm.size()))
    sums_.emplace(model_, optimizer_shard(cfg, comm), comm);
  else if (cfg.parallel.overlap_grads && comm.size() > 1 && comm.overlapping_collectives())
    opt_.set_overlap(int64_t(cfg.parallel.bucket_mb * double(1 << 20)) / int64_t(sizeof(float)));
  if (model_.weight_window().windowed()) gather_.emplace(model_, comm);
  model_.set_recompute(cfg.parallel.recompute);
  model_.initialise(cfg.train.seed);
  std::optional<SamplerState> resumed_sampler;
  const std::vector<std::string> candidates = checkpoints_.resume_candidates(topt.resume);
  if (!candidates.empty()) {
    resumed_sampler = resume_newest(candidates, topt);
  } else if (!cfg.model.init.empty() || !cfg.model.vision.init.empty()) {
    DHP_CHECK(topt.init.empty(), "--init {} and model.init {} both name weights to start from",
              topt.init, cfg.model.init.empty() ? cfg.model.vision.init : cfg.model.init);
    const HfImport r = import_hf_checkpoint(cfg.model.init, model_, rank0_);
    if (rank0_) log_hf_import(r, cfg.model);
    start_from_ = fmt::format("model.init '{}'{}", cfg.model.init,
                              cfg.model.vision.init.empty() ? "" : " and model.vision.init '" + cfg.model.vision.init + "'");
  } else if (!topt.init.empty()) {
    load_weights(topt.init, model_);
    if (rank0_) spdlog::info("initialised weights from {}", topt.init);
    start_from_ = fmt::format("--init '{}'", topt.init);
  }
  // What each rank read besides the configuration's files: a node with a stale copy of an image
  // folder or of a checkpoint would train on something else to the end, under the same names.
  check_terms_agree({{"data.train (its images and clips)", train_set_->contents_fingerprint()},
                     {"data.val (its images and clips)", val_set_ ? val_set_->contents_fingerprint() : "none"},
                     {"the starting weights (seeded, --init, model.init or the checkpoint resumed)",
                      weights_fingerprint(model_)}},
                    comm_, "what it read");
  report_.start(first_step_);
  sampler_.emplace(train_set_->size(), cfg.train.seed);
  first_position_ = resumed_sampler ? sampler_->resume(*resumed_sampler) : 0;
  log_setup();
}

// What load_checkpoint found wrong with a file's contents, as opposed to a run that does not
// continue it (another model, seed or data), which no older checkpoint would cure.
class DamagedCheckpoint : public Error {
 public:
  using Error::Error;
};

SamplerState Run::resume_newest(const std::vector<std::string>& paths, const TrainOptions& topt) {
  for (size_t i = 0;; ++i) {
    try {
      start_from_ = fmt::format("the checkpoint resumed, '{}'", paths[i]);
      return resume(paths[i], topt);
    } catch (const DamagedCheckpoint& e) {
      if (i + 1 == paths.size()) throw;
      if (rank0_) spdlog::warn("{}; resuming from the checkpoint before it, '{}'", e.what(), paths[i + 1]);
    }
  }
}

SamplerState Run::resume(const std::string& path, const TrainOptions& topt) {
  // Compared with this run, not run: its run-time settings need not hold here (a stored
  // train.attention = "cudnn" on a machine without a GPU).
  const Config saved = checkpoint_config(path, {}, false);
  check_same_model(saved, cfg_, path);
  // Any change of freezing resumes (the checkpoint holds every parameter, frozen ones with
  // zero moments); say what it means for the moments.
  for (size_t g = 0; g < kParamGroups && rank0_; ++g) {
    const bool was = saved.optim.groups.group[g].trainable, now = cfg_.optim.groups.group[g].trainable;
    if (was != now)
      spdlog::info("parameter group {} was {} in '{}' and is {} now: {}", kParamGroupNames[g],
                   was ? "trainable" : "frozen", path, now ? "trainable" : "frozen",
                   now ? "its AdamW moments start at zero" : "its AdamW moments are dropped");
  }
  TrainState st;
  std::string damage;
  try {
    st = load_checkpoint(path, model_, &opt_);
  } catch (const Error& e) {
    damage = e.what();
  }
  // The ranks read different parts of the moments: one rank's damaged part turns every rank
  // to the checkpoint before.
  int32_t negated = damage.empty() ? -comm_.size() : -comm_.rank();  // Max finds the first rank
  comm_.all_reduce_max(&negated, 1);
  const int first_bad = -negated;
  if (!damage.empty() && !rank0_) spdlog::warn("rank {}: {}", comm_.rank(), damage);
  if (first_bad < comm_.size())
    throw DamagedCheckpoint(!damage.empty() ? damage
                                            : fmt::format("checkpoint '{}': rank {} could not load its part of it "
                                                          "(its log says why)", path, first_bad));
  check_tokenizer(path, st, tokenizer_);
  DHP_CHECK(st.seed == cfg_.train.seed,
            "cannot resume from '{}': it was trained with train.seed = {}, this run has {}; "
            "the weights and the sample order come from the seed",
            path, st.seed, cfg_.train.seed);
  DHP_CHECK(st.dataset_size == train_set_->size(),
            "cannot resume from '{}': its run sampled from {} training samples, data.train "
            "'{}' now holds {}; the sample order would not continue",
            path, st.dataset_size, cfg_.data.train, train_set_->size());
  if (st.batch_size != cfg_.train.batch_size && rank0_)
    spdlog::info("train.batch_size changes from {} to {}; the sample stream continues where "
                 "it stopped", st.batch_size, cfg_.train.batch_size);
  first_step_ = st.step;
  planner_.restore(st.cost_state);
  DHP_CHECK(topt.stop_after < 0 || topt.stop_after > first_step_,
            "--stop-after {} is not after step {}, where this run resumes", topt.stop_after,
            first_step_);
  if (rank0_) spdlog::info("resumed from {} at step {}", path, first_step_);
  return st.sampler;
}

void Run::log_setup() const {
  if (!rank0_) return;
  const double mib = double(1 << 20), full = 2.0 * 4.0 * double(model_.n_grads()) / mib;
  const double grads = 4.0 * double(model_.grad_window().elements()) / mib;
  spdlog::info("optimizer state: {:.2f} MiB per rank{}; gradients: {:.2f} MiB{}",
               double(opt_.state_bytes()) / mib,
               opt_.sharded() ? fmt::format(" (ZeRO-{} over {} ranks; {:.2f} MiB unsharded)", cfg_.parallel.zero,
                                            comm_.size(), full)
                              : "",
               sums_ ? grads + double(sums_->bytes()) / mib : grads,
               sums_ ? fmt::format(" ({:.2f} MiB of slots and the parameters outside the decoder layers, {:.2f} MiB "
                                   "summed block; {:.2f} MiB unsharded)",
                                   grads, double(sums_->bytes()) / mib, 4.0 * double(model_.n_grads()) / mib)
                     : "");
  const VisionConfig& v = cfg_.model.vision;
  if (v.fixed_square())
    spdlog::info("images: model.vision.resize = {} to {}x{} (Pillow's bicubic, as Hugging Face's image processor{})",
                 image_fit_name(v.resize), v.image_size, v.image_size,
                 v.resize_stated ? "; the configuration names it"
                 : v.init.empty() && cfg_.model.init.empty() ? ""
                                                              : "; the folders chose it: a preprocessor_config.json, "
                                                                "or an original LLaVA's image_aspect_ratio");
  if (!model_.table().all_trainable()) {
    std::vector<std::string> frozen;
    int64_t trained = 0, all = 0;
    for (size_t g = 0; g < kParamGroups; ++g) {
      const int64_t n = model_.table().group_numel(ParamGroup(g));
      all += n;
      if (!cfg_.optim.groups.group[g].trainable)
        frozen.push_back(fmt::format("{} ({:.3f} M)", kParamGroupNames[g], double(n) / 1e6));
    }
    int64_t unused = 0;  // a tower's parts that never run, in a group that trains
    for (const auto& p : model_.table().specs()) {
      if (p.trainable) trained += p.numel();
      else if (cfg_.optim.groups.trainable(p.group)) unused += p.numel();
    }
    if (unused > 0) {
      const VisionConfig& tower = cfg_.model.vision;
      std::vector<std::string> parts;
      if (tower.layers_run() < tower.layers) parts.push_back("its layers after feature_layer");
      if (tower.post_norm) parts.push_back("post_layernorm");
      if (tower.pool_head) parts.push_back("pooling head");
      frozen.push_back(fmt::format("the tower's parts LLaVA never runs: {} ({:.3f} M)", fmt::join(parts, ", "),
                                   double(unused) / 1e6));
    }
    spdlog::info("frozen: {}; {:.3f} M of {:.3f} M parameters train", fmt::join(frozen, ", "),
                 double(trained) / 1e6, double(all) / 1e6);
  }
  if (gather_)
    spdlog::info("weights: each decoder layer's gathered from its owners before a pass reads it (ZeRO-3; {}); "
                 "{:.2f} MiB of working weights per rank ({:.2f} MiB unsharded), {:.2f} MiB of fp32 master",
                 comm_.overlapping_collectives() ? "the next layer's while this one computes" : comm_.name() + " waits for each gather",
                 double(model_.weight_window().elements() * int64_t(dtype_size(model_.storage_dtype()))) / mib,
                 double(model_.n_params() * int64_t(dtype_size(model_.storage_dtype()))) / mib,
                 4.0 * double(model_.master_shard().held_size()) / mib);
  else if (cfg_.parallel.shards_weights(comm_.size()))
    spdlog::warn("parallel.zero = 3: the decoder layers do not train (or are fewer than three), so every rank "
                 "holds their weights whole, as under ZeRO-2");
  if (gather_ && cfg_.eval.exact_match)
    spdlog::warn("eval.exact_match: not measured under parallel.zero = 3 (each rank generates alone, and the "
                 "decoder layers are gathered from every rank); the final evaluation reports loss and accuracy");
  if (sums_)
    spdlog::info("gradients: each decoder layer's summed onto its owners as backward leaves it, wave by wave "
                 "(ZeRO-{}; {}), the rest after the step's last wave", cfg_.parallel.zero,
                 comm_.overlapping_collectives() ? "while the next layer computes" : comm_.name() + " waits for each sum");
  else if (comm_.size() > 1)
    spdlog::info("gradients: {}", opt_.overlaps()
                                      ? fmt::format("summed in {} buckets of ~{} MiB while backward runs",
                                                    opt_.buckets(), cfg_.parallel.bucket_mb)
                                      : fmt::format("summed after backward ({})",
                                                    cfg_.parallel.overlap_grads
                                                        ? comm_.name() + " cannot overlap collectives"
                                                        : "parallel.overlap_grads = false"));
  spdlog::info("tokenizer: {} ({}, {} tokens, {} added; {})", tokenizer_.path(),
               tokenizer_.kind() == TokenizerKind::HuggingFace ? "Hugging Face tokenizer.json" : "SentencePiece",
               tokenizer_.vocab_size(), tokenizer_.added_tokens().size(), format_special_ids(tokenizer_.ids()));
  spdlog::info("model: {:.3f} M parameters; train: {} samples; val: {} samples; {} rank(s); "
               "{} backend, {} storage, {} compute thread(s)",
               double(model_.n_params()) / 1e6, train_set_->size(),
               val_set_ ? val_set_->size() : 0, comm_.size(), backend_->name(),
               dtype_name(backend_->ops().dtype()), backend_->threads());
}

StepWork Run::plan(int64_t step, const Planner& planner) const {
  const std::vector<int64_t> ids = sampler_->batch_at(position_of(step), cfg_.train.batch_size);
  return plan_step(planner, *train_set_, ids, comm_.rank());
}

std::future<StepWork> Run::plan_ahead(int64_t step) {
  return std::async(std::launch::async, [this, step, planner = planner_.current()] {
    StepWork w = plan(step, *planner);
    exec_.submit(w, false);
    return w;
  });
}

StepStats Run::compute(const StepWork& work, float loss_scale) {
  if (sums_) {
    sums_->begin_step();
    return exec_.run(work, loss_scale, true, {}, {}, &*sums_);
  }
  model_.zero_grads();
  GradsFinal final;
  if (opt_.overlaps()) {
    opt_.begin_overlap(model_.grads(), comm_);
    final = [this](int64_t offset) { opt_.grads_final_from(offset); };
  }
  return exec_.run(work, loss_scale, true, {}, final);
}

// The memory model's prediction for this rank next to what its buffers reached, every rank's.
// Each arena keeps the largest pass it has run, so the prediction holds each arena's largest
// over this rank's groups so far.
void Run::record_memory(const StepWork& work, StepRecord& rec) {
  const MemoryModel& mem = planner_.current()->memory();
  for (int g : work.plan.groups_of(comm_.rank())) {
    const PlanGroup& grp = work.plan.groups()[size_t(g)];
    // This rank's own tokens; the images of the ring's fullest encoder.
    int64_t tokens = 0;
    for (const TokenRange& r : work.plan.ranges(g, comm_.rank())) tokens += r.end - r.begin;
    std::vector<const SeqShape*> seqs;
    int64_t all = 0;
    for (int32_t s : grp.seqs) {
      seqs.push_back(&work.plan.seqs()[size_t(s)]);
      all += seqs.back()->tokens();
    }
    arenas_high_ = arenas_high_.max(
        mem.arenas_for(tokens, mem.max_rank_patches(seqs, grp.ring_degree), grp.ring_degree, all));
  }
  const int64_t predicted = mem.held_bytes(arenas_high_);
  const double mb = double(1 << 20);
  double mine[2] = {double(backend_->peak_bytes()) / mb, double(predicted) / mb};
  std::vector<double> all(2 * size_t(comm_.size()));
  comm_.all_gather(mine, all.data(), 2, DataType::F64);
  for (int r = 0; r < comm_.size(); ++r) {
    rec.rank_mem_peak_mb.push_back(all[2 * size_t(r)]);
    rec.rank_mem_predicted_mb.push_back(all[2 * size_t(r) + 1]);
  }
}

void Run::record_busy(StepRecord& rec) {
  double mine = 0.0, waited = 0.0;
  for (const GroupTiming& t : exec_.last_timings()) mine += t.busy_seconds, waited += t.wait_seconds;
  std::vector<double> rank_time(size_t(comm_.size()), 0.0);
  comm_.all_gather(&mine, rank_time.data(), 1, DataType::F64);
  const double slowest = *std::max_element(rank_time.begin(), rank_time.end());
  double mean = 0.0;
  for (double t : rank_time) mean += t / double(rank_time.size());
  rec.busy_s = mine;
  rec.rank_busy_s = rank_time;
  rec.ring_wait_s = waited;
  rec.imbalance = mean > 0.0 ? slowest / mean : 1.0;
}

double Run::global_loss(const StepStats& local, int64_t step, const StepWork& work) {
  double sums[2] = {local.loss_sum, double(local.targets)};  // loss, targets
  comm_.all_reduce_sum(sums, 2);
  DHP_CHECK(sums[1] > 0, "step {}: none of its {} samples could be used (all were skipped as "
            "bad data: see the warnings above); fix the data or set data.on_error = \"fail\" "
            "to stop at the first bad sample", step + 1, work.samples);
  return sums[0];
}

// The plan's shape as the step's record reports it.
void describe_plan(const StepWork& work, StepRecord& rec) {
  rec.groups = int64_t(work.plan.groups().size());
  for (const auto& g : work.plan.groups()) rec.degrees.push_back(g.ring_degree);
  std::sort(rec.degrees.begin(), rec.degrees.end(), std::greater<>());
  rec.max_degree = rec.degrees.empty() ? 1 : rec.degrees.front();
  rec.plan_s = work.plan_seconds;
  rec.predicted_s = double(work.plan.makespan_ns()) * 1e-9;
  rec.candidate = work.plan.candidate();
  rec.rule = work.plan.rule();
}

// Every group's prediction next to its measured time (its slowest member's), with the
// shapes the cost model prices: ring degree, the busiest member's tokens and zigzag pieces,
// images and their merged tokens.
void describe_groups(const StepWork& work, const std::vector<double>& measured, StepRecord& rec) {
  const Plan& plan = work.plan;
  for (size_t g = 0; g < plan.groups().size(); ++g) {
    const PlanGroup& grp = plan.groups()[g];
    StepRecord::GroupCost c;
    c.degree = grp.ring_degree;
    c.first_rank = grp.first_rank;
    c.seqs = int(grp.seqs.size());
    for (int32_t s : grp.seqs) {
      const SeqShape& q = plan.seqs()[size_t(s)];
      c.tokens += q.tokens();
      c.images += q.images;
      c.image_tokens += q.vision_tokens;
      if (q.images > 0) c.max_image_tokens = std::max(c.max_image_tokens, (q.vision_tokens + q.images - 1) / q.images);
    }
    for (int r = grp.first_rank; r < grp.first_rank + grp.ring_degree; ++r) {
      int64_t tokens = 0;
      const auto ranges = plan.ranges(int(g), r);
      for (const TokenRange& t : ranges) tokens += t.end - t.begin;
      if (tokens > c.piece_tokens) c.piece_tokens = tokens, c.pieces = int64_t(ranges.size());
    }
    c.predicted_s = double(grp.time_ns) * 1e-9;
    c.measured_s = g < measured.size() ? measured[g] : 0.0;
    rec.group_costs.push_back(c);
  }
}

StepRecord Run::step(int64_t step, const StepWork& work) {
  const auto t_step = Clock::now();
  backend_->reset_peak();
  const float scale = 1.0f / float(std::max<int64_t>(1, work.loss_tokens));
  const StepStats local = compute(work, scale);
  // Gradients summed over the ranks (reduce-scattered to each rank's block under ZeRO-1).
  // First: the buckets already in flight must meet every rank's same collectives in the
  // same order, so no other collective may come between.
  const double norm = sums_ ? opt_.reduce(*sums_, comm_) : opt_.reduce(model_.grads(), comm_);
  StepRecord rec;
  rec.step = step + 1;
  record_busy(rec);
  rec.loss = global_loss(local, step, work) * scale;
  // Before this run's first update the learning rate has changed nothing: the weights it started
  // from or the inputs overflow.
  const auto& v = cfg_.model.vision;
  DHP_CHECK(std::isfinite(norm) || step != first_step_,
            "step {}: the gradient norm is not finite ({}) before any update of this run: the starting "
            "weights ({}) or the inputs overflow (pixels are normalised by model.vision.pixel_mean = [{}] and "
            "pixel_std = [{}]{})",
            step, norm, start_from_.empty() ? "seeded" : start_from_, fmt::join(v.pixel_mean, ", "),
            fmt::join(v.pixel_std, ", "),
            v.init.empty() && cfg_.model.init.empty() ? "" : ", from the folder's preprocessor_config.json");
  DHP_CHECK(std::isfinite(norm), "step {}: the gradient norm is not finite ({}); lower optim.lr",
            step, norm);
  rec.lr = learning_rate(cfg_.optim, step, cfg_.train.steps);
  rec.grad_norm = norm;
  if (sums_) opt_.apply(model_, *sums_, rec.lr, norm, comm_);
  else opt_.apply(model_, rec.lr, norm, comm_);
  rec.threads = backend_->threads();
  record_memory(work, rec);
  backend_->adapt_to_load();
  // train.attention = "auto": every rank installs the same choice for the classes timed this step.
  if (backend_->device() == Device::CUDA) agree_attention_choices(*backend_, comm_);

  rec.step_s = seconds_since(t_step);
  rec.tokens_per_s = double(work.tokens) / rec.step_s;
  rec.samples_per_s = double(work.samples) / rec.step_s;
  {
    // Model FLOPs of the step's samples over what the world's devices could do in its time.
    const CostModel& cost = planner_.current()->cost();
    double flops = 0;
    for (const SeqShape& s : work.plan.seqs()) flops += cost.model_flops(s);
    // The CPU profile's rate is one thread's: times the threads each rank computes with.
    const double per_rank = cost.device().peak_flops * (cost.device().peak_measured ? double(std::max(1, rec.threads)) : 1.0);
    const double peak = per_rank * double(comm_.size());
    rec.mfu = peak > 0 ? flops / (rec.step_s * peak) : 0.0;
    rec.mfu_of_measured = cost.device().peak_measured;
  }
  rec.elapsed_s = seconds_since(t_start_);
  rec.loader_wait_s = exec_.last_wait_seconds();
  describe_plan(work, rec);
  const CostCheck costs = planner_.learn(work, exec_.last_timings());
  rec.cost_error = costs.error;
  rec.measured_s = costs.measured_s;
  describe_groups(work, costs.group_seconds, rec);
  return rec;
}

void Run::evaluate(int64_t step, TrainResult* out) {
  if (!val_set_ || val_set_->size() == 0) return;
  EvalOptions o{cfg_.train.batch_size, cfg_.eval.max_samples, false, cfg_.data.workers};
  o.eos = tokenizer_.ids().eos;
  // Generation only at the final evaluation, and where each rank holds every layer.
  o.exact_match = out && cfg_.eval.exact_match && !gather_;
  const std::shared_ptr<const Planner> planner = planner_.current();
  const EvalResult r = dhp::evaluate(model_, *val_set_, o, comm_, *planner);
  EvalResult b;
  if (cfg_.eval.blank_images) {
    EvalOptions ob = o;
    ob.blank_images = true;
    b = dhp::evaluate(model_, *val_set_, ob, comm_, *planner);
  }
  report_.eval(step, r, cfg_.eval.blank_images ? &b : nullptr);
  if (!out) return;
  out->final_loss = r.loss;
  out->final_accuracy = r.accuracy;
  out->final_blank_accuracy = cfg_.eval.blank_images ? b.accuracy : -1.0;
  out->final_exact_match = r.exact_match;
  out->final_blank_exact_match = cfg_.eval.blank_images ? b.exact_match : -1.0;
}

std::string Run::save(int64_t step, bool last) {
  const TrainState st{step, cfg_.train.seed, cfg_.train.batch_size,
                      sampler_->state_at(position_of(step)), train_set_->size(), tokenizer_.hash(),
                      planner_.saved(), format_special_ids(tokenizer_.ids()),
                      format_added_tokens(tokenizer_.added_tokens())};
  report_.clear();
  return checkpoints_.save(model_, opt_, st, last);
}

std::string Run::rescue(int64_t done, int64_t saved, const std::string& what) {
  // The folder is the truth: a save whose marker was written before its ranks failed to agree
  // on it (a rank that stopped answering in its last exchange) is complete, whatever it threw.
  saved = std::max(saved, newest_complete_step(cfg_.checkpoint.dir));
  if (done <= saved) return what;
  const std::string last = saved > 0 ? fmt::format("step {}", saved) : "no checkpoint yet";
  // The state is whole between steps: an error in a step's loads or compute comes before its
  // update, one in an evaluation after it. Several ranks cannot save together once one of
  // them has failed (the others are waiting for it), so only a run of one rank saves here.
  if (comm_.size() > 1)
    return fmt::format("{}\n(the {} steps since the last checkpoint ({}) were not saved: after an error on "
                       "one rank the ranks cannot save together)", what, done - saved, last);
  try {
    const std::string path = save(done, true);
    spdlog::warn("emergency save: the state after step {} is in {}", done, path);
    return fmt::format("{}\n(emergency save: the state after step {} is in '{}'; fix the cause and continue "
                       "with --resume auto)", what, done, path);
  } catch (const Error& e) {
    return fmt::format("{}\n(the emergency save after step {} failed too: {}; the last checkpoint is {})",
                       what, done, e.what(), last);
  }
}

// A signal reaches the ranks at slightly different moments: they agree to stop after the
// same step, so that all of them take part in the one checkpoint.
bool stop_requested(const TrainOptions& topt, Communicator& comm) {
  int32_t stop = topt.stop_flag && *topt.stop_flag ? 1 : 0;
  comm.all_reduce_max(&stop, 1);
  return stop != 0;
}

}  // namespace

TrainResult train(const Config& given, Communicator& comm, const TrainOptions& topt) {
  // A Hugging Face model.init sets the decoder's shape (a no-op when the caller applied it).
  Config cfg = given;
  apply_hf_init_for_run(cfg, topt.resume);
  DHP_CHECK(!cfg.data.tokenizer.empty(), "{}: data.tokenizer is not set: name the tokenizer of data.train '{}' (a "
            "SentencePiece .model, a tokenizer.json or a Hugging Face folder); dhp uses the demo's only with "
            "the demo's data", cfg.source, cfg.data.train);
  // Device, precision and cost profile made concrete before the ranks compare their settings
  // (a no-op where the command line did it, to print them).
  resolve_device_defaults(cfg, comm.rank() == 0);
  // Checked before anything is opened or locked: a stop that is never reached would train to
  // the end while the user expected a checkpoint at that step.
  DHP_CHECK(topt.stop_after < 0 || topt.stop_after <= cfg.train.steps,
            "--stop-after {} is past the last step of this run (train.steps = {})", topt.stop_after,
            cfg.train.steps);
  // Options that change what the run does are compared too: --stop-after on one rank would
  // leave the others waiting at the next step; --init given to one rank trains a mixture.
  check_ranks_agree(cfg, comm, {{"--stop-after", std::to_string(topt.stop_after)},
                                {"--init", topt.init.empty() ? "not given" : "given"},
                                {"--resume", topt.resume.empty() ? "not given" : topt.resume}});
  const auto t_start = Clock::now();
  const bool rank0 = comm.rank() == 0;
  // The planner's nodes are where the launcher put the ranks; a stated value must agree.
  const Placement placement = detect_placement(comm);
  cfg.parallel.ranks_per_node = resolve_ranks_per_node(cfg.parallel.ranks_per_node, placement);
  if (rank0 && comm.size() > 1)
    spdlog::info("placement: {} rank(s) on {} node(s), {} per node (parallel.ranks_per_node; from {})", comm.size(),
                 comm.size() / cfg.parallel.ranks_per_node, cfg.parallel.ranks_per_node, placement.source);
  Run run(cfg, comm, topt);
  const int64_t first = run.first_step();
  TrainResult result;
  result.last_step = first;

  // Steps done and saved, for the message (and the emergency save) when an error stops the run.
  int64_t done = first, saved = first;
  try {
    // A resumed run had its baseline already.
    if (cfg.eval.at_start && first == 0) run.evaluate(0, nullptr);
    std::future<StepWork> next;
    if (first < cfg.train.steps) next = run.plan_ahead(first);
    for (int64_t step = first; step < cfg.train.steps; ++step) {
      const StepWork cur = next.get();
      if (step + 1 < cfg.train.steps) next = run.plan_ahead(step + 1);
      const StepRecord rec = run.step(step, cur);
      result.steps.push_back(rec);
      result.last_step = done = rec.step;
      run.record(rec);

      if (cfg.eval.every > 0 && rec.step % cfg.eval.every == 0 && rec.step < cfg.train.steps)
        run.evaluate(rec.step, nullptr);
      const bool interrupted = stop_requested(topt, comm);
      if (interrupted || rec.step == topt.stop_after) {
        result.checkpoint = run.save(rec.step, true);
        saved = rec.step;
        if (rank0)
          spdlog::info("stopping after step {}{}; resume with --resume auto", rec.step,
                       interrupted ? " (signal)" : "");
        return result;
      }
      // A background save (checkpoint.async_save) completes at a later step, or at the next save.
      const std::string path = run.periodic_save(rec.step) ? run.save(rec.step, false) : run.poll_save();
      if (!path.empty()) result.checkpoint = path;
      saved = std::max(saved, run.saved_step());
    }
    run.clear_bar();
    // A resumed run that had no step left to take already has its checkpoint.
    if (result.last_step > first || first == 0) result.checkpoint = run.save(result.last_step, true);
    saved = result.last_step;
    run.evaluate(result.last_step, &result);
  } catch (const Error& e) {
    throw Error(run.rescue(done, saved, e.what()));
  }
  if (rank0) spdlog::info("done in {:.1f}s", seconds_since(t_start));
  return result;
}

}  // namespace dhp
