#include "data/loader.h"

#include <chrono>

#include "core/check.h"

namespace dhp {

BatchLoader::BatchLoader(const Dataset& dataset, int workers, int max_pending)
    : dataset_(dataset), max_pending_(max_pending) {
  DHP_CHECK(workers >= 0, "data.workers must be >= 0, got {}", workers);
  DHP_CHECK(max_pending > 0, "the loader needs max_pending > 0, got {}", max_pending);
  for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { work(); });
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

int64_t BatchLoader::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return int64_t(jobs_.size());
}

void BatchLoader::submit(const std::vector<int64_t>& ids, bool blank_images) {
  std::vector<Piece> pieces;
  pieces.reserve(ids.size());
  for (int64_t id : ids) pieces.push_back({id, 0, -1, false});
  submit(std::move(pieces), blank_images);
}

Sample BatchLoader::load(const Piece& p, bool blank) const {
  DHP_CHECK(p.sample >= 0 && p.sample < dataset_.size(), "loader: sample {} is not in 0..{}",
            p.sample, dataset_.size() - 1);
  const int64_t end = p.end < 0 ? dataset_.length(p.sample) : p.end;
  const ImageLoad images = p.text_only ? ImageLoad::Skip : blank ? ImageLoad::Blank : ImageLoad::Decode;
  return dataset_.load_range(p.sample, p.begin, end, images);
}

void BatchLoader::submit(std::vector<Piece> pieces, bool blank_images) {
  auto job = std::make_shared<Job>();
  job->out.resize(pieces.size());
  job->ids = std::move(pieces);
  job->blank = blank_images;
  {
    std::lock_guard<std::mutex> lock(mu_);
    DHP_ASSERT(int64_t(jobs_.size()) < max_pending_);
    jobs_.push_back(std::move(job));
  }
  work_cv_.notify_all();
}

void BatchLoader::work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    std::shared_ptr<Job> job;
    work_cv_.wait(lock, [&] {
      if (stop_) return true;
      for (const auto& j : jobs_)
        if (!j->error && j->claimed < j->ids.size()) {
          job = j;
          return true;
        }
      return false;
    });
    if (stop_) return;
    const size_t slot = job->claimed++;
    lock.unlock();
    std::exception_ptr err;
    Sample s;
    try {
      s = load(job->ids[slot], job->blank);
    } catch (...) {
      err = std::current_exception();
    }
    lock.lock();
    if (err) {
      if (!job->error) job->error = err;
    } else {
      job->out[slot] = std::move(s);
    }
    ++job->finished;
    if (job->complete()) done_cv_.notify_all();
  }
}

std::vector<Sample> BatchLoader::next() {
  const auto t0 = std::chrono::steady_clock::now();
  std::shared_ptr<Job> job;
  {
    std::unique_lock<std::mutex> lock(mu_);
    DHP_ASSERT(!jobs_.empty());
    if (threads_.empty()) {
      job = jobs_.front();
      jobs_.pop_front();
    } else {
      done_cv_.wait(lock, [&] { return jobs_.front()->complete(); });
      job = jobs_.front();
      jobs_.pop_front();
    }
  }
  if (threads_.empty())
    for (size_t i = 0; i < job->ids.size(); ++i)
      job->out[i] = load(job->ids[i], job->blank);
  last_wait_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (job->error) std::rethrow_exception(job->error);
  return std::move(job->out);
}

}  // namespace dhp
