#include "core/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/check.h"
#include "core/input.h"

namespace dhp {

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  DHP_CHECK(fd >= 0, "cannot open '{}' to sync it: {}", path, std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  DHP_CHECK(rc == 0, "cannot sync '{}' to disk: {}", path, std::strerror(err));
}

void commit_rename(const std::string& from, const std::string& to) {
  std::error_code ec;
  std::filesystem::rename(from, to, ec);
  DHP_CHECK(!ec, "cannot rename '{}' to '{}': {}", from, to, ec.message());
  const auto dir = std::filesystem::path(to).parent_path();
  fsync_path(dir.empty() ? "." : dir.string(), true);
}

namespace {

// What lstat says is at `path`, in words, for a refusal; empty for a regular file.
std::string not_regular(const struct stat& st) {
  if (S_ISREG(st.st_mode)) return "";
  if (S_ISDIR(st.st_mode)) return "a folder";
  if (S_ISLNK(st.st_mode)) return "a symbolic link";
  if (S_ISFIFO(st.st_mode)) return "a FIFO";
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) return "a device";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

std::string temporary_beside(const std::string& path) {
  const std::string tmp = path + ".tmp";
  struct stat st {};
  if (::lstat(tmp.c_str(), &st) != 0) return tmp;
  const std::string kind = not_regular(st);
  DHP_CHECK(kind.empty(), "'{}' (the temporary file for '{}') is {}: it is not ours to replace", tmp,
            path, kind);
  DHP_CHECK(::unlink(tmp.c_str()) == 0, "cannot remove the stale '{}': {}", tmp, std::strerror(errno));
  return tmp;
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  const std::string tmp = temporary_beside(path);
  {
    // O_EXCL | O_NOFOLLOW: whatever appeared at the temporary name since is never written through.
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    DHP_CHECK(fd >= 0, "cannot write '{}': {}", tmp, std::strerror(errno));
    size_t done = 0;
    int err = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        err = n < 0 ? errno : EIO;
        break;
      }
      done += size_t(n);
    }
    if (!err && ::fsync(fd) != 0) err = errno;
    if (::close(fd) != 0 && !err) err = errno;
    if (err) {
      ::unlink(tmp.c_str());
      throw Error(fmt::format("cannot write '{}': {}", tmp, std::strerror(err)));
    }
  }
  commit_rename(tmp, path);
}

std::string read_head(const std::string& path, size_t max_bytes) {
  // Only ever asked of a path check_output_path found to be a regular file, not a link.
  try {
    const InputFile file("file", path);
    std::string out(std::min<size_t>(max_bytes, size_t(file.size())), '\0');
    out.resize(size_t(file.read_at(out.data(), int64_t(out.size()), 0)));
    return out;
  } catch (const Error&) {
    return "";
  }
}

void check_output_path(const std::string& path, std::string_view what,
                       const std::function<bool(const std::string&)>& ours, bool force) {
  DHP_CHECK(!path.empty() && path.back() != '/', "{} '{}' must name a file, not a folder", what, path);
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    DHP_CHECK(errno == ENOENT, "{} '{}': {}", what, path, std::strerror(errno));
    return;
  }
  const std::string kind = not_regular(st);
  DHP_CHECK(kind.empty(), "{} '{}' is {}: dhp writes only regular files and never replaces {}", what, path,
            kind, kind == "a folder" ? "a folder" : "what it did not write");
  DHP_CHECK(force || (ours && ours(path)),
            "{} '{}' already exists and is not an earlier output of this command: not replaced (move it "
            "away, choose another path, or pass --force to replace it)",
            what, path);
}

std::string folder_name(const std::string& path) {
  if (path.empty()) return path;
  std::filesystem::path p = std::filesystem::path(path).lexically_normal();
  std::string s = p.string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s.empty() ? "." : s;
}

}  // namespace dhp
