#include "data/h5.h"

#include <cerrno>
#include <cstring>

namespace dhp {

void quiet_hdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

std::string hdf5_reason() {
  struct Found {
    std::string os, innermost;
  } found;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* e, void* out) -> herr_t {
        auto& f = *static_cast<Found*>(out);
        const std::string desc = e->desc ? e->desc : "";
        const std::string key = "error message = '";
        const auto at = desc.find(key);
        if (f.os.empty() && at != std::string::npos)
          f.os = desc.substr(at + key.size(), desc.find('\'', at + key.size()) - at - key.size());
        if (!desc.empty()) f.innermost = desc;  // walking downward: the last is the innermost
        return 0;
      },
      &found);
  if (!found.os.empty()) return found.os;
  if (!found.innermost.empty()) return found.innermost;
  return errno != 0 ? std::strerror(errno) : "no reason given";
}

}  // namespace dhp
