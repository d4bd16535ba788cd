// InfiniBand ports through libibverbs (see ib_ports.h).
#include "transport/fabric/ib_ports.h"

#include <infiniband/verbs.h>

#include <cerrno>

#include <fmt/format.h>

namespace meridian::transport::fabric {

namespace {

// Per-lane rates by the lowest bit of active_speed: IBTA's SDR 2.5, DDR 5, QDR 10,
// FDR10 10 (10.3125 signalling, 64b/66b), FDR 14, EDR 25, HDR 50, NDR 100 Gbit/s.
struct Speed {
  std::uint8_t bit;
  double gbps;
  const char* name;
};
constexpr Speed kSpeeds[] = {{1, 2.5, "SDR"},   {2, 5, "DDR"},  {4, 10, "QDR"},  {8, 10, "FDR10"},
                             {16, 14, "FDR"},   {32, 25, "EDR"}, {64, 50, "HDR"}, {128, 100, "NDR"}};
// Lanes by the lowest bit of active_width: 1x, 4x, 8x, 12x, 2x.
constexpr std::pair<std::uint8_t, int> kWidths[] = {{1, 1}, {2, 4}, {4, 8}, {8, 12}, {16, 2}};

std::uint8_t lowestBit(std::uint8_t v) { return static_cast<std::uint8_t>(v & -v); }

const char* stateName(ibv_port_state s) {
  switch (s) {
    case IBV_PORT_NOP: return "nop";
    case IBV_PORT_DOWN: return "down";
    case IBV_PORT_INIT: return "init";
    case IBV_PORT_ARMED: return "armed";
    case IBV_PORT_ACTIVE: return "active";
    case IBV_PORT_ACTIVE_DEFER: return "active-defer";
  }
  return "unknown";
}

const char* linkLayerName(std::uint8_t l) {
  switch (l) {
    case IBV_LINK_LAYER_INFINIBAND: return "infiniband";
    case IBV_LINK_LAYER_ETHERNET: return "ethernet";
    default: return "unspecified";
  }
}

}  // namespace

PortRate decodePortRate(std::uint8_t activeWidth, std::uint8_t activeSpeed) {
  PortRate r;
  const std::uint8_t w = lowestBit(activeWidth), s = lowestBit(activeSpeed);
  for (const auto& [bit, lanes] : kWidths) {
    if (bit == w) r.lanes = lanes;
  }
  for (const Speed& sp : kSpeeds) {
    if (sp.bit == s) {
      r.laneGbps = sp.gbps;
      r.name = sp.name;
    }
  }
  r.widthBits = activeWidth;
  r.speedBits = activeSpeed;
  return r;
}

std::string PortRate::text() const {
  if (!known()) return fmt::format("unknown (width {:#x}, speed {:#x})", widthBits, speedBits);
  return fmt::format("{}x {} ({:g} Gbit/s)", lanes, name, gbps());
}

std::string IbPort::text() const {
  return fmt::format("{}:{} {} {} {}", device, port, state, linkLayer, rate.text());
}

Result<std::vector<IbPort>> listIbPorts() {
  std::vector<IbPort> out;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) {
    // ENOSYS: no verbs support in the kernel; either way there is nothing to list.
    return out;
  }
  Status failed;
  for (int d = 0; d < n && failed.isOk(); ++d) {
    const char* name = ibv_get_device_name(list[d]);
    ibv_context* ctx = ibv_open_device(list[d]);
    if (ctx == nullptr) {
      failed = pathError("opening InfiniBand device {}: {}", name != nullptr ? name : "?", errnoText(errno));
      break;
    }
    ibv_device_attr attr{};
    if (int rc = ibv_query_device(ctx, &attr); rc != 0) {
      failed = pathError("querying InfiniBand device {}: {}", name, errnoText(rc));
    }
    for (int p = 1; failed.isOk() && p <= attr.phys_port_cnt; ++p) {
      ibv_port_attr pa{};
      if (int rc = ibv_query_port(ctx, static_cast<std::uint8_t>(p), &pa); rc != 0) {
        failed = pathError("querying port {} of InfiniBand device {}: {}", p, name, errnoText(rc));
        break;
      }
      IbPort port;
      port.device = name != nullptr ? name : "?";
      port.port = p;
      port.active = pa.state == IBV_PORT_ACTIVE;
      port.state = stateName(pa.state);
      port.linkLayer = linkLayerName(pa.link_layer);
      port.rate = decodePortRate(pa.active_width, pa.active_speed);
      out.push_back(std::move(port));
    }
    ibv_close_device(ctx);
  }
  ibv_free_device_list(list);
  if (!failed.isOk()) return failed;
  return out;
}

}  // namespace meridian::transport::fabric
