// Element-wise comparison of a kernel's output with the CPU reference: |got - ref| <=
// atol + rtol·|ref| for every element, reporting the first few that miss. Each caller names
// its tolerances with the reason they hold.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tests/ops_table/tol.h"

namespace dhp::testing {

// `side` names what `got` came from in the messages ("cuda", "emulated").
template <class T>
void expect_close(const std::string& what, const std::vector<T>& got, const std::vector<T>& ref,
                  Tol tol, const char* side) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double err = std::abs(double(got[i]) - double(ref[i]));
    if (!(err <= tol.atol + tol.rtol * std::abs(double(ref[i])))) {
      if (++bad <= 5)
        ADD_FAILURE() << what << "[" << i << "]: " << side << " " << got[i] << " cpu " << ref[i];
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << ref.size() << " values differ";
}

}  // namespace dhp::testing
