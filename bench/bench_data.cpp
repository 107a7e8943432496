// Data pipeline benchmarks: `dhp data build` throughput (lines/s, MB/s of input read) and
// loader throughput (samples/s, tokens/s) from built shards and from the JSONL manifest, with
// 1 and 2 worker threads, and for a set with video clips the decode time per clip with
// seeking against decoding forward and the video frames the build stores per second per
// worker. Run it on a synthetic set made by `dhp data synth --preset ...`
// (see docs/data.md for the commands). With --tokenizer, it instead builds the set once per
// tokenizer (SentencePiece against a tokenizer.json, each with its template), `--repeats` times
// each in turn, and prints the median build time of each and its ratio to the first.
// Prints tables; asserts nothing.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bench/timing.h"
#include "core/check.h"
#include "core/clock.h"
#include "core/log.h"
#include "data/build.h"
#include "data/chat_template.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/shard_dataset.h"
#include "data/tokenizer.h"
#include "data/manifest.h"
#include "data/video.h"

namespace {

using namespace dhp;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The build every row measures: `workers` threads, into `out_dir` (emptied first).
BuildOptions bench_build(const std::string& manifest, const std::string& tokenizer, const ImageGeometry& v,
                         const std::string& out_dir, int workers) {
  BuildOptions o;
  o.manifest = manifest;
  o.tokenizer = tokenizer;
  o.out_dir = out_dir;
  o.vision = v;
  o.max_tokens = int64_t(1) << 20;  // measure every sample: nothing is too long here
  o.workers = workers;
  o.shard_bytes = int64_t(32) << 20;  // several shards, as a real build has
  o.progress = false;
  fs::remove_all(o.out_dir);
  return o;
}

// One build of `manifest` with `tokenizer` laid out by `chat` on one worker; its CPU seconds
// (the build's own threads included) and summary.
BuildSummary timed_build(const std::string& manifest, const std::string& tokenizer, ChatTemplate chat,
                         const ImageGeometry& v, const std::string& out_dir, double& cpu) {
  BuildOptions o = bench_build(manifest, tokenizer, v, out_dir, 1);
  o.chat = chat;
  const double c0 = process_cpu_seconds();
  BuildSummary s = build_dataset(o);
  cpu = process_cpu_seconds() - c0;
  fs::remove_all(o.out_dir);
  return s;
}

// `dhp data build` of one set with each tokenizer ("PATH" or "PATH:TEMPLATE"), round robin
// `repeats` times so that a change in the machine's load falls on every row alike.
void tokenizer_rows(const std::string& manifest, const std::vector<std::string>& specs, int repeats,
                    const ImageGeometry& v, const std::string& out) {
  struct Row {
    std::string path;
    ChatTemplate chat = ChatTemplate::Dhp;
    std::vector<double> wall, cpu;
    BuildSummary last;
  };
  std::vector<Row> rows;
  for (const std::string& spec : specs) {
    Row r;
    const size_t colon = spec.rfind(':');
    r.path = colon == std::string::npos ? spec : spec.substr(0, colon);
    if (colon != std::string::npos) r.chat = parse_template(spec.substr(colon + 1));
    rows.push_back(std::move(r));
  }
  for (int i = 0; i < repeats; ++i)
    for (Row& r : rows) {
      double cpu = 0;
      r.last = timed_build(manifest, r.path, r.chat, v, out + "/built-tok", cpu);
      r.wall.push_back(r.last.seconds);
      r.cpu.push_back(cpu);
    }
  fmt::print("build with each tokenizer: {} ({} bytes of manifest), 1 worker, {} runs each\n", manifest,
             fs::file_size(manifest), repeats);
  fmt::print("{:<48}{:>9}{:>9}{:>18}{:>10}{:>12}{:>10}\n", "tokenizer", "template", "samples", "wall s (range)",
             "CPU s", "samples/s", "CPU ratio");
  const double base = bench::median(rows.front().cpu);
  for (const Row& r : rows) {
    const auto [lo, hi] = std::minmax_element(r.wall.begin(), r.wall.end());
    const double cpu = bench::median(r.cpu);
    fmt::print("{:<48}{:>9}{:>9}{:>7.1f} ({:4.1f}-{:4.1f}){:>10.1f}{:>12.0f}{:>9.2f}x\n", r.path,
               template_name(r.chat), r.last.samples, bench::median(r.wall), *lo, *hi, cpu,
               double(r.last.samples) / bench::median(r.wall), cpu / base);
  }
}

// Decodes `samples` samples in batches of `batch` through a BatchLoader with up to 4 batches
// in flight (what the training loop keeps), as fast as the workers can go.
void loader_row(const char* source, const Dataset& ds, int workers, int64_t samples, int64_t batch,
                bool print = true) {
  BatchLoader loader(ds, workers, 4);
  const int64_t n = std::min(samples, ds.size());
  const int64_t n_batches = (n + batch - 1) / batch;
  auto ids = [&](int64_t b) {
    std::vector<int64_t> out;
    for (int64_t i = b * batch; i < std::min(n, (b + 1) * batch); ++i) out.push_back(i);
    return out;
  };
  const auto t0 = Clock::now();
  int64_t submitted = 0, tokens = 0, patches = 0, images = 0;
  for (; submitted < std::min<int64_t>(4, n_batches); ++submitted) loader.submit(ids(submitted), false);
  for (int64_t b = 0; b < n_batches; ++b) {
    for (const Sample& s : loader.next()) {
      tokens += int64_t(s.tokens.size());
      for (const auto& im : s.images) patches += im.n_patches();
      images += int64_t(s.images.size());
    }
    if (submitted < n_batches) loader.submit(ids(submitted++), false);
  }
  const double t = seconds_since(t0);
  if (print) fmt::print("{:<8}{:>8}{:>10}{:>12.0f}{:>14.0f}{:>14.0f}{:>14.0f}\n", source, workers, n, double(n) / t,
             double(tokens) / t, double(patches) / t, double(images) / t / workers);
}

// Every clip of the manifest decoded at its sampled frames, once seeking and once decoding
// forward: the mean time per clip and the frames the decoder went through.
void video_rows(const std::string& manifest, const std::string& root, const VideoRules& rules) {
  std::ifstream in(manifest);
  std::string line;
  std::vector<std::string> clips;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    for (const auto& rel : media_list(j, "video")) clips.push_back((fs::path(root) / rel).string());
  }
  if (clips.empty()) return;
  fmt::print("\nvideo decode: {} clips, sampled at {} fps, {}..{} frames\n", clips.size(),
             rules.fps, rules.min_frames, rules.max_frames);
  fmt::print("{:<10}{:>10}{:>12}{:>10}{:>12}{:>14}\n", "mode", "frames", "decoded", "seeks",
             "ms/clip", "frames/s");
  // An unmeasured pass first, so both modes read the files from the page cache.
  const bool modes[3] = {false, true, false};
  for (int pass = 0; pass < 3; ++pass) {
    const bool seek = modes[pass];
    int64_t frames = 0, decoded = 0, seeks = 0;
    const auto t0 = Clock::now();
    for (const auto& path : clips) {
      VideoReader r(path, "", seek);
      for (int64_t f : sample_frames(r.info().frames, r.info().fps, rules)) r.frame(f), ++frames;
      decoded += r.decoded();
      seeks += r.seeks();
    }
    const double t = seconds_since(t0);
    if (pass == 0) continue;
    fmt::print("{:<10}{:>10}{:>12}{:>10}{:>12.2f}{:>14.0f}\n", seek ? "seek" : "forward", frames,
               decoded, seeks, 1e3 * t / double(clips.size()), double(frames) / t);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_data: build and loader throughput of the data pipeline"};
  std::string data, out = "/tmp/dhp_bench_data";
  int64_t load_samples = 4000, batch = 32;
  std::vector<int> workers = {1, 2};
  std::vector<double> video_fps = {1.0, 0.25};
  std::vector<std::string> tokenizers;
  int repeats = 3;
  ImageGeometry v;
  app.add_option("--data", data, "Folder written by `dhp data synth` (train.jsonl, tokenizer.model)")
      ->required();
  app.add_option("--out", out, "Scratch folder for the builds (removed first)")->capture_default_str();
  app.add_option("--workers", workers, "Worker counts to measure")->capture_default_str();
  app.add_option("--load-samples", load_samples, "Samples each loader row decodes")->capture_default_str();
  app.add_option("--batch", batch, "Samples per loader submission")->capture_default_str();
  app.add_option("--video-fps", video_fps, "Sampling rates of the video decode rows")
      ->capture_default_str();
  app.add_option("--tokenizer", tokenizers,
                 "Compare builds with these tokenizers (PATH or PATH:TEMPLATE, the first the baseline) "
                 "instead of the worker and loader tables");
  app.add_option("--repeats", repeats, "Builds per tokenizer (with --tokenizer)")->capture_default_str();
  app.add_option("--patch", v.patch)->capture_default_str();
  app.add_option("--merge", v.merge)->capture_default_str();
  app.add_option("--min-pixels", v.min_pixels)->capture_default_str();
  app.add_option("--max-pixels", v.max_pixels)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::warn);
  try {
    const std::string manifest = (fs::path(data) / "train.jsonl").string();
    const std::string tok_path = (fs::path(data) / "tokenizer.model").string();
    if (!tokenizers.empty()) {
      tokenizer_rows(manifest, tokenizers, std::max(1, repeats), v, out);
      return 0;
    }
    fmt::print("build: {} ({} bytes of manifest)\n", manifest, fs::file_size(manifest));
    fmt::print("{:<8}{:>10}{:>10}{:>10}{:>12}{:>10}{:>10}{:>16}\n", "workers", "lines", "samples",
               "seconds", "lines/s", "MB/s in", "shards", "frames/s/worker");
    std::string built;
    for (int w : workers) {
      const BuildOptions o = bench_build(manifest, tok_path, v, out + "/built-w" + std::to_string(w), w);
      const BuildSummary s = build_dataset(o);
      fmt::print("{:<8}{:>10}{:>10}{:>10.2f}{:>12.0f}{:>10.1f}{:>10}{:>16.0f}\n", w,
                 s.processed_lines, s.samples, s.seconds,
                 double(s.processed_lines) / s.seconds, double(s.input_bytes) / 1e6 / s.seconds,
                 s.shards, double(s.video_frames) / s.seconds / w);
      built = o.out_dir;
    }

    Tokenizer tok(tok_path);
    ShardDataset shards(built, tok, v, int64_t(1) << 20, "fail");
    JsonlDataset jsonl(manifest, "", tok, v, int64_t(1) << 20, "fail");
    fmt::print("\nloader: batches of {}, 4 in flight, patch {} merge {} pixels {}..{}\n", batch,
               v.patch, v.merge, v.min_pixels, v.max_pixels);
    fmt::print("{:<8}{:>8}{:>10}{:>12}{:>14}{:>14}{:>14}\n", "source", "workers", "samples",
               "samples/s", "tokens/s", "patches/s", "images/s/wkr");
    // A first, unmeasured pass grows the heap once, so the first measured row does not pay
    // for page faults that later rows would not.
    loader_row("warm-up", shards, workers.back(), load_samples, batch, false);
    for (int w : workers) loader_row("shards", shards, w, load_samples, batch);
    for (int w : workers) loader_row("jsonl", jsonl, w, load_samples, batch);
    for (double fps : video_fps) {
      VideoRules rules;
      rules.fps = fps;
      video_rows(manifest, data, rules);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_data: %s\n", e.what());
    return 1;
  }
  return 0;
}
