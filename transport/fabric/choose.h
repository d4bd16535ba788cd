// Which libfabric provider a device's fabric rail uses, from MERIDIAN_FABRIC (auto, on,
// off), MERIDIAN_FABRIC_PROVIDER and the providers present. Pure: the device and
// meridian-probe --fabric ask the same question the same way; unit-tested.
//
//   off                      none
//   auto, no provider named  verbs;ofi_rxm, then efa, if present; else none (TCP only)
//   auto, one named          that one if it is RDMA (present or not: opening it tells);
//                            a non-RDMA one is left alone (auto means RDMA only)
//   on, no provider named    the best present: verbs;ofi_rxm, efa, tcp;ofi_rxm, shm;
//                            kInvalidArgument when none is
//   on, one named            that one (opening an absent one fails with the list)
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace meridian::transport::fabric {

bool isRdmaProvider(std::string_view provider);

struct FabricChoice {
  std::string provider;  // empty: no fabric rail
  std::string why;       // one sentence for people: why this provider, or why none
};

Result<FabricChoice> chooseFabricProvider(std::string_view mode, std::string_view named,
                                          const std::vector<std::string>& present);

}  // namespace meridian::transport::fabric
