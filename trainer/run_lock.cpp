#include "trainer/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "core/check.h"

namespace dhp {

namespace {

namespace fs = std::filesystem;

std::string holder_of(int fd) {
  char buf[512] = {};
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  std::string s = n > 0 ? std::string(buf, size_t(n)) : std::string();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s.empty() ? "a process that has not yet recorded itself" : s;
}

}  // namespace

RunLock::RunLock(const std::string& dir) {
  DHP_CHECK(!dir.empty(), "checkpoint.dir is empty: set it to the folder this run saves into");
  std::error_code ec;
  fs::create_directories(dir, ec);
  DHP_CHECK(!ec, "checkpoint.dir '{}' cannot be created: {}", dir, ec.message());
  DHP_CHECK(fs::is_directory(dir), "checkpoint.dir '{}' is not a folder", dir);
  const std::string path = (fs::path(dir) / kRunLockFile).string();
  lock(path, fmt::format("checkpoint.dir '{}'", dir),
       "two runs on one folder would delete each other's checkpoints: wait for it to end or choose "
       "another folder",
       "checkpoints could not be saved, so the run does not start");
}

RunLock::RunLock(const std::string& lock_path, const std::string& what, const std::string& why) {
  lock(lock_path, what,
       !why.empty() ? why
                    : "two runs writing one file would destroy each other's records: wait for it to end or "
                      "choose another path",
       "the run does not start");
}

void RunLock::lock(const std::string& path, const std::string& what, const std::string& why,
                   const std::string& consequence) {
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  DHP_CHECK(fd_ >= 0, "{} is not writable ({}: {}); {}", what, path, std::strerror(errno), consequence);
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string who = holder_of(fd_);
    ::close(fd_);
    fd_ = -1;
    DHP_CHECK(err != EWOULDBLOCK, "{} is in use by another run ({}); {}", what, who, why);
    throw Error(fmt::format("cannot lock '{}': {}", path, std::strerror(err)));
  }
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::time_t now = std::time(nullptr);
  char when[64] = {};
  std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  const std::string who = fmt::format("pid {} on {}, started {}\n", ::getpid(), host, when);
  const bool ok = ::ftruncate(fd_, 0) == 0 &&
                  ::pwrite(fd_, who.data(), who.size(), 0) == ssize_t(who.size()) &&
                  ::fsync(fd_) == 0;
  if (!ok) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    throw Error(fmt::format("{} is not writable ({}: {}); {}", what, path, std::strerror(err), consequence));
  }
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace dhp
