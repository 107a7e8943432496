// Frozen parameter groups: what a training step holds and costs with the vision tower (and, in
// LLaVA's stage 1, everything but the projector) frozen against the whole model trained. One
// process, one compute thread, the same global batches: every step runs each variant in turn
// on the same planned batch, and the step's forward, backward and optimizer update are timed
// in thread CPU time (other processes on the machine do not enter it). Prints markdown;
// asserts nothing.
//   bench_freeze [--config configs/demo.toml] [--steps 30] [key=value overrides...]
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "bench/timing.h"
#include "core/clock.h"
#include "data/dataset.h"
#include "data/sampler.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "parallel/planner.h"
#include "parallel/threaded_comm.h"
#include "trainer/config.h"
#include "trainer/executor.h"
#include "trainer/optimizer.h"

namespace {

using namespace dhp;

struct Variant {
  std::string name;
  ParamGroups groups;
  std::unique_ptr<Model> model;
  std::unique_ptr<AdamW> opt;
  std::unique_ptr<Executor> exec;
  std::vector<double> cpu_s;  // per measured step
};

using bench::median;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Step cost and state of frozen parameter groups");
  std::string config = "configs/demo.toml";
  int steps = 30, warmup = 3;
  std::vector<std::string> overrides;
  app.add_option("--config", config, "training config (its data must exist)")->capture_default_str();
  app.add_option("--steps", steps, "measured steps")->capture_default_str();
  app.add_option("overrides", overrides, "config overrides, --section.key=value without the dashes");
  CLI11_PARSE(app, argc, argv);
  for (auto& o : overrides) o = "--" + o;
  const Config cfg = load_config(config, overrides);

  run_threaded(1, [&](Communicator& comm) {
    auto backend = make_cpu_backend({1});
    const Tokenizer tok(cfg.data.tokenizer);
    const auto data = open_dataset(cfg.data.train, cfg.data, tok, data_geometry(cfg.model.vision));
    std::vector<Variant> variants;
    auto add = [&](std::string name, std::initializer_list<ParamGroup> frozen) {
      Variant v;
      v.name = std::move(name);
      for (ParamGroup g : frozen) v.groups[g].trainable = false;
      v.model = std::make_unique<Model>(cfg.model, *backend, v.groups);
      v.model->initialise(cfg.train.seed);
      v.opt = std::make_unique<AdamW>(v.model->table(), cfg.optim, *backend);
      v.exec = std::make_unique<Executor>(*v.model, *data, 1, comm);  // decoding off this thread
      variants.push_back(std::move(v));
    };
    add("all trainable", {});
    add("vision frozen (LLaVA stage 2)", {ParamGroup::Vision});
    add("projector only (LLaVA stage 1)", {ParamGroup::Language, ParamGroup::Embeddings, ParamGroup::Vision});
    const Planner planner(cfg.model, cfg.parallel, 1);
    const Sampler sampler(data->size(), cfg.train.seed);
    for (int s = 0; s < warmup + steps; ++s) {
      const std::vector<int64_t> ids = sampler.batch(s, cfg.train.batch_size);
      const StepWork work = plan_step(planner, *data, ids, 0);
      const float scale = 1.0f / float(std::max<int64_t>(1, work.loss_tokens));
      for (Variant& v : variants) {
        v.exec->submit(work, false);
        const double t0 = thread_cpu_seconds();
        v.model->zero_grads();
        v.exec->run(work, scale, true);
        const double norm = v.opt->reduce(v.model->grads(), comm);
        v.opt->apply(v.model->params(), v.model->grads(), learning_rate(cfg.optim, s, cfg.train.steps), norm, comm);
        const double t = thread_cpu_seconds() - t0;
        if (s >= warmup) v.cpu_s.push_back(t);
      }
    }
    const double mib = double(1 << 20), base = median(variants[0].cpu_s);
    fmt::print("{} steps of {} samples ({}), one compute thread; thread CPU time per step, median\n\n",
               steps, cfg.train.batch_size, config);
    fmt::print("| variant | trainable parameters | gradients MiB | optimizer MiB per rank (1 / 2 / 4 ranks, ZeRO-1) | step CPU ms | vs all trainable |\n");
    fmt::print("|---|---|---|---|---|---|\n");
    for (const Variant& v : variants) {
      int64_t trainable = 0;
      for (const auto& p : v.model->table().specs())
        if (p.trainable) trainable += p.numel();
      std::vector<std::string> per_rank;
      for (int world : {1, 2, 4}) {
        const AdamW sharded(v.model->table(), cfg.optim, *backend,
                            world > 1 ? OptimizerShard{0, world} : OptimizerShard{});
        per_rank.push_back(fmt::format("{:.2f}", double(sharded.state_bytes()) / mib));
      }
      const double ms = median(v.cpu_s) * 1e3;
      fmt::print("| {} | {} of {} | {:.2f} | {} | {:.1f} | {:.2f}x |\n", v.name, trainable,
                 v.model->table().group_numel(ParamGroup::Language) +
                     v.model->table().group_numel(ParamGroup::Embeddings) +
                     v.model->table().group_numel(ParamGroup::Vision) +
                     v.model->table().group_numel(ParamGroup::Projector),
                 4.0 * double(v.model->n_grads()) / mib, fmt::join(per_rank, " / "), ms,
                 base > 0 ? ms / (base * 1e3) : 0.0);
    }
  });
  return 0;
}
