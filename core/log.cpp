#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include "core/check.h"

namespace dhp {

void set_up_logging(int rank, int world_size, const std::string& level) {
  auto lvl = spdlog::level::from_str(level);
  DHP_CHECK(lvl != spdlog::level::off || level == "off",
            "log.level: unknown level '{}' (use debug, info, warn or error)", level);
  spdlog::set_level(lvl);
  if (world_size > 1 && rank != 0)
    spdlog::set_pattern(fmt::format("[%H:%M:%S] [rank {}] [%^%l%$] %v", rank));
  else
    spdlog::set_pattern("[%H:%M:%S] [%^%l%$] %v");
}

}  // namespace dhp
