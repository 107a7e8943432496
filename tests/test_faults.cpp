// Bad input and faults, tried as a hostile user would: every failure is a clear error that
// comes early, and no work is lost. Most cases run the real executable (DHP_BINARY) and look
// at its exit status and message, because "exit 1 with a message" rather than an abort, a
// segfault or a hang is exactly what is being tested.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/check.h"
#include "data/build.h"
#include "data/dataset.h"
#include "data/image.h"
#include "data/shard_format.h"
#include "data/tokenizer.h"
#include "parallel/mpi_comm.h"
#include "parallel/threaded_comm.h"
#include "tests/error_of.h"
#include "tests/run_dhp.h"
#include "tests/train_fixture.h"
#include "trainer/agreement.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"
#include "trainer/limits.h"
#include "trainer/metrics.h"
#include "trainer/run_lock.h"
#include "trainer/train.h"
#include "trainer/weights.h"

namespace dhp {
namespace {

namespace fs = std::filesystem;
using testing::contains;
using testing::error_of;
using testing::Outcome;
using testing::read_text;
using testing::run_dhp;
using testing::run_dir;
using testing::small_config;
using testing::synth_dir;
using testing::write_text;

// A run configuration file holding `cfg`, for the executable.
std::string config_file(const Config& cfg, const fs::path& dir) {
  write_text(dir / "run.toml", to_toml(cfg));
  return (dir / "run.toml").string();
}

// ---- lose no work ------------------------------------------------------------------------

TEST(Faults, UnwritableCheckpointDirFailsBeforeTheFirstStep) {
  auto world = start_world(nullptr, nullptr);
  Communicator& comm = *world;
  const auto dir = run_dir("unwritable");
  write_text(dir / "a_file", "x");
  const std::string metrics = (dir / "metrics.jsonl").string();
  const Config cfg = small_config(3, dir, {"--checkpoint.dir=" + (dir / "a_file" / "ck").string(),
                                           "--log.metrics=" + metrics});
  const std::string msg = error_of([&] { train(cfg, comm); });
  EXPECT_TRUE(contains(msg, "checkpoint.dir") && contains(msg, "a_file")) << msg;
  EXPECT_FALSE(fs::exists(metrics)) << "the run started training before finding the folder unusable";
  // The executable: exit 1 with the message, not an abort after training.
  const Outcome r = run_dhp("train -c " + config_file(cfg, dir), dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "dhp: error: checkpoint.dir")) << r.output;
  EXPECT_FALSE(contains(r.output, "step     1")) << r.output;
  // An empty folder name is a configuration error.
  const std::string empty = error_of([&] { small_config(3, dir, {"--checkpoint.dir="}); });
  EXPECT_TRUE(contains(empty, "checkpoint.dir is empty")) << empty;
}

TEST(Faults, DiskFullDuringASaveReportsTheReasonAndCleansUp) {
  const auto dir = run_dir("diskfull");
  // A file size limit makes every write past it fail (EFBIG) as a full disk does (ENOSPC).
  // 30000 blocks (15 MB in 512-byte blocks, 30 MB in 1 KiB ones) leave room for MPI's
  // start-up files but not for a checkpoint of this wider model (about 54 MB). The executable
  // ignores SIGXFSZ, so the write fails instead of the signal killing the process.
  const Config cfg = small_config(4, dir, {"--checkpoint.every=2", "--eval.exact_match=false",
                                           "--model.dim=384", "--model.ffn=1536", "--log.level=info"});
  const Outcome r = run_dhp("train -c " + config_file(cfg, dir), dir, "ulimit -f 30000;");
  EXPECT_EQ(r.status, 1) << r.output;  // not 139 (a crash in HDF5 at exit)
  EXPECT_TRUE(contains(r.output, "File too large")) << r.output;  // the operating system's reason
  // The save at step 2 failed, training went on, and the final save is the error.
  EXPECT_TRUE(contains(r.output, "checkpoint of step 2 not saved")) << r.output;
  EXPECT_TRUE(contains(r.output, "training goes on")) << r.output;
  EXPECT_TRUE(contains(r.output, "step     4/4")) << r.output;
  EXPECT_TRUE(contains(r.output, "dhp: error: checkpoint of step 4 not saved")) << r.output;
  for (const auto& e : fs::directory_iterator(dir / "checkpoints"))
    EXPECT_NE(e.path().extension(), ".tmp") << "a partial checkpoint was left behind: " << e.path();
}

TEST(Faults, ARealFullDiskIsFoundBeforeWriting) {
  // A real full file system needs a mount: done as root (a 2 MiB tmpfs), skipped otherwise.
  const auto dir = run_dir("realfull");
  const fs::path mnt = dir / "mnt";
  fs::create_directories(mnt);
  if (::geteuid() != 0 || std::system(("mount -t tmpfs -o size=2m tmpfs " + mnt.string() + " 2>/dev/null").c_str()) != 0)
    GTEST_SKIP() << "needs root to mount a small tmpfs";
  const Config cfg = small_config(4, dir, {"--checkpoint.every=2", "--eval.exact_match=false",
                                           "--checkpoint.dir=" + (mnt / "ck").string()});
  write_text(mnt / "fill", std::string(1500 * 1024, 'x'));  // about 0.5 MiB stays free
  const Outcome r = run_dhp("train -c " + config_file(cfg, dir), dir);
  std::system(("umount " + mnt.string()).c_str());
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "No space left on device")) << r.output;
  EXPECT_TRUE(contains(r.output, "dhp: error: checkpoint of step 4 not saved")) << r.output;
}

TEST(Faults, TemporariesOfInterruptedSavesAreRemoved) {
  auto world = start_world(nullptr, nullptr);
  Communicator& comm = *world;
  const auto dir = run_dir("stale_tmp");
  const Config cfg = small_config(1, dir, {"--eval.exact_match=false"});
  fs::create_directories(cfg.checkpoint.dir);
  // What a save killed half-way leaves behind; on a nearly full disk it blocks the next one.
  const fs::path stale = fs::path(cfg.checkpoint.dir) / "step-00000007.h5.tmp";
  write_text(stale, std::string(1 << 20, 'x'));
  write_text(fs::path(cfg.checkpoint.dir) / "notes.tmp", "mine");
  train(cfg, comm);
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(fs::path(cfg.checkpoint.dir) / "notes.tmp"));  // not a checkpoint's
}

// torchrun starts N copies with WORLD_SIZE and RANK but no MPI world: each would train the
// whole job alone. The executable stops before reading anything and says how to launch it;
// WORLD_SIZE=1 (or none) is an ordinary one-process run.
TEST(Faults, ATorchrunLaunchWithoutMpiStopsAtOnceSayingHow) {
  const auto dir = run_dir("torchrun");
  const Config cfg = small_config(1, dir);
  const std::string env = "export WORLD_SIZE=4 RANK=1 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500;";
  const Outcome r = run_dhp("train -c " + config_file(cfg, dir), dir, env);
  EXPECT_EQ(r.status, 1) << r.output;
  for (const char* part : {"rank 1 of WORLD_SIZE=4", "not by an MPI launcher", "mpirun -np 4 dhp train", "srun --mpi=pmix"})
    EXPECT_TRUE(contains(r.output, part)) << part << "\n" << r.output;
  EXPECT_FALSE(fs::exists(cfg.checkpoint.dir)) << "it must stop before the run starts";
  const Outcome one = run_dhp("train -c " + config_file(cfg, dir), dir, "export WORLD_SIZE=1 RANK=0;");
  EXPECT_EQ(one.status, 0) << one.output;
}

// A wrong image folder for part of the data: more than data.max_skipped of the records lost
// stops the run, with the reasons counted; under the share, or with it raised, the run trains.
TEST(Faults, ARunThatSkipsMoreThanMaxSkippedStopsNamingTheReasons) {
  auto world = start_world(nullptr, nullptr);
  const auto dir = run_dir("max_skipped");
  std::ifstream in(synth_dir() / "train.jsonl");
  std::ofstream out(dir / "train.jsonl");
  int n = 0;
  for (std::string line; std::getline(in, line) && n < 40; ++n) {
    // Every fifth record's image in a folder that is not there: 8 of 40, 20%.
    if (n % 5 == 0) line.replace(line.find("\"images/"), 8, "\"elsewhere/");
    out << line << "\n";
  }
  out.close();
  const std::vector<std::string> o = {"--data.train=" + (dir / "train.jsonl").string(),
                                      "--data.image_root=" + synth_dir().string(), "--data.val="};
  const std::string msg = error_of([&] { train(small_config(1, dir, o), *world); });
  for (const char* part : {"data.train", "8 of its 40 records were skipped (20.0%, more than data.max_skipped = 5.0%)",
                           "data.max_skipped"})
    EXPECT_TRUE(contains(msg, part)) << part << "\n" << msg;
  std::vector<std::string> raised = o;
  raised.push_back("--data.max_skipped=0.25");
  EXPECT_EQ(train(small_config(1, dir, raised), *world).last_step, 1);
}

// data.tokenizer forgotten with one's own data: named as missing, never the demo's taken.
TEST(Faults, AForgottenTokenizerIsNamedNotTakenFromTheDemo) {
  const auto dir = run_dir("no_tokenizer");
  write_text(dir / "x.toml", std::string(testing::kSmallModelToml) + "[data]\ntrain = \"" +
                                 (testing::synth_dir() / "train.jsonl").string() + "\"\n");
  const Outcome r = run_dhp("train -c " + (dir / "x.toml").string() + " --checkpoint.dir=" + (dir / "ck").string(), dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "data.tokenizer is not set")) << r.output;
  EXPECT_FALSE(fs::exists(dir / "ck")) << "it must stop before the run starts";
}

// Slurm, by the environment srun gives its tasks: a plain `srun` (no MPI plugin) starts tasks
// with no MPI world, refused as torchrun's are; a batch script's own process (SLURM_NTASKS of
// the allocation, no step of many tasks) runs; `srun --mpi=pmix` hands the tasks PMIx's
// variables, which make them MPI ranks (the launcher test of tests/mpi_lib.sh covers those).
TEST(Faults, APlainSrunWithoutAnMpiPluginStopsAtOnceSayingHow) {
  const auto dir = run_dir("srun");
  Config cfg = small_config(1, dir);
  const std::string task = "export SLURM_JOB_ID=77 SLURM_NTASKS=8 SLURM_STEP_NUM_TASKS=8 SLURM_PROCID=5 "
                           "SLURM_LOCALID=1 SLURM_NTASKS_PER_NODE=4 SLURM_NODEID=1;";
  const Outcome r = run_dhp("train -c " + config_file(cfg, dir), dir, task);
  EXPECT_EQ(r.status, 1) << r.output;
  for (const char* part : {"rank 5 of SLURM_STEP_NUM_TASKS=8", "srun without an MPI plugin", "srun --mpi=pmix"})
    EXPECT_TRUE(contains(r.output, part)) << part << "\n" << r.output;
  EXPECT_FALSE(fs::exists(cfg.checkpoint.dir)) << "it must stop before the run starts";
  cfg.checkpoint.every = 0;
  const Outcome batch = run_dhp("train -c " + config_file(cfg, dir) + " --log.level=info", dir,
                                "export SLURM_JOB_ID=77 SLURM_NTASKS=8 SLURM_PROCID=0 SLURM_LOCALID=0;");
  EXPECT_EQ(batch.status, 0) << batch.output;
}

// Colour escapes only where asked for or on a terminal: a log captured to a file (here, and
// under mpirun in tests/mpi_lib.sh's train_run) holds none; a wrong value is named.
TEST(Faults, LogColourIsOffUnlessATerminalOrAsked) {
  const auto dir = run_dir("colour");
  Config cfg = small_config(1, dir);
  cfg.checkpoint.every = 0;
  const Outcome plain = run_dhp("train -c " + config_file(cfg, dir) + " --log.metrics= --log.level=info", dir);
  EXPECT_EQ(plain.status, 0) << plain.output;
  EXPECT_TRUE(contains(plain.output, "[info]")) << plain.output;
  EXPECT_FALSE(contains(plain.output, "\033[")) << plain.output;
  fs::remove_all(cfg.checkpoint.dir);
  const Outcome asked = run_dhp("train -c " + config_file(cfg, dir) + " --log.metrics= --log.level=info --log.color=always", dir);
  EXPECT_EQ(asked.status, 0) << asked.output;
  EXPECT_TRUE(contains(asked.output, "\033[")) << asked.output;
  const Outcome wrong = run_dhp("train -c " + config_file(cfg, dir) + " --log.color=sometimes", dir);
  EXPECT_EQ(wrong.status, 1) << wrong.output;
  EXPECT_TRUE(contains(wrong.output, "log.color")) << wrong.output;
}

TEST(Faults, SecondRunOnTheSameFolderIsRefusedNamingTheHolder) {
  auto world = start_world(nullptr, nullptr);
  Communicator& comm = *world;
  const auto dir = run_dir("lock");
  const Config cfg = small_config(1, dir);
  {
    RunLock first(cfg.checkpoint.dir);
    const std::string msg = error_of([&] { train(cfg, comm); });
    EXPECT_TRUE(contains(msg, "in use by another run")) << msg;
    EXPECT_TRUE(contains(msg, "pid " + std::to_string(::getpid()))) << msg;
    // The executable is refused the same way while this process holds the folder.
    const Outcome r = run_dhp("train -c " + config_file(cfg, dir), dir);
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_TRUE(contains(r.output, "pid " + std::to_string(::getpid()))) << r.output;
    EXPECT_TRUE(list_checkpoints(cfg.checkpoint.dir).empty());
  }
  // Released when its holder ends: the folder is usable again.
  EXPECT_NO_THROW(train(cfg, comm));
}

TEST(Faults, ResumeTrustsTheRecordedStepNotTheFileName) {
  auto world = start_world(nullptr, nullptr);
  Communicator& comm = *world;
  const auto dir = run_dir("renamed");
  const Config cfg = small_config(2, dir, {"--checkpoint.every=1", "--eval.exact_match=false"});
  train(cfg, comm);
  const fs::path ck = cfg.checkpoint.dir;
  const auto real = list_checkpoints(ck.string());
  ASSERT_EQ(real.size(), 2u);
  // Step 1's file under step 9's name, with a marker: it must not win.
  fs::copy_file(ck / "step-00000001.h5", ck / "step-00000009.h5");
  write_text(ck / "step-00000009.done", "9\n");
  EXPECT_EQ(list_checkpoints(ck.string()), real);
  EXPECT_EQ(resolve_checkpoint("auto", ck.string()), real.back());
  // A resumed run saves step 3 and its retention keeps the real newest two.
  TrainOptions o;
  o.resume = "auto";
  const TrainResult r = train(small_config(3, dir, {"--checkpoint.every=1", "--eval.exact_match=false"}), comm, o);
  EXPECT_EQ(r.last_step, 3);
  const auto after = list_checkpoints(ck.string());
  ASSERT_EQ(after.size(), 2u);
  EXPECT_EQ(after[0], real.back());
  EXPECT_EQ(load_checkpoint(after[1], *std::make_unique<Model>(cfg.model, *make_cpu_backend({1})), nullptr).step, 3);
}

// A small run of `steps` steps trained in `dir`; the options that name its checkpoint.
std::string trained_checkpoint(const fs::path& dir, int64_t steps) {
  auto world = start_world(nullptr, nullptr);
  const Config cfg = small_config(steps, dir, {"--eval.exact_match=false"});
  train(cfg, *world);
  return "--checkpoint auto --dir " + cfg.checkpoint.dir;
}

TEST(Faults, FailedWritesOfResultsAreNeverSilent) {
  const auto dir = run_dir("silent");
  const std::string ck = trained_checkpoint(dir, 2);
  // A full device: an error before any work (a device is never written through, see
  // OutputsNeverReplaceWhatDhpDidNotWrite).
  Outcome r = run_dhp("eval " + ck + " --json /dev/full", dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--json") && contains(r.output, "is a device")) << r.output;
  // A folder that does not exist: the write fails, with the option and the system's reason.
  r = run_dhp("eval " + ck + " --json " + (dir / "no" / "such" / "r.json").string(), dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--json") && contains(r.output, "No such file or directory")) << r.output;
  // data stats --csv past the file size limit (4 KiB: above the command's own output, below
  // the 240 rows' CSV of about 6 KB): the write fails with the system's reason.
  r = run_dhp("data stats --data " + (synth_dir() / "train.jsonl").string() + " --csv " +
              (dir / "l.csv").string() + " --data.tokenizer=" + (synth_dir() / "tokenizer.model").string(),
              dir, "ulimit -f 8;");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "File too large")) << r.output;
  // Metrics on a device: refused before the first step (a device is never written through).
  const Config m = small_config(3, run_dir("silent_metrics"), {"--log.metrics=/dev/full",
                                                              "--log.level=info",
                                                              "--eval.exact_match=false"});
  r = run_dhp("train -c " + config_file(m, dir), dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "log.metrics '/dev/full' is a device")) << r.output;
}

// A metrics write that fails mid-run (here past the file size limit): a warning, once, and
// training goes on without the file.
TEST(Faults, AFailedMetricsWriteWarnsOnceAndTrainingGoesOn) {
  const auto dir = run_dir("metrics_limit");
  std::ostringstream logs;
  const auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(logs)));
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit old_limit{};
  ::getrlimit(RLIMIT_FSIZE, &old_limit);
  {
    MetricsFile metrics((dir / "m.jsonl").string(), true, 0);
    rlimit small = old_limit;
    small.rlim_cur = 4096;
    ::setrlimit(RLIMIT_FSIZE, &small);
    for (int step = 1; step <= 200; ++step) metrics.write(nlohmann::json{{"step", step}, {"pad", std::string(100, 'x')}});
    ::setrlimit(RLIMIT_FSIZE, &old_limit);
  }
  std::signal(SIGXFSZ, old_handler);
  spdlog::set_default_logger(previous);
  const std::string text = logs.str();
  const size_t first = text.find("log.metrics: writing");
  EXPECT_NE(first, std::string::npos) << text;
  EXPECT_TRUE(contains(text, "File too large")) << text;
  EXPECT_EQ(text.find("log.metrics: writing", first + 1), std::string::npos) << text;
  EXPECT_LE(fs::file_size(dir / "m.jsonl"), 4096u);
}

TEST(Faults, AReplacedTokenizerIsRefused) {
  auto world = start_world(nullptr, nullptr);
  Communicator& comm = *world;
  const auto dir = run_dir("tokenizer");
  const fs::path tok = dir / "tok.model";
  fs::copy_file(synth_dir() / "tokenizer.model", tok);
  const Config cfg = small_config(1, dir, {"--data.tokenizer=" + tok.string(), "--eval.exact_match=false"});
  train(cfg, comm);
  // Same path, other contents: a tokenizer trained on other text.
  train_tokenizer({"completely different words", "nothing about circles or squares here"}, 120,
                  tok.string());
  const std::string ck = "--checkpoint auto --dir " + cfg.checkpoint.dir;
  Outcome r = run_dhp("eval " + ck, dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "another tokenizer")) << r.output;
  write_text(dir / "img.png", read_text(synth_dir() / "images" / "val-000000.png"));
  r = run_dhp("generate " + ck + " --image " + (dir / "img.png").string(), dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "another tokenizer")) << r.output;
  TrainOptions o;
  o.resume = "auto";
  const std::string msg = error_of([&] { train(small_config(2, dir, {"--data.tokenizer=" + tok.string()}), comm, o); });
  EXPECT_TRUE(contains(msg, "another tokenizer")) << msg;
}

// ---- crashes and hangs on bad input ------------------------------------------------------

TEST(Faults, DataBuildTakesABareManifestFileName) {
  const auto dir = run_dir("bare");
  const Outcome r = run_dhp("data build --manifest val.jsonl --tokenizer tokenizer.model --out " +
                            (dir / "out").string(),
                        dir, "cd " + synth_dir().string() + " &&");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir / "out" / kIndexFile)) << r.output;
}

TEST(Faults, SamplingOptionsAndOversizedImagesAreValidated) {
  auto world = start_world(nullptr, nullptr);
  Communicator& comm = *world;
  const auto dir = run_dir("sampling");
  const Config cfg = small_config(1, dir, {"--eval.exact_match=false"});
  train(cfg, comm);
  const std::string img = (synth_dir() / "images" / "val-000000.png").string();
  const std::string base = "generate --checkpoint auto --dir " + cfg.checkpoint.dir + " --image " + img;
  for (const std::string bad : {"--temperature nan", "--temperature inf", "--temperature -1",
                                 "--temperature 0.7 --top-p nan", "--top-p 0", "--max-tokens 0"}) {
    const Outcome r = run_dhp(base + " " + bad, dir);
    EXPECT_EQ(r.status, 1) << bad << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, "dhp: error: --")) << bad << "\n" << r.output;
  }
  EXPECT_EQ(run_dhp(base + " --temperature 0.7 --top-p 0.9 --max-tokens 4", dir).status, 0);
  // A seed below zero (it wrapped to 2^64 - 1), a prompt that is not UTF-8 (the data path
  // refuses such text too), and a KV cache larger than the machine, named by its option.
  Outcome r = run_dhp(base + " --temperature 1 --seed -1", dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--seed -1: must be 0 or more")) << r.output;
  r = run_dhp(base + " --prompt \"$(printf \"\\377\\376bad\")\"", dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--prompt is not valid UTF-8: \"\\xff\\xfebad\"")) << r.output;
  r = run_dhp(base + " --max-tokens 2000000000", dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--max-tokens 2000000000 needs a KV cache of") && contains(r.output, "fit"))
      << r.output;

  // A PNG whose header claims 20000 x 20000 pixels is refused from the header alone, before
  // the decoder allocates gigabytes for it.
  std::string png = read_text(img);
  auto be32 = [&](size_t at, uint32_t v) {
    for (int k = 0; k < 4; ++k) png[at + k] = char((v >> (24 - 8 * k)) & 0xff);
  };
  be32(16, 20000);
  be32(20, 20000);
  write_text(dir / "huge.png", png);
  r = run_dhp("generate --checkpoint auto --dir " + cfg.checkpoint.dir + " --image " + (dir / "huge.png").string(),
              dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "20000x20000")) << r.output;
  const std::string msg = error_of([&] { load_image((dir / "huge.png").string(), cfg.model.vision, kDefaultMaxImagePixels); });
  EXPECT_TRUE(contains(msg, "huge.png") && contains(msg, "data.max_image_pixels")) << msg;
}

TEST(Faults, BatchSizesAreCheckedAgainstDataAndMemory) {
  auto world = start_world(nullptr, nullptr);
  Communicator& comm = *world;
  const auto dir = run_dir("batch");
  const std::string msg = error_of([&] { train(small_config(1, dir, {"--train.batch_size=1000000000"}), comm); });
  EXPECT_TRUE(contains(msg, "train.batch_size = 1000000000") && contains(msg, "240 samples")) << msg;
  // The memory bound, with a machine of 1 MB.
  const Config cfg = small_config(1, dir, {"--train.batch_size=200"});
  Tokenizer tok(cfg.data.tokenizer);
  const auto ds = open_dataset(cfg.data.train, cfg.data, tok, cfg.model.vision);
  const std::string mem = error_of([&] { check_batch_fits(cfg, *ds, 1'000'000); });
  EXPECT_TRUE(contains(mem, "GB") && contains(mem, "lower train.batch_size")) << mem;
  EXPECT_NO_THROW(check_batch_fits(cfg, *ds, int64_t(1) << 34));
}

TEST(Faults, MalformedSafetensorsHeadersAreErrors) {
  const auto dir = run_dir("safetensors");
  const Config cfg = small_config(1, dir);
  auto backend = make_cpu_backend({1});
  Model m(cfg.model, *backend);
  // A header length of 2^64 - 1.
  {
    std::ofstream out(dir / "len.safetensors", std::ios::binary);
    const uint64_t n = ~uint64_t(0);
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << "{}";
  }
  std::string msg = error_of([&] { load_weights((dir / "len.safetensors").string(), m); });
  EXPECT_TRUE(contains(msg, "bad header length")) << msg;
  // data_offsets given as floats: 0.5 must not silently become 0.
  export_safetensors(m, cfg, (dir / "ok.safetensors").string(), (dir / "config.json").string());
  std::string bytes = read_text(dir / "ok.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  std::string header = bytes.substr(8, n);
  const std::string first = "\"data_offsets\":[0,";
  const auto at = header.find(first);
  ASSERT_NE(at, std::string::npos) << header;
  header.replace(at, first.size(), "\"data_offsets\":[0.5,");
  const std::string padded = header + std::string((8 - header.size() % 8) % 8, ' ');
  const uint64_t n2 = padded.size();
  std::string out(reinterpret_cast<const char*>(&n2), 8);
  write_text(dir / "float.safetensors", out + padded + bytes.substr(8 + n));
  msg = error_of([&] { load_weights((dir / "float.safetensors").string(), m); });
  EXPECT_TRUE(contains(msg, "data_offsets") && contains(msg, "integers")) << msg;
}

TEST(Faults, OutputPathsThatCannotBeWrittenAreErrors) {
  auto world = start_world(nullptr, nullptr);
  Communicator& comm = *world;
  const auto dir = run_dir("outputs");
  const Config cfg = small_config(1, dir, {"--eval.exact_match=false"});
  train(cfg, comm);
  write_text(dir / "file", "x");
  const std::string ck = "--checkpoint auto --dir " + cfg.checkpoint.dir;
  Outcome r = run_dhp("export " + ck + " -o " + (dir / "file" / "m.safetensors").string(), dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "dhp: error:") && contains(r.output, "file/m.safetensors")) << r.output;
  fs::create_directories(dir / "exp");
  r = run_dhp("export " + ck + " -o " + (dir / "exp").string() + "/", dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(fs::is_empty(dir / "exp")) << "export left a file behind in the folder";
  // log.metrics under a regular file.
  const Config m = small_config(1, run_dir("outputs_metrics"), {"--log.metrics=" + (dir / "file" / "m.jsonl").string()});
  r = run_dhp("train -c " + config_file(m, dir), dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "dhp: error: log.metrics")) << r.output;
}

TEST(Faults, AFifoGivenAsAnImageIsRefusedNotWaitedOn) {
  const auto dir = run_dir("fifo");
  fs::create_directories(dir / "images");
  ASSERT_EQ(::mkfifo((dir / "images" / "pipe.png").c_str(), 0644), 0);
  fs::copy_file(synth_dir() / "images" / "val-000000.png", dir / "images" / "ok.png");
  write_text(dir / "m.jsonl",
             "{\"id\": \"pipe\", \"image\": \"images/pipe.png\", \"conversations\": [{\"from\": "
             "\"human\", \"value\": \"<image>\"}, {\"from\": \"gpt\", \"value\": \"a circle.\"}]}\n"
             "{\"id\": \"ok\", \"image\": \"images/ok.png\", \"conversations\": [{\"from\": "
             "\"human\", \"value\": \"<image>\"}, {\"from\": \"gpt\", \"value\": \"a circle.\"}]}\n");
  const Outcome r = run_dhp("data build --manifest " + (dir / "m.jsonl").string() + " --tokenizer " +
                            (synth_dir() / "tokenizer.model").string() + " --out " + (dir / "out").string(),
                        dir);
  ASSERT_NE(r.status, 124) << "the build hung on the FIFO";
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(read_text(dir / "out" / kReportFile), "not a regular file"));
  // The JSONL path refuses it too, without blocking.
  Tokenizer tok((synth_dir() / "tokenizer.model").string());
  JsonlDataset ds((dir / "m.jsonl").string(), "", tok, ImageGeometry{}, 4096, "skip");
  EXPECT_EQ(ds.size(), 1);
}

TEST(Faults, FoldersGivenAsFilesAreErrors) {
  const auto dir = run_dir("folders");
  std::string msg = error_of([&] { load_config(dir.string()); });
  EXPECT_TRUE(contains(msg, "is a folder")) << msg;
  Tokenizer tok((synth_dir() / "tokenizer.model").string());
  msg = error_of([&] { JsonlDataset(dir.string(), "", tok, ImageGeometry{}, 4096, "skip"); });
  EXPECT_TRUE(contains(msg, "is a folder")) << msg;
  BuildOptions o;
  o.manifest = dir.string();
  o.out_dir = (dir / "out").string();
  o.tokenizer = (synth_dir() / "tokenizer.model").string();
  msg = error_of([&] { build_dataset(o); });
  EXPECT_TRUE(contains(msg, "is a folder")) << msg;
  const Outcome r = run_dhp("train -c " + dir.string(), dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "is a folder")) << r.output;
}

// Zeroes the stored bytes of every image of a built data set, so that every sample fails its
// checksum when loaded (after indexing, as data going bad on disk would).
void damage_every_image(const fs::path& built) {
  const ShardIndex x = read_index(built.string());
  for (int64_t shard = 0; shard < x.n_shards(); ++shard) {
    const fs::path file = built / shard_file_name(shard);
    std::string bytes = read_text(file);
    const int64_t base = x.extents[size_t(shard * kExtentCols + kBytesOffset)];
    for (int64_t i = 0; i < x.size(); ++i) {
      if (x.shard[size_t(i)] != shard) continue;
      for (int64_t k = x.at(i, kImageBegin); k < x.at(i, kImageEnd); ++k)
        std::fill(bytes.begin() + base + x.image(k, kByteBegin), bytes.begin() + base + x.image(k, kByteEnd), '\0');
    }
    write_text(file, bytes);
  }
}

// The held-out set built into dir/built with every stored image then damaged; its path.
std::string built_and_damaged(const fs::path& dir) {
  BuildOptions o;
  o.manifest = (synth_dir() / "val.jsonl").string();
  o.out_dir = (dir / "built").string();
  o.tokenizer = (synth_dir() / "tokenizer.model").string();
  o.vision = small_config(1, dir).model.vision;
  o.progress = false;
  EXPECT_TRUE(build_dataset(o).complete);
  damage_every_image(dir / "built");
  return o.out_dir;
}

TEST(Faults, NoUsableSampleInAStepOrAnEvaluationIsAnError) {
  auto world = start_world(nullptr, nullptr);
  Communicator& comm = *world;
  const auto dir = run_dir("allbad");
  const std::string built = built_and_damaged(dir);
  std::string msg = error_of([&] {
    train(small_config(2, dir, {"--data.train=" + built, "--data.val=", "--data.on_error=skip"}), comm);
  });
  EXPECT_TRUE(contains(msg, "step 1") && contains(msg, "none of its 16 samples")) << msg;
  EXPECT_TRUE(list_checkpoints((dir / "checkpoints").string()).empty());
  // Evaluation on the same data: no "ppl 0.00" over zero tokens.
  const Config good = small_config(1, dir, {"--checkpoint.dir=" + (dir / "good").string(),
                                            "--eval.exact_match=false"});
  train(good, comm);
  const Outcome r = run_dhp("eval --checkpoint auto --dir " + good.checkpoint.dir + " --data " + built, dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "none of the")) << r.output;
}

TEST(Faults, DivergenceCausesAreNamed) {
  auto world = start_world(nullptr, nullptr);
  Communicator& comm = *world;
  const auto dir = run_dir("nan");
  std::string msg = error_of([&] { small_config(1, dir, {"--optim.eps=0"}); });
  EXPECT_TRUE(contains(msg, "optim.eps must be positive")) << msg;
  const Config cfg = small_config(1, dir);
  auto backend = make_cpu_backend({1});
  Model m(cfg.model, *backend);
  m.initialise(1);
  const auto& spec = m.table().specs()[2];
  m.params()[spec.offset + 1] = std::numeric_limits<float>::quiet_NaN();
  export_safetensors(m, cfg, (dir / "nan.safetensors").string(), (dir / "config.json").string());
  TrainOptions o;
  o.init = (dir / "nan.safetensors").string();
  msg = error_of([&] { train(cfg, comm, o); });
  EXPECT_TRUE(contains(msg, "non-finite") && contains(msg, spec.name)) << msg;
  EXPECT_FALSE(contains(msg, "lower optim.lr")) << msg;
}

TEST(Faults, StopAfterMustBeAStepThisRunReaches) {
  const auto dir = run_dir("stopafter");
  const std::string conf = config_file(small_config(2, dir), dir);
  for (const std::string bad : {"0", "-3"}) {
    const Outcome r = run_dhp("train -c " + conf + " --stop-after " + bad, dir);
    EXPECT_EQ(r.status, 1) << bad << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, "--stop-after " + bad)) << r.output;
  }
  // Past the last step: it would never be reached.
  const Outcome past = run_dhp("train -c " + conf + " --stop-after 50", dir);
  EXPECT_EQ(past.status, 1) << past.output;
  EXPECT_TRUE(contains(past.output, "--stop-after 50 is past the last step of this run (train.steps = 2)"))
      << past.output;
  auto world = start_world(nullptr, nullptr);
  Communicator& comm = *world;
  TrainOptions first;
  first.stop_after = 2;
  train(small_config(4, dir, {"--eval.exact_match=false"}), comm, first);
  TrainOptions again;
  again.resume = "auto";
  again.stop_after = 1;
  const std::string msg = error_of([&] { train(small_config(4, dir), comm, again); });
  EXPECT_TRUE(contains(msg, "--stop-after 1")) << msg;
}

// ---- data hygiene ------------------------------------------------------------------------

std::string line_with(const std::string& id, const std::string& image_field, int images) {
  std::string human;
  for (int i = 0; i < images; ++i) human += "<image> ";
  return "{\"id\": \"" + id + "\", \"image\": " + image_field +
         ", \"conversations\": [{\"from\": \"human\", \"value\": \"" + human +
         "\"}, {\"from\": \"gpt\", \"value\": \"a red circle.\"}]}\n";
}

TEST(Faults, ImagePathsStayInsideTheImageRoot) {
  const auto dir = run_dir("confine");
  const fs::path root = dir / "root", outside = dir / "outside.png";
  fs::create_directories(root / "images");
  const std::string png = read_text(synth_dir() / "images" / "val-000000.png");
  write_text(outside, png);
  write_text(root / "images" / "ok.png", png);
  fs::create_symlink(outside, root / "images" / "link.png");
  fs::create_symlink(root / "images" / "ok.png", root / "images" / "inner.png");
  std::string m;
  m += line_with("ok", "\"images/ok.png\"", 1);
  m += line_with("inner-link", "\"images/inner.png\"", 1);  // a symlink within the root is fine
  m += line_with("dotdot", "\"../outside.png\"", 1);
  m += line_with("deep", "\"images/../../outside.png\"", 1);
  m += line_with("absolute", "\"" + outside.string() + "\"", 1);
  m += line_with("symlink-out", "\"images/link.png\"", 1);
  m += line_with("nul", "\"images/ok.png\\u0000.txt\"", 1);
  write_text(root / "m.jsonl", m);
  const std::string manifest = (root / "m.jsonl").string();
  Tokenizer tok((synth_dir() / "tokenizer.model").string());
  ModelConfig mc;
  JsonlDataset ds(manifest, "", tok, mc.vision, 4096, "skip");
  EXPECT_EQ(ds.size(), 2);
  EXPECT_EQ(ds.skipped(), (std::map<std::string, int64_t>{{"bad image path", 5}}));
  // Allowed explicitly, absolute paths are read; relative ones stay confined.
  JsonlDataset abs(manifest, "", tok, mc.vision, 4096, "skip", kDefaultMaxImagePixels, true);
  EXPECT_EQ(abs.size(), 3);
  // The build never embeds a file from outside the root.
  BuildOptions o;
  o.manifest = manifest;
  o.out_dir = (dir / "out").string();
  o.tokenizer = (synth_dir() / "tokenizer.model").string();
  o.progress = false;
  const BuildSummary s = build_dataset(o);
  EXPECT_EQ(s.samples, 2);
  EXPECT_EQ(s.skipped.at("bad image path"), 5);
}

TEST(Faults, JsonlAndShardPathsAcceptTheSameLines) {
  const auto dir = run_dir("samelines");
  fs::create_directories(dir / "images");
  std::string jpg;
  for (const auto& e : fs::directory_iterator(synth_dir() / "images"))
    if (e.path().extension() == ".jpg" && jpg.empty()) jpg = read_text(e.path());
  ASSERT_FALSE(jpg.empty());
  write_text(dir / "images" / "ok.jpg", jpg);
  write_text(dir / "images" / "cut.jpg", jpg.substr(0, jpg.size() * 6 / 10));
  write_text(dir / "m.jsonl", line_with("ok", "\"images/ok.jpg\"", 1) + line_with("cut", "\"images/cut.jpg\"", 1));
  Tokenizer tok((synth_dir() / "tokenizer.model").string());
  JsonlDataset ds((dir / "m.jsonl").string(), "", tok, ImageGeometry{}, 4096, "skip");
  BuildOptions o;
  o.manifest = (dir / "m.jsonl").string();
  o.out_dir = (dir / "out").string();
  o.tokenizer = (synth_dir() / "tokenizer.model").string();
  o.progress = false;
  const BuildSummary s = build_dataset(o);
  EXPECT_EQ(ds.size(), s.samples);
  EXPECT_EQ(ds.skipped(), s.skipped);
  EXPECT_EQ(ds.skipped(), (std::map<std::string, int64_t>{{"corrupt image", 1}}));
}

TEST(Faults, AListUnderImageIsAccepted) {
  const auto dir = run_dir("imagelist");
  fs::create_directories(dir / "images");
  fs::copy_file(synth_dir() / "images" / "train-000000.png", dir / "images" / "a.png");
  fs::copy_file(synth_dir() / "images" / "train-000001.png", dir / "images" / "b.png");
  write_text(dir / "m.jsonl", line_with("two", "[\"images/a.png\", \"images/b.png\"]", 2) +
                                  line_with("one", "[\"images/a.png\"]", 1) +
                                  line_with("bad", "[\"images/a.png\", 3]", 2));
  Tokenizer tok((synth_dir() / "tokenizer.model").string());
  JsonlDataset ds((dir / "m.jsonl").string(), "", tok, ImageGeometry{}, 4096, "skip");
  ASSERT_EQ(ds.size(), 2);
  EXPECT_EQ(ds.load(0, false).images.size(), 2u);
  EXPECT_EQ(ds.load(1, false).images.size(), 1u);
  EXPECT_EQ(ds.skipped(), (std::map<std::string, int64_t>{{"bad format", 1}}));
}

// Outputs never replace or write through what dhp did not write: a device, FIFO or folder is
// refused, and so is another program's file (a user's notes, a config.json beside the export)
// unless --force; an earlier output of the same command is replaced.
TEST(Faults, OutputsNeverReplaceWhatDhpDidNotWrite) {
  const auto dir = run_dir("foreign_outputs");
  const std::string ck = trained_checkpoint(dir, 1);
  auto is_fifo = [](const fs::path& p) { return fs::status(p).type() == fs::file_type::fifo; };
  // A FIFO (and, as root, a device node like /dev/null) at -o: refused and left as it was.
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0644), 0);
  Outcome r = run_dhp("export " + ck + " -o " + (dir / "fifo").string(), dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "is a FIFO")) << r.output;
  EXPECT_TRUE(is_fifo(dir / "fifo"));
  if (::geteuid() == 0) {
    ASSERT_EQ(::mknod((dir / "null").c_str(), S_IFCHR | 0666, makedev(1, 3)), 0);
    r = run_dhp("export " + ck + " -o " + (dir / "null").string(), dir);
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_TRUE(contains(r.output, "is a device")) << r.output;
    EXPECT_EQ(fs::status(dir / "null").type(), fs::file_type::character);
  }
  // Another program's file at -o, and another tool's config.json beside it.
  fs::create_directories(dir / "notes");
  write_text(dir / "notes" / "notes.txt", "keep\n");
  r = run_dhp("export " + ck + " -o " + (dir / "notes" / "notes.txt").string(), dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "not an earlier output") && contains(r.output, "--force")) << r.output;
  EXPECT_EQ(read_text(dir / "notes" / "notes.txt"), "keep\n");
  EXPECT_FALSE(fs::exists(dir / "notes" / "config.json"));
  fs::create_directories(dir / "hf");
  write_text(dir / "hf" / "config.json", "{\"mine\":1}\n");
  r = run_dhp("export " + ck + " -o " + (dir / "hf" / "w.safetensors").string(), dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "config.json")) << r.output;
  EXPECT_EQ(read_text(dir / "hf" / "config.json"), "{\"mine\":1}\n");
  EXPECT_FALSE(fs::exists(dir / "hf" / "w.safetensors"));
  // An earlier export is ours to replace; --force replaces another program's file.
  const std::string exp = (dir / "exp" / "model.safetensors").string();
  EXPECT_EQ(run_dhp("export " + ck + " -o " + exp, dir).status, 0);
  r = run_dhp("export " + ck + " -o " + exp, dir);
  EXPECT_EQ(r.status, 0) << r.output;
  r = run_dhp("export " + ck + " -o " + (dir / "hf" / "w.safetensors").string() + " --force", dir);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(read_text(dir / "hf" / "config.json"), "{\"mine\":1}\n");
  // The other result files follow the same rule, checked before any work is done.
  r = run_dhp("eval " + ck + " --json " + (dir / "fifo").string(), dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--json") && contains(r.output, "is a FIFO")) << r.output;
  r = run_dhp("eval " + ck + " --json " + (dir / "notes" / "notes.txt").string(), dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_EQ(read_text(dir / "notes" / "notes.txt"), "keep\n");
  r = run_dhp("profile --quick --repeats 1 --out " + (dir / "fifo").string(), dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--out") && contains(r.output, "is a FIFO")) << r.output;
  r = run_dhp("data stats --data " + (synth_dir() / "val.jsonl").string() + " --csv " +
              (dir / "notes" / "notes.txt").string() + " --data.tokenizer=" +
              (synth_dir() / "tokenizer.model").string(), dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_EQ(read_text(dir / "notes" / "notes.txt"), "keep\n");
  EXPECT_TRUE(is_fifo(dir / "fifo"));
}

// A safetensors file the format forbids is refused, never half-believed: a name given twice
// (the JSON library would keep the last), overlapping or out-of-order data, a gap, bytes after
// the last tensor, a header length past the end; and no message echoes raw bytes.
TEST(Faults, SafetensorsThatBreakTheFormatAreRefused) {
  const auto dir = run_dir("safetensors_format");
  const Config cfg = small_config(1, dir);
  auto backend = make_cpu_backend({1});
  Model m(cfg.model, *backend);
  export_safetensors(m, cfg, (dir / "ok.safetensors").string(), (dir / "config.json").string());
  const std::string bytes = read_text(dir / "ok.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const std::string header = bytes.substr(8, n), data = bytes.substr(8 + n);
  // A file with `head` as its header (padded to 8 bytes) and `tail` as its data.
  auto write = [&](const std::string& name, std::string head, const std::string& tail) {
    head += std::string((8 - head.size() % 8) % 8, ' ');
    const uint64_t len = head.size();
    write_text(dir / name, std::string(reinterpret_cast<const char*>(&len), 8) + head + tail);
    return error_of([&] { load_weights((dir / name).string(), m); });
  };
  EXPECT_EQ(write("same.safetensors", header, data), "");  // the control: as exported, it loads
  const nlohmann::json h = nlohmann::json::parse(header);
  const std::string wk = "layers.0.attn.wk.weight", wv = "layers.0.attn.wv.weight";
  ASSERT_TRUE(h.contains(wk) && h.contains(wv));
  // wk a second time, pointing at wv's bytes (appended after the first).
  std::string dup = header.substr(0, header.rfind('}')) + ",\"" + wk + "\":" + h[wv].dump() + "}";
  std::string msg = write("dup.safetensors", dup, data);
  EXPECT_TRUE(contains(msg, "'" + wk + "' appears twice")) << msg;
  // wv reading wk's bytes: two tensors over the same bytes, and a gap where wv's were.
  nlohmann::json over = h;
  over[wv]["data_offsets"] = h[wk]["data_offsets"];
  msg = write("overlap.safetensors", over.dump(), data);
  EXPECT_TRUE(contains(msg, "overlaps")) << msg;
  msg = write("trailing.safetensors", header, data + "extra bytes");
  EXPECT_TRUE(contains(msg, "11 bytes after the last tensor")) << msg;
  // Every tensor moved 4 bytes on: a gap at the start.
  nlohmann::json gap = h;
  for (auto& [name, t] : gap.items())
    if (name != "__metadata__") t["data_offsets"] = {t["data_offsets"][0].get<int64_t>() + 4, t["data_offsets"][1].get<int64_t>() + 4};
  msg = write("gap.safetensors", gap.dump(), std::string(4, '\0') + data);
  EXPECT_TRUE(contains(msg, "a gap of 4 bytes")) << msg;
  // A header length past the end of the file, and a header of binary bytes.
  {
    std::ofstream out(dir / "long.safetensors", std::ios::binary);
    const uint64_t len = 4096;
    out.write(reinterpret_cast<const char*>(&len), 8);
    out << "{}";
  }
  msg = error_of([&] { load_weights((dir / "long.safetensors").string(), m); });
  EXPECT_TRUE(contains(msg, "4096 exceeds the file's 10 bytes")) << msg;
  msg = write("binary.safetensors", std::string("{\"a\x01\xff\xfe"), "");
  EXPECT_TRUE(contains(msg, "not valid JSON (at byte")) << msg;
  EXPECT_EQ(msg.find('\xff'), std::string::npos) << msg;
}

// An --init path that is a folder or a FIFO is named as what it is, not "not found" (and a
// FIFO is never opened, where it would block).
TEST(Faults, InitPathThatIsNotAFileIsNamed) {
  const auto dir = run_dir("init_path");
  const Config cfg = small_config(1, dir);
  auto backend = make_cpu_backend({1});
  Model m(cfg.model, *backend);
  fs::create_directories(dir / "folder");
  ASSERT_EQ(::mkfifo((dir / "w.fifo").c_str(), 0644), 0);
  std::string msg = error_of([&] { load_weights((dir / "folder").string(), m); });
  EXPECT_TRUE(contains(msg, "is a folder")) << msg;
  msg = error_of([&] { load_weights((dir / "w.fifo").string(), m); });
  EXPECT_TRUE(contains(msg, "is not a regular file")) << msg;
  msg = error_of([&] { load_weights((dir / "none.safetensors").string(), m); });
  EXPECT_TRUE(contains(msg, "not found")) << msg;
}

// log.metrics is never destroyed: a second run on the same file is refused while the first
// holds it; a fresh run moves an earlier run's records aside instead of truncating them; a
// resume drops only the records after its step; a file that is not dhp metrics is refused.
TEST(Faults, MetricsFilesAreLockedAndNeverTruncated) {
  const auto dir = run_dir("metrics_rules");
  const std::string m = (dir / "m.jsonl").string();
  {
    MetricsFile first(m, true, 0);
    first.write(nlohmann::json{{"step", 1}});
    const std::string msg = error_of([&] { MetricsFile second(m, true, 0); });
    EXPECT_TRUE(contains(msg, "is in use by another run") && contains(msg, "pid")) << msg;
  }
  // A fresh run: the earlier records move to m.jsonl.1.
  write_text(m, "{\"step\":1}\n{\"step\":2}\n");
  { MetricsFile fresh(m, true, 0); }
  EXPECT_EQ(read_text(dir / "m.jsonl.1"), "{\"step\":1}\n{\"step\":2}\n");
  EXPECT_EQ(read_text(m), "");
  // A resume from step 2: steps up to 2 stay, a damaged line among them too, step 3 goes.
  write_text(m, "{\"step\":1}\n{\"st\x01\n{\"step\":2}\n{\"eval\":\"val\",\"step\":2}\n{\"step\":3}\n");
  { MetricsFile resumed(m, true, 2); }
  EXPECT_EQ(read_text(m), "{\"step\":1}\n{\"st\x01\n{\"step\":2}\n{\"eval\":\"val\",\"step\":2}\n");
  // Not metrics: refused and left as it was, on a fresh run and on a resume.
  const std::string notes = "my notes\n" + std::string(64, '\xff') + "\n";
  write_text(dir / "notes.jsonl", notes);
  for (int64_t step : {0, 5}) {
    const std::string msg = error_of([&] { MetricsFile bad((dir / "notes.jsonl").string(), true, step); });
    EXPECT_TRUE(contains(msg, "log.metrics") && contains(msg, "not an earlier output")) << msg;
    EXPECT_EQ(read_text(dir / "notes.jsonl"), notes);
  }
}

// A data or evaluation error that stops a run of one rank saves the trained state first (an
// emergency save), so the steps since the last checkpoint are not lost; the message says where.
TEST(Faults, AnErrorThatStopsTheRunSavesTheStateFirst) {
  auto world = start_world(nullptr, nullptr);
  Communicator& comm = *world;
  const auto dir = run_dir("emergency");
  // A held-out set whose stored images went bad after it was built: its evaluation at step 2
  // fails in on_error = "fail" mode, after two steps trained and none saved.
  const Config cfg = small_config(4, dir, {"--data.val=" + built_and_damaged(dir), "--data.on_error=fail",
                                           "--eval.every=2", "--checkpoint.every=0", "--eval.exact_match=false"});
  const std::string msg = error_of([&] { train(cfg, comm); });
  EXPECT_TRUE(contains(msg, "checksum")) << msg;
  EXPECT_TRUE(contains(msg, "emergency save: the state after step 2")) << msg;
  const auto saved = list_checkpoints(cfg.checkpoint.dir);
  ASSERT_EQ(saved.size(), 1u) << msg;
  auto backend = make_cpu_backend({1});
  Model m(cfg.model, *backend);
  EXPECT_EQ(load_checkpoint(saved[0], m, nullptr).step, 2);
}

// Ranks started with different settings or data stop at once, every one of them, naming the
// rank and the first key that differs (instead of waiting for parallel.timeout_s, or training
// on silently with another learning rate on one rank's ZeRO-1 block).
TEST(Faults, RanksThatDisagreeStopAtOnce) {
  const auto dir = run_dir("agree");
  const Config base = small_config(2, dir);
  fs::copy_file(synth_dir() / "train.jsonl", dir / "train.jsonl");
  std::string other = read_text(dir / "train.jsonl");
  other[other.find("\"gpt\"") + 16] ^= 1;  // one caption's letter
  write_text(dir / "other.jsonl", other);
  struct Case {
    std::vector<std::string> rank2;
    std::string says;
  };
  const Case cases[] = {
      {{"--model.dim=32"}, "model.dim = 32 there, 64 on rank 0"},
      {{"--optim.lr=0.5"}, "optim.lr = 0.5 there"},
      {{"--train.seed=99"}, "train.seed = 99 there"},
      {{"--data.train=" + (dir / "other.jsonl").string()}, "data.train (its contents)"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> messages(3);
    run_threaded(3, [&](Communicator& comm) {
      const Config cfg = comm.rank() == 2 ? small_config(2, dir, c.rank2) : base;
      messages[size_t(comm.rank())] = error_of([&] { check_ranks_agree(cfg, comm); });
    });
    for (int r = 0; r < 3; ++r) {
      EXPECT_TRUE(contains(messages[size_t(r)], "rank 2: its configuration differs from rank 0's")) << messages[size_t(r)];
      EXPECT_TRUE(contains(messages[size_t(r)], c.says)) << messages[size_t(r)];
    }
  }
  // Per-process keys may differ; the same data under another path is the same data.
  fs::copy_file(synth_dir() / "train.jsonl", dir / "copy.jsonl");
  run_threaded(3, [&](Communicator& comm) {
    const Config cfg = comm.rank() == 1 ? small_config(2, dir, {"--train.threads=1", "--log.every=7",
                                                                "--data.train=" + (dir / "copy.jsonl").string()})
                                        : base;
    EXPECT_EQ(error_of([&] { check_ranks_agree(cfg, comm); }), "");
  });
}

// A checkpoint whose run named its tokenizer by a relative path is usable from any folder:
// the message says what is relative to what, and --data.tokenizer= (any key) overrides it in
// generate, eval and export.
TEST(Faults, ACheckpointIsUsableFromAnotherFolder) {
  const auto dir = run_dir("elsewhere");
  fs::create_directories(dir / "run" / "tok");
  fs::copy_file(synth_dir() / "tokenizer.model", dir / "run" / "tok" / "tokenizer.model");
  const std::string conf = config_file(small_config(1, dir, {"--eval.exact_match=false"}), dir);
  Outcome r = run_dhp("train -c " + conf + " --data.tokenizer=tok/tokenizer.model", dir,
                      "cd " + (dir / "run").string() + " &&");
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string ck = "--checkpoint auto --dir " + small_config(1, dir).checkpoint.dir;
  const std::string img = (synth_dir() / "images" / "val-000000.png").string();
  const std::string away = "cd " + (dir / "elsewhere").string() + " &&";
  fs::create_directories(dir / "elsewhere");
  r = run_dhp("generate " + ck + " --image " + img, dir, away);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "'tok/tokenizer.model' is relative to the folder its run started in") &&
              contains(r.output, "--data.tokenizer=PATH")) << r.output;
  const std::string tok = " --data.tokenizer=" + (dir / "run" / "tok" / "tokenizer.model").string();
  EXPECT_EQ(run_dhp("generate " + ck + " --image " + img + tok, dir, away).status, 0);
  r = run_dhp("eval " + ck + " --data " + (synth_dir() / "val.jsonl").string() + tok, dir, away);
  EXPECT_EQ(r.status, 0) << r.output;
  r = run_dhp("export " + ck + " -o " + (dir / "exp" / "m.safetensors").string() + " --train.device=cpu", dir, away);
  EXPECT_EQ(r.status, 0) << r.output;
}

}  // namespace
}  // namespace dhp
