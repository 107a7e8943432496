// Running the dhp executable (DHP_BINARY) from a test: its exit status and everything it
// printed, under a timeout so that a hang fails the test instead of blocking the suite.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/file_text.h"

namespace dhp::testing {

inline std::string quoted(const std::string& s) { return "'" + s + "'"; }

inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

struct Outcome {
  int status = -1;  // exit status, or 128 + signal when the process was killed
  std::string output;  // stdout and stderr together
};

// The executable tried: DHP_BINARY, or DHP_TEST_BINARY from the environment when set, so the
// same tests can be run against another build (an older commit's, to see them fail there).
inline std::string dhp_binary() {
  const char* other = std::getenv("DHP_TEST_BINARY");
  return other != nullptr && *other != '\0' ? std::string(other) : std::string(DHP_BINARY);
}

// Runs `args` (the dhp executable is prepended) through the shell, with `prefix` shell
// commands before it (a limit, a cd). A run past `timeout_s` ends with status 124.
inline Outcome run_dhp(const std::string& args, const std::filesystem::path& out_dir,
                       const std::string& prefix = "", int timeout_s = 120) {
  const std::filesystem::path log = out_dir / "dhp_output.txt";
  const std::string cmd = "sh -c " +
                          quoted(prefix + " exec timeout -k 5 " + std::to_string(timeout_s) +
                                 " " + dhp_binary() + " " + args) +
                          " > " + log.string() + " 2>&1";
  const int raw = std::system(cmd.c_str());
  Outcome r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  r.output = read_text(log);
  return r;
}

}  // namespace dhp::testing
