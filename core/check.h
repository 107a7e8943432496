// One family of checks for the whole project.
//   DHP_CHECK(cond, fmt, args...)   a condition a user can violate (bad config, bad data, missing
//                                   file): throws dhp::Error whose message says what to do.
//   DHP_ASSERT(cond)                an internal invariant: a failure is a bug, reported with
//                                   the statement and file:line, then abort.
//   DHP_CUDA_CHECK(call)            (kernels/cuda/) the same for CUDA calls, naming the device.
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace dhp {

// An error the user can fix; its message is printed as it is, without a stack of context.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

[[noreturn]] inline void assert_fail(const char* expr, const char* file, int line) {
  std::fprintf(stderr, "dhp: internal error: %s failed at %s:%d\n", expr, file, line);
  std::abort();
}

}  // namespace dhp

#define DHP_CHECK(cond, ...)                                   \
  do {                                                         \
    if (!(cond)) throw ::dhp::Error(fmt::format(__VA_ARGS__)); \
  } while (0)

#define DHP_ASSERT(cond)                                                \
  do {                                                                  \
    if (!(cond)) ::dhp::assert_fail(#cond, __FILE__, __LINE__);         \
  } while (0)
