// Durable file writes: what reaches the disk before a name points at it. Shared by data
// shards, checkpoints and exports, so that a crash at any moment leaves either the old file or
// the complete new one under a name.
#pragma once

#include <string>

namespace dhp {

// Flushes a file's (or, with directory = true, a folder's entries') data to the disk.
void fsync_path(const std::string& path, bool directory);
// Renames `from` to `to` and fsyncs the folder, so the rename survives a crash.
void commit_rename(const std::string& from, const std::string& to);
// Writes `bytes` at `path` atomically: a temporary file, fsync, rename.
void write_file_atomic(const std::string& path, const std::string& bytes);

}  // namespace dhp
