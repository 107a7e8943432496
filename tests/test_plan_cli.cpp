// `dhp plan` from the command line: every bad input is a clear error with exit status 1,
// never a hang, an abort, an allocation failure or a silently replaced value.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

namespace fs = std::filesystem;

struct Result {
  int status = -1;  // exit status; 124 when the 60 s timeout killed it
  std::string output;
};

// Runs `dhp SUBCOMMAND ARGS` (ARGS already shell-quoted) under `timeout SECONDS`, with stdout
// and stderr together.
Result dhp(const std::string& subcommand, const std::string& args, int seconds) {
  const std::string cmd = "timeout " + std::to_string(seconds) + " " + DHP_BINARY + " " +
                          subcommand + " " + args + " 2>&1";
  Result r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

Result plan(const std::string& args) { return dhp("plan", args, 60); }

fs::path scratch(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("dhp_plan_cli_" + std::to_string(getpid()));
  fs::create_directories(d);
  return d / name;
}

void expect_error(const std::string& args, const std::string& says) {
  const Result r = plan(args);
  EXPECT_EQ(r.status, 1) << args << "\n" << r.output;
  EXPECT_NE(r.output.find("dhp: error:"), std::string::npos) << args << "\n" << r.output;
  EXPECT_NE(r.output.find(says), std::string::npos) << args << ": expected '" << says << "' in\n" << r.output;
}

// Small, fast settings for the runs that are meant to succeed.
const std::string kQuick = "--model-profile tiny --device cpu --steps 1 --world 4 --preset captions ";

TEST(PlanCli, ValidRunSucceeds) {
  const Result r = plan(kQuick + "--batch 16 --strategies dhp,pow2,static");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("dhp plans won by"), std::string::npos) << r.output;
}

TEST(PlanCli, HugeWorldsAreRefusedNotHungOrAborted) {
  // Used to hang (top * 2 overflowed in pow2) and to abort on an assertion in the solver.
  expect_error("--steps 1 --world 1073741824 --strategies pow2", "--world must be between 1 and");
  expect_error("--steps 1 --world 2147483647", "--world must be between 1 and");
  expect_error("--steps 1 --world 0", "--world must be between 1 and");
}

TEST(PlanCli, HugeBatchesAndStepCountsAreRefused) {
  expect_error("--steps 1 --batch 2000000000", "--batch must be between 1 and");
  expect_error("--steps 2000000000", "--steps must be between 1 and");
  expect_error("--steps 0", "--steps must be between 1 and");
}

TEST(PlanCli, MemoryAndNodeSizeAreCheckedNotReplacedByDefaults) {
  for (const char* gb : {"-5", "0", "nan", "inf", "1e300"})
    expect_error(kQuick + "--memory-gb " + gb, "--memory-gb must be a positive number of GiB");
  for (const char* rpn : {"0", "-3"}) expect_error(kQuick + "--ranks-per-node " + rpn, "--ranks-per-node must be at least 1");
  expect_error(kQuick + "--budget-ms -1", "--budget-ms must be between");
}

// --zero sets the ZeRO stage: the state line splits ZeRO-2's gradients into the window and the
// summed block, ZeRO-3 says what it gathers, and a state that does not fit names the stage that
// would.
TEST(PlanCli, TheZeroStageIsPricedAndNamed) {
  for (const char* bad : {"4", "-2"}) expect_error(kQuick + "--zero " + bad, "--zero: the ZeRO stage is 0 to 3");
  const Result two = plan(kQuick + "--batch 16 --zero 2");
  EXPECT_EQ(two.status, 0) << two.output;
  EXPECT_NE(two.output.find(" = a window of "), std::string::npos) << two.output;
  EXPECT_NE(two.output.find(", ZeRO-2)"), std::string::npos) << two.output;
  const Result one = plan(kQuick + "--batch 16 --zero 1");
  EXPECT_EQ(one.output.find(" = a window of "), std::string::npos) << one.output;
  EXPECT_EQ(two.output.find("ZeRO-3:"), std::string::npos) << two.output;
  // The tiny profile's two decoder layers fit the two slots: nothing to gather.
  const Result tiny = plan(kQuick + "--batch 16 --zero 3");
  EXPECT_EQ(tiny.status, 0) << tiny.output;
  EXPECT_NE(tiny.output.find("fewer than three, so every rank holds their working copy whole"), std::string::npos)
      << tiny.output;
  const Result three = plan("--model-profile 7b --device h100 --memory-gb 80 --world 8 --steps 1 --batch 16 --zero 3");
  EXPECT_EQ(three.status, 0) << three.output;
  EXPECT_NE(three.output.find(", ZeRO-3)"), std::string::npos) << three.output;
  EXPECT_NE(three.output.find("ZeRO-3: the working copy is a window of the weights outside the decoder layers and two "
                              "layers; each pass gathers 54 layers of "), std::string::npos) << three.output;
  expect_error("--model-profile 13b --device h100 --memory-gb 80 --world 8 --steps 1 --zero 1",
               "set parallel.zero = 2 (then 60.16 GiB per rank");
}

TEST(PlanCli, StrategiesMustNameSomething) {
  expect_error(kQuick + "--strategies ''", "--strategies: name at least one");
  expect_error(kQuick + "--strategies dhp,,pow2", "--strategies: empty name");
  expect_error(kQuick + "--strategies dhp,dhp", "given twice");
  expect_error(kQuick + "--strategies fast", "--strategies: unknown 'fast'");
}

TEST(PlanCli, DataFilesAreValidated) {
  const fs::path huge = scratch("huge.txt");
  std::ofstream(huge) << "9223372036854775807 1\n";
  expect_error(kQuick + "--batch 1 --data " + huge.string(), "tokens per sample");
  const fs::path neg = scratch("neg.txt");
  std::ofstream(neg) << "5 10\n-1 3\n";
  expect_error(kQuick + "--batch 1 --data " + neg.string(), "cannot be negative");
  const fs::path images = scratch("images.txt");
  std::ofstream(images) << "4 10 9\n";
  expect_error(kQuick + "--batch 1 --data " + images.string(), "images for 4 vision tokens");
  const fs::path junk = scratch("junk.txt");
  std::ofstream(junk) << "4 10 1 extra\n";
  expect_error(kQuick + "--batch 1 --data " + junk.string(), "unexpected 'extra'");
  const fs::path dup = scratch("dup.jsonl");
  std::ofstream(dup) << "{\"id\": 3, \"text_tokens\": 10}\n{\"id\": 3, \"text_tokens\": 12}\n";
  expect_error(kQuick + "--batch 1 --data " + dup.string(), "sample id 3 appears twice");
  // Fewer samples than the batch: every batch would plan a sample twice.
  const fs::path few = scratch("few.txt");
  std::ofstream(few) << "0 100\n16 50\n0 70\n";
  expect_error(kQuick + "--batch 4 --data " + few.string(), "fewer than --batch 4");
  const Result ok = plan(kQuick + "--batch 3 --data " + few.string());
  EXPECT_EQ(ok.status, 0) << ok.output;
  expect_error(kQuick + "--data " + scratch("missing.txt").string(), "not found");
  // A FIFO is refused, never waited on (the 60 s timeout would show a hang as status -1).
  const fs::path fifo = scratch("lengths.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  expect_error(kQuick + "--data " + fifo.string(), "is not a regular file");
  expect_error(kQuick + "--coeffs " + fifo.string(), "is not a regular file");
}

// An empty (or comment-only) config file is all defaults, which is rarely what was meant: a
// warning says so and where such a run would write.
TEST(PlanCli, EmptyConfigFileIsWarnedAbout) {
  const fs::path empty = scratch("empty.toml");
  std::ofstream(empty) << "# nothing here yet\n";
  const Result r = plan(kQuick + "--batch 4 --config " + empty.string());
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("holds no keys"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("runs/demo/checkpoints"), std::string::npos) << r.output;
}

// A data manifest or a binary file passed as lengths: named as not a lengths record, with the
// line's bytes escaped, never the JSON library's text or raw binary on the terminal.
TEST(PlanCli, FilesThatAreNotLengthsAreNamedSo) {
  const fs::path manifest = scratch("manifest.jsonl");
  std::ofstream(manifest) << R"({"id":"train-0","image":"a.png","conversations":[]})" << "\n";
  expect_error(kQuick + "--batch 1 --data " + manifest.string(), "manifest.jsonl:1 is not a lengths record");
  const fs::path binary = scratch("binary.bin");
  std::ofstream(binary, std::ios::binary) << std::string("\x7f" "ELF\x02\x01\xff\n", 8);
  const Result r = plan(kQuick + "--batch 1 --data " + binary.string());
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("\\x7fELF\\x02\\x01\\xff"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find('\xff'), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("json.exception"), std::string::npos) << r.output;
  const Result c = plan(kQuick + "--batch 1 --coeffs " + binary.string());
  EXPECT_EQ(c.status, 1) << c.output;
  EXPECT_EQ(c.output.find('\xff'), std::string::npos) << c.output;
  EXPECT_NE(c.output.find("is not JSON (at byte"), std::string::npos) << c.output;
}

TEST(PlanCli, CostCoefficientsFile) {
  const fs::path good = scratch("coeffs.json");
  std::ofstream(good) << R"({"sec_per_flop": 1e-10, "sec_per_att_flop": 3e-10, "sec_per_byte_intra": 2e-10,
    "sec_per_byte_inter": 1e-9, "sec_per_step": 2e-5, "sec_per_seq": 2e-5, "sec_per_weight_byte": 2e-10})";
  const Result r = plan(kQuick + "--json --coeffs " + good.string());
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("\"sec_per_att_flop\": 3e-10"), std::string::npos) << r.output;
  const fs::path bad = scratch("bad.json");
  std::ofstream(bad) << R"({"sec_per_flop": -1})";
  expect_error(kQuick + "--coeffs " + bad.string(), "sec_per_flop");
}

// The profiling pass measures the model, fits the coefficients and writes them where
// `dhp plan --coeffs` reads them.
TEST(PlanCli, ProfilingPassFitsCoefficientsThePlannerUses) {
  const fs::path out = scratch("profile.json");
  const Result profiled = dhp("profile", "--quick --repeats 1 --out " + out.string(), 300);
  const std::string& text = profiled.output;
  ASSERT_EQ(profiled.status, 0) << text;
  EXPECT_NE(text.find("mean relative error"), std::string::npos) << text;
  std::ifstream in(out);
  const std::string json((std::istreambuf_iterator<char>(in)), {});
  for (const char* key : {"sec_per_flop", "sec_per_att_flop", "sec_per_weight_byte", "error_fit"})
    EXPECT_NE(json.find(key), std::string::npos) << key;
  const Result r = plan(kQuick + "--batch 16 --coeffs " + out.string());
  EXPECT_EQ(r.status, 0) << r.output;
}

// The device probe: per-chunk attention rates and the Linear products measured op by op, the
// probed coefficients written as a file the planner reads; train.* keys choose the device, and
// a wrong one is an error naming it. (Ring transfer needs two ranks: one rank says so.)
TEST(PlanCli, ProbeMeasuresTheDeviceOpByOp) {
  const fs::path out = scratch("probe.json");
  const Result probed = dhp("profile", "--probe-only --quick --repeats 1 --model-profile tiny --train.device=cpu "
                                       "--out " + out.string(), 300);
  const std::string& text = probed.output;
  ASSERT_EQ(probed.status, 0) << text;
  for (const char* want : {"Linear products of a decoder layer", "attention over one causal document",
                           "ring transfer: one rank, not measured", "cpu (built-in)", "probed"})
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  EXPECT_EQ(text.find("whole steps"), std::string::npos) << text;
  std::ifstream in(out);
  const std::string json((std::istreambuf_iterator<char>(in)), {});
  for (const char* key : {"\"probe\"", "\"attention\"", "\"tokens\": 256", "\"probed_coeffs\"", "\"builtin_profile\": \"cpu\""})
    EXPECT_NE(json.find(key), std::string::npos) << key << "\n" << json;
  const Result r = plan(kQuick + "--batch 16 --coeffs " + out.string());
  EXPECT_EQ(r.status, 0) << r.output;
  const Result bad = dhp("profile", "--probe-only --quick --train.devise=cpu --out " + scratch("x.json").string(), 60);
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.output.find("devise"), std::string::npos) << bad.output;
}

// A clip tower is profiled as it trains: its class rows, the layers up to feature_layer, and
// the fit prices it (parallel/cost_model.h).
TEST(PlanCli, ProfilingPassTimesAClipTower) {
  const fs::path cfg = scratch("clip.toml"), out = scratch("clip_profile.json");
  std::ofstream(cfg) << "[model]\ndim = 32\nlayers = 1\nheads = 2\nkv_heads = 1\nffn = 64\n"
                        "[model.vision]\narch = \"clip\"\npatch = 8\nimage_size = 32\ndim = 32\n"
                        "layers = 3\nheads = 2\nffn = 64\nfeature_layer = -2\n";
  const Result profiled =
      dhp("profile", "--quick --repeats 1 --config " + cfg.string() + " --out " + out.string(), 300);
  const std::string& text = profiled.output;
  ASSERT_EQ(profiled.status, 0) << text;
  EXPECT_NE(text.find("vision clip 32 x 3 layers (2 run)"), std::string::npos) << text;
  std::ifstream in(out);
  const std::string json((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(json.find("\"vision_arch\": \"clip\""), std::string::npos) << json;
  EXPECT_NE(json.find("error_fit"), std::string::npos) << json;
}

}  // namespace
