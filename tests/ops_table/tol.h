// The bound of a comparison with the CPU reference: |got - ref| <= atol + rtol·|ref|.
#pragma once

namespace dhp::testing {

struct Tol {
  double atol, rtol;
};

}  // namespace dhp::testing
