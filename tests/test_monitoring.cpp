// What a user watches during a run: TensorBoard's event files (log.tensorboard), read back by a
// reader written from TensorBoard's published format (tests/reference/read_tfevents.py: its
// own CRC-32C, its own declarations of the messages, python3-protobuf to decode them) and
// compared value for value with the metrics file, across a resume.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sstream>

#include "core/check.h"
#include "core/hash.h"
#include "core/progress.h"
#include "parallel/mpi_comm.h"
#include "tests/error_of.h"
#include "tests/file_text.h"
#include "tests/train_fixture.h"
#include "trainer/tensorboard.h"
#include "trainer/train.h"

namespace dhp {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::read_text;
using testing::run_dir;
using testing::small_config;
using testing::write_text;

struct Read {
  int status = -1;
  nlohmann::json events;  // the reader's "events"
  std::vector<std::string> files;
  std::string errors;
};

// The reader's view of the event files in `dir`.
Read read_events(const fs::path& dir) {
  const fs::path out = dir.parent_path() / "tfevents.json", err = dir.parent_path() / "tfevents.err";
  const std::string cmd = "/usr/bin/python3 " + std::string(DHP_SOURCE_DIR) +
                          "/tests/reference/read_tfevents.py '" + dir.string() + "' > '" + out.string() +
                          "' 2> '" + err.string() + "'";
  Read r;
  const int raw = std::system(cmd.c_str());
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.errors = read_text(err);
  if (r.status == 0) {
    const auto j = nlohmann::json::parse(read_text(out));
    r.events = j["events"];
    r.files = j["files"].get<std::vector<std::string>>();
  }
  return r;
}

fs::path event_file_in(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find("tfevents") != std::string::npos) return e.path();
  return {};
}

TEST(TensorBoard, RecordsAreFramedWithTheMaskedCastagnoliCrc) {
  // RFC 3720's check value, and the masked CRC of nothing (TensorFlow's rotate-and-add).
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(masked_crc32c(""), 0xa282ead8u);
  const std::string r = tfrecord("abc");
  ASSERT_EQ(r.size(), 3u + 16u);
  EXPECT_EQ(r.substr(0, 8), std::string("\x03\0\0\0\0\0\0\0", 8));
  const uint32_t data_crc = masked_crc32c("abc");
  EXPECT_EQ(r.substr(15), std::string(reinterpret_cast<const char*>(&data_crc), 4));
}

// The test of the issue: the files parse, their CRCs check, every scalar is the metrics file's
// value at its step (as float32, what TensorBoard stores), and a run resumed from an earlier
// checkpoint than its predecessor reached holds each step once.
TEST(TensorBoard, EveryScalarIsTheMetricsFilesValueAndAResumedRunHoldsEachStepOnce) {
  auto world = start_world(nullptr, nullptr);
  const auto dir = run_dir("tensorboard");
  const fs::path tb = dir / "tb", metrics = dir / "metrics.jsonl";
  const std::vector<std::string> o = {"--log.metrics=" + metrics.string(), "--log.tensorboard=" + tb.string(),
                                      "--checkpoint.every=4", "--eval.every=3", "--eval.max_samples=16"};
  TrainOptions first;
  first.stop_after = 6;
  ASSERT_EQ(train(small_config(10, dir, o), *world, first).last_step, 6);
  // The run's newest checkpoint is lost: the next run resumes from step 4, and the events of
  // steps 5 and 6 in the files are stale.
  ASSERT_TRUE(fs::remove(dir / "checkpoints" / "step-00000006.h5"));
  TrainOptions again;
  again.resume = "auto";
  ASSERT_EQ(train(small_config(10, dir, o), *world, again).last_step, 10);

  const Read r = read_events(tb);
  ASSERT_EQ(r.status, 0) << r.errors;
  ASSERT_EQ(r.files.size(), 1u) << "the resumed run's file holds the kept events of the one before";

  // The metrics file's numbers at each (prefix, step), as TensorBoard's tags name them.
  std::map<std::pair<std::string, int64_t>, double> expected;
  std::set<int64_t> train_steps, eval_steps;
  std::istringstream lines(read_text(metrics));
  for (std::string line; std::getline(lines, line);) {
    const auto j = nlohmann::json::parse(line);
    const int64_t step = j["step"].get<int64_t>();
    const std::string prefix = j.contains("eval") ? "eval/val/" : "train/";
    (j.contains("eval") ? eval_steps : train_steps).insert(step);
    for (const auto& [k, v] : j.items())
      if (v.is_number() && k != "step") expected[{prefix + k, step}] = v.get<double>();
    if (j.contains("rank_mem_peak_mb")) {
      expected[{"memory/peak_mb", step}] = j["rank_mem_peak_mb"][0].get<double>();
      expected[{"memory/predicted_mb", step}] = j["rank_mem_predicted_mb"][0].get<double>();
    }
  }
  EXPECT_EQ(train_steps.size(), 10u);
  EXPECT_EQ(eval_steps, (std::set<int64_t>{3, 6, 9, 10}));

  std::map<std::pair<std::string, int64_t>, int> seen;
  std::vector<int64_t> config_steps;
  int histograms = 0;
  ASSERT_EQ(r.events[0].value("file_version", ""), "brain.Event:2");
  for (const auto& e : r.events) {
    const int64_t step = e["step"].get<int64_t>();
    if (e.contains("scalars"))
      for (const auto& [tag, v] : e["scalars"].items()) {
        ++seen[{tag, step}];
        const auto it = expected.find({tag, step});
        ASSERT_NE(it, expected.end()) << tag << " at step " << step << " is not in the metrics file";
        EXPECT_EQ(v.get<double>(), double(float(it->second))) << tag << " at step " << step;
      }
    if (e.contains("histograms")) {
      const auto& h = e["histograms"]["plan/ring_degrees"];
      EXPECT_EQ(h["num"].get<double>(), expected.at({"train/groups", step})) << "step " << step;
      EXPECT_EQ(h["max"].get<double>(), expected.at({"train/max_degree", step})) << "step " << step;
      ++histograms;
    }
    if (e.contains("texts")) {
      const auto& t = e["texts"]["config"];
      EXPECT_EQ(t["plugin"], "text");
      EXPECT_EQ(t["dtype"], 7) << "DT_STRING";
      EXPECT_TRUE(t["text"][0].get<std::string>().find("tensorboard = \"" + tb.string() + "\"") != std::string::npos);
      config_steps.push_back(step);
    }
  }
  EXPECT_EQ(histograms, 10);
  EXPECT_EQ(config_steps, (std::vector<int64_t>{0, 4})) << "each run's config once, at the step it started from";
  for (const auto& [key, n] : seen) EXPECT_EQ(n, 1) << key.first << " at step " << key.second << " is written " << n << " times";
  for (const auto& [key, v] : expected)
    EXPECT_EQ(seen.count(key), 1u) << key.first << " at step " << key.second << " is missing from the event files";

  // Negative control: a flipped byte in a record's data is caught by the reader's CRC.
  const fs::path f = event_file_in(tb);
  {
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(200);
    char c = 0;
    io.read(&c, 1);
    c ^= 0x01;
    io.seekp(200);
    io.write(&c, 1);
  }
  const Read damaged = read_events(tb);
  EXPECT_EQ(damaged.status, 1);
  EXPECT_TRUE(damaged.errors.find("CRC") != std::string::npos) << damaged.errors;
}

TEST(TensorBoard, AFreshRunKeepsAnEarlierRunsFilesApartAndLeavesOtherToolsFilesAlone) {
  const auto dir = run_dir("tensorboard_fresh");
  const fs::path tb = dir / "tb";
  { TensorBoardWriter w(tb.string(), 0); w.write(1, {{{"train/loss", 2.5}}, {}}); }
  write_text(tb / "events.out.tfevents.1700000000.otherhost", "another program's events");
  { TensorBoardWriter w(tb.string(), 0); w.write(1, {{{"train/loss", 1.5}}, {}}); }
  // The earlier run's file is in tb/earlier (a run of its own in TensorBoard); the other
  // program's file is where it was, untouched.
  const Read earlier = read_events(tb / "earlier");
  ASSERT_EQ(earlier.status, 0) << earlier.errors;
  ASSERT_EQ(earlier.events.size(), 2u);
  EXPECT_EQ(earlier.events[1]["scalars"]["train/loss"], 2.5);
  EXPECT_EQ(read_text(tb / "events.out.tfevents.1700000000.otherhost"), "another program's events");

  // A file where the folder should be is refused, naming the key.
  write_text(dir / "not_a_folder", "x");
  const std::string msg = error_of([&] { TensorBoardWriter w((dir / "not_a_folder").string(), 0); });
  EXPECT_TRUE(msg.find("log.tensorboard") != std::string::npos && msg.find("not a folder") != std::string::npos) << msg;
  // Two runs on one folder: the second is refused.
  TensorBoardWriter held((dir / "shared").string(), 0);
  const std::string twice = error_of([&] { TensorBoardWriter w((dir / "shared").string(), 0); });
  EXPECT_TRUE(twice.find("log.tensorboard") != std::string::npos) << twice;
}

// A run killed while writing leaves a cut-off last record: the next run keeps every whole
// record before it and its own file reads clean.
TEST(TensorBoard, AResumeOverACutOffFileKeepsTheWholeRecords) {
  const auto dir = run_dir("tensorboard_cut");
  const fs::path tb = dir / "tb";
  {
    TensorBoardWriter w(tb.string(), 0);
    for (int s = 1; s <= 5; ++s) w.write(s, {{{"train/loss", 1.0 / s}}, {}});
  }
  const fs::path f = event_file_in(tb);
  fs::resize_file(f, fs::file_size(f) - 3);
  { TensorBoardWriter w(tb.string(), 9); }
  const Read r = read_events(tb);
  ASSERT_EQ(r.status, 0) << r.errors;
  std::vector<int64_t> steps;
  for (const auto& e : r.events)
    if (e.contains("scalars")) steps.push_back(e["step"].get<int64_t>());
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4}));
}

// Long work's progress: a log line (not a terminal under ctest) with the bytes, share, rate and
// ETA once its interval has passed; nothing for work that ends sooner, or on a rank that does
// not report.
TEST(Progress, LongWorkSaysHowFarAndHowLongElsewhereThanATerminal) {
  std::ostringstream out;
  const auto old = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(out)));
  {
    ByteProgress slow("saving step-00000010", 3'000'000'000, true, 0.0);
    slow.add(1'000'000'000);
    ByteProgress quick("exporting", 1000, true, 5.0);
    quick.add(1000);
    ByteProgress other_rank("importing", 1000, false, 0.0);
    other_rank.add(500);
  }
  spdlog::set_default_logger(old);
  const std::string log = out.str();
  EXPECT_NE(log.find("saving step-00000010: 1.00 of 3.00 GB (33%), "), std::string::npos) << log;
  EXPECT_NE(log.find(" MB/s, eta "), std::string::npos) << log;
  EXPECT_EQ(log.find("exporting"), std::string::npos) << log;
  EXPECT_EQ(log.find("importing"), std::string::npos) << log;
  EXPECT_EQ(log.find('\r'), std::string::npos) << "no redrawn line outside a terminal";
  EXPECT_EQ(duration_text(42), "42s");
  EXPECT_EQ(duration_text(425), "7m05s");
  EXPECT_EQ(duration_text(3 * 3600 + 125), "3h02m");
}

}  // namespace
}  // namespace dhp
