// Logging goes through spdlog with one pattern set by set_up_logging(); lines from ranks other
// than 0 carry the rank so interleaved output from mpirun stays readable.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace dhp {

// level: "debug" | "info" | "warn" | "error".
void set_up_logging(int rank, int world_size, const std::string& level);

}  // namespace dhp
