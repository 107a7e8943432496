// The checkpoints of a run's folder, written so that a crash at any moment leaves the
// previous checkpoint loadable (the file itself: checkpoint_file.h).
//
// Saving writes NAME.h5.tmp, fsyncs it, renames it to NAME.h5, then writes the completion
// marker NAME.done holding the step; only checkpoints whose marker, name and recorded step
// agree are ever listed or loaded. A failed save removes its temporary and throws with the
// operating system's reason.
#pragma once

#include <string>
#include <vector>

#include "model/model.h"
#include "trainer/checkpoint_file.h"
#include "trainer/config.h"
#include "trainer/optimizer.h"

namespace dhp {

// Saves into cfg.checkpoint.dir and deletes all but the newest cfg.checkpoint.keep complete
// checkpoints. Returns the path written.
std::string save_checkpoint(const Config& cfg, const Model& model, const AdamW* opt,
                            const TrainState& state);

// Complete checkpoints of a directory, oldest first ("" entries never).
std::vector<std::string> list_checkpoints(const std::string& dir);

// "auto" = the newest complete checkpoint of cfg.checkpoint.dir (throws if none); otherwise a
// path to a .h5 file or to a directory holding checkpoints.
std::string resolve_checkpoint(const std::string& what, const std::string& default_dir);

}  // namespace dhp
