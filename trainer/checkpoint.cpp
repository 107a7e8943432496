#include "trainer/checkpoint.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

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

// The step a file name step-NNNNNNNN.h5 claims, or -1 for another name.
int64_t named_step(const fs::path& p) {
  const std::string stem = p.stem().string();
  if (p.extension() != ".h5" || stem.size() != 13 || stem.rfind("step-", 0) != 0) return -1;
  if (stem.find_first_not_of("0123456789", 5) != std::string::npos) return -1;
  return std::stoll(stem.substr(5));
}

// Keeps the newest `keep` complete checkpoints; the marker goes first so a crash in between
// never leaves a marker that points at a missing file. Also removes the temporaries of saves
// that a kill interrupted: the run saving is the folder's only writer (RunLock), so none of
// them is in progress, and each may be as large as a whole checkpoint.
void prune(const fs::path& dir, int keep) {
  std::error_code ec;
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const fs::path p = e.path();
    if (p.extension() == ".tmp" && named_step(p.parent_path() / p.stem()) >= 0) stale.push_back(p);
  }
  for (const auto& p : stale) fs::remove(p, ec);
  const auto all = list_checkpoints(dir.string());
  for (size_t i = 0; i + size_t(keep) < all.size(); ++i) {
    fs::remove(marker_of(all[i]), ec);
    if (!ec) fs::remove(all[i], ec);
    if (ec) spdlog::warn("could not delete old checkpoint '{}': {}", all[i], ec.message());
  }
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

}  // namespace

std::string save_checkpoint(const Config& cfg, const Model& model, const AdamW* opt,
                            const TrainState& st) {
  const fs::path dir = cfg.checkpoint.dir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  DHP_CHECK(!ec, "cannot create checkpoint.dir '{}': {}", dir.string(), ec.message());
  // A run killed between its last save and that save's pruning left one checkpoint too many;
  // pruning first too keeps the folder at most one over `keep` at any moment.
  prune(dir, cfg.checkpoint.keep);
  const fs::path final_path = dir / fmt::format("step-{:08d}.h5", st.step);
  const fs::path tmp = fs::path(final_path.string() + ".tmp");
  check_free_space(dir, model, opt != nullptr, st.step);
  // An older save of the same step is no longer complete once we start overwriting it.
  fs::remove(marker_of(final_path), ec);
  DHP_CHECK(!ec, "cannot remove '{}': {}", marker_of(final_path).string(), ec.message());
  try {
    write_checkpoint_file(tmp, cfg, model, opt, st);
    // Durable before visible: data on disk, then the name, then the marker that says complete.
    fsync_path(tmp.string(), false);
  } catch (const Error& e) {
    // A partial file is useless and, on a full disk, takes the space the next save needs.
    // Emptied before it is unlinked: HDF5 may still hold it open after a failed close, and
    // an open file's blocks are not freed by unlinking it.
    fs::resize_file(tmp, 0, ec);
    fs::remove(tmp, ec);
    throw Error(fmt::format("checkpoint of step {} not saved ({}): {}", st.step, tmp.string(),
                            e.what()));
  }
  commit_rename(tmp.string(), final_path.string());
  write_marker(final_path, st.step);
  fsync_path(dir.string(), true);

  prune(dir, cfg.checkpoint.keep);
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

std::string CheckpointManager::save(const Model& model, const AdamW& opt, const TrainState& state,
                                    bool last) {
  std::string path;
  if (rank0_) {
    try {
      path = save_checkpoint(cfg_, model, &opt, state);
      spdlog::info("checkpoint saved: {}", path);
    } catch (const Error& e) {
      if (last) throw;
      spdlog::warn("{}; training goes on and saves again at the next interval", e.what());
    }
  }
  comm_.barrier();
  return path;
}

}  // namespace dhp
