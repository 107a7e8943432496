#include "data/build.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "core/check.h"
#include "core/progress.h"
#include "core/hash.h"
#include "core/input.h"
#include "core/log.h"
#include "data/codecs.h"
#include "data/config.h"
#include "data/image.h"
#include "data/manifest_reader.h"
#include "data/resample.h"
#include "data/shard_format.h"
#include "data/shard_io.h"
#include "data/tokenizer.h"
#include "data/video.h"

namespace dhp {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int kJpegQuality = 95;       // --reencode jpeg: visually lossless for training
constexpr int kLinesPerWorker = 256;   // lines per round, per worker: enough that one long
                                       // sample (a 64-frame video) does not idle the rest

// Runs fn(0..n-1) on a fixed set of threads; run() returns when all calls are done.
class Pool {
 public:
  explicit Pool(int threads) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void run(int64_t n, const std::function<void(int64_t)>& fn) {
    std::unique_lock<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    next_ = 0;
    left_ = n;
    cv_.notify_all();
    done_.wait(lock, [&] { return left_ == 0; });
    fn_ = nullptr;
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      // Between rounds next_ == n_, so no thread starts work before run() resets them.
      cv_.wait(lock, [&] { return stop_ || next_ < n_; });
      if (stop_) return;
      const int64_t i = next_++;
      const auto* fn = fn_;
      lock.unlock();
      (*fn)(i);  // never throws: callers catch inside
      lock.lock();
      if (--left_ == 0) done_.notify_all();
    }
  }
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_, done_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, next_ = 0, left_ = 0;
  bool stop_ = false;
};

// Writes shards on its own thread, one in flight, so workers keep decoding meanwhile.
class ShardWriter {
 public:
  explicit ShardWriter(std::string dir) : dir_(std::move(dir)), thread_([this] { loop(); }) {}
  ~ShardWriter() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void submit(int64_t k, ShardContents s) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !job_ || error_; });
    rethrow();
    job_.emplace(k, std::move(s));
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !job_; });
    rethrow();
  }

 private:
  void rethrow() {
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || job_; });
      if (!job_) return;
      lock.unlock();
      try {
        write_shard((fs::path(dir_) / shard_file_name(job_->first)).string(), job_->second);
      } catch (...) {
        lock.lock();
        error_ = std::current_exception();
        lock.unlock();
      }
      lock.lock();
      job_.reset();
      cv_.notify_all();
    }
  }
  std::string dir_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<std::pair<int64_t, ShardContents>> job_;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;
};

// One manifest line, checked and ready to append to a shard.
struct LineResult {
  int64_t line = 0;
  bool blank = false;
  std::optional<LineError> error;
  ParsedLine parsed;
  std::vector<std::vector<uint8_t>> blobs;  // encoded image bytes, as stored
  int64_t bytes_read = 0;
  int64_t frames = 0;        // video frames decoded and stored
  std::exception_ptr fatal;  // not a bad line but a failure of the build itself
};

LineResult process_line(const std::string& text, int64_t line_no, const Tokenizer& tok,
                        const LineRules& rules, const std::string& reencode) {
  LineResult r;
  r.line = line_no;
  r.bytes_read = int64_t(text.size()) + 1;
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) {
    r.blank = true;
    return r;
  }
  try {
    r.parsed = parse_line(text, line_no, tok, rules);
    // Video frames are decoded here, once, and stored at their final size, so training
    // never runs FFmpeg. PNG unless --reencode jpeg: lossless, so a built set trains on the
    // pixels the JSONL path decodes.
    std::vector<cv::Mat> frames, pair_frames;
    check_line_frames(r.parsed, &frames, &pair_frames);
    std::set<std::string> clips;  // each clip's bytes count once as input read
    for (size_t k = 0; k < r.parsed.paths.size(); ++k)
      if (r.parsed.frames[k].index >= 0 && clips.insert(r.parsed.paths[k]).second) {
        std::error_code ec;
        r.bytes_read += int64_t(fs::file_size(r.parsed.paths[k], ec));
      }
    for (size_t k = 0; k < r.parsed.paths.size(); ++k) {
      const std::string& path = r.parsed.paths[k];
      if (r.parsed.frames[k].index >= 0) {
        // A frame pair is stored as one picture, its second frame below its first (ShardDataset
        // splits it: only a pair decodes to twice its recorded height).
        if (r.parsed.frames[k].pair >= 0) cv::vconcat(frames[k], pair_frames[k], frames[k]);
        // A tiled tower takes a frame as one tile: stored as that tile (Pillow's resize to
        // image_size, as the JSONL path prepares it), which tiles to itself at load.
        if (rules.vision.tiled()) {
          const int side = rules.vision.image_size;
          if (frames[k].rows != side || frames[k].cols != side) frames[k] = pil_resize_bicubic(frames[k], side, side);
          r.parsed.sizes[k] = {side, side};
        }
        std::vector<uint8_t> bytes;
        const bool jpeg = reencode == "jpeg";
        DHP_CHECK(codecs::encode_image(jpeg ? ".jpg" : ".png", frames[k], bytes,
                               jpeg ? std::vector<int>{cv::IMWRITE_JPEG_QUALITY, kJpegQuality}
                                    : std::vector<int>{cv::IMWRITE_PNG_COMPRESSION, 1}),
                  "cannot encode frame {} of '{}'", r.parsed.frames[k].index, path);
        r.blobs.push_back(std::move(bytes));
        ++r.frames;
        continue;
      }
      // Every image is decoded once here, so corrupt and truncated files are caught at build
      // time rather than in the middle of a training run.
      cv::Mat bgr;
      std::vector<uint8_t> bytes = read_line_image(r.parsed, k, &bgr);
      r.bytes_read += int64_t(bytes.size());
      if (reencode != "none") {
        const std::vector<int> params =
            reencode == "jpeg" ? std::vector<int>{cv::IMWRITE_JPEG_QUALITY, kJpegQuality}
                               : std::vector<int>{cv::IMWRITE_PNG_COMPRESSION, 3};
        bytes.clear();
        DHP_CHECK(codecs::encode_image(reencode == "jpeg" ? ".jpg" : ".png", bgr, bytes, params),
                  "cannot re-encode '{}' as {}", path, reencode);
      }
      r.blobs.push_back(std::move(bytes));
    }
  } catch (const LineError& e) {
    r.error = e;
    r.blobs.clear();
  }
  return r;
}

void append(ShardContents& s, LineResult& r) {
  const ParsedLine& p = r.parsed;
  const int64_t lb = int64_t(s.layout.size()), ib = s.n_images();
  s.layout.insert(s.layout.end(), p.layout.begin(), p.layout.end());
  s.layout_loss.insert(s.layout_loss.end(), p.loss.begin(), p.loss.end());
  uint64_t text_sum = fnv1a(p.layout.data(), p.layout.size() * sizeof(int32_t));
  text_sum = fnv1a(p.loss.data(), p.loss.size(), text_sum);
  for (size_t k = 0; k < r.blobs.size(); ++k) {
    const auto& b = r.blobs[k];
    const int64_t at = int64_t(s.image_bytes.size());
    s.image_bytes.insert(s.image_bytes.end(), b.begin(), b.end());
    const int64_t row[kImageCols] = {at, at + int64_t(b.size()), p.sizes[k].h, p.sizes[k].w,
                                     int64_t(fnv1a(b.data(), b.size()))};
    s.images.insert(s.images.end(), row, row + kImageCols);
  }
  const int64_t row[kSampleCols] = {lb, int64_t(s.layout.size()), ib, s.n_images(),
                                    p.vision_tokens, p.text_tokens, p.loss_tokens, r.line,
                                    int64_t(text_sum)};
  s.samples.insert(s.samples.end(), row, row + kSampleCols);
  s.names += p.name;
  s.name_offsets.push_back(int64_t(s.names.size()));
}

std::string hex(uint64_t v) { return fmt::format("{:016x}", v); }

// The build's progress in manifest lines: a bar that redraws itself on a terminal, a log line
// every few seconds elsewhere (a batch job's log), both with an ETA from the pace so far.
class Progress {
 public:
  Progress(int64_t total, bool on) : total_(total), on_(on), terminal_(isatty(STDERR_FILENO) != 0) {}
  void draw(int64_t done, int64_t samples, int64_t skipped, int64_t bytes, double secs) {
    if (!on_ || (!terminal_ && secs < next_line_s_)) return;
    const double rate = double(bytes) / 1e6 / std::max(secs, 1e-9);
    const std::string eta = done > 0 && total_ > done
                                ? ", eta " + duration_text(secs / double(done) * double(total_ - done)) : "";
    if (!terminal_) {
      spdlog::info("build: {}/{} lines ({:.0f}%), {} samples, {} skipped, {:.1f} MB/s{}", done, total_,
                   100.0 * double(done) / double(std::max<int64_t>(1, total_)), samples, skipped, rate, eta);
      next_line_s_ = secs + kLineEveryS;
      return;
    }
    const int width = 30;
    const int fill = int(width * done / std::max<int64_t>(1, total_));
    fmt::print(stderr, "\r[{:=<{}}{:<{}}] {}/{} lines, {} samples, {} skipped, {:.1f} MB/s{}\033[K",
               "", fill, "", width - fill, done, total_, samples, skipped, rate, eta);
    std::fflush(stderr);
  }
  void clear() {
    if (on_ && terminal_) fmt::print(stderr, "\r\033[K");
  }

 private:
  static constexpr double kLineEveryS = 5.0;
  int64_t total_;
  bool on_, terminal_;
  double next_line_s_ = kLineEveryS;
};

// Checks the options and the folder; returns the build key that any resumed run must match.
std::string build_key(const BuildOptions& o, const std::string& image_root,
                      const std::string& tok_hash, int64_t* lines) {
  DHP_CHECK(o.on_error == "skip" || o.on_error == "fail",
            "data.on_error must be \"skip\" or \"fail\", not \"{}\"", o.on_error);
  DHP_CHECK(o.reencode == "none" || o.reencode == "png" || o.reencode == "jpeg",
            "--reencode must be none, png or jpeg, not '{}'", o.reencode);
  DHP_CHECK(o.workers >= 1 && o.workers <= kMaxDataWorkers,
            "--workers must be between 1 and {}, not {}", kMaxDataWorkers, o.workers);
  DHP_CHECK(o.shard_bytes > 0, "the shard size must be positive");
  DHP_CHECK(o.max_new_shards == -1 || o.max_new_shards >= 1,
            "--max-shards must be >= 1, not {}", o.max_new_shards);
  DHP_CHECK(!o.out_dir.empty(), "--out is required");
  DHP_CHECK(!fs::is_directory(o.manifest), "manifest '{}' is a folder, not a JSONL file",
            printable(o.manifest));
  // One pass over the manifest: its hash ties committed shards to these exact bytes.
  ManifestReader in(o.manifest);
  uint64_t h = kFnvSeed;
  int64_t n_lines = 0, size = 0;
  std::string line;
  while (in.next(line)) {
    h = fnv1a(line.data(), line.size(), h);
    h = fnv1a("\n", 1, h);
    size += int64_t(line.size()) + 1;
    ++n_lines;
  }
  *lines = n_lines;
  nlohmann::ordered_json j;
  j["format_version"] = kShardFormatVersion;
  j["manifest_hash"] = hex(h);
  j["manifest_bytes"] = size;
  j["image_root"] = fs::absolute(image_root).lexically_normal().string();
  j["tokenizer_hash"] = tok_hash;
  j["patch"] = o.vision.patch;
  j["merge"] = o.vision.merge;
  j["min_pixels"] = o.vision.min_pixels;
  j["max_pixels"] = o.vision.max_pixels;
  j["max_tokens"] = o.max_tokens;
  j["max_image_pixels"] = o.max_image_pixels;
  j["shard_bytes"] = o.shard_bytes;
  j["reencode"] = o.reencode;
  if (o.vision.video_frames_per_image != 1) j["video_frames_per_image"] = o.vision.video_frames_per_image;
  if (o.vision.tiled()) j["tiles"] = {o.vision.min_tiles, o.vision.max_tiles, o.vision.thumbnail, o.vision.image_size};
  // Only when set, so that the keys of builds made before the option existed still match.
  if (o.allow_absolute_paths) j["allow_absolute_paths"] = true;
  if (o.chat != ChatTemplate::Dhp) j["template"] = template_name(o.chat);
  if (o.vision.resize != ImageFit::native) {
    j["resize"] = std::string(image_fit_name(o.vision.resize));
    j["image_size"] = o.vision.image_size;
  }
  // The video keys decide the layout of video lines; only when changed from their defaults,
  // for the same reason.
  const VideoRules dv;
  if (o.video.fps != dv.fps) j["video_fps"] = o.video.fps;
  if (o.video.min_frames != dv.min_frames) j["min_frames"] = o.video.min_frames;
  if (o.video.max_frames != dv.max_frames) j["max_frames"] = o.video.max_frames;
  if (o.video.max_pixels != dv.max_pixels) j["video_max_pixels"] = o.video.max_pixels;
  return j.dump(2) + "\n";
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// "missing image" when one reason covers every skipped line, else each reason with its count.
std::string skip_reasons(const std::map<std::string, int64_t>& counts) {
  return counts.size() == 1 ? counts.begin()->first : format_counts(counts);
}

// Committed shards of an earlier run, in order; removes leftovers of an interrupted write.
int64_t committed_shards(const fs::path& dir, int64_t* end_line) {
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".tmp") fs::remove(e.path());
  int64_t k = 0;
  *end_line = 0;
  while (fs::exists(dir / shard_file_name(k))) {
    const ShardContents s = read_shard_tables((dir / shard_file_name(k)).string(), nullptr);
    DHP_CHECK(s.first_line == *end_line,
              "'{}' starts at manifest line {} but the shard before it ends at {}: the folder "
              "is inconsistent; remove it and build again",
              (dir / shard_file_name(k)).string(), s.first_line + 1, *end_line);
    *end_line = s.end_line;
    ++k;
  }
  return k;
}

void finish(const BuildOptions& o, const fs::path& dir, int64_t n_shards, const std::string& key,
            const std::string& tok_hash, BuildSummary& sum) {
  ShardIndex x;
  x.vision = o.vision;
  x.max_tokens = o.max_tokens;
  x.max_image_pixels = o.max_image_pixels;
  x.tokenizer_hash = tok_hash;
  x.chat_template = template_name(o.chat);
  x.build_key = key;
  for (int64_t k = 0; k < n_shards; ++k) {
    std::vector<int64_t> ext;
    const ShardContents s = read_shard_tables((dir / shard_file_name(k)).string(), &ext);
    const int64_t image_base = int64_t(x.images.size()) / kImageCols;
    for (int64_t i = 0; i < s.n_samples(); ++i) {
      x.shard.push_back(int32_t(k));
      const int64_t* row = &s.samples[size_t(i * kSampleCols)];
      for (int c = 0; c < kSampleCols; ++c)
        x.samples.push_back(row[c] + (c == kImageBegin || c == kImageEnd ? image_base : 0));
    }
    x.images.insert(x.images.end(), s.images.begin(), s.images.end());
    for (int64_t i = 0; i < s.n_images(); ++i)
      sum.image_bytes += s.images[size_t(i * kImageCols + kByteEnd)] -
                         s.images[size_t(i * kImageCols + kByteBegin)];
    const int64_t base = int64_t(x.names.size());
    x.names += s.names;
    for (size_t i = 1; i < s.name_offsets.size(); ++i)
      x.name_offsets.push_back(base + s.name_offsets[i]);
    x.extents.insert(x.extents.end(), ext.begin(), ext.end());
    x.skipped.insert(x.skipped.end(), s.skipped.begin(), s.skipped.end());
    sum.lines = s.end_line;
  }
  sum.samples = x.size();
  for (const auto& r : x.skipped) ++sum.skipped[r.reason];
  std::string report = fmt::format("# dhp data build report\n# manifest: {}\n", o.manifest);
  report += fmt::format("# lines: {}, samples: {}, skipped: {}{}{}\n", sum.lines, sum.samples,
                        x.skipped.size(), x.skipped.empty() ? "" : " - ",
                        format_counts(sum.skipped));
  report += "# line\treason\tdetail\n";
  for (const auto& r : x.skipped) report += fmt::format("{}\t{}\t{}\n", r.line, r.reason, r.detail);
  write_file_atomic((dir / kReportFile).string(), report);
  // Refused before the index marks the build complete: an empty data set would only fail
  // later, at training time.
  DHP_CHECK(x.size() > 0, "manifest '{}' holds no usable sample ({} of {} lines skipped: {}); "
            "see {}",
            printable(o.manifest), x.skipped.size(), sum.lines, skip_reasons(sum.skipped),
            (dir / kReportFile).string());
  write_index(dir.string(), x);  // last: its presence marks the build complete
  sum.complete = true;
}

}  // namespace

BuildSummary build_dataset(const BuildOptions& o) {
  const auto t0 = Clock::now();
  prepare_media_decoding();
  const std::string image_root =
      o.image_root.empty() ? manifest_folder(o.manifest).string() : o.image_root;
  int64_t total_lines = 0;
  const Tokenizer tok(o.tokenizer, o.added_tokens);
  const std::string tok_hash = hex(tok.hash());
  const std::string key = build_key(o, image_root, tok_hash, &total_lines);
  const fs::path dir(o.out_dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  DHP_CHECK(!ec, "cannot create '{}': {}", o.out_dir, ec.message());
  const fs::path key_path = dir / kBuildKeyFile;
  if (fs::exists(key_path)) {
    DHP_CHECK(read_text(key_path) == key,
              "'{}' holds a build of other inputs or settings (its {} differs from this "
              "run's); remove the folder or choose another --out",
              o.out_dir, kBuildKeyFile);
  } else {
    DHP_CHECK(fs::is_empty(dir), "'{}' is not empty and holds no {}: choose an empty --out",
              o.out_dir, kBuildKeyFile);
    write_file_atomic(key_path.string(), key);
  }

  BuildSummary sum;
  int64_t first_line = 0;
  int64_t next_shard = committed_shards(dir, &first_line);
  sum.resumed_shards = next_shard;
  if (fs::exists(dir / kIndexFile)) {  // already complete: just summarise
    finish(o, dir, next_shard, key, tok_hash, sum);
    sum.shards = next_shard;
    sum.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return sum;
  }
  if (next_shard > 0)
    spdlog::info("build: resuming after {} committed shard(s), at manifest line {}", next_shard,
                 first_line + 1);

  LineRules rules;
  rules.image_root = image_root;
  rules.allow_absolute_paths = o.allow_absolute_paths;
  rules.vision = o.vision;
  rules.max_tokens = o.max_tokens;
  rules.max_image_pixels = o.max_image_pixels;
  rules.chat = o.chat;
  rules.video = o.video;

  ManifestReader in(o.manifest);
  std::string text;
  int64_t line_no = 0;
  while (line_no < first_line && in.next(text)) ++line_no;

  Pool pool(o.workers);
  ShardWriter writer(o.out_dir);
  Progress bar(total_lines, o.progress);
  ShardContents cur;
  cur.first_line = cur.end_line = line_no;
  int64_t written = 0, n_samples = 0, n_skipped = 0;
  bool stopped = false;
  const size_t batch = size_t(kLinesPerWorker) * size_t(o.workers);
  std::vector<std::string> texts;
  std::vector<LineResult> results;
  while (!stopped) {
    texts.clear();
    while (texts.size() < batch && in.next(text)) texts.push_back(std::move(text));
    if (texts.empty()) break;
    results.assign(texts.size(), {});
    pool.run(int64_t(texts.size()), [&](int64_t i) {
      try {
        results[size_t(i)] =
            process_line(texts[size_t(i)], line_no + i + 1, tok, rules, o.reencode);
      } catch (...) {
        results[size_t(i)].fatal = std::current_exception();
      }
    });
    for (auto& r : results) {
      if (r.fatal) {
        writer.wait();
        std::rethrow_exception(r.fatal);
      }
      sum.processed_lines++;
      sum.input_bytes += r.bytes_read;
      if (!r.error) sum.video_frames += r.frames;
      cur.end_line = r.line;
      if (r.error) {
        if (o.on_error == "fail") {
          writer.wait();
          throw Error(fmt::format("{}: {}: {} (set data.on_error = \"skip\" to skip such lines)",
                                  in.where(r.line), r.error->reason, r.error->detail));
        }
        cur.skipped.push_back({r.line, r.error->reason, r.error->detail});
        ++n_skipped;
      } else if (!r.blank) {
        append(cur, r);
        ++n_samples;
      }
      if (cur.bytes() >= o.shard_bytes) {
        const int64_t end = cur.end_line;
        writer.submit(next_shard++, std::move(cur));
        cur = ShardContents{};
        cur.first_line = cur.end_line = end;
        if (o.max_new_shards >= 0 && ++written >= o.max_new_shards) {
          stopped = true;
          break;
        }
      }
    }
    line_no += int64_t(texts.size());
    bar.draw(line_no, n_samples, n_skipped, sum.input_bytes,
             std::chrono::duration<double>(Clock::now() - t0).count());
  }
  // The tail becomes the last shard, unless it holds nothing but blank lines.
  if (!stopped && (cur.n_samples() > 0 || !cur.skipped.empty()))
    writer.submit(next_shard++, std::move(cur));
  writer.wait();
  bar.clear();
  sum.shards = next_shard;
  if (!stopped) finish(o, dir, next_shard, key, tok_hash, sum);
  sum.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return sum;
}

}  // namespace dhp
