#include "data/stats.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/check.h"
#include "core/files.h"
#include "data/dataset.h"
#include "data/shard_format.h"

namespace dhp {

namespace {

int64_t nearest_rank(const std::vector<int64_t>& sorted, double p) {
  const auto n = int64_t(sorted.size());
  int64_t r = int64_t(std::ceil(p / 100.0 * double(n)));
  r = std::clamp<int64_t>(r, 1, n);
  return sorted[size_t(r - 1)];
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

}  // namespace

Distribution describe(std::vector<int64_t> v) {
  Distribution d;
  d.n = int64_t(v.size());
  if (v.empty()) return d;
  std::sort(v.begin(), v.end());
  for (int64_t x : v) d.sum += x;
  d.min = v.front();
  d.max = v.back();
  d.mean = double(d.sum) / double(d.n);
  d.p50 = nearest_rank(v, 50);
  d.p90 = nearest_rank(v, 90);
  d.p99 = nearest_rank(v, 99);
  d.p999 = nearest_rank(v, 99.9);
  return d;
}

std::string distribution_table(const std::vector<std::string>& names,
                               const std::vector<std::vector<int64_t>>& columns) {
  DHP_ASSERT(names.size() == columns.size());
  std::string out = fmt::format("{:<14}{:>10}{:>10}{:>8}{:>8}{:>8}{:>8}{:>8}{:>9}\n", "tokens",
                                "n", "mean", "min", "p50", "p90", "p99", "p99.9", "max");
  for (size_t c = 0; c < names.size(); ++c) {
    const Distribution d = describe(columns[c]);
    out += fmt::format("{:<14}{:>10}{:>10.1f}{:>8}{:>8}{:>8}{:>8}{:>8}{:>9}\n", names[c], d.n,
                       d.mean, d.min, d.p50, d.p90, d.p99, d.p999, d.max);
  }
  return out;
}

std::string histogram(const std::vector<int64_t>& values, int width) {
  if (values.empty()) return "(no samples)\n";
  // Bin 0 holds 0; bin k >= 1 holds [2^(k-1), 2^k).
  std::vector<int64_t> count(65, 0), tokens(65, 0);
  int64_t total_tokens = 0;
  for (int64_t v : values) {
    DHP_ASSERT(v >= 0);
    const int b = v == 0 ? 0 : std::bit_width(uint64_t(v));
    ++count[size_t(b)];
    tokens[size_t(b)] += v;
    total_tokens += v;
  }
  int lo = 0, hi = 64;
  while (count[size_t(lo)] == 0) ++lo;
  while (count[size_t(hi)] == 0) --hi;
  const int64_t peak = *std::max_element(count.begin(), count.end());
  std::string out = fmt::format("{:>19} {:>9} {:>7}  {}\n", "total tokens", "samples", "work",
                                "(work = share of all tokens)");
  for (int b = lo; b <= hi; ++b) {
    const int64_t a = b == 0 ? 0 : int64_t(1) << (b - 1), z = b == 0 ? 0 : (int64_t(1) << b) - 1;
    const int bar = int((count[size_t(b)] * width + peak - 1) / peak);
    out += fmt::format("{:>9}..{:<8} {:>9} {:>6.1f}%  {}\n", a, z, count[size_t(b)],
                       100.0 * double(tokens[size_t(b)]) / double(std::max<int64_t>(1, total_tokens)),
                       std::string(size_t(bar), '#'));
  }
  return out;
}

LengthTable lengths_of(const Dataset& data) {
  LengthTable t;
  for (int64_t i = 0; i < data.size(); ++i) {
    t.names.push_back(data.name(i));
    t.vision.push_back(data.vision_tokens(i));
    t.text.push_back(data.length(i) - t.vision.back());
    t.loss.push_back(data.loss_tokens(i));
  }
  return t;
}

LengthTable lengths_of(const ShardIndex& x) {
  LengthTable t;
  for (int64_t i = 0; i < x.size(); ++i) {
    t.names.push_back(x.name(i));
    t.vision.push_back(x.at(i, kVision));
    t.text.push_back(x.at(i, kText));
    t.loss.push_back(x.at(i, kLoss));
  }
  return t;
}

namespace {
const std::string kCsvHeader = "sample,name,vision_tokens,text_tokens,total_tokens,loss_tokens\n";
}  // namespace

bool is_lengths_csv(const std::string& path) { return read_head(path, kCsvHeader.size()) == kCsvHeader; }

void write_lengths_csv(const LengthTable& t, const std::string& path, bool force) {
  check_output_path(path, "--csv", is_lengths_csv, force);
  std::ostringstream out;
  out << kCsvHeader;
  for (int64_t i = 0; i < t.size(); ++i) {
    const size_t k = size_t(i);
    out << i << ',' << csv_field(t.names[k]) << ',' << t.vision[k] << ',' << t.text[k] << ','
        << t.vision[k] + t.text[k] << ',' << t.loss[k] << '\n';
  }
  write_file_atomic(path, out.str());
}

std::string describe_lengths(const LengthTable& t) {
  std::vector<int64_t> total(t.vision.size());
  for (size_t i = 0; i < total.size(); ++i) total[i] = t.vision[i] + t.text[i];
  const Distribution d = describe(total);
  // The share of all tokens held by the longest 1% of samples: the work a static layout
  // must size itself for.
  std::vector<int64_t> desc = total;
  std::sort(desc.rbegin(), desc.rend());
  int64_t top = 0;
  for (size_t i = 0; i < std::max<size_t>(1, desc.size() / 100) && i < desc.size(); ++i) top += desc[i];
  std::string out = distribution_table({"vision", "text", "total", "loss"},
                                       {t.vision, t.text, total, t.loss});
  out += fmt::format("\nlongest / median = {:.1f}x; the longest 1% of samples hold {:.1f}% of "
                     "all tokens\n\n",
                     double(d.max) / double(std::max<int64_t>(1, d.p50)),
                     100.0 * double(top) / double(std::max<int64_t>(1, d.sum)));
  return out + histogram(total);
}

}  // namespace dhp
