#include "trainer/checkpoint.h"

#include <sys/statvfs.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "core/check.h"
#include "core/files.h"
#include "core/log.h"

namespace dhp {
namespace {

namespace fs = std::filesystem;

fs::path marker_of(const fs::path& h5) {
  fs::path m = h5;
  return m.replace_extension(".done");
}

// The main file of the checkpoint of `step` in `dir`.
fs::path checkpoint_in(const fs::path& dir, int64_t step) { return dir / fmt::format("step-{:08d}.h5", step); }

// The step a file name step-NNNNNNNN.h5 claims, or -1 for another name (a moment part's too).
int64_t named_step(const fs::path& p) {
  const int64_t step = checkpoint_file_step(p);
  return step >= 0 && p.extension() == ".h5" && p.stem().string().size() == 13 ? step : -1;
}

// Keeps the newest `keep` complete checkpoints; the marker goes first so a crash in between
// never leaves a marker that points at a missing file, then the main file, then its moment
// parts. Also removes the temporaries of saves that a kill interrupted and the parts no
// complete checkpoint owns: the run saving is the folder's only writer (RunLock) and prunes
// only between saves, so none of them is in progress, and each may be large.
void prune(const fs::path& dir, int keep) {
  std::error_code ec;
  const auto all = list_checkpoints(dir.string());
  const size_t drop = all.size() > size_t(keep) ? all.size() - size_t(keep) : 0;
  std::set<std::string> kept;
  for (size_t i = drop; i < all.size(); ++i) kept.insert(all[i]);
  for (size_t i = 0; i < drop; ++i) {
    fs::remove(marker_of(all[i]), ec);
    if (!ec) fs::remove(all[i], ec);
    if (ec) spdlog::warn("could not delete old checkpoint '{}': {}", all[i], ec.message());
  }
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const fs::path p = e.path();
    const int64_t step = checkpoint_file_step(p);
    if (step < 0 || named_step(p) >= 0) continue;  // not a temporary or part
    if (p.extension() == ".tmp" || !kept.contains(checkpoint_in(dir, step).string())) stale.push_back(p);
  }
  for (const auto& p : stale) fs::remove(p, ec);
}

// A save that cannot fit fails before it writes anything: a disk that fills mid-write is
// handled by the save, but a full disk known in advance needs no partial file at all.
void check_free_space(const fs::path& dir, const Model& model, bool with_moments, int64_t step) {
  struct statvfs fs_info {};
  if (::statvfs(dir.c_str(), &fs_info) != 0) return;
  const double need = double(model.n_params()) * sizeof(float) * (with_moments ? 3 : 1) + (1 << 20);
  const double free = double(fs_info.f_bavail) * double(fs_info.f_frsize);
  DHP_CHECK(need <= free,
            "checkpoint of step {} not saved: it needs about {:.1f} MB and '{}' has {:.1f} MB "
            "free: {}",
            step, need / 1e6, dir.string(), free / 1e6, std::strerror(ENOSPC));
}

// The completion marker of a renamed checkpoint, durable: it holds the step, which listing
// checks against the name and the file's contents.
void write_marker(const fs::path& h5, int64_t step) {
  {
    std::ofstream marker(marker_of(h5));
    marker << step << "\n";
    marker.close();
    DHP_CHECK(marker.good(), "cannot write '{}': {}", marker_of(h5).string(), std::strerror(errno));
  }
  fsync_path(marker_of(h5).string(), false);
}

fs::path checkpoint_path(const Config& cfg, int64_t step) { return checkpoint_in(cfg.checkpoint.dir, step); }

// Before a save writes anything: the folder exists, holds at most `keep` checkpoints, has room,
// and no longer calls an older save of the same step complete (it is about to be overwritten).
// Returns the checkpoint's path.
fs::path prepare_save(const Config& cfg, const Model& model, bool with_moments, int64_t step) {
  const fs::path dir = cfg.checkpoint.dir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  DHP_CHECK(!ec, "cannot create checkpoint.dir '{}': {}", dir.string(), ec.message());
  // A run killed between its last save and that save's pruning left one checkpoint too many;
  // pruning first too keeps the folder at most one over `keep` at any moment.
  prune(dir, cfg.checkpoint.keep);
  check_free_space(dir, model, with_moments, step);
  const fs::path final_path = checkpoint_path(cfg, step);
  fs::remove(marker_of(final_path), ec);
  DHP_CHECK(!ec, "cannot remove '{}': {}", marker_of(final_path).string(), ec.message());
  return final_path;
}

fs::path temporary_of(const fs::path& p) { return fs::path(p.string() + ".tmp"); }

// Writes `final_path`'s temporary with `write` and makes it durable; a failure removes it and
// throws naming the step.
template <class Write>
void write_durable(const fs::path& final_path, int64_t step, Write&& write) {
  const fs::path tmp = temporary_of(final_path);
  std::error_code ec;
  try {
    write(tmp);
    // Durable before visible: data on disk, then the name, then the marker that says complete.
    fsync_path(tmp.string(), false);
  } catch (const Error& e) {
    // A partial file is useless and, on a full disk, takes the space the next save needs.
    // Emptied before it is unlinked: HDF5 may still hold it open after a failed close, and
    // an open file's blocks are not freed by unlinking it.
    fs::resize_file(tmp, 0, ec);
    fs::remove(tmp, ec);
    throw Error(fmt::format("checkpoint of step {} not saved ({}): {}", step, tmp.string(), e.what()));
  }
}

// The last act of a save, once every file of it is durable under its final name: the marker
// that makes it complete, then retention.
void complete_save(const Config& cfg, const fs::path& final_path, int64_t step) {
  write_marker(final_path, step);
  fsync_path(final_path.parent_path().string(), true);
  prune(final_path.parent_path(), cfg.checkpoint.keep);
}

}  // namespace

std::string save_checkpoint(const Config& cfg, const Model& model, const AdamW* opt,
                            const TrainState& st) {
  const fs::path final_path = prepare_save(cfg, model, opt != nullptr, st.step);
  write_durable(final_path, st.step,
                [&](const fs::path& tmp) { write_checkpoint_file(tmp, cfg, model, opt, st); });
  commit_rename(temporary_of(final_path).string(), final_path.string());
  complete_save(cfg, final_path, st.step);
  return final_path.string();
}

std::vector<std::string> list_checkpoints(const std::string& dir, bool warn) {
  // Ordered by the step each file records, not by its name: a file renamed to a higher step
  // must neither be resumed from nor push the real newest checkpoint out of retention.
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const fs::path p = e.path();
    const int64_t named = named_step(p);
    if (named < 0 || !fs::is_regular_file(p, ec) || !fs::exists(marker_of(p), ec)) continue;
    std::ifstream marker(marker_of(p));
    int64_t marked = -1;
    marker >> marked;
    const int64_t recorded = recorded_step(p.string());
    if (recorded != named || marked != named) {
      if (warn)
        spdlog::warn("ignoring checkpoint '{}': its name says step {}, its completion marker {} "
                   "and its contents {}; it was renamed or damaged",
                   p.string(), named, marked, recorded);
      continue;
    }
    found.emplace_back(recorded, p.string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

int64_t newest_complete_step(const std::string& dir) {
  const auto all = list_checkpoints(dir, false);
  return all.empty() ? 0 : std::max<int64_t>(0, recorded_step(all.back()));
}

std::string resolve_checkpoint(const std::string& what, const std::string& default_dir, bool warn) {
  const std::string dir = what == "auto" ? default_dir : what;
  if (what != "auto" && fs::is_regular_file(what)) return what;
  // A folder with config.json is a Hugging Face checkpoint (trainer/hf_checkpoint.h), which
  // eval, generate and export read as they read a checkpoint.
  if (what != "auto" && fs::exists(fs::path(what) / "config.json")) return what;
  DHP_CHECK(fs::is_directory(dir), "no checkpoint at '{}' (neither a file nor a directory)", dir);
  auto all = list_checkpoints(dir, warn);
  DHP_CHECK(!all.empty(), "no complete checkpoint in '{}'", dir);
  return all.back();
}

CheckpointManager::CheckpointManager(const Config& cfg, Communicator& comm)
    : cfg_(cfg), comm_(comm), rank0_(comm.rank() == 0) {
  if (rank0_) lock_.emplace(cfg.checkpoint.dir);
}

std::string CheckpointManager::resume_path(const std::string& resume) const {
  const std::string& dir = cfg_.checkpoint.dir;
  const bool resuming = !resume.empty() && (resume != "auto" || !fs::is_directory(dir) ||
                                            !list_checkpoints(dir, rank0_).empty());
  if (resuming) return resolve_checkpoint(resume, dir, rank0_);
  if (!resume.empty() && rank0_)
    spdlog::info("--resume auto: '{}' holds no checkpoint yet; starting a fresh run", dir);
  const auto existing = list_checkpoints(dir, false);
  DHP_CHECK(existing.empty(),
            "checkpoint.dir '{}' already holds checkpoints of another run (newest: {}); "
            "continue that run with --resume auto, or set checkpoint.dir to a new folder",
            dir, existing.back());
  return "";
}

std::vector<std::string> CheckpointManager::resume_candidates(const std::string& resume) const {
  const std::string path = resume_path(resume);
  if (path.empty() || resume != "auto") return path.empty() ? std::vector<std::string>{} : std::vector{path};
  // Every rank reads the same files and reaches the same verdicts; rank 0 alone says so.
  std::vector<std::string> all = list_checkpoints(cfg_.checkpoint.dir, false);  // resume_path warned
  std::reverse(all.begin(), all.end());
  return all;
}

bool CheckpointManager::periodic(int64_t step) const {
  const int64_t every = cfg_.checkpoint.every;
  return every > 0 && step % every == 0 && step < cfg_.train.steps;
}

double save_timeout(const Config& cfg, const ParamTable& table, int world) {
  if (cfg.checkpoint.timeout_s > 0) return cfg.checkpoint.timeout_s;
  // Rank 0's files are the largest: the frozen weights, and its share of the trainable
  // weights and the moments (one rank: all of them, in one file).
  const int64_t n = table.trainable_total(), share = n / world + n % world;
  const double bytes = double(sizeof(float)) *
                       double(world > 1 ? table.total() - n + 3 * share : table.total() + 2 * n);
  return cfg.parallel.timeout_s + bytes / 20e6;
}

namespace {

// A save that every rank agreed had failed, its message complete.
class SaveFailed : public Error {
 public:
  using Error::Error;
};

// Every rank's outcome of one stage of a save, known to all: the ranks that failed it.
std::vector<int> failed_ranks(Communicator& comm, const std::string& error) {
  std::vector<int32_t> failed(size_t(comm.size()), 0);
  int32_t mine = error.empty() ? 0 : 1;
  comm.all_gather(&mine, failed.data(), 1, DataType::I32);
  std::vector<int> out;
  for (int r = 0; r < comm.size(); ++r)
    if (failed[size_t(r)]) out.push_back(r);
  return out;
}

// The wait for a save, however long its writes take, is bounded by the save's own limit,
// not by parallel.timeout_s, which is sized for one step's collectives.
class SaveTimeout {
 public:
  SaveTimeout(Communicator& comm, double save, double usual) : comm_(comm), usual_(usual) {
    comm.set_timeout(save);
  }
  ~SaveTimeout() { comm_.set_timeout(usual_); }
  SaveTimeout(const SaveTimeout&) = delete;
  SaveTimeout& operator=(const SaveTimeout&) = delete;

 private:
  Communicator& comm_;
  double usual_;
};

}  // namespace

// A save's stages. Each ends with every rank learning which ranks failed it, so that all leave
// the save the same way: this rank's own reason, which ranks failed, and in which stage.
struct SaveStages {
  Communicator& comm;
  std::string error;
  std::vector<int> failed;
  const char* stage = "";
  // Runs `body` unless a stage before failed, then agrees on the outcome.
  template <class Body>
  void run(const char* name, Body&& body) {
    if (!failed.empty()) return;
    stage = name;
    try {
      body();
    } catch (const Error& e) {
      error = e.what();
      if (comm.size() > 1) spdlog::warn("rank {}: {}", comm.rank(), error);
    }
    agree();
  }
  void agree() { failed = comm.size() > 1 ? failed_ranks(comm, error) : std::vector<int>(error.empty() ? 0 : 1, 0); }
};

// A save whose files are being written (by a background thread under checkpoint.async_save):
// what each rank took from the device, where it goes, and how the writing went.
struct CheckpointManager::Pending {
  std::optional<ParamTable> table;  // the model's, which the writer reads
  int64_t step = 0;
  bool last = false;
  fs::path final_path, part_path;
  std::vector<float> m, v, w;  // this rank's part of the moments and trainable weights (several ranks)
  int64_t begin = 0;        // its compact offset
  MomentParts parts;
  std::optional<SaveSnapshot> snapshot;  // rank 0: the main file's contents
  TrainState state;
  std::string error;        // this rank's writing failure, "" when it wrote its files
  std::atomic<bool> written{false};
  std::thread writer;
};

CheckpointManager::~CheckpointManager() {
  if (!pending_) return;
  // A run stopped while a background save was writing: its files are not complete, and with
  // no other rank to agree with they never will be. The temporaries go; the marker never came.
  if (pending_->writer.joinable()) pending_->writer.join();
  std::error_code ec;
  fs::remove(temporary_of(pending_->part_path), ec);
  if (rank0_) fs::remove(temporary_of(pending_->final_path), ec);
}

std::string CheckpointManager::save(const Model& model, const AdamW& opt, const TrainState& state,
                                    bool last) {
  if (pending_) finish();  // one save at a time: the one before completes first
  const double limit = save_timeout(cfg_, model.table(), comm_.size());
  const SaveTimeout scope(comm_, limit, cfg_.parallel.timeout_s);
  try {
    return save_with_every_rank(model, opt, state, last);
  } catch (const SaveFailed&) {
    throw;
  } catch (const Error& e) {
    // A rank that stopped answering: the others' waits ended at the save's limit.
    throw Error(fmt::format("checkpoint of step {} not saved: {} (a save waits for the other ranks up to {:.1f} s: "
                            "checkpoint.timeout_s)", state.step, e.what(), limit));
  }
}

std::string CheckpointManager::save_with_every_rank(const Model& model, const AdamW& opt,
                                                    const TrainState& state, bool last) {
  const int world = comm_.size(), rank = comm_.rank();
  const int64_t step = state.step;
  SaveStages stages{comm_, "", {}, ""};
  auto p = std::make_unique<Pending>();
  p->table.emplace(model.table());
  p->step = step, p->last = last, p->state = state;
  p->final_path = checkpoint_path(cfg_, step);
  p->part_path = moment_part_path(p->final_path, rank, world);
  stages.run("preparing the folder", [&] {
    if (rank0_) prepare_save(cfg_, model, true, step);
  });
  // Several ranks: each writes its part of the moments and of the trainable weights at once
  // (the fp32 master of what it holds under ZeRO), and rank 0 the frozen weights and the
  // record of the parts' checksums, gathered first. No rank holds the whole weights.
  const bool in_parts = world > 1;
  const auto [begin, end] = AdamW::save_part(opt.compact_size(), rank, world);
  p->begin = begin;
  if (in_parts) {
    stages.run("reading its moments and weights", [&] {
      p->m.resize(size_t(end - begin)), p->v.resize(size_t(end - begin)), p->w.resize(size_t(end - begin));
      opt.download_compact(begin, end - begin, p->m.data(), p->v.data());
      model.table().for_each_trainable(begin, end, [&](int64_t w, int64_t a, int64_t n) {
        model.read_params(w, n, p->w.data() + (a - begin));
      });
    });
    if (!stages.failed.empty()) return give_up(stages.failed, stages.error, stages.stage, step, last, p->part_path);
    const uint64_t mine[3] = {moment_checksum(p->m), moment_checksum(p->v), moment_checksum(p->w)};
    p->parts = {world, true, std::vector<uint64_t>(size_t(3 * world))};
    comm_.all_gather(mine, p->parts.checksums.data(), 3, DataType::I64);
  }
  stages.run("reading the weights", [&] {
    if (rank0_) p->snapshot = snapshot_for_save(model, &opt, p->parts);
  });
  if (!stages.failed.empty()) return give_up(stages.failed, stages.error, stages.stage, step, last, p->part_path);
  pending_ = std::move(p);
  if (last || !cfg_.checkpoint.async_save) {
    write_pending(false);
    return finish();
  }
  // The files are written while training goes on; finish() completes the save.
  pending_->writer = std::thread([this] { write_pending(true); });
  return "";
}

void CheckpointManager::write_pending(bool background) {
  Pending& p = *pending_;
  try {
    if (p.parts.world > 0)
      write_durable(p.part_path, p.step, [&](const fs::path& tmp) {
        write_moment_part(tmp, p.step, comm_.rank(), comm_.size(), p.begin, p.m, p.v, &p.w, !background);
      });
    if (p.snapshot)
      write_durable(p.final_path, p.step, [&](const fs::path& tmp) {
        write_checkpoint_file(tmp, cfg_, *p.table, *p.snapshot, p.state, p.parts, !background);
      });
  } catch (const Error& e) {
    p.error = e.what();
    if (comm_.size() > 1) spdlog::warn("rank {}: {}", comm_.rank(), p.error);
  }
  p.snapshot.reset(), p.m.clear(), p.v.clear(), p.w.clear();  // the host copies are spent
  p.written = true;
}

std::string CheckpointManager::poll() {
  if (!pending_ || !pending_->writer.joinable()) return "";
  int32_t writing = pending_->written ? 0 : 1;
  comm_.all_reduce_max(&writing, 1);
  return writing ? "" : finish();
}

std::string CheckpointManager::finish() {
  Pending& p = *pending_;
  if (p.writer.joinable()) p.writer.join();
  const SaveTimeout scope(comm_, save_timeout(cfg_, *p.table, comm_.size()), cfg_.parallel.timeout_s);
  // Parts first; the main file's name, then the marker, make the checkpoint whole.
  SaveStages stages{comm_, p.error, {}, "writing"};
  stages.agree();
  stages.run("naming the parts", [&] {
    if (p.parts.world > 0) commit_rename(temporary_of(p.part_path).string(), p.part_path.string());
  });
  stages.run("completing", [&] {
    if (!rank0_) return;
    commit_rename(temporary_of(p.final_path).string(), p.final_path.string());
    complete_save(cfg_, p.final_path, p.step);
  });
  const std::unique_ptr<Pending> done = std::move(pending_);
  if (stages.failed.empty()) {
    if (rank0_) spdlog::info("checkpoint saved: {}", p.final_path.string());
    saved_step_ = p.step;
    return p.final_path.string();
  }
  return give_up(stages.failed, stages.error, stages.stage, p.step, p.last, p.part_path);
}

std::string CheckpointManager::give_up(const std::vector<int>& failed, const std::string& error,
                                       const char* stage, int64_t step, bool last,
                                       const fs::path& part_path) const {
  // A part already named is left to the next save's pruning: no marker makes it complete.
  std::error_code ec;
  fs::remove(temporary_of(part_path), ec);
  if (rank0_) fs::remove(temporary_of(checkpoint_path(cfg_, step)), ec);
  const std::string what =
      !error.empty() ? error
                     : fmt::format("checkpoint of step {} not saved: rank{} {} failed while {} ({} why)", step,
                                   failed.size() > 1 ? "s" : "", fmt::join(failed, ", "), stage,
                                   failed.size() > 1 ? "their logs say" : "its log says");
  const std::string kept = fmt::format("{}; the checkpoints before it are unchanged", what);
  if (last) throw SaveFailed(kept);
  if (rank0_) spdlog::warn("{}; training goes on and saves again at the next interval", kept);
  return "";
}

}  // namespace dhp
