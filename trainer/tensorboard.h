// TensorBoard's event files (log.tensorboard = DIR), so that a run's curves can be watched in
// TensorBoard while it trains: `tensorboard --logdir DIR`. The files are TensorBoard's record
// files: each record is its length (8 bytes, little-endian), the masked CRC-32C of those 8
// bytes, the data, and the masked CRC-32C of the data; each record's data is an Event message
// of TensorBoard's public event.proto, in protocol buffers' wire format. The few messages are
// encoded here, field number by field number, rather than by linking libprotobuf: Debian's
// libsentencepiece.so exports a protobuf-lite copy of its own, and a second runtime in the
// process crashed one or the other, whichever bound the shared symbols (both seen). Rank 0
// writes the files.
#pragma once

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "trainer/run_lock.h"

namespace dhp {

// TensorBoard's masked CRC: the CRC-32C rotated right by 15 bits plus 0xa282ead8.
uint32_t masked_crc32c(std::string_view bytes);

// One record of the file: length, its masked CRC, the data, its masked CRC.
std::string tfrecord(std::string_view data);

// What one event holds: scalars, and histograms of integers (one bucket per value).
struct TensorBoardValues {
  std::vector<std::pair<std::string, double>> scalars;
  std::vector<std::pair<std::string, std::vector<int>>> histograms;
};

class TensorBoardWriter {
 public:
  // Opens DIR (created when missing) for a run that starts after `first_step`. A resumed run
  // (first_step > 0) keeps the events its earlier runs wrote up to first_step and drops those
  // after it, which this run writes again, so every step is in the files once; a fresh run
  // moves the event files of an earlier run into DIR/earlier/ (a run of its own in
  // TensorBoard). Event files dhp did not write are left alone, with a warning. The folder
  // is locked for the run (DIR/dhp-tensorboard.lock).
  TensorBoardWriter(const std::string& dir, int64_t first_step);
  // One event at `step`; scalars are stored as float32, as TensorBoard's simple_value is.
  void write(int64_t step, const TensorBoardValues& values);
  // Text at `step` (rendered as Markdown by TensorBoard's text plugin).
  void text(int64_t step, const std::string& tag, const std::string& markdown);
  const std::string& file() const { return path_; }

 private:
  void append(const std::string& event);
  std::optional<RunLock> lock_;
  std::ofstream out_;
  std::string path_;
};

}  // namespace dhp
