// Frozen parameter groups and per-group learning rates (optim.groups.<name>): every parameter
// has a group by its name; a frozen group changes no gradient of a trainable parameter (bit
// for bit), holds no gradient or moment, is never updated, is left out of the ZeRO-1 shards
// and of the memory model's gradient and optimizer bytes; checkpoints resume across any
// change of freezing, on any world size.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>

#include "model/layer_window.h"
#include "model/model.h"
#include "parallel/cost_model.h"
#include "parallel/memory_model.h"
#include "parallel/planner.h"
#include "parallel/threaded_comm.h"
#include "tests/error_of.h"
#include "tests/model_fixtures.h"
#include "trainer/checkpoint_file.h"
#include "trainer/config.h"
#include "trainer/grad_reducer.h"
#include "trainer/optimizer.h"

namespace dhp {
namespace {

using testing::error_of;
using testing::make_batch;
using testing::randomise;
using testing::sample_docs;
using testing::tiny_config;

ParamGroups frozen(std::initializer_list<ParamGroup> groups) {
  ParamGroups p;
  for (ParamGroup g : groups) p[g].trainable = false;
  return p;
}

// LLaVA's two stages, and each group frozen alone.
std::vector<std::pair<std::string, ParamGroups>> freezings() {
  return {
      {"stage1 (projector only)",
       frozen({ParamGroup::Language, ParamGroup::Embeddings, ParamGroup::Vision})},
      {"stage2 (vision frozen)", frozen({ParamGroup::Vision})},
      {"language frozen", frozen({ParamGroup::Language})},
      {"embeddings frozen", frozen({ParamGroup::Embeddings})},
      {"projector frozen", frozen({ParamGroup::Projector})},
      {"vision and projector frozen", frozen({ParamGroup::Vision, ParamGroup::Projector})},
  };
}

bool same_bits(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, sizeof(float) * size_t(n)) == 0;
}

bool any_nonzero(const float* a, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (a[i] != 0.0f) return true;
  return false;
}

// A null weight gradient skips that gradient and nothing else: the input gradient is the same
// bits (the frozen-weight path of rmsnorm_backward and linear_backward).
TEST(FrozenOps, NullWeightGradientsLeaveTheInputGradientAlone) {
  auto backend = make_cpu_backend({2});
  const Ops& ops = backend->ops();
  const int64_t T = 13, C = 24, O = 20;
  Rng rng(1);
  const std::vector<float> x = testing::random_vec(rng, T * C), w = testing::random_vec(rng, C),
                           dy = testing::random_vec(rng, T * C), W = testing::random_vec(rng, O * C),
                           dyl = testing::random_vec(rng, T * O);
  std::vector<float> y(T * C), rstd(T), dx1(T * C), dx2(T * C), dw(C, 0.0f);
  ops.rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), T, C, 1e-6f);
  ops.rmsnorm_backward(dx1.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), T, C);
  ops.rmsnorm_backward(dx2.data(), nullptr, dy.data(), x.data(), w.data(), rstd.data(), T, C);
  EXPECT_TRUE(any_nonzero(dw.data(), C));
  EXPECT_TRUE(same_bits(dx1.data(), dx2.data(), T * C));
  std::vector<float> dW(O * C, 0.0f), db(O, 0.0f);
  ops.linear_backward(dx1.data(), dW.data(), db.data(), dyl.data(), x.data(), W.data(), T, C, O, false);
  ops.linear_backward(dx2.data(), nullptr, nullptr, dyl.data(), x.data(), W.data(), T, C, O, false);
  EXPECT_TRUE(any_nonzero(dW.data(), O * C) && any_nonzero(db.data(), O));
  EXPECT_TRUE(same_bits(dx1.data(), dx2.data(), T * C));
}

TEST(ParamGroupTable, EveryNameHasTheGroupOfItsPrefix) {
  EXPECT_EQ(group_of("vision.layers.0.attn.wq.weight"), ParamGroup::Vision);
  EXPECT_EQ(group_of("vision.layers.0.attn.wq.bias"), ParamGroup::Vision);
  EXPECT_EQ(group_of("projector.fc1.bias"), ParamGroup::Projector);
  EXPECT_EQ(group_of("tok_embed.weight"), ParamGroup::Embeddings);
  EXPECT_EQ(group_of("lm_head.weight"), ParamGroup::Embeddings);
  EXPECT_EQ(group_of("layers.3.attn.wk.bias"), ParamGroup::Language);
  EXPECT_EQ(group_of("final_norm.weight"), ParamGroup::Language);
  EXPECT_EQ(group_of("layersX.0.weight"), std::nullopt);
  EXPECT_EQ(group_of("rotary_emb.inv_freq"), std::nullopt);
  for (bool tied : {false, true}) {
    ModelConfig cfg = tiny_config();
    cfg.tie_embeddings = tied;
    const ParamTable t(cfg);
    int64_t by_group = 0, all = 0;
    for (const auto& s : t.specs()) {
      EXPECT_EQ(s.group, group_of(s.name)) << s.name;
      all += s.numel();
    }
    for (size_t g = 0; g < kParamGroups; ++g) {
      EXPECT_GT(t.group_numel(ParamGroup(g)), 0) << kParamGroupNames[g];
      by_group += t.group_numel(ParamGroup(g));
    }
    EXPECT_EQ(by_group, all);
  }
}

TEST(ParamGroupTable, GradientLayoutHoldsTheTrainableParametersOnly) {
  const ModelConfig cfg = tiny_config();
  const ParamTable all(cfg);
  EXPECT_TRUE(all.all_trainable());
  EXPECT_EQ(all.trainable_total(), all.total());
  for (const auto& s : all.specs()) EXPECT_EQ(s.grad_offset, s.offset) << s.name;
  for (const auto& [name, groups] : freezings()) {
    const ParamTable t(cfg, groups);
    EXPECT_FALSE(t.all_trainable()) << name;
    int64_t held = 0, next = 0;
    for (const auto& s : t.specs()) {
      EXPECT_EQ(s.trainable, groups.trainable(s.group)) << name << " " << s.name;
      EXPECT_EQ(s.grad_offset, next) << name << " " << s.name;
      if (!s.trainable) continue;
      held += s.numel();
      next = s.grad_offset + (s.numel() + 15) / 16 * 16;
    }
    EXPECT_EQ(t.trainable_total(), next) << name;
    EXPECT_LT(t.trainable_total(), t.total()) << name;
    int64_t want = 0;
    for (size_t g = 0; g < kParamGroups; ++g)
      if (groups.group[g].trainable) want += t.group_numel(ParamGroup(g));
    EXPECT_EQ(held, want) << name;
  }
}

class FrozenGradients : public ::testing::TestWithParam<bool> {};

// fp32, one thread: a frozen group changes no bit of any trainable parameter's gradient,
// while its own gradient GEMMs (and the vision tower below a frozen projector) are skipped.
TEST_P(FrozenGradients, TrainableGradientsAreBitIdentical) {
  auto backend = make_cpu_backend({1});
  ModelConfig cfg = tiny_config();
  cfg.tie_embeddings = GetParam();
  const Batch b = make_batch(sample_docs(), cfg, 3);
  const float scale = 1.0f / float(b.loss_tokens());
  Model full(cfg, *backend);
  randomise(full, 41);
  full.zero_grads();
  const StepStats want = full.step(b, scale, true);
  for (const auto& [name, groups] : freezings()) {
    Model m(cfg, *backend, groups);
    randomise(m, 41);
    m.zero_grads();
    const StepStats got = m.step(b, scale, true);
    EXPECT_EQ(got.loss_sum, want.loss_sum) << name;
    EXPECT_LT(m.n_grads(), full.n_grads()) << name;
    for (const auto& s : m.table().specs()) {
      if (!s.trainable) continue;
      const float* g = m.grads() + s.grad_offset;
      ASSERT_TRUE(any_nonzero(g, s.numel())) << name << ": " << s.name << " has no gradient";
      EXPECT_TRUE(same_bits(g, full.grads() + s.offset, s.numel())) << name << ": " << s.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tied, FrozenGradients, ::testing::Values(false, true));

OptimConfig plain_adamw() {
  OptimConfig o;
  o.weight_decay = 0.1;
  o.grad_clip = 1.0;
  return o;
}

// Steps of the replicated AdamW with the model's own groups; returns the losses.
// Every frozen parameter holds the same bits in `after` as in `before`.
void expect_frozen_untouched(const ParamTable& table, const std::vector<float>& after, const std::vector<float>& before,
                             const std::string& where) {
  for (const auto& s : table.specs())
    if (!s.trainable) {
      EXPECT_TRUE(same_bits(after.data() + s.offset, before.data() + s.offset, s.numel())) << where << ": " << s.name;
    }
}

std::vector<double> train_steps(Model& m, AdamW& opt, Communicator& comm,
                                const std::vector<Batch>& batches, double lr) {
  std::vector<double> losses;
  for (const Batch& b : batches) {
    m.zero_grads();
    double loss = m.step(b, 1.0f / float(b.loss_tokens()), true).loss_sum;
    comm.all_reduce_sum(&loss, 1);
    const double norm = opt.reduce(m.grads(), comm);
    opt.apply(m, lr, norm, comm);
    losses.push_back(loss);
  }
  return losses;
}

TEST(FrozenOptimizer, FrozenWeightsStayBitForBitAndHoldNoMoments) {
  const ModelConfig cfg = tiny_config();
  const std::vector<Batch> batches = {make_batch(sample_docs(), cfg, 1),
                                      make_batch(sample_docs(), cfg, 2),
                                      make_batch(sample_docs(), cfg, 3)};
  for (const auto& [name, groups] : freezings()) {
    run_threaded(1, [&](Communicator& comm) {
      auto backend = make_cpu_backend({1});
      Model m(cfg, *backend, groups);
      randomise(m, 7);
      const std::vector<float> before = m.download_params();
      AdamW opt(m.table(), plain_adamw(), *backend);
      EXPECT_EQ(opt.state_bytes(), 2 * 4 * m.table().trainable_total()) << name;
      train_steps(m, opt, comm, batches, 1e-2);
      const std::vector<float> after = m.download_params();
      const std::vector<float> mom = opt.download_m(), vel = opt.download_v();
      for (const auto& s : m.table().specs()) {
        const bool unchanged = same_bits(after.data() + s.offset, before.data() + s.offset, s.numel());
        EXPECT_EQ(unchanged, !s.trainable) << name << ": " << s.name;
        const bool has_m = any_nonzero(mom.data() + s.offset, s.numel());
        const bool has_v = any_nonzero(vel.data() + s.offset, s.numel());
        EXPECT_EQ(has_m, s.trainable) << name << ": " << s.name;
        EXPECT_EQ(has_v, s.trainable) << name << ": " << s.name;
      }
    });
  }
}

// The global norm that clipping divides by counts the trainable parameters only: it is the
// norm of the unfrozen model's gradients over those parameters.
TEST(FrozenOptimizer, ClippingNormCountsTrainableParametersOnly) {
  const ModelConfig cfg = tiny_config();
  const Batch b = make_batch(sample_docs(), cfg, 6);
  auto backend = make_cpu_backend({1});
  Model full(cfg, *backend);
  randomise(full, 13);
  full.zero_grads();
  full.step(b, 1.0f / float(b.loss_tokens()), true);
  for (const auto& [name, groups] : freezings()) {
    run_threaded(1, [&](Communicator& comm) {
      Model m(cfg, *backend, groups);
      randomise(m, 13);
      m.zero_grads();
      m.step(b, 1.0f / float(b.loss_tokens()), true);
      AdamW opt(m.table(), plain_adamw(), *backend);
      double want = 0.0, all = 0.0;
      for (const auto& s : m.table().specs())
        for (int64_t i = s.offset; i < s.offset + s.numel(); ++i) {
          const double g = full.grads()[i];
          all += g * g;
          if (s.trainable) want += g * g;
        }
      const double norm = opt.reduce(m.grads(), comm);
      EXPECT_NEAR(norm, std::sqrt(want), 1e-6 * std::sqrt(want)) << name;
      EXPECT_LT(norm, std::sqrt(all) * (1 - 1e-4)) << name;
    });
  }
}

// AdamW's first step moves each weight by lr·g/(|g| + eps) (bias-corrected moments, no decay):
// lr·sign(g) where |g| >> eps. A group's lr_scale multiplies exactly that.
TEST(FrozenOptimizer, LrScaleMultipliesTheGroupsUpdate) {
  const ModelConfig cfg = tiny_config();
  const Batch b = make_batch(sample_docs(), cfg, 4);
  OptimConfig o;
  o.weight_decay = 0.0;
  o.grad_clip = 0.0;
  o.eps = 1e-12;
  const double lr = 1e-3;
  ParamGroups scaled;
  scaled[ParamGroup::Projector].lr_scale = 0.25;
  scaled[ParamGroup::Language].lr_scale = 3.0;
  std::vector<float> delta[2], grads;
  ParamTable table(cfg);
  for (int k = 0; k < 2; ++k) {
    run_threaded(1, [&](Communicator& comm) {
      auto backend = make_cpu_backend({1});
      Model m(cfg, *backend, k == 0 ? ParamGroups{} : scaled);
      randomise(m, 11);
      const std::vector<float> before = m.download_params();
      AdamW opt(m.table(), o, *backend);
      m.zero_grads();
      m.step(b, 1.0f / float(b.loss_tokens()), true);
      if (k == 0) grads.assign(m.grads(), m.grads() + m.n_grads());
      const double norm = opt.reduce(m.grads(), comm);
      opt.apply(m.params(), m.grads(), lr, norm, comm);
      const std::vector<float> after = m.download_params();
      for (size_t i = 0; i < after.size(); ++i) delta[k].push_back(after[i] - before[i]);
    });
  }
  int64_t checked = 0;
  for (const auto& s : table.specs()) {
    const double want = scaled[s.group].lr_scale;
    for (int64_t i = s.offset; i < s.offset + s.numel(); ++i) {
      if (std::abs(grads[size_t(i)]) < 1e-6f) continue;  // the step is lr·g/(|g|+eps) < lr
      // Weights are O(0.5): a float step carries ~6e-8 of rounding.
      ASSERT_NEAR(std::abs(delta[0][size_t(i)]), lr, 1e-3 * lr) << s.name;
      ASSERT_NEAR(delta[1][size_t(i)], want * delta[0][size_t(i)], 2e-4 * want * lr) << s.name;
      ++checked;
    }
  }
  EXPECT_GT(checked, table.total() / 2);
}

// ZeRO-1 over the trainable ranges against replicated AdamW, for every freezing, on 2 to 4
// ranks with different micro-batches per rank: the same losses and weights; frozen weights
// untouched on every rank; optimizer state per rank = the trainable parameters / N.
TEST(FrozenOptimizer, Zero1MatchesReplicatedOnTheTrainableRanges) {
  const ModelConfig cfg = tiny_config();
  for (const auto& [name, groups] : freezings()) {
    for (int world = 2; world <= 4; ++world) {
      std::vector<double> losses[2];
      std::vector<float> weights[2], moments[2];
      std::vector<float> init;
      for (int zero = 0; zero < 2; ++zero) {
        std::mutex mu;
        run_threaded(world, [&](Communicator& comm) {
          auto backend = make_cpu_backend({1});
          Model m(cfg, *backend, groups);
          randomise(m, 5);
          const std::vector<float> before = m.download_params();
          const OptimizerShard shard = zero ? OptimizerShard{comm.rank(), world} : OptimizerShard{};
          AdamW opt(m.table(), plain_adamw(), *backend, shard);
          if (zero) {
            const int64_t n = m.table().trainable_total();
            EXPECT_EQ(opt.state_bytes(), 2 * 4 * (n / world + n % world)) << name;
          }
          std::vector<Batch> batches;
          for (int s = 0; s < 3; ++s)
            batches.push_back(make_batch(sample_docs(), cfg, uint64_t(100 * s + comm.rank())));
          const std::vector<double> l = train_steps(m, opt, comm, batches, 1e-2);
          opt.gather_moments(comm);
          const std::vector<float> mom = opt.download_m();
          const std::vector<float> after = m.download_params();
          expect_frozen_untouched(m.table(), after, before, fmt::format("{}, rank {}", name, comm.rank()));
          std::lock_guard lk(mu);
          if (comm.rank() != 0) return;
          losses[zero] = l;
          weights[zero] = after;
          moments[zero] = mom;
          init = before;
        });
      }
      for (size_t s = 0; s < losses[0].size(); ++s)
        EXPECT_NEAR(losses[1][s], losses[0][s], 1e-6 * std::abs(losses[0][s])) << name << ", " << world;
      for (size_t i = 0; i < weights[0].size(); ++i) {
        ASSERT_NEAR(weights[1][i], weights[0][i], 1e-6 * std::max(1.0f, std::abs(weights[0][i])))
            << name << ", " << world << " ranks, weight " << i;
        ASSERT_NEAR(moments[1][i], moments[0][i], 1e-6 + 1e-5 * std::abs(moments[0][i]))
            << name << ", " << world << " ranks, moment " << i;
      }
    }
  }
}

// The distributed optimizer: in bf16 storage over 2 to 4 ranks, a model holding the fp32
// master of its ZeRO-1 shard alone trains bit for bit as one holding the whole master (the
// same sums, the same update of the same fp32 values, the same rounding into the working
// copy), for every freezing; rank 0 assembles the whole master (gather_weights), a rank's
// master is its block and the tail, and frozen weights, held in bf16 alone, stay their
// initial values.
TEST(FrozenOptimizer, AShardedMasterTrainsBitForBitAsAWholeOneInBf16) {
  const ModelConfig cfg = tiny_config();
  BackendOptions bo;
  bo.threads = 1;
  bo.precision = Precision::bf16;
  auto freezings_and_none = freezings();
  freezings_and_none.emplace_back("none", ParamGroups{});
  for (const auto& [name, groups] : freezings_and_none) {
    for (int world = 2; world <= 4; ++world) {
      std::vector<double> losses[2];
      std::vector<float> weights[2], working[2], initial;
      for (int sheds = 0; sheds < 2; ++sheds) {
        std::mutex mu;
        run_threaded(world, [&](Communicator& comm) {
          auto backend = make_cpu_backend(bo);
          const OptimizerShard shard{comm.rank(), world};
          Model m(cfg, *backend, groups, sheds ? shard : OptimizerShard{});
          ASSERT_EQ(m.sheds_master(), sheds == 1);
          randomise(m, 5);
          std::vector<float> before(size_t(m.n_params()));
          m.read_working(0, m.n_params(), before.data());
          AdamW opt(m.table(), plain_adamw(), *backend, shard);
          if (sheds) {
            const int64_t n = m.table().trainable_total();
            EXPECT_EQ(m.master_shard().held_size(), n / world + n % world) << name;
          }
          std::vector<Batch> batches;
          for (int s = 0; s < 3; ++s)
            batches.push_back(make_batch(sample_docs(), cfg, uint64_t(100 * s + comm.rank())));
          const std::vector<double> l = train_steps(m, opt, comm, batches, 1e-2);
          const std::vector<float> whole = gather_weights(m, comm);
          std::vector<float> work(size_t(m.n_params()));
          m.read_working(0, m.n_params(), work.data());
          expect_frozen_untouched(m.table(), work, before, fmt::format("{}, rank {}", name, comm.rank()));
          std::lock_guard lk(mu);
          if (comm.rank() != 0) return;
          losses[sheds] = l;
          weights[sheds] = whole;
          working[sheds] = work;
          initial = before;
        });
      }
      const std::string where = fmt::format("{}, {} ranks", name, world);
      EXPECT_EQ(losses[1], losses[0]) << where;
      ASSERT_EQ(weights[1].size(), weights[0].size()) << where;
      // A frozen parameter has no master where the master is sharded: its weights are the
      // working copy's, the whole master's rounded to bf16. (The alignment between tensors
      // is no parameter's.)
      const ParamTable table(cfg, groups);
      for (const auto& s : table.specs()) {
        EXPECT_TRUE(same_bits(working[1].data() + s.offset, working[0].data() + s.offset, s.numel())) << where << ": " << s.name;
        const float* want = (s.trainable ? weights[0] : working[0]).data() + s.offset;
        EXPECT_TRUE(same_bits(weights[1].data() + s.offset, want, s.numel())) << where << ": " << s.name;
      }
      EXPECT_FALSE(same_bits(working[1].data(), initial.data(), int64_t(initial.size()))) << where << ": nothing trained";
    }
  }
}

Config checkpoint_cfg(const ParamGroups& groups) {
  Config c;
  c.model = tiny_config();
  c.optim.groups = groups;
  return c;
}

// A checkpoint stores moments in the weight arena's layout, zeros for frozen parameters. It
// resumes with another freezing on another world size, sharded or not: a parameter frozen then
// and trainable now starts from zero moments; one trainable then and frozen now drops them.
TEST(FrozenCheckpoint, ResumesAcrossFreezingWorldSizeAndZero1) {
  const ModelConfig cfg = tiny_config();
  const auto dir = std::filesystem::temp_directory_path() / "dhp_test_freeze_ckpt";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const ParamGroups saved_groups = frozen({ParamGroup::Vision});
  const std::string path = (dir / "vision_frozen.h5").string();
  std::vector<float> saved_m, saved_v;
  run_threaded(2, [&](Communicator& comm) {
    auto backend = make_cpu_backend({1});
    Model m(cfg, *backend, saved_groups);
    randomise(m, 3);
    AdamW opt(m.table(), plain_adamw(), *backend, OptimizerShard{comm.rank(), 2});
    train_steps(m, opt, comm, {make_batch(sample_docs(), cfg, uint64_t(comm.rank())),
                               make_batch(sample_docs(), cfg, uint64_t(7 + comm.rank()))}, 1e-2);
    opt.gather_moments(comm);
    if (comm.rank() != 0) return;
    saved_m = opt.download_m();
    saved_v = opt.download_v();
    TrainState st;
    st.step = 2;
    write_checkpoint_file(path, checkpoint_cfg(saved_groups), m, &opt, st);
  });
  for (const auto& [name, groups] : std::vector<std::pair<std::string, ParamGroups>>{
           {"all trainable", ParamGroups{}},
           {"the same freezing", saved_groups},
           {"stage1 (projector only)", freezings()[0].second}}) {
    for (int world : {1, 3}) {
      for (bool zero : {false, true}) {
        std::mutex mu;
        run_threaded(world, [&](Communicator& comm) {
          auto backend = make_cpu_backend({1});
          Model m(cfg, *backend, groups);
          const OptimizerShard shard = zero ? OptimizerShard{comm.rank(), world} : OptimizerShard{};
          AdamW opt(m.table(), plain_adamw(), *backend, shard);
          const TrainState st = load_checkpoint(path, m, &opt);
          EXPECT_EQ(st.step, 2);
          EXPECT_EQ(opt.steps_taken(), 2);
          opt.gather_moments(comm);
          const std::vector<float> mom = opt.download_m(), vel = opt.download_v();
          // And it trains on from there.
          train_steps(m, opt, comm, {make_batch(sample_docs(), cfg, 9)}, 1e-2);
          std::lock_guard lk(mu);
          const std::string where = name + ", " + std::to_string(world) + " ranks" + (zero ? ", ZeRO-1" : "");
          for (const auto& s : m.table().specs()) {
            const bool kept = s.trainable && saved_groups.trainable(s.group);
            for (int64_t i = s.offset; i < s.offset + s.numel(); ++i) {
              ASSERT_EQ(mom[size_t(i)], kept ? saved_m[size_t(i)] : 0.0f) << where << ": " << s.name;
              ASSERT_EQ(vel[size_t(i)], kept ? saved_v[size_t(i)] : 0.0f) << where << ": " << s.name;
            }
            if (saved_groups.trainable(s.group)) {
              EXPECT_TRUE(any_nonzero(saved_m.data() + s.offset, s.numel())) << s.name;
            }
          }
        });
      }
    }
  }
  std::filesystem::remove_all(dir);
}

// The memory model's static part is what the engine's buffers hold (types/state_bytes.h): for
// every profile, its storage dtype run on the CPU (bf16 for the GPUs' profiles), on 1 and 4
// ranks, replicated, ZeRO-1, 2 and 3, with every freezing, the bytes a rank's model,
// optimizer and (ZeRO-2) gradient reducer hold once built equal static_bytes() but for two
// scalars (the loss statistics, the norm): fp32 master weights of every parameter, the bf16
// working copy, fp32 gradients (under ZeRO-2 the window of two decoder layers and the rest,
// and the summed block; under ZeRO-3 the working weights windowed too and the master sharded in
// fp32 as well) and moments of the trainable groups only, the moments sharded. A
// pricing of the weights in their storage dtype alone, or of 2-byte gradients, misses by
// megabytes here. Its group counts are the parameter table's.
TEST(FrozenMemoryModel, StaticBytesAreWhatTheEnginesBuffersHold) {
  ModelConfig cfg = tiny_config();
  cfg.tie_embeddings = false;
  cfg.layers = 4;  // ZeRO-2's window holds two of them
  const ParamTable table(cfg);
  for (const std::string& profile : device_profile_names()) {
    const DeviceProfile dev = device_profile(profile);
    BackendOptions bo;
    bo.precision = dev.act_bytes == 2 ? Precision::bf16 : Precision::fp32;
    for (int world : {1, 4}) {
      for (int zero : {0, 1, 2, 3}) {
        const MemoryModel all(cfg, dev, world, 80, zero, Recompute::off, {},
                              EngineLayout{dev.act_bytes, table.total(), table.trainable_total(),
                                           LayerWindow::of_grads(table, cfg.layers).elements(),
                                           LayerWindow::of_weights(table, cfg.layers).elements()});
        for (size_t g = 0; g < kParamGroups; ++g)
          EXPECT_EQ(all.group_parameters(ParamGroup(g)), table.group_numel(ParamGroup(g)))
              << kParamGroupNames[g];
        EXPECT_EQ(all.trainable_parameters(), all.parameters());
        auto freezings_and_none = freezings();
        freezings_and_none.emplace_back("none", ParamGroups{});
        for (const auto& [name, groups] : freezings_and_none) {
          const std::string where = fmt::format("{}, {} rank(s), ZeRO-{}, frozen: {}", profile, world, zero, name);
          // What a run's planner knows: the table's totals, every tensor aligned to 16 elements.
          const ParamTable t(cfg, groups);
          const LayerWindow window = LayerWindow::of_grads(t, cfg.layers);
          const bool windowed = zero >= 2 && world > 1, gathered = zero == 3 && world > 1;
          const EngineLayout engine{dev.act_bytes, t.total(), t.trainable_total(), window.elements(),
                                    LayerWindow::of_weights(t, cfg.layers).elements()};
          const MemoryModel m(cfg, dev, world, 80, zero, Recompute::off, groups, engine);
          int64_t trainable = 0;
          for (size_t g = 0; g < kParamGroups; ++g)
            if (groups.group[g].trainable) trainable += table.group_numel(ParamGroup(g));
          EXPECT_EQ(m.trainable_parameters(), trainable) << where;
          if (!windowed) {
            EXPECT_EQ(m.gradient_bytes(), 4 * t.trainable_total()) << where;
          }
          // Without the table (dhp plan) the counts come from the shape, short of the alignment
          // alone: 15 elements at most per tensor, of at most 26 bytes of state each.
          const MemoryModel shape_only(cfg, dev, world, 80, zero, Recompute::off, groups);
          EXPECT_LE(shape_only.static_bytes(), m.static_bytes()) << where;
          EXPECT_GE(shape_only.static_bytes(), m.static_bytes() - 15 * 26 * int64_t(t.specs().size())) << where;
          run_threaded(world, [&](Communicator& comm) {
            auto backend = make_cpu_backend(bo);
            const int64_t before = backend->bytes_in_use();
            const OptimizerShard shard = zero >= 1 ? OptimizerShard{comm.rank(), world} : OptimizerShard{};
            Model model(cfg, *backend, groups, shard, windowed, gathered);
            const AdamW opt(model.table(), OptimConfig{}, *backend, shard);
            std::optional<GradReducer> sums;
            if (windowed) sums.emplace(model, shard, comm);
            // Besides the state, two scalars: the loss statistics and the norm's scratch.
            const int64_t held = backend->bytes_in_use() - before;
            EXPECT_GE(held, m.static_bytes()) << where << ", rank " << comm.rank();
            EXPECT_LE(held, m.static_bytes() + 64) << where << ", rank " << comm.rank();
          });
          if (name != "none") {
            EXPECT_LT(m.static_bytes(), all.static_bytes()) << where;
          }
          // The planner's memory model is the one of the run's groups and engine.
          ParallelConfig par;
          par.cost_profile = profile;
          par.zero = zero;
          EXPECT_EQ(Planner(cfg, par, world, groups, engine).memory().static_bytes(), m.static_bytes()) << where;
        }
      }
    }
  }
}

// Qwen3's q/k norms (head_dim apart from dim/heads) and Llama's/Qwen3's output bias: the memory
// model counts the parameter table's weights, and prices what the norms add to a pass (q and k
// before their norms, one fp32 rstd per head and token) in every recompute mode: the measured
// growth of a pass's carved activations is within the predicted growth, which has the
// arenas' eighth of headroom above it.
TEST(DecoderMemoryModel, CountsQkNormsOutputBiasAndTheirActivations) {
  ModelConfig plain = tiny_config();
  plain.head_dim = 8;
  plain.attention_bias = true;
  ModelConfig qwen3 = plain;
  qwen3.qk_norm = true;
  qwen3.attention_out_bias = true;
  const DeviceProfile dev = device_profile("cpu");
  const ParamTable table(qwen3);
  const MemoryModel priced(qwen3, dev, 1, 80, false);
  for (size_t g = 0; g < kParamGroups; ++g)
    EXPECT_EQ(priced.group_parameters(ParamGroup(g)), table.group_numel(ParamGroup(g)))
        << kParamGroupNames[g];
  EXPECT_EQ(priced.parameters() - MemoryModel(plain, dev, 1, 80, false).parameters(),
            int64_t(qwen3.layers) * (2 * 8 + qwen3.dim));
  // A text-only pack: the decoder's activations alone.
  const std::vector<int32_t> ids = {1, 5, 9, 3, 7, 2, 11, 4, 6, 8, 10, 12, 13, 14, 15, 16, 17, 18, 19, 20};
  const Batch b = make_batch({{ids, std::vector<int>(ids.size(), 1), {}}}, plain, 1);
  for (Recompute mode : {Recompute::off, Recompute::selective, Recompute::full}) {
    auto carved = [&](const ModelConfig& c) {
      auto backend = make_cpu_backend({1});
      Model m(c, *backend);
      m.set_recompute(mode);
      m.initialise(1);
      m.step(b, 0.1f, true);
      return int64_t(m.activation_bytes());
    };
    const int64_t measured = carved(qwen3) - carved(plain);
    const int64_t predicted = b.T * (MemoryModel(qwen3, dev, 1, 80, false, mode).bytes_per_token() -
                                     MemoryModel(plain, dev, 1, 80, false, mode).bytes_per_token());
    EXPECT_GT(measured, 0) << recompute_name(mode);
    EXPECT_LE(measured, predicted) << recompute_name(mode);
    EXPECT_GE(measured * 5 / 4, predicted) << recompute_name(mode);
  }
}

TEST(FrozenConfig, GroupsParseAndLlavaRecipesAreExpressible) {
  const Config stage1 = parse_config(
      "[optim.groups.language]\ntrainable = false\n[optim.groups.embeddings]\ntrainable = false\n"
      "[optim.groups.vision]\ntrainable = false\n",
      "stage1.toml");
  EXPECT_TRUE(stage1.optim.groups.trainable(ParamGroup::Projector));
  EXPECT_FALSE(stage1.optim.groups.trainable(ParamGroup::Language));
  EXPECT_FALSE(stage1.optim.groups.trainable(ParamGroup::Embeddings));
  EXPECT_FALSE(stage1.optim.groups.trainable(ParamGroup::Vision));
  const Config stage2 = parse_config("[optim.groups.vision]\ntrainable = false\nlr_scale = 0.1\n",
                                     "stage2.toml", {"--optim.groups.projector.lr_scale=2"});
  EXPECT_FALSE(stage2.optim.groups.trainable(ParamGroup::Vision));
  EXPECT_TRUE(stage2.optim.groups.trainable(ParamGroup::Language));
  EXPECT_EQ(stage2.optim.groups[ParamGroup::Vision].lr_scale, 0.1);
  EXPECT_EQ(stage2.optim.groups[ParamGroup::Projector].lr_scale, 2.0);
  // What checkpoints store reads back to the same groups.
  const Config again = parse_config(to_toml(stage2), "again.toml");
  for (size_t g = 0; g < kParamGroups; ++g) {
    EXPECT_EQ(again.optim.groups.group[g].trainable, stage2.optim.groups.group[g].trainable);
    EXPECT_EQ(again.optim.groups.group[g].lr_scale, stage2.optim.groups.group[g].lr_scale);
  }
}

TEST(FrozenConfig, BadGroupsAreErrorsThatSayWhatAndWhere) {
  std::string msg = error_of([] { parse_config("[optim.groups.visual]\ntrainable = false\n", "g.toml"); });
  EXPECT_NE(msg.find("g.toml:1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("optim.groups.visual"), std::string::npos) << msg;
  EXPECT_NE(msg.find("language, embeddings, vision, projector"), std::string::npos) << msg;
  msg = error_of([] { parse_config("", "g.toml", {"--optim.groups.llm.trainable=false"}); });
  EXPECT_NE(msg.find("'llm' is no parameter group"), std::string::npos) << msg;
  msg = error_of([] { parse_config("[optim.groups.vision]\nfrozen = true\n", "g.toml"); });
  EXPECT_NE(msg.find("unknown key 'optim.groups.vision.frozen'"), std::string::npos) << msg;
  msg = error_of([] { parse_config("[optim.groups.vision]\ntrainable = 0\n", "g.toml"); });
  EXPECT_NE(msg.find("must be a boolean"), std::string::npos) << msg;
  msg = error_of([] { parse_config("[optim.groups.vision]\nlr_scale = -1\n", "g.toml"); });
  EXPECT_NE(msg.find("out of range"), std::string::npos) << msg;
  msg = error_of([] { parse_config("[optim.groups.vision]\nlr_scale = 0\n", "g.toml"); });
  EXPECT_NE(msg.find("set trainable = false"), std::string::npos) << msg;
  msg = error_of([] {
    parse_config("", "g.toml",
                 {"--optim.groups.language.trainable=false", "--optim.groups.embeddings.trainable=false",
                  "--optim.groups.vision.trainable=false", "--optim.groups.projector.trainable=false"});
  });
  EXPECT_NE(msg.find("every parameter group is frozen"), std::string::npos) << msg;
  // A frozen group may keep any lr_scale: it is not used.
  EXPECT_NO_THROW(parse_config("[optim.groups.vision]\ntrainable = false\nlr_scale = 0\n", "g.toml"));
}

}  // namespace
}  // namespace dhp
