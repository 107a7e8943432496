// Durable file writes: what reaches the disk before a name points at it. Shared by data
// shards, checkpoints and exports, so that a crash at any moment leaves either the old file or
// the complete new one under a name.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace dhp {

// Flushes a file's (or, with directory = true, a folder's entries') data to the disk.
void fsync_path(const std::string& path, bool directory);
// Renames `from` to `to` and fsyncs the folder, so the rename survives a crash.
void commit_rename(const std::string& from, const std::string& to);
// Writes `bytes` at `path` atomically: a temporary file, fsync, rename. Errors carry the
// operating system's reason.
void write_file_atomic(const std::string& path, const std::string& bytes);

// The rule for every file this program writes where the user points it: it never replaces or
// writes through what it did not write. A path is accepted when nothing is there, or when a
// regular file is there that `ours(path)` recognises as an earlier output of the same kind (it
// is then replaced), or any regular file when `force` is set. A device, FIFO, socket, folder
// or symbolic link is always refused; so is another program's file without `force`. `what`
// names the option or key in the message. A null `ours` recognises nothing.
void check_output_path(const std::string& path, std::string_view what,
                       const std::function<bool(const std::string&)>& ours, bool force);

// `path` + ".tmp", made ready to be created: a stale regular file of an interrupted write is
// removed; anything else there (a device, FIFO, folder, link) is refused.
std::string temporary_beside(const std::string& path);

// The first `max_bytes` of a regular file (fewer when it is shorter), or empty when it cannot
// be read; for recognising an earlier output by its first bytes.
std::string read_head(const std::string& path, size_t max_bytes);

// A folder's name as a user may type it ("hf/base/", "./hf//base") made canonical in form
// ("hf/base"): lexically normal, without a trailing separator, so that paths built inside it
// and prefixes compared against them agree. The root stays "/"; "" stays "".
std::string folder_name(const std::string& path);

}  // namespace dhp
