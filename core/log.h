// Logging goes through spdlog with one pattern set by set_up_logging(); lines from ranks other
// than 0 carry the rank so interleaved output from mpirun stays readable.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace dhp {

// level: "debug" | "info" | "warn" | "error". color: "auto" | "always" | "never" (log.color);
// `launched`: an MPI launcher started the process, whose standard output is then a pty that
// says nothing of where the text goes (auto colours only a terminal outside a launcher).
void set_up_logging(int rank, int world_size, const std::string& level, const std::string& color = "auto",
                    bool launched = false);

}  // namespace dhp
