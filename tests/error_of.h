// Tests of user-facing errors look at the message: it must say what and where.
#pragma once

#include <string>

#include "core/check.h"

namespace dhp::testing {

// The message of the dhp::Error that `f` throws, or "" when it throws none.
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace dhp::testing
