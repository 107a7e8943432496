#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/check.h"
#include "tests/error_of.h"
#include "kernels/backend.h"
#include "data/config.h"
#include "parallel/cost_model.h"
#include "trainer/config.h"

namespace dhp {
namespace {

using testing::error_of;

TEST(Config, DefaultsWhenEmpty) {
  Config c = parse_config("", "empty.toml");
  EXPECT_EQ(c.model.dim, ModelConfig{}.dim);
  EXPECT_EQ(c.parallel.strategy, Strategy::dhp);
}

TEST(Config, ReadsSectionsAndNestedVision) {
  Config c = parse_config(
      "[model]\ndim = 96\nheads = 4\nkv_heads = 2\n[model.vision]\npatch = 8\nmerge = 1\n"
      "[optim]\nlr = 1\n[parallel]\nstrategy = \"pow2\"\n",
      "a.toml");
  EXPECT_EQ(c.model.dim, 96);
  EXPECT_EQ(c.model.vision.patch, 8);
  EXPECT_EQ(c.model.vision.merge, 1);
  EXPECT_DOUBLE_EQ(c.optim.lr, 1.0);  // an integer is accepted where a float is expected
  EXPECT_EQ(c.parallel.strategy, Strategy::pow2);
}

TEST(Config, OverridesWinAndAcceptBareStrings) {
  Config c = parse_config("[model]\ndim = 96\n", "a.toml",
                          {"--model.dim=64", "optim.lr=1e-4", "--optim.min_lr=1e-5", "--parallel.strategy=static",
                           "--log.progress=false", "--model.vision.layers=0"});
  EXPECT_EQ(c.model.dim, 64);
  EXPECT_DOUBLE_EQ(c.optim.lr, 1e-4);
  EXPECT_EQ(c.parallel.strategy, Strategy::static_layout);
  EXPECT_FALSE(c.log.progress);
  EXPECT_EQ(c.model.vision.layers, 0);
}

TEST(Config, UnknownKeyNamesFileLineKeyAndSuggests) {
  std::string msg = error_of([] { parse_config("[train]\nsteps = 3\nbatch_sise = 4\n", "run.toml"); });
  EXPECT_NE(msg.find("run.toml:3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("train.batch_sise"), std::string::npos) << msg;
  EXPECT_NE(msg.find("train.batch_size"), std::string::npos) << msg;
}

TEST(Config, UnknownSection) {
  std::string msg = error_of([] { parse_config("\n[trian]\nsteps = 3\n", "run.toml"); });
  EXPECT_NE(msg.find("run.toml:2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[trian]"), std::string::npos) << msg;
}

TEST(Config, WrongTypeNamesKeyAndType) {
  std::string msg = error_of([] { parse_config("[model]\n\ndim = \"big\"\n", "m.toml"); });
  EXPECT_NE(msg.find("m.toml:3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.dim"), std::string::npos) << msg;
  EXPECT_NE(msg.find("integer"), std::string::npos) << msg;
  msg = error_of([] { parse_config("[log]\nprogress = 1\n", "m.toml"); });
  EXPECT_NE(msg.find("boolean"), std::string::npos) << msg;
}

TEST(Config, OutOfRangeAndBadChoice) {
  std::string msg = error_of([] { parse_config("[checkpoint]\nkeep = 1\n", "c.toml"); });
  EXPECT_NE(msg.find("c.toml:2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("checkpoint.keep"), std::string::npos) << msg;
  EXPECT_NE(msg.find("out of range"), std::string::npos) << msg;
  msg = error_of([] { parse_config("[parallel]\nstrategy = \"ring\"\n", "c.toml"); });
  EXPECT_NE(msg.find("dhp, static, pow2"), std::string::npos) << msg;
}

TEST(Config, OverrideErrorsNameTheOverride) {
  std::string msg = error_of([] { parse_config("", "c.toml", {"--model.dimm=4"}); });
  EXPECT_NE(msg.find("--model.dimm=4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.dim"), std::string::npos) << msg;
  msg = error_of([] { parse_config("", "c.toml", {"--model.dim=wide"}); });
  EXPECT_NE(msg.find("integer"), std::string::npos) << msg;
  msg = error_of([] { parse_config("", "c.toml", {"--model.dim"}); });
  EXPECT_NE(msg.find("section.key=value"), std::string::npos) << msg;
}

TEST(Config, CrossKeyValidation) {
  std::string msg = error_of([] { parse_config("[model]\nheads = 6\nkv_heads = 4\ndim = 96\n", "x.toml"); });
  EXPECT_NE(msg.find("kv_heads"), std::string::npos) << msg;
}

TEST(Config, ComputeThreadsShareTheNodeBetweenLocalRanks) {
  Config c = parse_config("[train]\nthreads = 3\n", "t.toml");
  EXPECT_EQ(compute_threads(c), 3);
  c.train.threads = 0;
  const int all = compute_threads(c);
  EXPECT_GE(all, 1);
  ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  EXPECT_EQ(compute_threads(c), std::max(1, all / 2));
  ::unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
}

TEST(Config, MissingFile) {
  std::string msg = error_of([] { load_config("/nonexistent/dir/run.toml"); });
  EXPECT_NE(msg.find("/nonexistent/dir/run.toml"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not found"), std::string::npos) << msg;
}

TEST(Config, InvalidTomlNamesLine) {
  std::string msg = error_of([] { parse_config("[model]\ndim = = 3\n", "bad.toml"); });
  EXPECT_NE(msg.find("bad.toml:2"), std::string::npos) << msg;
}

TEST(Config, TomlRoundTripAndDemoConfigLoads) {
  Config a = parse_config("", "a.toml", {"--model.dim=80", "--data.train=x y.jsonl", "--optim.lr=0.25"});
  Config b = parse_config(to_toml(a), "b.toml");
  EXPECT_EQ(format_config(a), format_config(b));
  Config demo = load_config(std::string(DHP_SOURCE_DIR) + "/configs/demo.toml");
  EXPECT_GT(demo.train.steps, 0);
  // Every example in configs/ holds only keys dhp knows, with values it accepts.
  for (const auto& e : std::filesystem::directory_iterator(std::string(DHP_SOURCE_DIR) + "/configs"))
    if (e.path().extension() == ".toml") {
      EXPECT_NO_THROW(load_config(e.path().string())) << e.path();
    }
  const Config gpu = load_config(std::string(DHP_SOURCE_DIR) + "/configs/gpu.toml");
  EXPECT_EQ(gpu.train.precision, Precision::automatic);
  EXPECT_EQ(gpu.parallel.cost_profile, "auto");
  EXPECT_TRUE(gpu.checkpoint.async_save);
}

// Another data set never falls back to the demo's tokenizer or held-out set: what the file or
// the command line does not name is left unset (and training refuses a missing tokenizer).
TEST(Config, OtherDataNeverFallsBackToTheDemosTokenizerOrValidationSet) {
  const Config demo = parse_config("", "t.toml");
  EXPECT_EQ(demo.data.tokenizer, DataConfig{}.tokenizer);
  EXPECT_EQ(demo.data.val, DataConfig{}.val);
  const Config mine = parse_config("[data]\ntrain = \"mine/train.jsonl\"\n", "t.toml");
  EXPECT_EQ(mine.data.tokenizer, "");
  EXPECT_EQ(mine.data.val, "");
  const Config named = parse_config("[data]\ntrain = \"mine/train.jsonl\"\ntokenizer = \"data/demo/tokenizer.model\"\n",
                                    "t.toml", {"--data.val=data/demo/val.jsonl"});
  EXPECT_EQ(named.data.tokenizer, "data/demo/tokenizer.model");
  EXPECT_EQ(named.data.val, "data/demo/val.jsonl");
  EXPECT_EQ(parse_config("", "t.toml", {"--data.train=mine.jsonl"}).data.tokenizer, "");
}

// parallel.ranks_per_node is a count or "auto" (0 reads as auto, as earlier versions wrote it),
// written back as "auto".
TEST(Config, RanksPerNodeIsACountOrAuto) {
  EXPECT_EQ(parse_config("[parallel]\nranks_per_node = \"auto\"\n", "t.toml").parallel.ranks_per_node, 0);
  EXPECT_EQ(parse_config("[parallel]\nranks_per_node = 0\n", "t.toml").parallel.ranks_per_node, 0);
  EXPECT_EQ(parse_config("", "t.toml", {"--parallel.ranks_per_node=8"}).parallel.ranks_per_node, 8);
  EXPECT_EQ(parse_config("", "t.toml", {"--parallel.ranks_per_node=auto"}).parallel.ranks_per_node, 0);
  const Config d = parse_config("", "t.toml");
  EXPECT_NE(to_toml(d).find("ranks_per_node = \"auto\"\n"), std::string::npos) << to_toml(d);
  EXPECT_EQ(parse_config(to_toml(d), "b.toml").parallel.ranks_per_node, 0);
  const std::string word = error_of([] { parse_config("[parallel]\nranks_per_node = \"all\"\n", "t.toml"); });
  EXPECT_NE(word.find("t.toml:2: 'parallel.ranks_per_node' = \"all\" must be a number or \"auto\""), std::string::npos) << word;
  const std::string neg = error_of([] { parse_config("[parallel]\nranks_per_node = -2\n", "t.toml"); });
  EXPECT_NE(neg.find("out of range"), std::string::npos) << neg;
  const std::string type = error_of([] { parse_config("[parallel]\nranks_per_node = 2.5\n", "t.toml"); });
  EXPECT_NE(type.find("must be an integer or \"auto\""), std::string::npos) << type;
}

// train.precision and parallel.cost_profile default to what the device calls for, once the
// device is known; stated values stay. The CUDA device here is a stand-in registered under
// "cuda" (a CPU backend with an H200's name), so the choice is seen on a machine without one.
TEST(Config, PrecisionAndCostProfileFollowTheDevice) {
  Config cpu = parse_config("[train]\ndevice = \"cpu\"\n", "t.toml");
  EXPECT_EQ(cpu.train.precision, Precision::automatic);
  resolve_device_defaults(cpu, false);
  EXPECT_EQ(cpu.train.precision, Precision::fp32);
  EXPECT_EQ(cpu.parallel.cost_profile, "cpu");

  backend_registry().add("cuda", make_cpu_backend, [] { return std::string(); },
                         [](int) { return std::string("NVIDIA H200 NVL"); });
  Config gpu = parse_config("", "t.toml");
  resolve_device_defaults(gpu, false);
  EXPECT_EQ(gpu.train.device, "cuda");
  EXPECT_EQ(gpu.train.precision, Precision::bf16);
  EXPECT_EQ(gpu.parallel.cost_profile, "h200");
  const Config again = [&] { Config c = gpu; resolve_device_defaults(c, false); return c; }();
  EXPECT_EQ(format_config(again), format_config(gpu));
  Config stated = parse_config("[train]\nprecision = \"fp32\"\n[parallel]\ncost_profile = \"a100\"\n", "t.toml");
  resolve_device_defaults(stated, false);
  EXPECT_EQ(stated.train.precision, Precision::fp32);
  EXPECT_EQ(stated.parallel.cost_profile, "a100");

  std::string why;
  EXPECT_EQ(profile_for_device("NVIDIA H100 80GB HBM3", &why), "h100");
  EXPECT_EQ(profile_for_device("NVIDIA A100-SXM4-80GB", &why), "a100");
  EXPECT_EQ(profile_for_device("NVIDIA H800", &why), "h100");
  EXPECT_EQ(profile_for_device("NVIDIA GH200 480GB", &why), "h200");
  EXPECT_NE(why.find("H200"), std::string::npos) << why;
  EXPECT_EQ(profile_for_device("NVIDIA GeForce RTX 4090", &why), "h100");
  EXPECT_NE(why.find("no profile names the device"), std::string::npos) << why;
}

TEST(Config, TomlRoundTripKeepsQuotesAndBackslashesInStrings) {
  // Checkpoints store to_toml() and resume parses it back: strings must be escaped.
  Config a = parse_config("[data]\nimage_root = 'C:\\images\\new'\ntrain = 'say \"hi\".jsonl'\n", "a.toml");
  EXPECT_EQ(a.data.image_root, "C:\\images\\new");
  Config b = parse_config(to_toml(a), "b.toml");
  EXPECT_EQ(b.data.image_root, a.data.image_root);
  EXPECT_EQ(b.data.train, a.data.train);
}

// parallel.device was renamed parallel.cost_profile (it is not the device train.device picks);
// configs and checkpoints that still say parallel.device keep working.
TEST(Config, RenamedKeyIsStillRead) {
  Config c = parse_config("[parallel]\ndevice = \"h100\"\n", "old.toml");
  EXPECT_EQ(c.parallel.cost_profile, "h100");
  c = parse_config("", "a.toml", {"--parallel.device=a100"});
  EXPECT_EQ(c.parallel.cost_profile, "a100");
  EXPECT_EQ(parse_config(to_toml(c), "again.toml").parallel.cost_profile, "a100");
  EXPECT_EQ(to_toml(c).find("device = \"a100\""), std::string::npos);
}

// parallel.zero1 (a flag) became parallel.zero (the ZeRO stage): configurations and
// checkpoints that say zero1 = true or false read as stage 1 and 0; the new key takes the
// stages and no other value.
TEST(Config, TheZeroFlagReadsAsAStage) {
  EXPECT_EQ(parse_config("[parallel]\nzero1 = false\n", "old.toml").parallel.zero, 0);
  EXPECT_EQ(parse_config("[parallel]\nzero1 = true\n", "old.toml").parallel.zero, 1);
  EXPECT_EQ(parse_config("", "a.toml", {"--parallel.zero1=false"}).parallel.zero, 0);
  const Config c = parse_config("", "a.toml", {"--parallel.zero=2"});
  EXPECT_EQ(c.parallel.zero, 2);
  EXPECT_EQ(parse_config(to_toml(c), "again.toml").parallel.zero, 2);
  EXPECT_EQ(to_toml(c).find("zero1"), std::string::npos);
  EXPECT_EQ(parse_config("[parallel]\nzero = true\n", "a.toml").parallel.zero, 1);
  for (const char* bad : {"zero = 4", "zero = -1", "zero = \"2\"", "zero = 1.5"})
    EXPECT_THROW(parse_config(std::string("[parallel]\n") + bad + "\n", "bad.toml"), Error) << bad;
}

// Strategies and precisions are values parsed once; the resolved config writes their names.
TEST(Config, ChoicesAreParsedOnceAndWrittenByName) {
  Config c = parse_config("[train]\nprecision = \"bf16\"\n[parallel]\nstrategy = \"pow2\"\n", "a.toml");
  EXPECT_EQ(c.train.precision, Precision::bf16);
  EXPECT_EQ(c.parallel.strategy, Strategy::pow2);
  const Config back = parse_config(to_toml(c), "b.toml");
  EXPECT_EQ(back.train.precision, Precision::bf16);
  EXPECT_EQ(back.parallel.strategy, Strategy::pow2);
  EXPECT_NE(format_config(c).find("parallel.strategy"), std::string::npos);
  EXPECT_NE(format_config(c).find("\"pow2\""), std::string::npos);
  // dhp-waves is a reference for `dhp plan`, not a strategy a run can train with.
  EXPECT_THROW(parse_config("[parallel]\nstrategy = \"dhp-waves\"\n", "c.toml"), Error);
  EXPECT_THROW(parse_config("[train]\nprecision = 16\n", "d.toml"), Error);
}

// parallel.recompute was a flag: true and false still read (as full and off), in files and
// overrides; the modes read by name and are written by name; anything else names the choices.
TEST(Config, RecomputeReadsModesAndTheOldBoolean) {
  EXPECT_EQ(parse_config("", "a.toml").parallel.recompute, Recompute::off);
  EXPECT_EQ(parse_config("[parallel]\nrecompute = true\n", "a.toml").parallel.recompute, Recompute::full);
  EXPECT_EQ(parse_config("[parallel]\nrecompute = false\n", "a.toml").parallel.recompute, Recompute::off);
  EXPECT_EQ(parse_config("[parallel]\nrecompute = \"selective\"\n", "a.toml").parallel.recompute,
            Recompute::selective);
  EXPECT_EQ(parse_config("", "a.toml", {"--parallel.recompute=true"}).parallel.recompute, Recompute::full);
  EXPECT_EQ(parse_config("", "a.toml", {"--parallel.recompute=selective"}).parallel.recompute,
            Recompute::selective);
  EXPECT_EQ(parse_config("", "a.toml", {"--parallel.recompute=off"}).parallel.recompute, Recompute::off);
  Config c = parse_config("[parallel]\nrecompute = \"full\"\n", "a.toml");
  EXPECT_EQ(parse_config(to_toml(c), "b.toml").parallel.recompute, Recompute::full);
  std::string msg = error_of([] { parse_config("[parallel]\nrecompute = \"some\"\n", "c.toml"); });
  EXPECT_NE(msg.find("off, selective, full"), std::string::npos) << msg;
  msg = error_of([] { parse_config("[parallel]\nrecompute = 1\n", "c.toml"); });
  EXPECT_NE(msg.find("parallel.recompute"), std::string::npos) << msg;
  // Other choices take no boolean.
  EXPECT_THROW(parse_config("[parallel]\nstrategy = true\n", "c.toml"), Error);
  EXPECT_THROW(parse_config("", "c.toml", {"--parallel.strategy=true"}), Error);
}

// An override is one TOML value: a line break would let the rest become other keys or whole
// sections, which were dropped without a word.
TEST(Config, OverrideWithALineBreakIsRefused) {
  std::string msg = error_of([] { parse_config("", "a.toml", {"--train.steps=2\nbogus_key = 7"}); });
  EXPECT_NE(msg.find("must be a single TOML value"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;  // shown escaped
  msg = error_of([] { parse_config("", "a.toml", {"--train.steps=2\n[optim]\nlr = 9.5"}); });
  EXPECT_NE(msg.find("must be a single TOML value"), std::string::npos) << msg;
  msg = error_of([] { parse_config("", "a.toml", {"--optim.lr=0.5 bogus = 1"}); });
  EXPECT_FALSE(msg.empty());
}

// Type errors name the type given; a number too large for 64 bits is out of range; a table
// given to a key is named as such, not as an unknown section; a NUL in a value is named.
TEST(Config, MessagesNameWhatWasGiven) {
  std::string msg = error_of([] { parse_config("[train]\nsteps = 3.5\n", "t.toml"); });
  EXPECT_NE(msg.find("must be an integer, got a float"), std::string::npos) << msg;
  msg = error_of([] { parse_config("", "t.toml", {"--model.tie_embeddings=1"}); });
  EXPECT_NE(msg.find("must be a boolean (true or false), got an integer"), std::string::npos) << msg;
  msg = error_of([] { parse_config("", "t.toml", {"--train.steps=99999999999999999999"}); });
  EXPECT_NE(msg.find("out of range"), std::string::npos) << msg;
  msg = error_of([] { parse_config("[optim]\nlr = {x=1}\n", "t.toml"); });
  EXPECT_NE(msg.find("'optim.lr' must be a number, got a table"), std::string::npos) << msg;
  msg = error_of([] { parse_config("[checkpoint]\ndir = \"ck\\u0000evil\"\n", "t.toml"); });
  EXPECT_NE(msg.find("holds a NUL character: \"ck\\x00evil\""), std::string::npos) << msg;
}

// A config path that is a FIFO or a folder is named as such (a FIFO used to block forever).
TEST(Config, ConfigFileMustBeARegularFile) {
  const std::string dir = ::testing::TempDir() + "dhp_config_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string fifo = dir + "/c.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  std::string msg = error_of([&] { load_config(fifo); });
  EXPECT_NE(msg.find("is not a regular file"), std::string::npos) << msg;
  msg = error_of([&] { load_config(dir); });
  EXPECT_NE(msg.find("is a folder"), std::string::npos) << msg;
  std::filesystem::remove_all(dir);
}

// model.mrope_section: three integers splitting the head's rotary pairs, written back as read;
// a split that does not cover them, a fourth count or a fraction say what and where.
TEST(Config, MRopeSectionIsThreeCountsOfTheHeadsPairs) {
  const Config c = parse_config("[model]\ndim = 64\nheads = 2\nmrope_section = [6, 5, 5]\nmrope_interleaved = false\n",
                                "m.toml");
  EXPECT_EQ(c.model.mrope_section, (std::array<int, 3>{6, 5, 5}));
  EXPECT_TRUE(c.model.mrope());
  EXPECT_FALSE(c.model.mrope_interleaved);
  EXPECT_EQ(parse_config(to_toml(c), "again.toml").model.mrope_section, c.model.mrope_section);
  EXPECT_FALSE(parse_config("", "d.toml").model.mrope());
  std::string msg = error_of([] { parse_config("[model]\ndim = 64\nheads = 2\nmrope_section = [8, 8, 8]\n", "m.toml"); });
  EXPECT_NE(msg.find("model.mrope_section = [8, 8, 8] must split the head's 16 rotary pairs"), std::string::npos) << msg;
  msg = error_of([] { parse_config("[model]\nmrope_section = [8, 8, 8, 8]\n", "m.toml"); });
  EXPECT_NE(msg.find("m.toml:2: 'model.mrope_section' must hold 3 integers (temporal, height, width)"), std::string::npos)
      << msg;
  msg = error_of([] { parse_config("[model]\nmrope_section = [8.5, 8, 8]\n", "m.toml"); });
  EXPECT_NE(msg.find("an array of 3 integers"), std::string::npos) << msg;
  // Qwen2-VL's blocked split read as interleaved would give the axes 22, 21 and 21 pairs.
  msg = error_of([] { parse_config("[model]\ndim = 256\nheads = 2\nmrope_section = [16, 24, 24]\n", "m.toml"); });
  EXPECT_NE(msg.find("interleaved gives the axes 22, 21 and 21 pairs"), std::string::npos) << msg;
  EXPECT_TRUE(parse_config("[model]\ndim = 256\nheads = 2\nmrope_section = [16, 24, 24]\nmrope_interleaved = false\n",
                           "m.toml").model.mrope());
  EXPECT_TRUE(parse_config("[model]\ndim = 256\nheads = 2\nmrope_section = [24, 20, 20]\n", "m.toml").model.mrope());
}

// A pooling head or post_layernorm held on a tower whose row has none is refused by name.
TEST(Config, HeldTowerPartsOnlyWhereTheRowHasThem) {
  std::string msg = error_of([] {
    parse_config("[model.vision]\narch = \"clip\"\nimage_size = 28\npool_head = true\n", "v.toml");
  });
  EXPECT_NE(msg.find("model.vision.pool_head is set, but a clip tower has no pooling head"), std::string::npos) << msg;
  msg = error_of([] { parse_config("[model.vision]\npost_norm = true\n", "v.toml"); });
  EXPECT_NE(msg.find("model.vision.post_norm is set, but a native tower holds no post_layernorm"), std::string::npos)
      << msg;
  EXPECT_TRUE(parse_config("[model.vision]\narch = \"siglip\"\nimage_size = 28\npool_head = true\npost_norm = true\n",
                           "v.toml").model.vision.pool_head);
}

TEST(Config, VisionTowerKeysAndTheirDefaultsByArch) {
  Config native = parse_config("", "v.toml");
  EXPECT_EQ(native.model.vision.arch, VisionArch::native);
  EXPECT_EQ(native.model.vision.pixel_mean, kClipPixelMean);
  EXPECT_EQ(native.model.vision.projector_gelu(), ProjectorAct::gelu_tanh);
  Config clip = parse_config(
      "[model.vision]\narch = \"clip\"\nimage_size = 56\npatch = 14\nlayers = 3\nmerge = 1\n"
      "resize = \"pad_square\"\n",
      "v.toml");
  EXPECT_EQ(clip.model.vision.pixel_std, kClipPixelStd);
  EXPECT_EQ(clip.model.vision.layers_run(), 2);  // feature_layer -2 of 3 layers
  EXPECT_EQ(clip.model.vision.pos_rows(), 4 * 4 + 1);
  EXPECT_EQ(clip.model.vision.projector_gelu(), ProjectorAct::gelu);
  Config siglip = parse_config(
      "[model.vision]\narch = \"siglip\"\nimage_size = 28\npatch = 14\nact = \"gelu_tanh\"\n"
      "feature_layer = -1\nnorm_eps = 1e-6\n",
      "v.toml");
  EXPECT_EQ(siglip.model.vision.pixel_mean, kSiglipPixelMean);
  EXPECT_EQ(siglip.model.vision.pixel_std, kSiglipPixelStd);
  EXPECT_EQ(siglip.model.vision.pos_rows(), 4);
  EXPECT_EQ(siglip.model.vision.layers_run(), 1);
  // Set constants win over the arch's; the round trip keeps every key.
  Config set = parse_config("[model.vision]\narch = \"siglip\"\nimage_size = 28\n"
                            "pixel_mean = [0.25, 1, 0.5]\n", "v.toml",
                            {"--model.vision.pixel_std=[0.1,0.2,0.3]"});
  EXPECT_EQ(set.model.vision.pixel_mean, (std::array<double, 3>{0.25, 1.0, 0.5}));
  EXPECT_EQ(set.model.vision.pixel_std, (std::array<double, 3>{0.1, 0.2, 0.3}));
  Config back = parse_config(to_toml(set), "back.toml");
  EXPECT_EQ(to_toml(back), to_toml(set));
  EXPECT_EQ(back.model.vision.pixel_mean, set.model.vision.pixel_mean);
}

TEST(Config, VisionTowerErrorsSayWhatAndWhere) {
  const std::string tower = "[model.vision]\narch = \"clip\"\npatch = 14\nlayers = 2\n";
  std::string msg = error_of([&] { parse_config(tower, "t.toml"); });
  EXPECT_NE(msg.find("t.toml"), std::string::npos) << msg;
  EXPECT_NE(msg.find("needs model.vision.image_size"), std::string::npos) << msg;
  msg = error_of([&] { parse_config(tower + "image_size = 30\n", "t.toml"); });
  EXPECT_NE(msg.find("image_size (30) must be a multiple of model.vision.patch (14)"),
            std::string::npos) << msg;
  msg = error_of([&] { parse_config(tower + "image_size = 28\nfeature_layer = -4\n", "t.toml"); });
  EXPECT_NE(msg.find("feature_layer = -4 names no hidden state of a 2-layer tower"),
            std::string::npos) << msg;
  msg = error_of([&] { parse_config(tower + "image_size = 28\nfeature_layer = 3\n", "t.toml"); });
  EXPECT_NE(msg.find("feature_layer = 3"), std::string::npos) << msg;
  EXPECT_NO_THROW(parse_config(tower + "image_size = 28\nfeature_layer = -3\n", "t.toml"));
  EXPECT_NO_THROW(parse_config(tower + "image_size = 28\nfeature_layer = 2\n", "t.toml"));
  msg = error_of([&] { parse_config("[model.vision]\narch = \"vit\"\n", "t.toml"); });
  EXPECT_NE(msg.find("t.toml:2: 'model.vision.arch' = \"vit\" is not one of: native, clip, siglip"),
            std::string::npos) << msg;
  msg = error_of([&] { parse_config(tower + "image_size = 28\nact = \"relu\"\n", "t.toml"); });
  EXPECT_NE(msg.find("'model.vision.act' = \"relu\" is not one of: quick_gelu, gelu_tanh, gelu"),
            std::string::npos) << msg;
  msg = error_of([&] { parse_config(tower + "image_size = 28\npixel_mean = [0.5, 0.5]\n", "t.toml"); });
  EXPECT_NE(msg.find("t.toml:6: 'model.vision.pixel_mean' must hold 3 numbers (R, G, B), got 2"),
            std::string::npos) << msg;
  msg = error_of([&] { parse_config(tower + "image_size = 28\npixel_std = [0.5, 0, 0.5]\n", "t.toml"); });
  EXPECT_NE(msg.find("'model.vision.pixel_std' = 0 is out of range"), std::string::npos) << msg;
  msg = error_of([&] { parse_config(tower + "image_size = 28\npixel_mean = 0.5\n", "t.toml"); });
  EXPECT_NE(msg.find("'model.vision.pixel_mean' must be an array of 3 numbers, got a float"),
            std::string::npos) << msg;
  msg = error_of([&] { parse_config(tower + "image_size = 28\nnorm_eps = 0\n", "t.toml"); });
  EXPECT_NE(msg.find("'model.vision.norm_eps' = 0 is out of range"), std::string::npos) << msg;
  // pad_square needs a side that the merge divides; the native tower takes no HF folder.
  msg = error_of([&] {
    parse_config("[model.vision]\npatch = 14\nmerge = 2\nresize = \"pad_square\"\nimage_size = 42\n", "t.toml");
  });
  EXPECT_NE(msg.find("image_size (42) must be a positive multiple of patch x merge (28)"),
            std::string::npos) << msg;
  // A folder brings the tower's arch and shape: its checks wait until the folder is read.
  const Config folder = parse_config("[model.vision]\narch = \"clip\"\ninit = \"/m/clip\"\n", "t.toml");
  EXPECT_EQ(folder.model.vision.init, "/m/clip");
  msg = error_of([&] { validate(folder, true); });
  EXPECT_NE(msg.find("needs model.vision.image_size"), std::string::npos) << msg;
  // The native tower keeps its 2-D RoPE rule; the pretrained towers have no RoPE.
  msg = error_of([&] { parse_config("[model.vision]\ndim = 36\nheads = 6\n", "t.toml"); });
  EXPECT_NE(msg.find("multiple of 4 for 2-D RoPE"), std::string::npos) << msg;
  EXPECT_NO_THROW(parse_config(tower + "image_size = 28\ndim = 36\nheads = 6\n", "t.toml"));
}

}  // namespace
}  // namespace dhp
