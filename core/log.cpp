#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <unistd.h>

#include <cstdlib>

#include "core/check.h"

namespace dhp {

namespace {

bool colour(const std::string& mode, bool launched) {
  DHP_CHECK(mode == "auto" || mode == "always" || mode == "never",
            "log.color: unknown value '{}' (use auto, always or never)", mode);
  if (mode != "auto") return mode == "always";
  const char* term = std::getenv("TERM");
  return !launched && ::isatty(STDOUT_FILENO) && term && std::string(term) != "dumb";
}

}  // namespace

void set_up_logging(int rank, int world_size, const std::string& level, const std::string& color,
                    bool launched) {
  auto lvl = spdlog::level::from_str(level);
  DHP_CHECK(lvl != spdlog::level::off || level == "off",
            "log.level: unknown level '{}' (use debug, info, warn or error)", level);
  spdlog::set_level(lvl);
  // spdlog's own choice (a terminal in TERM's list) is replaced by log.color's.
  const auto mode = colour(color, launched) ? spdlog::color_mode::always : spdlog::color_mode::never;
  for (const auto& sink : spdlog::default_logger()->sinks())
    if (auto console = std::dynamic_pointer_cast<spdlog::sinks::stdout_color_sink_mt>(sink)) console->set_color_mode(mode);
  if (world_size > 1 && rank != 0)
    spdlog::set_pattern(fmt::format("[%H:%M:%S] [rank {}] [%^%l%$] %v", rank));
  else
    spdlog::set_pattern("[%H:%M:%S] [%^%l%$] %v");
}

}  // namespace dhp
