// Checkpoints: bit-exact resume, crash safety under kill -9, refusal of damaged files and of
// resumes that change the model, safetensors export/import (including a file Python wrote),
// and the SIGTERM save of the real executable.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <thread>

#include "core/check.h"
#include "core/hash.h"
#include "core/rng.h"
#include "model/model.h"
#include "parallel/mpi_comm.h"
#include "tests/error_of.h"
#include "tests/file_text.h"
#include "tests/h5_damage.h"
#include "tests/train_fixture.h"
#include "trainer/checkpoint.h"
#include "trainer/train.h"
#include "trainer/weights.h"

extern char** environ;

namespace dhp {
namespace {

namespace fs = std::filesystem;
using testing::run_dir;
using testing::small_config;

using testing::error_of;
using testing::flip_tensor_byte;

std::vector<float> weights_of(const std::string& checkpoint) {
  Config cfg = checkpoint_config(checkpoint);
  auto backend = make_cpu_backend({1});
  Model m(cfg.model, *backend);
  load_checkpoint(checkpoint, m, nullptr);
  return std::vector<float>(m.params(), m.params() + m.n_params());
}

TEST(Checkpoint, ResumeIsBitExact) {
  auto world = start_world(nullptr, nullptr);
  Communicator& comm = *world;
  const auto straight_dir = run_dir("straight"), resumed_dir = run_dir("resumed");
  TrainResult straight = train(small_config(20, straight_dir), comm);

  TrainOptions first;
  first.stop_after = 10;
  const std::string metrics = "--log.metrics=" + (resumed_dir / "metrics.jsonl").string();
  TrainResult a = train(small_config(20, resumed_dir, {metrics}), comm, first);
  ASSERT_EQ(a.last_step, 10);
  // As if the interrupted run had logged two more steps after its last checkpoint.
  std::ofstream(resumed_dir / "metrics.jsonl", std::ios::app)
      << "{\"step\": 11, \"loss\": 9}\n{\"step\": 12, \"loss\": 9}\n";
  TrainOptions again;
  again.resume = "auto";
  TrainResult b = train(small_config(20, resumed_dir, {metrics}), comm, again);
  ASSERT_EQ(b.steps.size(), 10u);
  // The metrics file holds each step once: the stale records after step 10 were dropped.
  std::ifstream in(resumed_dir / "metrics.jsonl");
  std::vector<int64_t> logged;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (!j.contains("eval")) logged.push_back(j["step"].get<int64_t>());
  }
  std::vector<int64_t> expect(20);
  std::iota(expect.begin(), expect.end(), 1);
  EXPECT_EQ(logged, expect);

  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(straight.steps[i].loss, a.steps[i].loss) << "step " << i + 1;
    EXPECT_EQ(straight.steps[10 + i].loss, b.steps[i].loss) << "step " << 11 + i;
    EXPECT_EQ(straight.steps[10 + i].grad_norm, b.steps[i].grad_norm) << "step " << 11 + i;
  }
  const auto w1 = weights_of(straight.checkpoint), w2 = weights_of(b.checkpoint);
  ASSERT_EQ(w1.size(), w2.size());
  EXPECT_EQ(0, std::memcmp(w1.data(), w2.data(), w1.size() * sizeof(float)))
      << "final weights differ";
  EXPECT_EQ(straight.final_accuracy, b.final_accuracy);
}

// --resume auto treats a newest checkpoint whose contents fail their checksum as it treats a
// truncated one: a warning, and the checkpoint before it.
TEST(Checkpoint, ResumeAutoPassesOverACheckpointThatFailsItsChecksum) {
  auto world = start_world(nullptr, nullptr);
  Communicator& comm = *world;
  const auto dir = run_dir("resume_damaged");
  const Config cfg = small_config(3, dir, {"--checkpoint.every=1", "--checkpoint.keep=3",
                                           "--eval.exact_match=false"});
  train(cfg, comm);
  const auto all = list_checkpoints(cfg.checkpoint.dir);
  ASSERT_EQ(all.size(), 3u);
  flip_tensor_byte(all.back(), "params/layers.1.mlp.w2.weight");
  TrainOptions o;
  o.resume = "auto";
  TrainResult r;
  EXPECT_EQ(error_of([&] { r = train(small_config(4, dir, {"--checkpoint.every=1", "--checkpoint.keep=3",
                                                          "--eval.exact_match=false"}), comm, o); }), "");
  ASSERT_FALSE(r.steps.empty());
  EXPECT_EQ(r.steps.front().step, 3);  // resumed after step 2, the step 3 checkpoint passed over
  EXPECT_EQ(r.last_step, 4);
}

TEST(Checkpoint, ResumeRefusesAChangedModelShapeNamingTheKey) {
  auto world = start_world(nullptr, nullptr);
  Communicator& comm = *world;
  const auto dir = run_dir("shape");
  train(small_config(2, dir), comm);
  TrainOptions o;
  o.resume = "auto";
  std::string msg = error_of([&] { train(small_config(4, dir, {"--model.ffn=96"}), comm, o); });
  EXPECT_NE(msg.find("model.ffn"), std::string::npos) << msg;
  // A different learning rate and a longer schedule are fine, and so is another batch size:
  // the sample stream continues where it stopped.
  TrainResult r = train(small_config(4, dir, {"--optim.lr=1e-3", "--train.batch_size=8"}), comm, o);
  EXPECT_EQ(r.steps.size(), 2u);
  msg = error_of([&] { train(small_config(6, dir, {"--train.seed=12"}), comm, o); });
  EXPECT_NE(msg.find("train.seed"), std::string::npos) << msg;
  // Another training set would change the sample stream.
  const std::string val = (testing::synth_dir() / "val.jsonl").string();
  msg = error_of([&] { train(small_config(6, dir, {"--data.train=" + val}), comm, o); });
  EXPECT_NE(msg.find("training samples"), std::string::npos) << msg;
}

TEST(Checkpoint, RecordsTheTokenizerTableAndRefusesAResumeWithOtherAddedTokens) {
  auto world = start_world(nullptr, nullptr);
  Communicator& comm = *world;
  const auto dir = run_dir("tokenizer_table");
  const std::vector<std::string> wide = {"--model.vocab_size=192"};
  train(small_config(2, dir, wide), comm);
  const std::string ck = list_checkpoints((dir / "checkpoints").string()).back();
  const Config cfg = checkpoint_config(ck);
  auto backend = make_cpu_backend({1});
  Model m(cfg.model, *backend);
  const TrainState st = load_checkpoint(ck, m, nullptr);
  EXPECT_EQ(st.special_ids, "pad=0 unk=1 bos=2 eos=3 image=-1 img=4 /img=5");
  EXPECT_EQ(st.added_tokens, "[]");
  TrainOptions o;
  o.resume = "auto";
  std::vector<std::string> more = wide;
  more.push_back("--data.added_tokens=<extra>");
  const std::string msg = error_of([&] { train(small_config(4, dir, more), comm, o); });
  EXPECT_NE(msg.find("added tokens [], tokenizer"), std::string::npos) << msg;
  EXPECT_NE(msg.find("<extra>"), std::string::npos) << msg;
  // Negative control: the same resume with the recorded tokens continues.
  EXPECT_EQ(train(small_config(4, dir, wide), comm, o).steps.size(), 2u);
}

TEST(Checkpoint, ShapeCheckIgnoresModelInOtherKeysValues) {
  // Only model.* keys are the model's shape; "model." inside a path of another key is not.
  const Config saved = parse_config("", "a.toml", {"--checkpoint.dir=runs/model.v1", "--data.train=a.jsonl"});
  const Config now = parse_config("", "b.toml", {"--checkpoint.dir=runs/model.v2", "--data.train=model.b.jsonl"});
  EXPECT_NO_THROW(check_same_model(saved, now, "x.h5"));
  const Config wider = parse_config("", "c.toml", {"--model.ffn=96"});
  const std::string msg = error_of([&] { check_same_model(saved, wider, "x.h5"); });
  EXPECT_NE(msg.find("model.ffn"), std::string::npos) << msg;
}

// Saves checkpoints in a loop in a child process and kills it with SIGKILL at random moments;
// whatever moment the kill hits, the newest complete checkpoint loads and holds exactly the
// values saved for its step.
TEST(Checkpoint, SurvivesKillDuringSave) {
  const auto dir = run_dir("crash");
  Config cfg = small_config(1, dir, {"--model.dim=128", "--model.ffn=384", "--checkpoint.keep=2"});
  auto backend = make_cpu_backend({1});
  Model model(cfg.model, *backend);
  AdamW opt(model.table(), cfg.optim, *backend);
  Rng rng(5);
  int64_t next_step = 1;
  for (int round = 0; round < 25; ++round) {
    const int64_t first = next_step;
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      for (int64_t s = first;; ++s) {
        std::fill_n(model.params(), model.n_params(), float(s));
        std::fill_n(opt.m(), model.n_params(), float(-s));
        save_checkpoint(cfg, model, &opt, TrainState{s, 11, 16, SamplerState{11, 0, 0}, 0, 0, "", "", ""});
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(rng.range(2000, 60000)));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    const auto all = list_checkpoints((dir / "checkpoints").string());
    if (all.empty()) continue;  // killed before the first save completed
    const std::string newest = all.back();
    Model loaded(cfg.model, *backend);
    AdamW lopt(loaded.table(), cfg.optim, *backend);
    TrainState st;
    ASSERT_NO_THROW(st = load_checkpoint(newest, loaded, &lopt)) << newest;
    EXPECT_EQ(loaded.params()[0], float(st.step));
    EXPECT_EQ(loaded.params()[loaded.n_params() - 1], float(st.step));
    EXPECT_EQ(lopt.m()[7], float(-st.step));
    EXPECT_LE(all.size(), 3u);  // keep = 2, plus at most one whose older twin awaits deletion
    next_step = st.step + 1000;  // later rounds write newer steps
  }
}

TEST(Checkpoint, DamagedOrTruncatedFilesAreRefused) {
  auto world = start_world(nullptr, nullptr);
  Communicator& comm = *world;
  const auto dir = run_dir("damaged");
  TrainResult r = train(small_config(1, dir), comm);
  const std::string good = r.checkpoint;
  auto backend = make_cpu_backend({1});
  Model model(checkpoint_config(good).model, *backend);

  // Truncated at several lengths.
  const auto size = fs::file_size(good);
  for (double frac : {0.0, 0.1, 0.5, 0.9, 0.999}) {
    const fs::path t = dir / "truncated.h5";
    fs::copy_file(good, t, fs::copy_options::overwrite_existing);
    fs::resize_file(t, uintmax_t(size * frac));
    std::string msg = error_of([&] { load_checkpoint(t.string(), model, nullptr); });
    EXPECT_FALSE(msg.empty()) << "truncated to " << frac << " loaded";
    EXPECT_NE(msg.find("truncated.h5"), std::string::npos) << msg;
  }

  // One flipped byte inside a tensor's data: the checksum catches it.
  const fs::path flipped = dir / "flipped.h5";
  fs::copy_file(good, flipped, fs::copy_options::overwrite_existing);
  flip_tensor_byte(flipped.string(), "params/layers.1.mlp.w2.weight");
  std::string msg = error_of([&] { load_checkpoint(flipped.string(), model, nullptr); });
  EXPECT_NE(msg.find("checksum"), std::string::npos) << msg;
  EXPECT_NE(msg.find("layers.1.mlp.w2.weight"), std::string::npos) << msg;

  // Not a checkpoint at all.
  std::ofstream(dir / "text.h5") << "hello";
  msg = error_of([&] { load_checkpoint((dir / "text.h5").string(), model, nullptr); });
  EXPECT_NE(msg.find("not a readable HDF5 file"), std::string::npos) << msg;

  // An HDF5 file with a version number but written by something else.
  {
    const std::string other = (dir / "other.h5").string();
    hid_t f = H5Fcreate(other.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, "format_version", H5T_NATIVE_INT64, space, H5P_DEFAULT, H5P_DEFAULT);
    const int64_t one = 1;
    H5Awrite(a, H5T_NATIVE_INT64, &one);
    H5Aclose(a);
    H5Sclose(space);
    H5Fclose(f);
    msg = error_of([&] { load_checkpoint(other, model, nullptr); });
    EXPECT_NE(msg.find("not a dhp checkpoint"), std::string::npos) << msg;
  }

  // The good one still loads.
  EXPECT_NO_THROW(load_checkpoint(good, model, nullptr));
}

// The arrays' checksum (wide_hash): any one flipped bit of inputs from 0 to 300 bytes, at any
// alignment, changes it, as do the length and swapped 8-byte words; an unaligned copy hashes
// as the aligned one. Its speed against FNV-1a is bench_checkpoint's.
TEST(Checkpoint, TheArraysChecksumSeesEveryFlippedBit) {
  std::vector<unsigned char> buf(300 + 8);
  Rng rng(3);
  for (auto& c : buf) c = (unsigned char)(rng.next() & 0xff);
  for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(8), size_t(31), size_t(32), size_t(33), size_t(64),
                   size_t(100), size_t(300)}) {
    for (size_t shift : {size_t(0), size_t(3)}) {
      unsigned char* p = buf.data() + shift;
      const uint64_t h = wide_hash(p, n);
      std::vector<unsigned char> copy(p, p + n);
      EXPECT_EQ(wide_hash(copy.data(), n), h) << n;
      if (n > 0) {
        EXPECT_NE(wide_hash(p, n - 1), h) << n;
      }
      for (size_t bit = 0; bit < 8 * n; ++bit) {
        p[bit / 8] ^= (unsigned char)(1u << (bit % 8));
        ASSERT_NE(wide_hash(p, n), h) << n << " bytes, bit " << bit;
        p[bit / 8] ^= (unsigned char)(1u << (bit % 8));
      }
      if (n >= 64) {  // the first two words of two lanes swapped
        std::vector<unsigned char> swapped(p, p + n);
        std::swap_ranges(swapped.begin(), swapped.begin() + 8, swapped.begin() + 8);
        EXPECT_NE(wide_hash(swapped.data(), n), h) << n;
      }
    }
  }
  EXPECT_NE(wide_hash(buf.data(), 64), fnv1a(buf.data(), 64));
}

// A checkpoint written before the arrays carried wide_hash (FNV-1a under "checksum") still
// loads, with the same values, and a flipped byte in it is still refused.
TEST(Checkpoint, ACheckpointWithTheEarlierChecksumsStillLoads) {
  auto world = start_world(nullptr, nullptr);
  const auto dir = run_dir("earlier_checksums");
  const std::string good = train(small_config(1, dir), *world).checkpoint;
  const fs::path earlier = dir / "earlier.h5";
  fs::copy_file(good, earlier, fs::copy_options::overwrite_existing);
  const Config cfg = checkpoint_config(good);
  const ParamTable table(cfg.model);
  {
    hid_t f = H5Fopen(earlier.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    int rewritten = 0;
    for (const char* group : {"params/", "optim/m/", "optim/v/"})
      for (const auto& spec : table.specs()) {
        const std::string name = group + spec.name;
        hid_t d = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
        ASSERT_GE(d, 0) << name;
        std::vector<float> x(size_t(spec.numel()));
        ASSERT_GE(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x.data()), 0) << name;
        ASSERT_GE(H5Adelete(d, "wide_checksum"), 0) << name;
        const uint64_t sum = fnv1a(x.data(), x.size() * sizeof(float));
        hid_t space = H5Screate(H5S_SCALAR);
        hid_t a = H5Acreate2(d, "checksum", H5T_NATIVE_UINT64, space, H5P_DEFAULT, H5P_DEFAULT);
        H5Awrite(a, H5T_NATIVE_UINT64, &sum);
        H5Aclose(a);
        H5Sclose(space);
        H5Dclose(d);
        ++rewritten;
      }
    H5Fclose(f);
    EXPECT_EQ(rewritten, 3 * int(table.specs().size()));
  }
  auto backend = make_cpu_backend({1});
  Model a(cfg.model, *backend), b(cfg.model, *backend);
  AdamW oa(a.table(), cfg.optim, *backend), ob(b.table(), cfg.optim, *backend);
  load_checkpoint(good, a, &oa);
  load_checkpoint(earlier.string(), b, &ob);
  EXPECT_EQ(a.download_params(), b.download_params());
  EXPECT_EQ(oa.download_m(), ob.download_m());
  EXPECT_EQ(oa.download_v(), ob.download_v());
  flip_tensor_byte(earlier.string(), "params/layers.1.mlp.w2.weight");
  const std::string msg = error_of([&] { load_checkpoint(earlier.string(), b, nullptr); });
  EXPECT_NE(msg.find("does not match its checksum"), std::string::npos) << msg;
}

// Bytes flipped anywhere (a stride of them from each of many starts, or one): the checkpoint
// is refused as damaged, or it loads exactly what was saved (the flip fell in unused space).
// HDF5's newest format checksums every object header, tensors and strings carry their own,
// and a damaged header must read as damage, never as a name the model lacks or as another
// program's file.
TEST(Checkpoint, DamageAnywhereIsRefusedAsDamagedNeverLoadedAsOtherValues) {
  auto world = start_world(nullptr, nullptr);
  const auto dir = run_dir("damage_anywhere");
  const Config cfg = small_config(1, dir);
  const std::string good = train(cfg, *world).checkpoint;
  auto backend = make_cpu_backend({1});
  Model model(checkpoint_config(good).model, *backend);
  AdamW opt(model.table(), cfg.optim, *backend);
  load_checkpoint(good, model, &opt);
  const std::vector<float> p0 = model.download_params(), m0 = opt.download_m(),
                           v0 = opt.download_v();
  const std::string config0 = to_toml(checkpoint_config(good));
  const std::string clean = testing::read_text(good);
  const fs::path t = dir / "damaged.h5";
  int refused = 0, loaded = 0;
  for (size_t start = 0; start < clean.size(); start += 4099)
    for (const size_t stride : {size_t(61), clean.size()}) {
      std::string bytes = clean;
      for (size_t k = start; k < bytes.size(); k += stride) bytes[k] = char(bytes[k] ^ 0x5a);
      testing::write_text(t, bytes);
      SCOPED_TRACE(::testing::Message() << "bytes flipped from " << start << " every " << stride);
      const std::string msg = error_of([&] {
        const std::string config = to_toml(checkpoint_config(t.string()));
        load_checkpoint(t.string(), model, &opt);
        EXPECT_EQ(config, config0);
        EXPECT_TRUE(model.download_params() == p0 && opt.download_m() == m0 &&
                    opt.download_v() == v0);
      });
      if (msg.empty()) {
        ++loaded;
        continue;
      }
      ++refused;
      EXPECT_NE(msg.find(t.string()), std::string::npos) << msg;
      EXPECT_TRUE(msg.find("damaged") != std::string::npos ||
                  msg.find("truncated") != std::string::npos)
          << msg;
    }
  EXPECT_GT(refused, 300);
  EXPECT_LT(loaded, refused / 4);
}

// --init of a checkpoint into a model of a smaller configuration loads what the model has and
// names what it leaves out (here the q/k/v biases of a model trained with attention_bias).
TEST(Weights, InitFromALargerCheckpointNamesWhatIsLeftOut) {
  auto world = start_world(nullptr, nullptr);
  Communicator& comm = *world;
  const auto dir = run_dir("leftout");
  Config big = small_config(1, dir);
  big.model.attention_bias = true;
  TrainResult r = train(big, comm);
  Config small = checkpoint_config(r.checkpoint);
  small.model.attention_bias = false;
  auto backend = make_cpu_backend({1});
  Model full(checkpoint_config(r.checkpoint).model, *backend), part(small.model, *backend);
  load_checkpoint(r.checkpoint, full, nullptr);
  load_weights(r.checkpoint, part);
  const std::vector<std::string> left = checkpoint_params_not_in(r.checkpoint, part.table());
  EXPECT_EQ(left.size(), size_t(3 * big.model.layers));
  for (const auto& n : left) EXPECT_NE(n.find("attn.w"), std::string::npos) << n;
  EXPECT_TRUE(checkpoint_params_not_in(r.checkpoint, full.table()).empty());
  // What the smaller model has is the checkpoint's.
  const ParamSpec& w = part.table().get("tok_embed.weight");
  EXPECT_EQ(0, std::memcmp(part.params() + w.offset, full.params() + full.table().get("tok_embed.weight").offset,
                           size_t(w.numel()) * sizeof(float)));
}

TEST(Weights, ExportThenImportIsIdentical) {
  auto world = start_world(nullptr, nullptr);
  Communicator& comm = *world;
  const auto dir = run_dir("export");
  TrainResult r = train(small_config(2, dir), comm);
  Config cfg = checkpoint_config(r.checkpoint);
  auto backend = make_cpu_backend({1});
  Model a(cfg.model, *backend), b(cfg.model, *backend);
  load_checkpoint(r.checkpoint, a, nullptr);
  export_safetensors(a, cfg, (dir / "m.safetensors").string(), (dir / "config.json").string());
  load_weights((dir / "m.safetensors").string(), b);
  EXPECT_EQ(0, std::memcmp(a.params(), b.params(), sizeof(float) * a.n_params()));
  auto j = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  EXPECT_EQ(j["dim"], cfg.model.dim);
  EXPECT_EQ(j["vision"]["patch"], cfg.model.vision.patch);
  // The file is the real format: the header parses as JSON with the spec's names.
  std::ifstream in(dir / "m.safetensors", std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  std::string text(n, '\0');
  in.read(text.data(), std::streamsize(n));
  auto h = nlohmann::json::parse(text);
  EXPECT_EQ(h["projector.fc1.weight"]["dtype"], "F32");
  EXPECT_EQ(h["projector.fc1.weight"]["shape"], (std::vector<int64_t>{64, 128}));
}

TEST(Weights, MalformedSafetensorsHeaderIsAnErrorNamingTheFile) {
  // Valid JSON of the wrong shape must be refused with dhp::Error, not escape as a JSON
  // library exception (which the CLI does not catch).
  const auto dir = run_dir("badheader");
  Config cfg = small_config(1, dir);
  auto backend = make_cpu_backend({1});
  Model m(cfg.model, *backend);
  auto write = [&](const std::string& name, const std::string& header) {
    std::ofstream out(dir / name, std::ios::binary);
    const uint64_t n = header.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header;
    return (dir / name).string();
  };
  const std::string first = m.table().specs().front().name;
  for (const auto& [name, header] :
       {std::pair<std::string, std::string>{"array.safetensors", "[1, 2, 3]"},
        {"entry.safetensors", "{\"" + first + "\": 5}"},
        {"shape.safetensors", "{\"" + first + "\": {\"dtype\": \"F32\", \"shape\": \"x\"}}"}}) {
    const std::string path = write(name, header);
    const std::string msg = error_of([&] { load_weights(path, m); });
    EXPECT_NE(msg.find(name), std::string::npos) << msg;
  }
}

TEST(Weights, LoadsASafetensorsFileWrittenByPython) {
  const auto dir = run_dir("python");
  Config cfg = small_config(1, dir);
  auto backend = make_cpu_backend({1});
  Model m(cfg.model, *backend);
  nlohmann::json table = nlohmann::json::array();
  for (const auto& s : m.table().specs()) table.push_back({{"name", s.name}, {"shape", s.shape}});
  std::ofstream(dir / "table.json") << table.dump();
  const std::string cmd = "/usr/bin/python3 " + std::string(DHP_SOURCE_DIR) +
                          "/tests/reference/write_safetensors.py " + (dir / "table.json").string() +
                          " " + (dir / "py.safetensors").string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  load_weights((dir / "py.safetensors").string(), m);
  size_t k = 0;
  for (const auto& s : m.table().specs()) {
    // F16 keeps 11 significant bits, BF16 8: compare within the format's rounding.
    const double tol = k % 3 == 0 ? 1e-3 : k % 3 == 1 ? 8e-3 : 0.0;
    for (int64_t i = 0; i < s.numel(); i += std::max<int64_t>(1, s.numel() / 50)) {
      const double want = double(float(double(i) * 0.001 - 1.0));
      ASSERT_NEAR(m.params()[s.offset + i], want, tol * std::max(1.0, std::abs(want)))
          << s.name << "[" << i << "]";
    }
    ++k;
  }
  // A file missing a tensor, or with a wrong shape, is refused by name and loads nothing.
  std::vector<float> before(m.params(), m.params() + m.n_params());
  table.erase(table.begin() + 3);
  std::ofstream(dir / "table.json") << table.dump();
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::string msg = error_of([&] { load_weights((dir / "py.safetensors").string(), m); });
  EXPECT_NE(msg.find(m.table().specs()[3].name), std::string::npos) << msg;
  EXPECT_EQ(0, std::memcmp(before.data(), m.params(), before.size() * sizeof(float)));
}

// The executable saves a checkpoint and exits cleanly on SIGTERM.
TEST(Checkpoint, SigtermSavesBeforeExiting) {
  const auto dir = run_dir("sigterm");
  Config cfg = small_config(100000, dir, {"--log.metrics=" + (dir / "metrics.jsonl").string()});
  std::ofstream(dir / "run.toml") << to_toml(cfg);
  const std::string bin = DHP_BINARY, conf = (dir / "run.toml").string();
  std::vector<std::string> args = {bin, "train", "--config", conf};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, bin.c_str(), nullptr, nullptr, argv.data(), environ), 0);
  // Wait for a few steps to be logged, then ask it to stop.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  int64_t lines = 0;
  while (lines < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::ifstream in(dir / "metrics.jsonl");
    lines = std::count(std::istreambuf_iterator<char>(in), {}, '\n');
  }
  ASSERT_GE(lines, 3) << "the trainer did not start";
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  const auto all = list_checkpoints((dir / "checkpoints").string());
  ASSERT_EQ(all.size(), 1u);
  auto backend = make_cpu_backend({1});
  Model m(cfg.model, *backend);
  TrainState st = load_checkpoint(all.back(), m, nullptr);
  EXPECT_GE(st.step, 3);
  EXPECT_LT(st.step, 100000);
}

}  // namespace
}  // namespace dhp

namespace dhp {
namespace {

TEST(Checkpoint, FreshRunRefusesAFolderHoldingAnotherRun) {
  auto world = start_world(nullptr, nullptr);
  Communicator& comm = *world;
  const auto dir = testing::run_dir("occupied");
  train(testing::small_config(1, dir), comm);
  std::string msg = error_of([&] { train(testing::small_config(1, dir), comm); });
  EXPECT_NE(msg.find("--resume auto"), std::string::npos) << msg;
}

TEST(Weights, TrainInitStartsFromExportedWeights) {
  auto world = start_world(nullptr, nullptr);
  Communicator& comm = *world;
  const auto a = testing::run_dir("init_src"), b = testing::run_dir("init_dst");
  TrainResult src = train(testing::small_config(3, a), comm);
  Config cfg = checkpoint_config(src.checkpoint);
  auto backend = make_cpu_backend({1});
  Model m(cfg.model, *backend);
  load_checkpoint(src.checkpoint, m, nullptr);
  export_safetensors(m, cfg, (a / "w.safetensors").string(), (a / "config.json").string());
  // Zero steps: the run saves the weights it started from, which must be the export's.
  TrainOptions o;
  o.init = (a / "w.safetensors").string();
  TrainResult dst = train(testing::small_config(0, b), comm, o);
  EXPECT_EQ(weights_of(dst.checkpoint), weights_of(src.checkpoint));
}

}  // namespace
}  // namespace dhp
