#include "trainer/tensorboard.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>

#include "core/check.h"
#include "core/files.h"
#include "core/hash.h"
#include "core/log.h"

namespace dhp {

namespace fs = std::filesystem;

uint32_t masked_crc32c(std::string_view bytes) {
  const uint32_t c = crc32c(bytes.data(), bytes.size());
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

namespace {

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(char((v >> (8 * i)) & 0xff));
}

uint64_t get_le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(uint8_t(p[i])) << (8 * i);
  return v;
}

// The file names TensorBoard reads ("tfevents" in the name) and, by their ending, which of
// them dhp wrote.
constexpr std::string_view kOurEnding = ".dhp";
bool is_event_file(const fs::path& p) { return p.filename().string().find("tfevents") != std::string::npos; }
bool is_ours(const fs::path& p) {
  const std::string n = p.filename().string();
  return is_event_file(p) && n.size() > kOurEnding.size() && n.ends_with(kOurEnding);
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A host name as a file name holds it: letters, digits, '-' and '.'.
std::string host_for_name() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) return "host";
  std::string h;
  for (const char* c = host; *c; ++c) h.push_back(std::isalnum(uint8_t(*c)) || *c == '-' || *c == '.' ? *c : '_');
  return h.empty() ? "host" : h;
}

// Protocol buffers' wire format, the part these messages use: a field is its key (number << 3
// | wire type) as a varint, then a varint (0), 8 little-endian bytes (1), a varint length and
// that many bytes (2: strings, messages, packed arrays) or 4 little-endian bytes (5).
class Proto {
 public:
  Proto& varint(int field, uint64_t v) { return key(field, 0).raw_varint(v); }
  Proto& fixed64(int field, double v) { return key(field, 1).raw_fixed64(v); }
  Proto& fixed32(int field, float v) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    key(field, 5);
    put_le(out_, bits, 4);
    return *this;
  }
  Proto& bytes(int field, std::string_view b) {
    key(field, 2).raw_varint(b.size());
    out_.append(b);
    return *this;
  }
  Proto& message(int field, const Proto& m) { return bytes(field, m.out_); }
  Proto& packed(int field, const std::vector<double>& v) {
    Proto p;
    for (double x : v) p.raw_fixed64(x);
    return bytes(field, p.out_);
  }
  const std::string& str() const { return out_; }

 private:
  Proto& key(int field, int wire) { return raw_varint(uint64_t(field) << 3 | uint64_t(wire)); }
  Proto& raw_varint(uint64_t v) {
    for (; v >= 0x80; v >>= 7) out_.push_back(char(v | 0x80));
    out_.push_back(char(v));
    return *this;
  }
  Proto& raw_fixed64(double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    put_le(out_, bits, 8);
    return *this;
  }
  std::string out_;
};

// The field numbers of TensorBoard's public protos (tensorboard/compat/proto/): the files hold
// these, never the names.
namespace field {
// Event (event.proto)
constexpr int kWallTime = 1, kStep = 2, kFileVersion = 3, kSummary = 5;
// Summary (summary.proto): repeated Value value = 1; Value: tag 1, simple_value 2 (float),
// histo 5, tensor 8, metadata 9
constexpr int kValue = 1;
constexpr int kTag = 1, kSimpleValue = 2, kHisto = 5, kTensor = 8, kMetadata = 9;
// SummaryMetadata: plugin_data 1 { plugin_name 1 }
constexpr int kPluginData = 1, kPluginName = 1;
// HistogramProto (histogram.proto)
constexpr int kMin = 1, kMax = 2, kNum = 3, kSum = 4, kSumSquares = 5, kBucketLimit = 6, kBucket = 7;
// TensorProto (tensor.proto): dtype 1, tensor_shape 2 { repeated Dim dim = 2 { size 1 } },
// string_val 8; DataType DT_STRING = 7 (types.proto)
constexpr int kDtype = 1, kTensorShape = 2, kDim = 2, kDimSize = 1, kStringVal = 8;
constexpr int kDtString = 7;
}  // namespace field

Proto event_at(int64_t step) {
  Proto e;
  e.fixed64(field::kWallTime, now_s());
  if (step != 0) e.varint(field::kStep, uint64_t(step));
  return e;
}

std::string version_event() { return event_at(0).bytes(field::kFileVersion, "brain.Event:2").str(); }

// What resuming needs of an event written by this file: its step, and whether it is the
// file-version record or the config text, which every run writes anew.
struct EventKind {
  int64_t step = 0;
  bool version = false, text = false, valid = true;
};

// Walks the top-level fields of a message, calling `f(field, wire, varint, bytes)`; false when
// the bytes are not a well-formed message.
template <class F>
bool for_each_field(std::string_view m, F&& f) {
  size_t at = 0;
  auto varint = [&](uint64_t& v) {
    v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (at >= m.size()) return false;
      const uint8_t b = uint8_t(m[at++]);
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  };
  while (at < m.size()) {
    uint64_t key = 0, v = 0;
    if (!varint(key)) return false;
    std::string_view b;
    switch (key & 7) {
      case 0: if (!varint(v)) return false; break;
      case 1: if (m.size() - at < 8) return false; at += 8; break;
      case 5: if (m.size() - at < 4) return false; at += 4; break;
      case 2:
        if (!varint(v) || v > m.size() - at) return false;
        b = m.substr(at, v);
        at += v;
        break;
      default: return false;
    }
    f(int(key >> 3), int(key & 7), v, b);
  }
  return true;
}

EventKind kind_of(std::string_view event) {
  EventKind k;
  k.valid = for_each_field(event, [&](int f, int wire, uint64_t v, std::string_view b) {
    if (f == field::kStep && wire == 0) k.step = int64_t(v);
    if (f == field::kFileVersion) k.version = true;
    if (f == field::kSummary && wire == 2)
      for_each_field(b, [&](int vf, int, uint64_t, std::string_view value) {
        if (vf == field::kValue)
          for_each_field(value, [&](int xf, int, uint64_t, std::string_view) { k.text |= xf == field::kTensor; });
      });
  });
  return k;
}

// The event data of every whole record of `path`, in order; a damaged or cut-off record (a run
// killed mid-write) ends the list, with a warning.
std::vector<std::string> read_events(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<std::string> events;
  for (int64_t at = 0;; ) {
    char head[12];
    in.read(head, sizeof head);
    if (in.gcount() == 0) break;
    const uint64_t n = get_le(head, 8);
    std::string data;
    bool whole = in.gcount() == std::streamsize(sizeof head) &&
                 uint32_t(get_le(head + 8, 4)) == masked_crc32c({head, 8}) && n < (uint64_t(1) << 32);
    if (whole) {
      data.resize(n);
      char crc[4];
      in.read(data.data(), std::streamsize(n));
      whole = in.gcount() == std::streamsize(n);
      in.read(crc, 4);
      whole = whole && in.gcount() == 4 && uint32_t(get_le(crc, 4)) == masked_crc32c(data);
    }
    if (!whole) {
      spdlog::warn("log.tensorboard: '{}' is damaged or cut off at byte {} (a run that ended while "
                   "writing it); the events after that point are dropped", path.string(), at);
      break;
    }
    events.push_back(std::move(data));
    at += int64_t(16 + n);
  }
  return events;
}

}  // namespace

std::string tfrecord(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  put_le(out, data.size(), 8);
  put_le(out, masked_crc32c(out), 4);
  out.append(data);
  put_le(out, masked_crc32c(data), 4);
  return out;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, int64_t first_step) {
  const fs::path d(dir);
  std::error_code ec;
  if (fs::exists(fs::symlink_status(d, ec)) && !fs::is_directory(d, ec))
    throw Error(fmt::format("log.tensorboard: '{}' is not a folder; name a folder for TensorBoard's "
                            "event files (it is created when missing)", dir));
  fs::create_directories(d, ec);
  DHP_CHECK(!ec, "log.tensorboard: cannot create the folder '{}': {}", dir, ec.message());
  lock_.emplace((d / "dhp-tensorboard.lock").string(), fmt::format("log.tensorboard '{}'", dir),
                "two runs writing one folder's event files would show as one run in TensorBoard");

  std::vector<fs::path> ours, foreign;
  for (const auto& e : fs::directory_iterator(d, ec)) {
    if (!is_event_file(e.path())) continue;
    (is_ours(e.path()) && e.is_regular_file() && !e.is_symlink() ? ours : foreign).push_back(e.path());
  }
  DHP_CHECK(!ec, "log.tensorboard: cannot list '{}': {}", dir, ec.message());
  std::sort(ours.begin(), ours.end());
  if (!foreign.empty())
    spdlog::warn("log.tensorboard: '{}' also holds event files dhp did not write ({}); TensorBoard "
                 "shows their curves mixed with this run's", dir, foreign.front().filename().string());

  // A name no file has: a run resumed in the same second by the same process (a test, a
  // library user) would otherwise be given the name of the file it replaces.
  const std::string stem = fmt::format("events.out.tfevents.{:010}.{}.{}", int64_t(now_s()), host_for_name(), ::getpid());
  for (int n = 0; path_.empty() || fs::exists(fs::symlink_status(path_)); ++n)
    path_ = (d / (stem + (n > 0 ? fmt::format(".{}", n) : "") + std::string(kOurEnding))).string();
  std::string kept = tfrecord(version_event());
  if (first_step > 0) {
    // The events up to the step this run resumes from, from the files of the runs before it,
    // in one file: the events after it are written again by this run. The config text of the
    // resumed step is written again too.
    int64_t dropped = 0;
    for (const auto& f : ours)
      for (const std::string& data : read_events(f)) {
        const EventKind e = kind_of(data);
        if (e.version || !e.valid) continue;
        if (e.step < first_step || (e.step == first_step && !e.text)) kept += tfrecord(data);
        else ++dropped;
      }
    if (dropped > 0)
      spdlog::info("log.tensorboard: {} events after step {} dropped; this run writes them again",
                   dropped, first_step);
  } else if (!ours.empty()) {
    // A fresh run into a folder of an earlier run: the earlier curves are kept, as a run of
    // their own, and do not mix with this run's.
    const fs::path earlier = d / "earlier";
    if (fs::exists(fs::symlink_status(earlier)) && !fs::is_directory(fs::symlink_status(earlier)))
      throw Error(fmt::format("log.tensorboard: '{}' holds an earlier run's event files and '{}' is not "
                              "a folder to move them to", dir, earlier.string()));
    fs::create_directories(earlier, ec);
    DHP_CHECK(!ec, "log.tensorboard: cannot create '{}': {}", earlier.string(), ec.message());
    for (const auto& e : fs::directory_iterator(earlier))
      if (is_ours(e.path()) && e.is_regular_file() && !e.is_symlink()) fs::remove(e.path());
    for (const auto& f : ours) commit_rename(f.string(), (earlier / f.filename()).string());
    spdlog::warn("log.tensorboard: '{}' held an earlier run's event files; they are now in '{}'", dir,
                 earlier.string());
  }
  write_file_atomic(path_, kept);
  if (first_step > 0)
    for (const auto& f : ours) fs::remove(f, ec);
  out_.open(path_, std::ios::binary | std::ios::app);
  DHP_CHECK(out_.good(), "log.tensorboard: cannot write '{}': {}", path_, std::strerror(errno));
}

void TensorBoardWriter::append(const std::string& event) {
  if (!out_.is_open()) return;
  out_ << tfrecord(event);
  out_.flush();  // TensorBoard reads the file while the run writes it
  if (out_.good()) return;
  spdlog::warn("log.tensorboard: writing '{}' failed ({}); no more events are recorded in it", path_,
               std::strerror(errno));
  out_.close();
}

void TensorBoardWriter::write(int64_t step, const TensorBoardValues& values) {
  Proto summary;
  for (const auto& [tag, v] : values.scalars)
    summary.message(field::kValue, Proto().bytes(field::kTag, tag).fixed32(field::kSimpleValue, float(v)));
  for (const auto& [tag, ints] : values.histograms) {
    if (ints.empty()) continue;
    std::map<int, int64_t> count;
    double sum = 0, sq = 0;
    for (int v : ints) {
      ++count[v];
      sum += v;
      sq += double(v) * v;
    }
    // One bucket per value v, (v - 0.5, v + 0.5], after an empty one up to the smallest.
    std::vector<double> limits = {count.begin()->first - 0.5}, buckets = {0.0};
    for (const auto& [v, n] : count) {
      limits.push_back(v + 0.5);
      buckets.push_back(double(n));
    }
    Proto h;
    h.fixed64(field::kMin, count.begin()->first).fixed64(field::kMax, count.rbegin()->first);
    h.fixed64(field::kNum, double(ints.size())).fixed64(field::kSum, sum).fixed64(field::kSumSquares, sq);
    h.packed(field::kBucketLimit, limits).packed(field::kBucket, buckets);
    summary.message(field::kValue, Proto().bytes(field::kTag, tag).message(field::kHisto, h));
  }
  append(event_at(step).message(field::kSummary, summary).str());
}

void TensorBoardWriter::text(int64_t step, const std::string& tag, const std::string& markdown) {
  Proto tensor;
  tensor.varint(field::kDtype, field::kDtString)
      .message(field::kTensorShape, Proto().message(field::kDim, Proto().varint(field::kDimSize, 1)))
      .bytes(field::kStringVal, markdown);
  Proto value;
  value.bytes(field::kTag, tag)
      .message(field::kMetadata, Proto().message(field::kPluginData, Proto().bytes(field::kPluginName, "text")))
      .message(field::kTensor, tensor);
  append(event_at(step).message(field::kSummary, Proto().message(field::kValue, value)).str());
}

}  // namespace dhp
