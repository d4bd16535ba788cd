#include "transport/fabric/choose.h"

#include <algorithm>
#include <array>

#include "core/knobs.h"

namespace meridian::transport::fabric {
namespace {
// Best first; the first two are RDMA.
constexpr std::array<std::string_view, 4> kPreference = {"verbs;ofi_rxm", "efa", "tcp;ofi_rxm", "shm"};
}  // namespace

bool isRdmaProvider(std::string_view provider) { return provider == "verbs;ofi_rxm" || provider == "efa"; }

Result<FabricChoice> chooseFabricProvider(std::string_view mode, std::string_view named,
                                          const std::vector<std::string>& present) {
  const std::string have = present.empty() ? std::string("none") : joinCommaList(present);
  if (mode == "off") return FabricChoice{"", "MERIDIAN_FABRIC=off: TCP paths only"};
  if (mode != "auto" && mode != "on") return invalidArgument("MERIDIAN_FABRIC='{}': not one of auto, on, off", mode);
  if (!named.empty()) {
    if (mode == "auto" && !isRdmaProvider(named)) {
      return FabricChoice{"", fmt::format("MERIDIAN_FABRIC_PROVIDER={} is not RDMA, and MERIDIAN_FABRIC=auto uses RDMA "
                                          "providers only (MERIDIAN_FABRIC=on uses it): TCP paths only",
                                          named)};
    }
    return FabricChoice{std::string(named), fmt::format("{} (MERIDIAN_FABRIC_PROVIDER)", named)};
  }
  for (std::string_view p : kPreference) {
    if (mode == "auto" && !isRdmaProvider(p)) break;
    if (std::find(present.begin(), present.end(), p) != present.end()) {
      return FabricChoice{std::string(p), fmt::format("{}, the best provider present (libfabric offers: {})", p, have)};
    }
  }
  if (mode == "auto") {
    return FabricChoice{"", fmt::format("no RDMA provider (verbs;ofi_rxm, efa) here (libfabric offers: {}): TCP "
                                        "paths only",
                                        have)};
  }
  return invalidArgument("MERIDIAN_FABRIC=on, but libfabric offers no provider for fabric paths here ({})", have);
}

}  // namespace meridian::transport::fabric
