// The checkpoints of a run's folder, written so that a crash at any moment leaves the
// previous checkpoint loadable (the file itself: checkpoint_file.h), and the manager that
// decides for a training run when they are written, kept and resumed from.
//
// Saving writes NAME.h5.tmp, fsyncs it, renames it to NAME.h5, then writes the completion
// marker NAME.done holding the step; only checkpoints whose marker, name and recorded step
// agree are ever listed or loaded. A failed save removes its temporary and throws with the
// operating system's reason. A run of several ranks saves in parallel: each rank writes its
// part of the trainable weights and the optimizer moments beside NAME.h5 (checkpoint_file.h)
// while rank 0 writes the frozen weights and the record of the parts, and the marker follows
// every part's fsync and rename.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/model.h"
#include "parallel/communicator.h"
#include "trainer/checkpoint_file.h"
#include "trainer/config.h"
#include "trainer/optimizer.h"
#include "trainer/run_lock.h"

namespace dhp {

// Saves into cfg.checkpoint.dir and deletes all but the newest cfg.checkpoint.keep complete
// checkpoints. Returns the path written.
std::string save_checkpoint(const Config& cfg, const Model& model, const AdamW* opt,
                            const TrainState& state);

// How long the ranks of a save wait for each other: checkpoint.timeout_s, or when 0
// parallel.timeout_s plus the time to write rank 0's files (the frozen weights, its share of
// the trainable weights and the moments) at 20 MB/s.
double save_timeout(const Config& cfg, const ParamTable& table, int world);

// Complete checkpoints of a directory, oldest first ("" entries never).
std::vector<std::string> list_checkpoints(const std::string& dir, bool warn = true);
// The step the newest complete checkpoint of `dir` holds; 0 when there is none.
int64_t newest_complete_step(const std::string& dir);

// "auto" = the newest complete checkpoint of cfg.checkpoint.dir (throws if none); otherwise a
// path to a .h5 file, to a directory holding checkpoints, or to a Hugging Face folder (returned
// as it is).
std::string resolve_checkpoint(const std::string& what, const std::string& default_dir, bool warn = true);

// A training run's checkpoints (torchtitan's CheckpointManager): the folder's lock, which
// checkpoint the run resumes from, when it saves, how many it keeps (save_checkpoint), and
// whether a failed save ends the run.
class CheckpointManager {
 public:
  // Rank 0 locks cfg.checkpoint.dir for the manager's lifetime (RunLock): a folder that is
  // another run's or cannot be written is an error before anything else of the run happens.
  CheckpointManager(const Config& cfg, Communicator& comm);

  // The checkpoint a run resumes from, or "" for a fresh run. `resume`: "" (fresh), "auto"
  // (the folder's newest) or a path. `auto` on a folder without a checkpoint yet starts
  // afresh, so a job killed before its first save is resubmitted unchanged; a fresh run
  // refuses a folder that holds another run's checkpoints.
  std::string resume_path(const std::string& resume) const;
  // With `auto`, every complete checkpoint of the folder, newest first: one whose contents
  // fail to load (a checksum) is passed over for the one before it, as a truncated one is.
  // Otherwise resume_path alone (or nothing).
  std::vector<std::string> resume_candidates(const std::string& resume) const;

  // Whether the run saves after `step` (1-based) on its way: every checkpoint.every steps,
  // the last step excepted (the run ends with its own save).
  bool periodic(int64_t step) const;

  // Saves with every rank, each writing its part, the waits bounded by save_timeout; every
  // rank gets the path ("" when a periodic save failed). The save a run ends with (last) must
  // succeed; a periodic one that fails (a full disk, a rank that could not write) warns,
  // naming the ranks that failed, and training goes on to try again at the next interval.
  // With checkpoint.async_save a periodic save returns "" once every rank has its state on the
  // host, and its files are written in the background while training goes on; poll()
  // completes it. Any save first completes the one before.
  std::string save(const Model& model, const AdamW& opt, const TrainState& state, bool last);
  // Called by every rank after each step: completes a background save once every rank's files
  // are written (one small collective a step while one is under way) and returns its path,
  // "" otherwise (or when a periodic save failed, as save does).
  std::string poll();
  // Whether a background save is under way.
  bool saving() const { return pending_ != nullptr; }
  // The step of the newest save completed through this manager (0: none).
  int64_t saved_step() const { return saved_step_; }
  ~CheckpointManager();
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

 private:
  struct Pending;
  std::string save_with_every_rank(const Model& model, const AdamW& opt, const TrainState& state, bool last);
  // Writes the pending save's files under their temporary names (this rank's part; rank 0 the
  // main file), recording its failure; in the background without drawing progress.
  void write_pending(bool background);
  // Agrees on the writing, names the parts, then the main file, then the marker.
  std::string finish();
  // A save that `failed` on those ranks while at `stage`: this rank's temporaries removed,
  // then a throw (last) or a warning and "".
  std::string give_up(const std::vector<int>& failed, const std::string& error, const char* stage,
                      int64_t step, bool last, const std::filesystem::path& part_path) const;
  const Config& cfg_;
  Communicator& comm_;
  const bool rank0_;
  std::optional<RunLock> lock_;
  std::unique_ptr<Pending> pending_;
  int64_t saved_step_ = 0;
};

}  // namespace dhp
