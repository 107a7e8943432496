// Bad input and faults, round 3: what a hostile review of Hugging Face folders, exports,
// video, multi-rank agreement and resource bombs found. Each case runs the real executable
// (DHP_BINARY) or the engine in process, and checks that the input ends in a clear error that
// names what and where, or in a correct result, never a signal, a hang, a read outside what the
// user named, or a checkpoint or export that dhp itself cannot load.
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

#include "core/input.h"
#include "data/codecs.h"
#include "data/tokenizer.h"
#include "parallel/mpi_comm.h"
#include "parallel/threaded_comm.h"
#include "tests/error_of.h"
#include "tests/hf_fixture.h"
#include "tests/run_dhp.h"
#include "tests/train_fixture.h"
#include "trainer/agreement.h"
#include "trainer/checkpoint.h"
#include "trainer/checkpoint_file.h"
#include "trainer/config.h"
#include "trainer/hf_checkpoint.h"
#include "trainer/run_lock.h"
#include "trainer/safetensors.h"
#include "trainer/train.h"

namespace dhp {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::contains;
using testing::error_of;
using testing::Outcome;
using testing::read_text;
using testing::run_dhp;
using testing::run_dir;
using testing::small_config;
using testing::synth_dir;
using testing::write_text;

// The Llama folder the cases start from (its own tokenizer is not needed: the synthesized data
// set's 160-piece tokenizer is smaller than its 320 rows).
const fs::path& base_folder() {
  static const fs::path p =
      testing::hf_fixture("make_hf_fixture.py", "base", "--hidden 32 --heads 4 --kv 2 --layers 1 --ffn 48 --vocab 320");
  return p;
}

const fs::path& clip_folder() {
  static const fs::path p = testing::hf_fixture("make_hf_llava_fixture.py", "clip", "clip_vision --seed 8");
  return p;
}

// A copy of `from` under `name`, to be damaged.
fs::path copy_of(const fs::path& from, const std::string& name) {
  const fs::path to = testing::hf_fixture_root() / name;
  fs::remove_all(to);
  fs::copy(from, to, fs::copy_options::recursive);
  return to;
}

void edit_json(const fs::path& file, const std::function<void(json&)>& change) {
  json j = json::parse(std::ifstream(file));
  change(j);
  write_text(file, j.dump(2));
}

// A run configuration file of the small test model on the synthesized data.
std::string config_file(const fs::path& dir, int64_t steps = 1, std::vector<std::string> extra = {}) {
  write_text(dir / "run.toml", to_toml(small_config(steps, dir, std::move(extra))));
  return (dir / "run.toml").string();
}

// Every tensor of a safetensors file, its bytes as they are, plus `extra` ones (F32, zeros).
void rewrite_with(const fs::path& file, const std::vector<std::pair<std::string, std::vector<int64_t>>>& extra) {
  std::vector<SafetensorsOut> out;
  std::map<std::string, std::string> meta;
  std::vector<std::string> raw;
  {
    const InputFile in("test file", file.string());
    const SafetensorsHeader h = read_safetensors_header(in, file.string());
    meta = h.metadata;
    raw.reserve(h.tensors.size());
    for (const auto& t : h.tensors) {
      raw.emplace_back(size_t(t.end - t.begin), '\0');
      in.read_at(raw.back().data(), t.end - t.begin, h.data_start + t.begin);
      const std::string* bytes = &raw.back();
      out.push_back({t.name, t.dtype, t.shape, [bytes](char* dst) { std::memcpy(dst, bytes->data(), bytes->size()); }});
    }
  }
  for (const auto& [name, shape] : extra) {
    SafetensorsOut t{name, "F32", shape, nullptr};
    const int64_t n = t.bytes();
    t.fill = [n](char* dst) { std::memset(dst, 0, size_t(n)); };
    out.push_back(t);
  }
  write_safetensors(file.string(), out, meta);
}

// ---- data loss and security ---------------------------------------------------------------

// N2, V7: cuDNN's attention asked of a run that "auto" puts on the CPU is refused before the
// first step, so no checkpoint records a setting no command can load; a checkpoint that does
// (written by an earlier version) loads once the command line corrects it, and a value set by
// the command line is blamed on the command line.
TEST(FaultsInput, CudnnAttentionOnTheCpuIsRefusedAndItsCheckpointsStillLoad) {
  const auto dir = run_dir("cudnn_auto");
  const std::string cfg = config_file(dir, 2);
  Outcome r = run_dhp("train --config " + cfg + " --train.attention=cudnn --train.precision=bf16 --train.device=auto", dir);
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "train.attention = \"cudnn\" needs a CUDA device")) << r.output;
  EXPECT_TRUE(list_checkpoints((dir / "checkpoints").string(), false).empty());

  // Such a checkpoint, as 1b05368 wrote it: device "cpu", attention "cudnn".
  Config bad = small_config(0, dir, {"--checkpoint.dir=" + (dir / "old").string(), "--train.device=cpu"});
  auto world = start_world(nullptr, nullptr);
  const TrainResult t = train(bad, *world);
  ASSERT_FALSE(t.checkpoint.empty());
  bad.train.attention = AttentionImpl::cudnn;
  bad.train.precision = Precision::bf16;
  {
    auto backend = make_cpu_backend({1});
    Model m(bad.model, *backend);
    load_checkpoint(t.checkpoint, m, nullptr);
    TrainState st;
    st.step = 0;
    st.seed = bad.train.seed;
    bad.checkpoint.dir = (dir / "bad").string();
    save_checkpoint(bad, m, nullptr, st);
  }
  const std::string ck = list_checkpoints((dir / "bad").string(), false).back();
  EXPECT_TRUE(contains(error_of([&] { checkpoint_config(ck); }), "needs train.device"));
  EXPECT_EQ(error_of([&] { checkpoint_config(ck, {"--train.attention=own"}); }), "");
  r = run_dhp("eval --checkpoint " + ck + " --data " + (synth_dir() / "val.jsonl").string() + " --train.attention=own", dir);
  EXPECT_EQ(r.status, 0) << r.output;
  // V7: the command line's value is the command line's fault.
  r = run_dhp("generate --checkpoint " + t.checkpoint + " --prompt hello --train.attention=cudnn", dir);
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "with --train.attention=cudnn")) << r.output;
}

// N3: an export that cannot write tokenizer files never deletes an earlier export's; it is
// refused, or with --force keeps them.
TEST(FaultsInput, AnExportWithoutATokenizerKeepsTheEarlierOnes) {
  const auto dir = run_dir("tokdel");
  auto world = start_world(nullptr, nullptr);
  // The run names its tokenizer by a path relative to `dir`.
  fs::create_directories(dir / "tok");
  fs::copy_file(synth_dir() / "tokenizer.model", dir / "tok" / "tokenizer.model");
  const fs::path old = fs::current_path();
  fs::current_path(dir);
  const TrainResult t = train(small_config(1, dir, {"--data.tokenizer=tok/tokenizer.model"}), *world);
  fs::current_path(old);
  const fs::path out = dir / "ex";
  Outcome r = run_dhp("export --format hf --checkpoint " + t.checkpoint + " -o " + out.string(), dir, "cd " + dir.string() + " &&");
  ASSERT_EQ(r.status, 0) << r.output;
  ASSERT_TRUE(fs::exists(out / "tokenizer.model"));
  const std::string before = read_text(out / "tokenizer_config.json");
  // From elsewhere the tokenizer is not found: refused, nothing removed.
  fs::create_directories(dir / "elsewhere");
  r = run_dhp("export --format hf --checkpoint " + t.checkpoint + " -o " + out.string(), dir,
              "cd " + (dir / "elsewhere").string() + " &&");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "has tokenizer files (tokenizer.model")) << r.output;
  EXPECT_TRUE(fs::exists(out / "tokenizer.model"));
  EXPECT_EQ(read_text(out / "tokenizer_config.json"), before);
  r = run_dhp("export --format hf --force --checkpoint " + t.checkpoint + " -o " + out.string(), dir,
              "cd " + (dir / "elsewhere").string() + " &&");
  EXPECT_EQ(r.status, 0) << r.output;
  for (const char* f : {"tokenizer.model", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json"})
    EXPECT_TRUE(fs::exists(out / f)) << f;
  EXPECT_TRUE(contains(read_text(out / "dhp_export.json"), "tokenizer.model"));
}

// N13: --force over a folder of another sharded checkpoint leaves no stale index or shard, so
// dhp and transformers read the same, new weights; a folder holding both kinds is read from
// model.safetensors, as transformers reads it, and the log says so.
TEST(FaultsInput, ExportsSupersedeEveryOldWeightFileAndImportsReadWhatTransformersReads) {
  const auto dir = run_dir("supersede");
  const fs::path sharded = testing::hf_fixture("make_hf_fixture.py", "sharded3",
                                               "--hidden 32 --heads 4 --kv 2 --layers 1 --ffn 48 --vocab 320 --shards 3");
  const fs::path foreign = copy_of(sharded, "foreign_sharded");
  auto world = start_world(nullptr, nullptr);
  const TrainResult t = train(small_config(1, dir, {"--model.init=" + base_folder().string()}), *world);
  Outcome r = run_dhp("export --format hf --force --checkpoint " + t.checkpoint + " -o " + foreign.string(), dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_FALSE(fs::exists(foreign / "model.safetensors.index.json"));
  for (const auto& e : fs::directory_iterator(foreign))
    EXPECT_EQ(e.path().filename().string().rfind("model-", 0), std::string::npos) << e.path();
  // The folder holds exactly this export: the same tensors as an export into an empty folder.
  const fs::path clean = dir / "clean";
  r = run_dhp("export --format hf --checkpoint " + t.checkpoint + " -o " + clean.string(), dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(testing::folder_f32(foreign), testing::folder_f32(clean));
  // Both folders hold both kinds: import reads model.safetensors and says so.
  const fs::path both = copy_of(sharded, "both");
  fs::copy_file(base_folder() / "model.safetensors", both / "model.safetensors");
  const fs::path run2 = run_dir("supersede2");
  r = run_dhp("train --config " + config_file(run2, 0, {"--model.init=" + both.string(), "--log.level=info"}), run2);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "holds both model.safetensors and model.safetensors.index.json; read model.safetensors"))
      << r.output;
}

// V9: an export takes its folder's lock, so a second export into it is refused naming the
// first, and none removes the other's files.
TEST(FaultsInput, ExportsIntoOneFolderAreOneAtATime) {
  const auto dir = run_dir("export_lock");
  auto world = start_world(nullptr, nullptr);
  const TrainResult t = train(small_config(1, dir), *world);
  const fs::path out = dir / "ex";
  fs::create_directories(out);
  {
    RunLock held((out / kRunLockFile).string(), "an export folder");
    const Outcome r = run_dhp("export --format hf --checkpoint " + t.checkpoint + " -o " + out.string(), dir);
    EXPECT_NE(r.status, 0);
    EXPECT_TRUE(contains(r.output, "is in use by another run (pid " + std::to_string(::getpid()))) << r.output;
    EXPECT_FALSE(fs::exists(out / "config.json"));
  }
  const Outcome r = run_dhp("export --format hf --checkpoint " + t.checkpoint + " -o " + out.string(), dir);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_FALSE(fs::exists(out / kRunLockFile)) << "the lock file stays behind";
}

// ---- crashes --------------------------------------------------------------------------------

// N4: JSON nested 200,000 deep in any file of a folder is an error, never a stack overflow.
TEST(FaultsInput, DeeplyNestedJsonInAFolderIsAnError) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  const auto dir = run_dir("deep");
  const std::string cfg = config_file(dir, 1, {"--data.val="});
  struct Case {
    std::string name, file;
    std::function<void(std::string&)> edit;
  };
  const auto set_key = [&](const std::string& key) {
    return [key, deep](std::string& text) { text.insert(text.find('{') + 1, "\"" + key + "\": " + deep + ", "); };
  };
  const Case cases[] = {
      {"rope_scaling", "config.json", set_key("rope_scaling")},
      {"unused key", "config.json", set_key("unused_deep_key")},
      {"added token", "added_tokens.json", [&](std::string& t) { t = "{\"<image>\": " + deep + "}"; }},
  };
  for (const Case& c : cases) {
    const fs::path f = copy_of(base_folder(), "deep_" + std::to_string(&c - cases));
    if (c.file == "added_tokens.json") fs::copy_file(synth_dir() / "tokenizer.model", f / "tokenizer.model");
    std::string text = fs::exists(f / c.file) ? read_text(f / c.file) : "{}";
    c.edit(text);
    write_text(f / c.file, text);
    const std::string tok = c.file == "added_tokens.json" ? " --data.tokenizer=" + f.string() : "";
    const Outcome r = run_dhp("train --config " + cfg + " --model.init=" + f.string() + tok, dir);
    EXPECT_EQ(r.status, 1) << c.name << ": " << r.output;
    EXPECT_TRUE(contains(r.output, "nested deeper than 64 levels")) << c.name << ": " << r.output;
  }
  // A LLaVA folder's nested configs and a tower's preprocessor constants.
  const fs::path llava = testing::hf_fixture("make_hf_llava_fixture.py", "llava_deep_src", "llava_hf --tower clip");
  for (const char* where : {"text_config", "vision_config"}) {
    const fs::path f = copy_of(llava, std::string("deep_") + where);
    std::string text = read_text(f / "config.json");
    text.insert(text.find("\"" + std::string(where) + "\"") + std::strlen(where) + 5, "\"unused\": " + deep + ", ");
    write_text(f / "config.json", text);
    const Outcome r = run_dhp("train --config " + cfg + " --model.init=" + f.string(), dir);
    EXPECT_EQ(r.status, 1) << where << ": " << r.output;
    EXPECT_TRUE(contains(r.output, "nested deeper than")) << where << ": " << r.output;
  }
  const fs::path pp = copy_of(clip_folder(), "deep_preprocessor");
  write_text(pp / "preprocessor_config.json", "{\"image_mean\": " + deep + "}");
  const Outcome r = run_dhp("train --config " + cfg + " --model.init=" + base_folder().string() +
                                " --model.vision.init=" + pp.string() + " --model.vision.merge=1",
                            dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "nested deeper than")) << r.output;
}

// N5: a tower folder holding a tensor dhp does not map is named, not a null dereference.
TEST(FaultsInput, ATowerWithATensorTheModelLacksIsNamed) {
  const auto dir = run_dir("tower_extra");
  const fs::path f = copy_of(clip_folder(), "clip_extra");
  rewrite_with(f / "model.safetensors", {{"vision_model.extra.weight", {1}}});
  const Outcome r = run_dhp("train --config " + config_file(dir, 1, {"--data.val="}) + " --model.init=" +
                                base_folder().string() + " --model.vision.init=" + f.string() + " --model.vision.merge=1",
                            dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "holds tensor 'vision_model.extra.weight', which the model does not have")) << r.output;
}

// N6: a shard truncated while it is read is an error naming it, not SIGBUS.
TEST(FaultsInput, AShardThatShrinksWhileReadIsAnError) {
  const fs::path f = copy_of(base_folder(), "shrinks");
  const std::string path = (f / "model.safetensors").string();
  const InputFile in("checkpoint shard", path);
  const SafetensorsHeader h = read_safetensors_header(in, path);
  const SafetensorsEntry& last = h.tensors.back();
  ASSERT_EQ(::truncate(path.c_str(), off_t(h.data_start + last.begin + 4)), 0);
  std::vector<char> buffer;
  int64_t seen = 0;
  const std::string msg = error_of([&] {
    for (const auto& t : h.tensors) for_each_chunk(in, path, h, t, 3, buffer, [&](const char*, int64_t, int64_t c) { seen += c; });
  });
  EXPECT_TRUE(contains(msg, "shrank while being read")) << msg;
  EXPECT_TRUE(contains(msg, last.name)) << msg;
  EXPECT_GT(seen, 0);
}

// ---- hangs and resource exhaustion ----------------------------------------------------------

// N7: a caption far longer than data.max_tokens could hold is refused before the tokenizer
// sees it (SentencePiece takes time quadratic in a run of characters it does not know).
TEST(FaultsInput, HugeRunsOfUnknownCharactersAreRefusedBeforeTokenizing) {
  const auto dir = run_dir("unknown_run");
  const std::string lines = read_text(synth_dir() / "train.jsonl");
  json j = json::parse(lines.substr(0, lines.find('\n')));
  j["conversations"][1]["value"] = std::string(4 << 20, 'x');
  write_text(dir / "big.jsonl", j.dump() + "\n");
  const Outcome r = run_dhp("data stats --data " + (dir / "big.jsonl").string() + " --data.tokenizer=" +
                                (synth_dir() / "tokenizer.model").string() + " --data.max_tokens=4096" +
                                " --data.image_root=" + synth_dir().string(),
                            dir, "", 60);
  EXPECT_NE(r.status, 124) << "timed out";
  EXPECT_TRUE(contains(r.output, "too long")) << r.output;
  EXPECT_TRUE(contains(r.output, "refused before tokenizing")) << r.output;
}

// A memory limit for the shell that runs dhp: AddressSanitizer reserves terabytes of address
// space for its shadow, so under it (scripts/sanitize.sh) the limit is left out and only the
// messages are checked.
std::string memory_limit(const std::string& kb) {
#if defined(__SANITIZE_ADDRESS__)
  (void)kb;
  return "";
#else
  return "ulimit -v " + kb + ";";
#endif
}

// N8, V5, V6: profile options are range-checked before any measuring; running out of memory
// names the options that asked for it.
TEST(FaultsInput, ProfileOptionsAreChecked) {
  const auto dir = run_dir("profile_opts");
  const std::string cfg = config_file(dir);
  for (const std::string bad : {"32", "-5", "1000000000"}) {
    const Outcome r = run_dhp("profile --config " + cfg + " --repeats 1 --probe-only --max-chunk " + bad, dir, "", 60);
    EXPECT_EQ(r.status, 1) << bad << ": " << r.output;
    EXPECT_TRUE(contains(r.output, "--max-chunk must be between 64 and")) << r.output;
  }
  Outcome r = run_dhp("profile --config " + cfg + " --repeats 1 --probe-only --prior nonsense", dir, "", 60);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--prior 'nonsense' is not a built-in GPU profile")) << r.output;
#if !defined(__SANITIZE_ADDRESS__)  // running out of memory is the point: no limit, no test
  r = run_dhp("profile --config " + cfg + " --repeats 1 --model-profile 7b --out " + (dir / "p.json").string(), dir,
              memory_limit("2500000"), 120);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--model-profile 7b")) << r.output;
#endif
}

// N9: sizes a config.json claims are compared with its tensors before anything of that size is
// built; a safetensors header length is capped before it is read.
TEST(FaultsInput, ClaimedSizesAreCheckedBeforeAllocating) {
  const auto dir = run_dir("claimed_sizes");
  const std::string cfg = config_file(dir, 1, {"--data.val="});
  const fs::path vocab = copy_of(base_folder(), "vocab24");
  edit_json(vocab / "config.json", [](json& c) { c["vocab_size"] = 1 << 24; });
  Outcome r = run_dhp("train --config " + cfg + " --model.init=" + vocab.string(), dir, memory_limit("6000000"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "model.embed_tokens.weight' has shape [320, 32]; config.json implies [16777216, 32] "
                                 "(its vocab_size is 16777216)")) << r.output;
  const fs::path ffn = copy_of(base_folder(), "ffn20");
  edit_json(ffn / "config.json", [](json& c) { c["intermediate_size"] = 1 << 20; });
  r = run_dhp("train --config " + cfg + " --model.init=" + ffn.string(), dir, memory_limit("6000000"), 30);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "config.json implies [1048576, 32]")) << r.output;
  // A LLaVA config without vision_config would build LlavaConfig's default ViT-L tower: its 336-px
  // position grid disagrees with the folder's image processor (16 px) before anything is
  // allocated; with the processor's size made 336 too, the tensors' shapes are refused.
  const fs::path llava = copy_of(testing::hf_fixture("make_hf_llava_fixture.py", "llava_src", "llava_hf --tower clip"),
                                 "llava_novision");
  edit_json(llava / "config.json", [](json& c) { c.erase("vision_config"); });
  r = run_dhp("train --config " + cfg + " --model.init=" + llava.string(), dir, memory_limit("6000000"), 30);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "resizes images to 16 px, but the tower's config.json says image_size 336")) << r.output;
  EXPECT_FALSE(contains(r.output, "out of host memory")) << r.output;
  edit_json(llava / "preprocessor_config.json", [](json& c) {
    c["size"] = json{{"shortest_edge", 336}};
    c["crop_size"] = json{{"height", 336}, {"width", 336}};
  });
  r = run_dhp("train --config " + cfg + " --model.init=" + llava.string(), dir, memory_limit("6000000"), 30);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "has shape")) << r.output;
  EXPECT_FALSE(contains(r.output, "out of host memory")) << r.output;
  // A header length of 3 GiB over a sparse file: refused at once.
  const fs::path sparse = copy_of(base_folder(), "sparse_header");
  {
    std::ofstream f(sparse / "model.safetensors", std::ios::binary | std::ios::trunc);
    const uint64_t n = uint64_t(3) << 30;
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << '{';
  }
  ASSERT_EQ(::truncate((sparse / "model.safetensors").c_str(), off_t((uint64_t(3) << 30) + 108)), 0);
  r = run_dhp("train --config " + cfg + " --model.init=" + sparse.string(), dir, memory_limit("3000000"), 30);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "a safetensors header of 3221225472 bytes is larger than any real one")) << r.output;
}

// N10, N14: ranks compare the options that change the run, what they read besides the
// configuration's files (images, clips) and the weights they start from.
TEST(FaultsInput, RanksAgreeOnOptionsImagesAndStartingWeights) {
  const auto dir = run_dir("agree3");
  // A copy of the data set whose images are all black on rank 1.
  const fs::path black = dir / "black";
  fs::copy(synth_dir(), black, fs::copy_options::recursive);
  for (const auto& e : fs::directory_iterator(black / "images")) {
    cv::Mat im = codecs::read_image(e.path().string(), cv::IMREAD_COLOR);
    im.setTo(cv::Scalar(0, 0, 0));
    ASSERT_TRUE(codecs::write_image(e.path().string(), im));
  }
  auto run = [&](const std::function<Config(int)>& cfg_of, const std::function<TrainOptions(int)>& opt_of) {
    std::vector<std::string> messages(2);
    run_threaded(2, [&](Communicator& comm) {
      messages[size_t(comm.rank())] = error_of([&] { train(cfg_of(comm.rank()), comm, opt_of(comm.rank())); });
    });
    return messages;
  };
  const auto same_opts = [](int) { return TrainOptions{}; };
  // --stop-after on one rank only.
  auto m = run([&](int) { return small_config(3, dir / "s"); },
               [](int r) { TrainOptions o; o.stop_after = r == 1 ? 1 : -1; return o; });
  EXPECT_TRUE(contains(m[0], "--stop-after = 1 there, -1 on rank 0")) << m[0];
  // Another image folder's bytes under the same manifest.
  fs::copy_file(synth_dir() / "train.jsonl", dir / "train.jsonl");
  m = run([&](int r) {
        return small_config(1, dir / "i",
                            {"--data.train=" + (r == 1 ? black : synth_dir()).string() + "/train.jsonl", "--data.val="});
      },
      same_opts);
  EXPECT_TRUE(contains(m[0], "data.train (its images and clips)")) << m[0];
  // Other starting weights: --init of two different exports.
  auto world = start_world(nullptr, nullptr);
  const TrainResult a = train(small_config(1, dir / "wa"), *world);
  const TrainResult b = train(small_config(2, dir / "wb"), *world);
  m = run([&](int) { return small_config(1, dir / "w", {"--data.val="}); },
          [&](int r) { TrainOptions o; o.init = r == 1 ? b.checkpoint : a.checkpoint; return o; });
  EXPECT_TRUE(contains(m[0], "the starting weights")) << m[0];
  // --init given to rank 0 only.
  m = run([&](int) { return small_config(1, dir / "o", {"--data.val="}); },
          [&](int r) { TrainOptions o; if (r == 0) o.init = a.checkpoint; return o; });
  EXPECT_TRUE(contains(m[0], "--init = not given there, given on rank 0")) << m[0];
}

// ---- wrong results --------------------------------------------------------------------------

// N11, N12: a folder named with a trailing slash, and one in the hub cache's layout (every file
// a symbolic link into ../../blobs), start a run as the plain folder does.
TEST(FaultsInput, FolderNamesAsUsersTypeThemAndHubCacheLayouts) {
  const auto dir = run_dir("folder_names");
  const std::string cfg = config_file(dir, 0, {"--data.val="});
  Outcome r = run_dhp("train --config " + cfg + " --model.init=" + base_folder().string() + "/", dir);
  EXPECT_EQ(r.status, 0) << r.output;
  r = run_dhp("train --config " + config_file(dir, 0, {"--data.val=", "--checkpoint.dir=" + (dir / "c2").string()}) +
                  " --model.init=" + base_folder().string() + "//",
              dir);
  EXPECT_EQ(r.status, 0) << r.output;
  r = run_dhp("eval --checkpoint " + base_folder().string() + "/ --data " + (synth_dir() / "val.jsonl").string() +
                  " --data.tokenizer=" + (synth_dir() / "tokenizer.model").string(),
              dir);
  EXPECT_EQ(r.status, 0) << r.output;
  // The hub cache: snapshots/<rev>/<file> -> ../../blobs/<name>.
  const fs::path hub = dir / "hub" / "models--x--tiny";
  fs::create_directories(hub / "blobs");
  fs::create_directories(hub / "snapshots" / "abc123");
  for (const auto& e : fs::directory_iterator(base_folder())) {
    const std::string name = e.path().filename().string();
    fs::copy_file(e.path(), hub / "blobs" / ("blob_" + name));
    fs::create_symlink(fs::path("..") / ".." / "blobs" / ("blob_" + name), hub / "snapshots" / "abc123" / name);
  }
  r = run_dhp("train --config " + config_file(dir, 0, {"--data.val=", "--checkpoint.dir=" + (dir / "c3").string()}) +
                  " --model.init=" + (hub / "snapshots" / "abc123").string(),
              dir);
  EXPECT_EQ(r.status, 0) << r.output;
}

// N15: a tokenizer whose own pieces outnumber the checkpoint's rows is another model's.
TEST(FaultsInput, ATokenizerLargerThanTheCheckpointIsRefused) {
  const auto dir = run_dir("bigtok");
  Outcome r = run_dhp("data synth --out " + (dir / "big").string() + " --train 200 --val 2 --vocab-size 2000", dir);
  ASSERT_EQ(r.status, 0) << r.output;
  // A folder of 160 rows, as an export of a run on the 160-piece demo tokenizer is.
  const fs::path rows160 = testing::hf_fixture("make_hf_fixture.py", "rows160",
                                               "--hidden 32 --heads 4 --kv 2 --layers 1 --ffn 48 --vocab 160");
  const std::string args = "train --config " + config_file(dir, 1, {"--data.val="}) + " --model.init=" + rows160.string();
  r = run_dhp(args + " --data.tokenizer=" + (dir / "big" / "tokenizer.model").string(), dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "pieces of its own, more than the 160 rows")) << r.output;
  // The folder's own tokenizer size, and one with added tokens only, still start.
  r = run_dhp(args + " --data.tokenizer=" + (synth_dir() / "tokenizer.model").string(), dir);
  EXPECT_EQ(r.status, 0) << r.output;
}

// N16: preprocessor constants outside what pixels can be are refused, naming the file.
TEST(FaultsInput, PixelConstantsAreRangeChecked) {
  const auto dir = run_dir("pixel_consts");
  const std::string cfg = config_file(dir, 1, {"--data.val="});
  struct Case {
    const char* key;
    double value;
  };
  for (const Case c : {Case{"image_mean", 1e10}, Case{"image_mean", -0.5}, Case{"image_std", 1e-300}, Case{"image_std", 1e300}}) {
    const fs::path f = copy_of(clip_folder(), std::string("pp_") + c.key);
    edit_json(f / "preprocessor_config.json", [&](json& j) {
      j[c.key] = {c.value, 0.4, 0.4};
      j["do_pad"] = true;
    });
    const Outcome r = run_dhp("train --config " + cfg + " --model.init=" + base_folder().string() +
                                  " --model.vision.init=" + f.string() + " --model.vision.merge=1",
                              dir);
    EXPECT_EQ(r.status, 1) << c.key << " " << c.value << ": " << r.output;
    EXPECT_TRUE(contains(r.output, "preprocessor_config.json': \"" + std::string(c.key) + "\"[0]")) << r.output;
  }
}

// ---- unclear messages -----------------------------------------------------------------------

// V1: a non-finite first step names where the weights came from, not the learning rate.
TEST(FaultsInput, ANonFiniteFirstStepNamesTheWeights) {
  const auto dir = run_dir("huge_weight");
  const fs::path f = copy_of(base_folder(), "huge_weight");
  {
    // 3e38 in one q_proj weight: finite, but its products overflow.
    const std::string path = (f / "model.safetensors").string();
    const InputFile in("x", path);
    const SafetensorsHeader h = read_safetensors_header(in, path);
    const SafetensorsEntry* q = h.find("model.layers.0.self_attn.q_proj.weight");
    ASSERT_TRUE(q && q->dtype == "F32");
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    const float big = 3e38f;
    for (int64_t i = 0; i < q->numel(); ++i) {
      io.seekp(std::streamoff(h.data_start + q->begin + 4 * i));
      io.write(reinterpret_cast<const char*>(&big), 4);
    }
  }
  const Outcome r = run_dhp("train --config " + config_file(dir, 1, {"--data.val="}) + " --model.init=" + f.string(), dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "before any update of this run")) << r.output;
  EXPECT_TRUE(contains(r.output, "model.init '" + f.string() + "'")) << r.output;
  EXPECT_FALSE(contains(r.output, "lower optim.lr")) << r.output;
}

// V2: LLaVA's own data files, one JSON array (pretty-printed or on one line), are read as
// records everywhere a JSONL is.
TEST(FaultsInput, JsonArrayManifestsAreReadAsRecords) {
  const auto dir = run_dir("json_array");
  std::vector<json> records;
  std::ifstream in(synth_dir() / "train.jsonl");
  for (std::string line; std::getline(in, line);) records.push_back(json::parse(line));
  write_text(dir / "train_pretty.json", json(records).dump(2));
  write_text(dir / "train_one_line.json", json(records).dump());
  // The arrays lie in this test's folder (the data set is shared), their images in the set's.
  const std::string root = " --data.image_root=" + synth_dir().string();
  const std::string tok = " --data.tokenizer=" + (synth_dir() / "tokenizer.model").string() + root;
  const Outcome jsonl = run_dhp("data stats --data " + (synth_dir() / "train.jsonl").string() + tok, dir);
  ASSERT_EQ(jsonl.status, 0) << jsonl.output;
  for (const char* name : {"train_pretty.json", "train_one_line.json"}) {
    const Outcome r = run_dhp("data stats --data " + (dir / name).string() + tok, dir);
    EXPECT_EQ(r.status, 0) << r.output;
    // The same samples, token for token: the statistics are the same lines.
    EXPECT_EQ(r.output.substr(r.output.find("samples")), jsonl.output.substr(jsonl.output.find("samples"))) << name;
  }
  Outcome r = run_dhp("data build --manifest " + (dir / "train_pretty.json").string() + " --tokenizer " +
                          (synth_dir() / "tokenizer.model").string() + " --out " + (dir / "built").string() +
                          " --image-root " + synth_dir().string(),
                      dir);
  EXPECT_EQ(r.status, 0) << r.output;
  r = run_dhp("train --config " + config_file(dir, 2, {"--data.train=" + (dir / "train_pretty.json").string(),
                                               "--data.image_root=" + synth_dir().string()}), dir);
  EXPECT_EQ(r.status, 0) << r.output;
  // A cut-off array names its last record.
  std::string cut = read_text(dir / "train_pretty.json");
  write_text(dir / "cut.json", cut.substr(0, cut.size() / 2));
  r = run_dhp("data stats --data " + (dir / "cut.json").string() + tok, dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "is a JSON array cut off in record")) << r.output;
}

// V3, V4: messages about folders quote a bounded excerpt, stop at no NUL, show the number a
// file holds, and read as sentences.
TEST(FaultsInput, MessagesAboutFoldersAreShortWholeAndExact) {
  const auto dir = run_dir("messages");
  const std::string cfg = config_file(dir, 1, {"--data.val="});
  const fs::path rope = copy_of(base_folder(), "big_rope");
  edit_json(rope / "config.json", [](json& c) { c["rope_scaling"] = {{"type", std::string(200000, 'y')}}; });
  Outcome r = run_dhp("train --config " + cfg + " --model.init=" + rope.string(), dir);
  EXPECT_EQ(r.status, 1);
  EXPECT_LT(r.output.size(), 4000u) << "the 200 kB value was echoed";
  EXPECT_TRUE(contains(r.output, "rope_scaling")) << r.output.substr(0, 500);
  const fs::path huge = copy_of(base_folder(), "huge_hidden");
  std::string text = read_text(huge / "config.json");
  const size_t at = text.find("\"hidden_size\"");
  text.replace(at, text.find(',', at) - at, "\"hidden_size\": 18446744073709551615");
  write_text(huge / "config.json", text);
  r = run_dhp("train --config " + cfg + " --model.init=" + huge.string(), dir);
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.output, "\"hidden_size\" = 18446744073709551615 is out of range")) << r.output;
  // A NUL in a shard's name in the index: the message goes on past it.
  const fs::path nul = copy_of(testing::hf_fixture("make_hf_fixture.py", "sharded2", "--hidden 32 --heads 4 --kv 2 "
                                                   "--layers 1 --ffn 48 --vocab 320 --shards 2"), "index_nul");
  text = read_text(nul / "model.safetensors.index.json");
  text.replace(text.find("model-00001"), 11, "model-\\u0000001");
  write_text(nul / "model.safetensors.index.json", text);
  r = run_dhp("train --config " + cfg + " --model.init=" + nul.string(), dir);
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.output, "is not a file name in the folder (for '")) << r.output;
  // A folder where the single file should be: no index is named.
  const fs::path stdir = copy_of(base_folder(), "st_dir");
  fs::remove(stdir / "model.safetensors");
  fs::create_directories(stdir / "model.safetensors");
  r = run_dhp("train --config " + cfg + " --model.init=" + stdir.string(), dir);
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.output, "is a folder, not a regular file")) << r.output;
  EXPECT_FALSE(contains(r.output, "listed in")) << r.output;
  // V4.
  auto world = start_world(nullptr, nullptr);
  const TrainResult t = train(small_config(1, dir / "v4"), *world);
  for (const std::string n : {"0", "-5"}) {
    r = run_dhp("export --format hf --max-shard-bytes " + n + " --checkpoint " + t.checkpoint + " -o " +
                    (dir / "v4" / "ex").string(),
                dir);
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_TRUE(contains(r.output, "--max-shard-bytes must be at least 1, got " + n)) << r.output;
  }
}

// V8: a run started from a folder resumes when the folder has moved (the checkpoint holds the
// shape and the weights); a changed shape is named key by key, with the keys to restate.
TEST(FaultsInput, ResumesNeedNotTheFolderAndNameWhatChanged) {
  const auto dir = run_dir("resume_moved");
  const fs::path f = copy_of(base_folder(), "res_a");
  const std::string cfg = config_file(dir, 2, {"--data.val=", "--model.init=" + f.string()});
  Outcome r = run_dhp("train --config " + cfg + " --stop-after 1", dir);
  ASSERT_EQ(r.status, 0) << r.output;
  fs::rename(f, testing::hf_fixture_root() / "res_a_moved");
  r = run_dhp("train --config " + cfg + " --resume auto --log.level=info", dir);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "the model's keys come from the checkpoint resumed")) << r.output;
  r = run_dhp("train --config " + cfg + " --resume auto --train.steps=3 --model.rms_norm_eps=1e-6 --model.init=", dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "model.rms_norm_eps = 1e-05 in the checkpoint, 1e-06 now")) << r.output;
  EXPECT_TRUE(contains(r.output, "--model.rms_norm_eps=1e-05")) << r.output;
  EXPECT_FALSE(contains(r.output, "  =")) << "the padded table was pasted: " << r.output;
}

}  // namespace
}  // namespace dhp
