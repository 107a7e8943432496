#include "core/input.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>

#include "core/check.h"

namespace dhp {

namespace {

// A descriptor for `rel` below the folder `root_fd`, or -1 with errno set. openat2 resolves
// every component inside the folder (EXDEV when a ".." or a symlink leads out); kernels
// before 5.6 lack it, and there the path the descriptor really names is checked instead.
int open_beneath(int root_fd, const std::string& root, const std::string& rel) {
  open_how how{};
  how.flags = O_RDONLY | O_NONBLOCK | O_CLOEXEC;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  const long fd = ::syscall(SYS_openat2, root_fd, rel.c_str(), &how, sizeof(how));
  if (fd >= 0 || errno != ENOSYS) return int(fd);
  const int plain = ::openat(root_fd, rel.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (plain < 0) return -1;
  char real[PATH_MAX];
  const std::string link = "/proc/self/fd/" + std::to_string(plain);
  const ssize_t n = ::readlink(link.c_str(), real, sizeof(real) - 1);
  const std::string prefix = root == "/" ? root : root + "/";
  if (n <= 0 || std::string_view(real, size_t(n)).substr(0, prefix.size()) != prefix) {
    ::close(plain);
    errno = EXDEV;
    return -1;
  }
  return plain;
}

}  // namespace

InputFile::InputFile(const std::string& what, const std::string& path, const std::string& hint)
    : what_(what), path_(path) {
  DHP_CHECK(path.find('\0') == std::string::npos, "{} '{}' holds a NUL character", what,
            printable(path));
  // O_NONBLOCK: the open of a FIFO returns at once instead of waiting for a writer.
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  check_opened(hint);
}

InputFile::InputFile(const std::string& what, const std::string& root, const std::string& path,
                     const std::string& hint)
    : what_(what), path_(path) {
  const std::string prefix = root == "/" ? root : root + "/";
  DHP_CHECK(path.compare(0, prefix.size(), prefix) == 0 && path.size() > prefix.size(),
            "{} '{}' is not inside '{}'", what, printable(path), printable(root));
  const int root_fd = ::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  DHP_CHECK(root_fd >= 0, "{} '{}': cannot open its folder '{}': {}", what, printable(path),
            printable(root), std::strerror(errno));
  fd_ = open_beneath(root_fd, root, path.substr(prefix.size()));
  const int err = errno;
  ::close(root_fd);
  errno = err;
  DHP_CHECK(fd_ >= 0 || err != EXDEV,
            "{} '{}' now leads outside '{}' (a symlink or '..' changed since it was checked); "
            "refusing to read it",
            what, printable(path), printable(root));
  check_opened(hint);
}

void InputFile::check_opened(const std::string& hint) {
  const std::string p = printable(path_);
  if (fd_ < 0) {
    DHP_CHECK(errno != ENOENT, "{} '{}' not found{}", what_, p, hint);
    throw Error(fmt::format("{} '{}': cannot open it: {}", what_, p, std::strerror(errno)));
  }
  struct stat st {};
  const int rc = ::fstat(fd_, &st);
  const int err = errno;
  if (rc != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    DHP_CHECK(rc == 0, "{} '{}': cannot stat it: {}", what_, p, std::strerror(err));
    DHP_CHECK(!S_ISDIR(st.st_mode), "{} '{}' is a folder, not a regular file{}", what_, p, hint);
    throw Error(fmt::format("{} '{}' is not a regular file (a FIFO, device or socket); refusing "
                            "to read it",
                            what_, p));
  }
  size_ = int64_t(st.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

int64_t InputFile::read_at(void* out, int64_t n, int64_t offset) const {
  auto* p = static_cast<char*>(out);
  int64_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd_, p + done, size_t(n - done), off_t(offset + done));
    if (r < 0 && errno == EINTR) continue;
    DHP_CHECK(r >= 0, "{} '{}': cannot read {} bytes at offset {}: {}", what_, printable(path_),
              n, offset, std::strerror(errno));
    if (r == 0) break;
    done += r;
  }
  return done;
}

void InputFile::prefetch(int64_t offset, int64_t n) const {
  ::posix_fadvise(fd_, off_t(offset), off_t(n), POSIX_FADV_WILLNEED);
}

std::string InputFile::read_all(int64_t max_bytes, const std::string& cap_name) const {
  DHP_CHECK(size_ <= max_bytes, "{} '{}' is {} bytes, more than the {} allowed ({})", what_,
            printable(path_), size_, max_bytes, cap_name);
  std::string bytes(size_t(size_), '\0');
  DHP_CHECK(read_at(bytes.data(), size_, 0) == size_,
            "{} '{}' could not be read whole (it shrank while being read)", what_,
            printable(path_));
  return bytes;
}

int64_t append_next_chunk(const InputFile& file, std::string& buf, size_t consumed, int64_t& offset,
                          size_t chunk) {
  buf.erase(0, consumed);
  const size_t old = buf.size();
  buf.resize(old + chunk);
  const int64_t n = file.read_at(buf.data() + old, int64_t(chunk), offset);
  buf.resize(old + size_t(n));
  offset += n;
  return n;
}

LineReader::LineReader(const std::string& what, const std::string& path, const std::string& hint,
                       const volatile int* stop, int64_t max_line)
    : file_(what, path, hint), what_(what), path_(path), stop_(stop), max_line_(max_line) {}

void LineReader::check_stop() const {
  DHP_CHECK(!stop_ || !*stop_, "stopped by a signal while reading {} '{}' (at line {})", what_,
            printable(path_), line_no_ + 1);
}

bool LineReader::next(std::string& line) {
  constexpr size_t kChunk = size_t(1) << 20;
  check_stop();
  for (;;) {
    const size_t nl = buf_.find('\n', pos_);
    const size_t end = nl == std::string::npos ? buf_.size() : nl;
    DHP_CHECK(int64_t(end - pos_) <= max_line_, "{} '{}': line {} longer than {} bytes", what_,
              printable(path_), line_no_ + 1, max_line_);
    if (nl != std::string::npos || (eof_ && pos_ < buf_.size())) {
      line.assign(buf_, pos_, end - pos_);
      pos_ = std::min(end + 1, buf_.size());
      ++line_no_;
      return true;
    }
    if (eof_) return false;
    eof_ = append_next_chunk(file_, buf_, pos_, offset_, kChunk) == 0;
    pos_ = 0;
    check_stop();
  }
}

}  // namespace dhp
