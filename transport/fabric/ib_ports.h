// InfiniBand (and RoCE) ports as libibverbs reports them: which HCAs and ports a host has,
// whether each is up, its link layer, and its rate (lanes x per-lane speed). The data path
// never goes through here (it runs on libfabric's verbs provider); this names rails, gives
// NCCL a port's speed and shows ports in meridian-probe. libfabric's own speed figure is
// not used: 1.17 knows no speed past EDR and reports 0 for HDR and NDR links.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace meridian::transport::fabric {

// A port's rate from ibv_port_attr's active_width and active_speed (bit masks; rdma-core
// 44, Debian 12's, has no active_speed_ex, so XDR reads as unknown there).
struct PortRate {
  int lanes = 0;          // 1, 2, 4, 8 or 12; 0 when the width is unknown
  double laneGbps = 0;    // 2.5 (SDR) ... 100 (NDR); 0 when the speed is unknown
  const char* name = "";  // "SDR" ... "NDR"; "" when unknown
  std::uint8_t widthBits = 0, speedBits = 0;  // as the port reported them
  double gbps() const { return lanes * laneGbps; }
  bool known() const { return lanes > 0 && laneGbps > 0; }
  std::string text() const;  // "4x NDR (400 Gbit/s)", or "unknown (width 0x.., speed 0x..)"
};
PortRate decodePortRate(std::uint8_t activeWidth, std::uint8_t activeSpeed);

struct IbPort {
  std::string device;  // "mlx5_0"
  int port = 0;        // 1-based
  bool active = false;
  std::string state;      // "active", "down", ...
  std::string linkLayer;  // "infiniband", "ethernet" (RoCE), "unspecified"
  PortRate rate;
  std::string text() const;  // "mlx5_0:1 active infiniband 4x NDR (400 Gbit/s)"
};

// Every port of every HCA here; empty when there is none (not an error). kPathError when a
// device is listed but cannot be opened or queried.
Result<std::vector<IbPort>> listIbPorts();

}  // namespace meridian::transport::fabric
