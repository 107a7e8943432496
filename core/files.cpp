#include "core/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "core/check.h"

namespace dhp {

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  DHP_CHECK(fd >= 0, "cannot open '{}' to sync it", path);
  const int rc = ::fsync(fd);
  ::close(fd);
  DHP_CHECK(rc == 0, "cannot sync '{}' to disk", path);
}

void commit_rename(const std::string& from, const std::string& to) {
  std::error_code ec;
  std::filesystem::rename(from, to, ec);
  DHP_CHECK(!ec, "cannot rename '{}' to '{}': {}", from, to, ec.message());
  const auto dir = std::filesystem::path(to).parent_path();
  fsync_path(dir.empty() ? "." : dir.string(), true);
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    DHP_CHECK(f != nullptr, "cannot write '{}'", tmp);
    const size_t n = std::fwrite(bytes.data(), 1, bytes.size(), f);
    const bool ok = n == bytes.size() && std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
    std::fclose(f);
    DHP_CHECK(ok, "cannot write '{}' (disk full?)", tmp);
  }
  commit_rename(tmp, path);
}

}  // namespace dhp
