// Device creation by kind (device.h).
#include "transport/device.h"

#include "transport/memory/memory_device.h"
#include "transport/tcp/tcp_device.h"

namespace meridian::transport {

std::string_view deviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kTcp: return "tcp";
    case DeviceKind::kMemory: return "memory";
  }
  return "unknown";
}

Result<std::unique_ptr<Device>> Device::create(DeviceOptions options) {
  switch (options.kind) {
    case DeviceKind::kTcp: {
      MERIDIAN_ASSIGN_OR_RETURN(auto dev, tcp::TcpDevice::create(std::move(options)));
      return std::unique_ptr<Device>(std::move(dev));
    }
    case DeviceKind::kMemory: {
      MERIDIAN_ASSIGN_OR_RETURN(auto dev, memory::Network::shared().createDevice(std::move(options)));
      return std::unique_ptr<Device>(std::move(dev));
    }
  }
  return invalidArgument("no device of kind {}", static_cast<int>(options.kind));
}

}  // namespace meridian::transport
