// The checkpoint folder belongs to one run at a time. A run takes an exclusive lock on
// <checkpoint.dir>/dhp.lock for its whole lifetime (flock: the kernel drops it when the
// process ends, however it ends, so a crashed run never leaves a stale lock) and writes who
// holds it into the file, so a second run on the same folder is refused naming the first.
// Creating the lock file is also the start-up proof that the folder is writable: a run that
// could not save a checkpoint fails before its first step, not after its last.
#pragma once

#include <string>

namespace dhp {

class RunLock {
 public:
  // Creates the folder when needed and locks it; throws dhp::Error when the folder cannot
  // be created or written, or when another process holds the lock (naming its pid, host and
  // start time as that process recorded them).
  explicit RunLock(const std::string& dir);
  // The same lock on the file `lock_path`, for another output two runs must not share (the
  // metrics file, an export folder); `what` names that output in messages, `why` says what
  // sharing it would do and what to do instead.
  RunLock(const std::string& lock_path, const std::string& what, const std::string& why = "");
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  void lock(const std::string& path, const std::string& what, const std::string& why,
            const std::string& consequence);
  int fd_ = -1;
};

inline constexpr const char* kRunLockFile = "dhp.lock";

}  // namespace dhp
