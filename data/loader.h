// Background decoding of submitted sample lists, so images for the next steps are ready when
// the training loop asks for them. A submission holds whole samples or (sample, token range)
// pieces: a rank that the plan gives only part of a long sequence decodes only the images
// that part needs.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "data/dataset.h"

namespace dhp {

// Tokens [begin, end) of sample `sample`; end = -1 means to the end of the sample.
// text_only: leave the range's images undecoded (ImageLoad::Skip), because another rank of
// the piece's ring encodes them.
struct Piece {
  int64_t sample = 0;
  int64_t begin = 0;
  int64_t end = -1;
  bool text_only = false;
};

class BatchLoader {
 public:
  // workers: background threads (0 = decode inside next() on the caller's thread).
  // max_pending: submissions not yet taken by next(); this bounds the memory held by decoded
  // images. Submitting more is a bug of the caller (it would only wait on itself).
  BatchLoader(const Dataset& dataset, int workers, int max_pending = 4);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  void submit(const std::vector<int64_t>& ids, bool blank_images);  // whole samples
  void submit(std::vector<Piece> pieces, bool blank_images);
  // The samples (or pieces) of the oldest submission, in the order submitted. Rethrows the
  // first error a worker met while decoding that submission (on_error = "fail"; in "skip"
  // mode the dataset returns placeholders instead of throwing).
  std::vector<Sample> next();
  // Seconds the last next() spent waiting for its samples (all of the decode when workers=0).
  double last_wait_seconds() const { return last_wait_; }
  int64_t pending() const;

 private:
  struct Job {
    std::vector<Piece> ids;
    bool blank = false;
    std::vector<Sample> out;  // (ids) filled in by the workers, slot per piece
    size_t claimed = 0;       // samples handed to a worker
    size_t finished = 0;      // samples decoded or failed
    std::exception_ptr error;
    bool complete() const { return finished == claimed && (error || claimed == ids.size()); }
  };
  void work();
  Sample load(const Piece& p, bool blank) const;

  const Dataset& dataset_;
  const int max_pending_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<std::shared_ptr<Job>> jobs_;  // oldest first
  bool stop_ = false;
  double last_wait_ = 0.0;
  std::vector<std::thread> threads_;
};

}  // namespace dhp
