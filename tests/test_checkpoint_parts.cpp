// Checkpoints of several ranks: every rank writes its part of the optimizer moments beside the
// main file. The parts re-slice onto any number of ranks, sharded or not, bit for bit; a part
// that is damaged, missing or from another save is refused by name, and a resume whose one
// rank finds its part damaged turns every rank to the checkpoint before; the ranks wait for a
// save under the save's own limit, never parallel.timeout_s.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/check.h"
#include "core/rng.h"
#include "data/h5.h"
#include "model/model.h"
#include "parallel/threaded_comm.h"
#include "tests/error_of.h"
#include "tests/file_text.h"
#include "tests/h5_damage.h"
#include "tests/train_fixture.h"
#include "trainer/checkpoint.h"
#include "trainer/hf_checkpoint.h"
#include "trainer/train.h"

namespace dhp {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::flip_tensor_byte;
using testing::run_dir;
using testing::small_config;

// Moments as a checkpoint holds them: the weight arena's layout, zeros where a parameter is
// frozen (it has none).
struct Moments {
  std::vector<float> m, v;
};

Moments random_moments(const ParamTable& table, uint64_t seed) {
  Rng rng(seed);
  Moments x{std::vector<float>(size_t(table.total()), 0.0f), std::vector<float>(size_t(table.total()), 0.0f)};
  for (const auto& p : table.specs())
    if (p.trainable)
      for (int64_t i = 0; i < p.numel(); ++i) {
        x.m[size_t(p.offset + i)] = float(rng.uniform() - 0.5);
        x.v[size_t(p.offset + i)] = float(rng.uniform());
      }
  return x;
}

OptimizerShard shard_of(const Communicator& comm, bool zero1) {
  return zero1 ? OptimizerShard{comm.rank(), comm.size()} : OptimizerShard{};
}

// Saves a checkpoint of step 7 with moments `x` on `world` ranks; returns its path.
std::string save_on(int world, bool zero1, const Config& cfg, const Moments& x) {
  std::string path;
  run_threaded(world, [&](Communicator& comm) {
    auto backend = make_cpu_backend({1});
    Model model(cfg.model, *backend, cfg.optim.groups);
    model.initialise(cfg.train.seed);
    AdamW opt(model.table(), cfg.optim, *backend, shard_of(comm, zero1));
    opt.upload_moments(x.m, x.v);
    opt.set_steps_taken(7);
    CheckpointManager checkpoints(cfg, comm);
    TrainState st;
    st.step = 7;
    st.seed = cfg.train.seed;
    const std::string p = checkpoints.save(model, opt, st, true);
    if (comm.rank() == 0) path = p;
  });
  return path;
}

// What `world` ranks load from `path`: the moments gathered, the step, the weights.
struct Loaded {
  Moments x;
  int64_t steps = 0;
  std::vector<float> params;
};

Loaded load_on(int world, bool zero1, const Config& cfg, const std::string& path) {
  Loaded out;
  run_threaded(world, [&](Communicator& comm) {
    auto backend = make_cpu_backend({1});
    Model model(cfg.model, *backend, cfg.optim.groups);
    AdamW opt(model.table(), cfg.optim, *backend, shard_of(comm, zero1));
    load_checkpoint(path, model, &opt);
    opt.gather_moments(comm);
    if (comm.rank() == 0) out = {{opt.download_m(), opt.download_v()}, opt.steps_taken(), model.download_params()};
  });
  return out;
}

TEST(CheckpointParts, MomentsReSliceBitExactlyOntoAnyWorldAndSharding) {
  const Config cfg = small_config(1, run_dir("parts_reslice_1"));
  const ParamTable table(cfg.model);
  const Moments x = random_moments(table, 3);
  std::vector<float> weights;
  for (const int saved : {2, 3}) {
    Config c = cfg;
    c.checkpoint.dir = (run_dir("parts_reslice_" + std::to_string(saved)) / "checkpoints").string();
    const std::string path = save_on(saved, true, c, x);
    for (int r = 0; r < saved; ++r) EXPECT_TRUE(fs::is_regular_file(moment_part_path(path, r, saved))) << r;
    for (const int world : {1, 2, 3, 4})
      for (const bool zero1 : {false, true}) {
        const Loaded got = load_on(world, zero1, c, path);
        EXPECT_TRUE(got.x.m == x.m && got.x.v == x.v) << saved << " -> " << world << (zero1 ? " sharded" : "");
        EXPECT_EQ(got.steps, 7);
        if (weights.empty()) weights = got.params;
        EXPECT_TRUE(got.params == weights);
      }
  }
}

// Since format 3 the parts hold the trained weights too (each rank's exact fp32 master of its
// range), and the main file the frozen ones alone: with the tower frozen, saved on 3 ranks
// under ZeRO-1, no trained weight is in the main file, and every world loads the weights the
// run had, bit for bit. The tower is 40 wide, so its norms are padded in the layouts
// (16-float alignment), frozen and trained. A model whose trained tensor has another shape is
// refused by name. A checkpoint of format 2 (the weights whole in the main file, the moments
// in parts), as dhp wrote it before, still loads.
TEST(CheckpointParts, TheTrainedWeightsAreInThePartsAndFormatTwoStillLoads) {
  Config cfg = small_config(1, run_dir("parts_weights"), {"--model.vision.dim=40"});
  cfg.optim.groups[ParamGroup::Vision].trainable = false;
  const ParamTable table(cfg.model, cfg.optim.groups);
  const Moments x = random_moments(table, 5);
  auto backend = make_cpu_backend({1});
  Model init(cfg.model, *backend, cfg.optim.groups);
  init.initialise(cfg.train.seed);
  const std::vector<float> w0 = init.download_params();
  const std::string path = save_on(3, true, cfg, x);
  {
    H5 file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    ASSERT_TRUE(file.ok());
    int in_main = 0;
    for (const ParamSpec& s : table.specs()) {
      const bool there = H5Lexists(file, ("params/" + s.name).c_str(), H5P_DEFAULT) > 0;
      EXPECT_EQ(there, !s.trainable) << s.name;
      in_main += there;
    }
    EXPECT_GT(in_main, 0);
  }
  for (const int world : {1, 2, 4}) {
    const Loaded got = load_on(world, true, cfg, path);
    EXPECT_TRUE(got.params == w0) << world << " ranks";
    EXPECT_TRUE(got.x.m == x.m && got.x.v == x.v) << world << " ranks";
  }
  {
    // Everything trains, padded tensors included: the moments re-slice through the padded layout.
    Config all = cfg;
    all.optim.groups[ParamGroup::Vision].trainable = true;
    all.checkpoint.dir = (run_dir("parts_weights_all") / "checkpoints").string();
    const Moments y = random_moments(ParamTable(all.model), 6);
    const std::string p = save_on(2, true, all, y);
    const Loaded got = load_on(3, true, all, p);
    EXPECT_TRUE(got.params == w0);
    EXPECT_TRUE(got.x.m == y.m && got.x.v == y.v);
  }
  Config wider = cfg;
  wider.model.ffn += 16;
  const std::string e = error_of([&] {
    auto be = make_cpu_backend({1});
    Model model(wider.model, *be, wider.optim.groups);
    load_checkpoint(path, model, nullptr);
  });
  EXPECT_NE(e.find("layers.0.mlp.w1.weight has shape ["), std::string::npos) << e;
  EXPECT_NE(e.find("the model expects ["), std::string::npos) << e;

  // Format 2, written as dhp wrote it before format 3.
  Config old = cfg;
  old.checkpoint.dir = (run_dir("parts_format2") / "checkpoints").string();
  fs::create_directories(old.checkpoint.dir);
  const fs::path main = fs::path(old.checkpoint.dir) / "step-00000007.h5";
  run_threaded(2, [&](Communicator& comm) {
    auto be = make_cpu_backend({1});
    Model model(old.model, *be, old.optim.groups);
    model.initialise(old.train.seed);
    AdamW opt(model.table(), old.optim, *be, shard_of(comm, true));
    opt.upload_moments(x.m, x.v);
    opt.set_steps_taken(7);
    const auto [begin, end] = AdamW::save_part(opt.compact_size(), comm.rank(), 2);
    std::vector<float> m(size_t(end - begin)), v(size_t(end - begin));
    opt.download_compact(begin, end - begin, m.data(), v.data());
    write_moment_part(moment_part_path(main, comm.rank(), 2), 7, comm.rank(), 2, begin, m, v, nullptr);
    const uint64_t mine[2] = {moment_checksum(m), moment_checksum(v)};
    MomentParts parts{2, false, std::vector<uint64_t>(4)};
    comm.all_gather(mine, parts.checksums.data(), 2, DataType::I64);
    TrainState st;
    st.step = 7;
    st.seed = old.train.seed;
    if (comm.rank() == 0) write_checkpoint_file(main, old, model, &opt, st, parts);
  });
  for (const int world : {1, 3}) {
    const Loaded got = load_on(world, true, old, main.string());
    EXPECT_TRUE(got.params == w0) << "format 2 on " << world << " ranks";
    EXPECT_TRUE(got.x.m == x.m && got.x.v == x.v) << "format 2 on " << world << " ranks";
    EXPECT_EQ(got.steps, 7);
  }
}

// A group frozen since the save drops its moments; one thawed since starts from zeros: the
// parts are mapped through the layout the checkpoint records, not the one the run has now.
TEST(CheckpointParts, AnotherFreezingMapsThePartsThroughTheRecordedLayout) {
  Config frozen = small_config(1, run_dir("parts_frozen"));
  frozen.optim.groups[ParamGroup::Vision].trainable = false;
  Config thawed = frozen;
  thawed.optim.groups[ParamGroup::Vision].trainable = true;
  const ParamTable table_frozen(frozen.model, frozen.optim.groups), table_thawed(thawed.model, thawed.optim.groups);
  ASSERT_LT(table_frozen.trainable_total(), table_thawed.trainable_total());
  // Saved thawed, loaded frozen: the vision moments are gone, the rest as saved.
  Config c = thawed;
  const Moments all = random_moments(table_thawed, 5);
  const std::string path = save_on(3, true, c, all);
  const Loaded dropped = load_on(2, true, frozen, path);
  for (const auto& p : table_frozen.specs())
    for (int64_t i = 0; i < p.numel(); ++i) {
      const size_t at = size_t(p.offset + i);
      ASSERT_EQ(dropped.x.m[at], p.trainable ? all.m[at] : 0.0f) << p.name;
      ASSERT_EQ(dropped.x.v[at], p.trainable ? all.v[at] : 0.0f) << p.name;
    }
  // Saved frozen, loaded thawed: what was saved, zeros for the thawed group.
  c = frozen;
  c.checkpoint.dir = (run_dir("parts_frozen_2") / "checkpoints").string();
  const Moments some = random_moments(table_frozen, 6);
  const Loaded grown = load_on(3, true, thawed, save_on(2, true, c, some));
  EXPECT_TRUE(grown.x.m == some.m && grown.x.v == some.v);
}

TEST(CheckpointParts, ADamagedMissingOrForeignPartIsRefusedByName) {
  const Config cfg = small_config(1, run_dir("parts_refused"));
  const ParamTable table(cfg.model);
  const std::string path = save_on(2, true, cfg, random_moments(table, 7));
  Config other = cfg;
  other.checkpoint.dir = (run_dir("parts_refused_other") / "checkpoints").string();
  const std::string foreign = save_on(2, true, other, random_moments(table, 8));
  const fs::path part1 = moment_part_path(path, 1, 2);
  EXPECT_EQ(part1.filename().string(), "step-00000007.optim-00001-of-00002.h5");
  auto load_error = [&](bool with_moments) {
    return error_of([&] {
      auto backend = make_cpu_backend({1});
      Model model(cfg.model, *backend);
      AdamW opt(model.table(), cfg.optim, *backend);
      load_checkpoint(path, model, with_moments ? &opt : nullptr);
    });
  };
  ASSERT_EQ(load_error(true), "");

  fs::copy_file(moment_part_path(foreign, 1, 2), part1, fs::copy_options::overwrite_existing);
  std::string e = load_error(true);
  EXPECT_NE(e.find("step-00000007.optim-00001-of-00002.h5' is not the one"), std::string::npos) << e;
  EXPECT_NE(e.find("belongs to another save"), std::string::npos) << e;

  fs::remove(part1);
  e = load_error(true);
  EXPECT_NE(e.find("part 1"), std::string::npos) << e;
  EXPECT_NE(e.find("is missing"), std::string::npos) << e;
  // The parts hold the trainable weights too: the weights alone (eval, generate, export,
  // --init) need them as well, and say so.
  e = load_error(false);
  EXPECT_NE(e.find("keeps its optimizer moments and trainable weights in 2 parts beside it and part 1"),
            std::string::npos) << e;
  EXPECT_NE(e.find("copy every step-00000007.optim-*.h5 with it"), std::string::npos) << e;

  const std::string again = save_on(2, true, cfg, random_moments(table, 7));
  ASSERT_EQ(again, path);
  flip_tensor_byte(part1.string(), "v");
  e = load_error(true);
  EXPECT_NE(e.find("checkpoint part '"), std::string::npos) << e;
  EXPECT_NE(e.find("does not match its checksum"), std::string::npos) << e;
  ASSERT_EQ(save_on(2, true, cfg, random_moments(table, 7)), path);
  flip_tensor_byte(part1.string(), "w");
  e = load_error(false);
  EXPECT_NE(e.find("step-00000007.optim-00001-of-00002.h5': w does not match its checksum"), std::string::npos) << e;
}

// Rank 1 cannot create its part (a folder, not empty, stands at its temporary's path): every
// rank leaves the save the same way. A periodic save returns "" on each and the run goes on; the
// save a run ends with throws on each, and the message names rank 1 and the stage. Nothing of
// the failed save is marked complete.
TEST(CheckpointParts, ARankThatCannotWriteItsPartFailsTheSaveOnEveryRank) {
  const Config cfg = small_config(1, run_dir("parts_rank_fails"));
  const Moments x = random_moments(ParamTable(cfg.model), 4);
  const fs::path dir = cfg.checkpoint.dir;
  const fs::path blocked = fs::path(moment_part_path(dir / "step-00000003.h5", 1, 2).string() + ".tmp");
  fs::create_directories(blocked);
  std::ofstream(blocked / "keep") << "x";
  // A periodic save, the last save, and a periodic save written in the background: that one
  // fails as it completes, at a poll after the step that started it.
  for (const auto& [last, async] : {std::pair{false, false}, std::pair{true, false}, std::pair{false, true}}) {
    Config c = cfg;
    c.checkpoint.async_save = async;
    std::vector<std::string> got(2, "unset");
    const std::string e = error_of([&] {
      run_threaded(2, [&](Communicator& comm) {
        auto backend = make_cpu_backend({1});
        Model model(c.model, *backend);
        AdamW opt(model.table(), c.optim, *backend, shard_of(comm, true));
        opt.upload_moments(x.m, x.v);
        CheckpointManager checkpoints(c, comm);
        TrainState st;
        st.step = 3;
        std::string message;
        try {
          got[size_t(comm.rank())] = checkpoints.save(model, opt, st, last);
          EXPECT_EQ(checkpoints.saving(), async);
          while (checkpoints.saving()) got[size_t(comm.rank())] = checkpoints.poll();
        } catch (const Error& e) {
          message = e.what();
        }
        if (!message.empty()) got[size_t(comm.rank())] = "threw: " + message;
      });
    });
    EXPECT_EQ(e, "");
    for (int r = 0; r < 2; ++r) {
      if (!last) {
        EXPECT_EQ(got[size_t(r)], "") << r;
        continue;
      }
      EXPECT_EQ(got[size_t(r)].rfind("threw: checkpoint of step 3 not saved", 0), 0u) << got[size_t(r)];
      EXPECT_NE(got[size_t(r)].find("the checkpoints before it are unchanged"), std::string::npos) << got[size_t(r)];
    }
    if (last) {
      EXPECT_NE(got[0].find("rank 1 failed while writing (its log says why)"), std::string::npos) << got[0];
      EXPECT_NE(got[1].find("cannot create checkpoint part"), std::string::npos) << got[1];
    }
    EXPECT_FALSE(fs::exists(dir / "step-00000003.done"));
    EXPECT_FALSE(fs::exists(dir / "step-00000003.h5"));
    EXPECT_FALSE(fs::exists(moment_part_path(dir / "step-00000003.h5", 0, 2)));
  }
}

// `dhp export` streams a checkpoint's weights from its files (CheckpointWeights: the frozen
// ones from the main file, the trained ones from the parts, one part in memory at a time)
// instead of loading the model: the same files, byte for byte, as an export of the loaded
// model; a damaged tensor or part is named. (A 152M-parameter checkpoint: 52 MB peak RSS against 1.81 GB, docs/checkpoints.md.)
TEST(CheckpointParts, AnExportStreamedFromTheFileIsTheLoadedModelsExport) {
  const Config cfg = small_config(1, run_dir("parts_export"));
  const std::string path = save_on(2, true, cfg, random_moments(ParamTable(cfg.model), 2));
  HfExportOptions streamed, loaded;
  streamed.dir = (run_dir("parts_export_streamed") / "hf").string();
  loaded.dir = (run_dir("parts_export_loaded") / "hf").string();
  {
    const CheckpointWeights weights(path);
    export_hf_checkpoint(cfg.model, ParamTable(cfg.model), [&](const ParamSpec& s, float* out) { weights.read(s, out); },
                         streamed);
  }
  auto backend = make_cpu_backend({1});
  Model model(cfg.model, *backend);
  load_checkpoint(path, model, nullptr);
  export_hf_checkpoint(model, loaded);
  int files = 0;
  for (const auto& e : fs::directory_iterator(loaded.dir)) {
    const std::string name = e.path().filename().string();
    if (name == "dhp.lock") continue;
    ++files;
    EXPECT_EQ(testing::read_text(e.path()), testing::read_text(fs::path(streamed.dir) / name)) << name;
  }
  EXPECT_GE(files, 3);
  // Every parameter trains here: its weights are in the parts, which a read verifies whole.
  flip_tensor_byte(moment_part_path(path, 1, 2).string(), "w");
  const ParamTable table(cfg.model);
  const std::string e = error_of([&] {
    const CheckpointWeights weights(path);
    for (const ParamSpec& s : table.specs()) {
      std::vector<float> x(size_t(s.numel()));
      weights.read(s, x.data());
    }
  });
  EXPECT_NE(e.find("optim-00001-of-00002.h5': w does not match its checksum"), std::string::npos) << e;
}

// What a run that stops on an error says it saved is the folder's newest complete checkpoint,
// not only what its loop saw returned: a save whose marker was written before a rank stopped
// answering in the save's last exchange threw, yet is complete. Renamed and unmarked files do
// not count.
TEST(CheckpointParts, TheNewestCompleteStepIsTheFoldersNotTheLoops) {
  const Config cfg = small_config(1, run_dir("parts_newest"));
  const std::string dir = cfg.checkpoint.dir;
  EXPECT_EQ(newest_complete_step(dir), 0);
  const ParamTable table(cfg.model);
  save_on(2, true, cfg, random_moments(table, 1));  // step 7
  EXPECT_EQ(newest_complete_step(dir), 7);
  fs::copy_file(fs::path(dir) / "step-00000007.h5", fs::path(dir) / "step-00000009.h5");
  testing::write_text(fs::path(dir) / "step-00000009.done", "9\n");  // renamed: its contents say 7
  fs::copy_file(fs::path(dir) / "step-00000007.h5", fs::path(dir) / "step-00000008.h5");  // no marker
  EXPECT_EQ(newest_complete_step(dir), 7);
}

TrainResult train_on(int n, const Config& cfg, const TrainOptions& o = {}) {
  TrainResult r0;
  run_threaded(n, [&](Communicator& comm) {
    TrainResult r = train(cfg, comm, o);
    if (comm.rank() == 0) r0 = r;
  });
  return r0;
}

// checkpoint.async_save: the periodic saves of a 2-rank run write their files in the
// background while training goes on, and hold what the saves written at once hold, bit for bit
// (the state was copied to the host before the next step changed it); the losses are the same,
// and the run's last save completes the one still being written.
TEST(CheckpointParts, ABackgroundSaveHoldsWhatASaveAtOnceHolds) {
  std::vector<double> losses[2];
  fs::path dirs[2];
  for (const bool async : {false, true}) {
    dirs[async] = run_dir(async ? "parts_async" : "parts_sync");
    const Config cfg = small_config(5, dirs[async], {"--checkpoint.every=2", "--checkpoint.keep=3",
                                                     fmt::format("--checkpoint.async_save={}", async),
                                                     "--eval.exact_match=false", "--data.val=",
                                                     "--parallel.refit=false"});  // the same plans
    for (const auto& s : train_on(2, cfg).steps) losses[async].push_back(s.loss);
  }
  EXPECT_EQ(losses[1], losses[0]);
  const Config cfg = small_config(5, dirs[0]);
  for (const char* name : {"step-00000002.h5", "step-00000004.h5", "step-00000005.h5"}) {
    std::vector<float> w[2], m[2], v[2];
    for (int async = 0; async < 2; ++async) {
      const fs::path path = dirs[async] / "checkpoints" / name;
      ASSERT_TRUE(fs::exists(fs::path(path).replace_extension(".done"))) << path;
      auto backend = make_cpu_backend({1});
      Model model(cfg.model, *backend);
      AdamW opt(model.table(), cfg.optim, *backend);
      load_checkpoint(path.string(), model, &opt);
      w[async] = model.download_params(), m[async] = opt.download_m(), v[async] = opt.download_v();
    }
    EXPECT_EQ(w[1], w[0]) << name;
    EXPECT_EQ(m[1], m[0]) << name;
    EXPECT_EQ(v[1], v[0]) << name;
  }
}

// Rank 0 holds block 0 and never reads part 1: without agreement it would resume from step 4
// while rank 1 fell back to step 2, and the ranks would train different steps.
TEST(CheckpointParts, OneRanksDamagedPartTurnsEveryRankToTheCheckpointBefore) {
  const auto dir = run_dir("parts_resume_damaged");
  const std::vector<std::string> extra = {"--checkpoint.every=2", "--checkpoint.keep=3", "--parallel.zero=1",
                                          "--eval.exact_match=false", "--data.val="};
  train_on(2, small_config(4, dir, extra));
  const fs::path ck = dir / "checkpoints";
  flip_tensor_byte(moment_part_path(ck / "step-00000004.h5", 1, 2).string(), "m");
  TrainOptions o;
  o.resume = "auto";
  const TrainResult r = train_on(2, small_config(6, dir, extra), o);
  ASSERT_FALSE(r.steps.empty());
  EXPECT_EQ(r.steps.front().step, 3);  // resumed after step 2, the step 4 checkpoint passed over
  EXPECT_EQ(r.last_step, 6);
}

// Rank 1 reaches the save 0.6 s after rank 0, far past parallel.timeout_s = 0.1 s: the save
// completes under checkpoint.timeout_s, and the step's limit is back in force after it. The
// same save under a limit shorter than the wait fails, naming the wait.
TEST(CheckpointParts, TheRanksWaitForASaveUnderItsOwnLimit) {
  auto attempt = [](double save_limit, const std::string& name) {
    Config cfg = small_config(1, run_dir(name), {"--parallel.timeout_s=0.1"});
    cfg.checkpoint.timeout_s = save_limit;
    const Moments x = random_moments(ParamTable(cfg.model), 9);
    return error_of([&] {
      run_threaded(
          2,
          [&](Communicator& comm) {
            auto backend = make_cpu_backend({1});
            Model model(cfg.model, *backend);
            AdamW opt(model.table(), cfg.optim, *backend, shard_of(comm, true));
            opt.upload_moments(x.m, x.v);
            CheckpointManager checkpoints(cfg, comm);
            if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(600));
            TrainState st;
            st.step = 1;
            DHP_CHECK(!checkpoints.save(model, opt, st, true).empty(), "rank {}: no path", comm.rank());
            if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(600));
            comm.barrier();
          },
          std::chrono::milliseconds(100));
    });
  };
  const std::string restored = attempt(30.0, "parts_limit_ok");
  // The save passed; the barrier after it, with rank 1 late again, ran under the step's limit.
  EXPECT_NE(restored.find("barrier"), std::string::npos) << restored;
  EXPECT_EQ(restored.find("not saved"), std::string::npos) << restored;
  const std::string short_limit = attempt(0.2, "parts_limit_short");
  EXPECT_NE(short_limit.find("checkpoint of step 1 not saved"), std::string::npos) << short_limit;
  EXPECT_NE(short_limit.find("0.2 s"), std::string::npos) << short_limit;
  EXPECT_EQ(short_limit.find("barrier"), std::string::npos) << short_limit;
}

}  // namespace
}  // namespace dhp
