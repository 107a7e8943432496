// `dhp data stats`: length distributions of a data set, from lengths alone (no pixel is
// decoded): what a user looks at to see why a static parallel layout wastes time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dhp {

class Dataset;
struct ShardIndex;

// Every sample's length record.
struct LengthTable {
  std::vector<std::string> names;
  std::vector<int64_t> vision, text, loss;  // (samples) tokens
  int64_t size() const { return int64_t(vision.size()); }
};
LengthTable lengths_of(const Dataset& data);
// Straight from a built index (the lengths under the build's resize rule): no tokenizer or
// model needed.
LengthTable lengths_of(const ShardIndex& index);

struct Distribution {
  int64_t n = 0, sum = 0, min = 0, max = 0;
  double mean = 0;
  int64_t p50 = 0, p90 = 0, p99 = 0, p999 = 0;
};

// Nearest-rank percentiles: pXX is the smallest value with at least XX% of samples <= it.
Distribution describe(std::vector<int64_t> values);

// A table: one row per quantity (vision, text, total tokens), columns n mean min p50 p90
// p99 p99.9 max.
std::string distribution_table(const std::vector<std::string>& names,
                               const std::vector<std::vector<int64_t>>& columns);

// Bars over power-of-two bins [2^k, 2^(k+1)): samples per bin and the share of all tokens in
// that bin (the long tail's share of the work). `width` is the longest bar in characters.
std::string histogram(const std::vector<int64_t>& values, int width = 40);

// One CSV row per sample: sample, name, vision_tokens, text_tokens, total_tokens, loss_tokens.
// Replaces only an earlier lengths CSV (or any regular file with `force`), never a device,
// FIFO, folder or another program's file (core/files.h, check_output_path).
void write_lengths_csv(const LengthTable& t, const std::string& path, bool force = false);
bool is_lengths_csv(const std::string& path);  // an earlier write_lengths_csv output

// distribution_table, the long tail's share, and a histogram of total tokens.
std::string describe_lengths(const LengthTable& t);

}  // namespace dhp
