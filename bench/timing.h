// How the benches summarise repeated timings.
#pragma once

#include <algorithm>
#include <vector>

namespace dhp::bench {

// The middle of the values (the upper of the two middle ones for an even count); 0 for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::nth_element(v.begin(), v.begin() + long(v.size() / 2), v.end());
  return v[v.size() / 2];
}

}  // namespace dhp::bench
