// Built instead of csrc/verbs/ where libibverbs' headers were missing at build time: TCP rails
// only, and a rail named "rdma:" is refused with what to install.
#include <stdexcept>

#include "rail_io.h"

namespace r2cc {

RailProvider& rail_provider_for(const std::vector<std::string>& rails) {
  for (const auto& r : rails)
    if (r.rfind("rdma:", 0) == 0)
      throw std::runtime_error("r2cc: rail " + r + ": this build of r2cc has no RDMA support (libibverbs' "
                               "headers were missing when it was built): install libibverbs-dev "
                               "(Debian/Ubuntu) or rdma-core-devel, then reinstall r2cc-serve");
  return tcp_rail_provider();
}

}  // namespace r2cc
