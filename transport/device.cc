// Device creation by kind (device.h).
#include "transport/device.h"

#include "core/knob_list.h"
#include "core/knobs.h"
#include "core/secret.h"
#include "transport/frame.h"
#include "transport/memory/memory_device.h"
#include "transport/tcp/tcp_device.h"

namespace meridian::transport {

static_assert(knobs::kChunkBytes.maxValue == kMaxChunkBytes, "MERIDIAN_CHUNK_BYTES's range ends at the frame limit");

Status resolveKnobs(DeviceOptions& o) {
  if (o.chunkBytes == 0) {
    MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t v, readKnobInt(knobs::kChunkBytes));
    o.chunkBytes = static_cast<std::size_t>(v);
  }
  if (o.pathStallMs <= 0) {
    MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t v, readKnobInt(knobs::kPathStallMs));
    o.pathStallMs = static_cast<int>(v);
  }
  if (o.secret.empty()) {
    MERIDIAN_ASSIGN_OR_RETURN(o.secret, readJobSecret());
  }
  if (!o.wireSecurity) {
    MERIDIAN_ASSIGN_OR_RETURN(const WireSecurity mode, wireSecurityFromKnob());
    o.wireSecurity = mode;
  }
  if (o.kind == DeviceKind::kTcp) {
    if (o.tcp.streamsPerPath <= 0) {
      MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t v, readKnobInt(knobs::kTcpStreams));
      o.tcp.streamsPerPath = static_cast<int>(v);
    }
    if (o.tcp.socketBufferBytes <= 0) {
      MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t v, readKnobInt(knobs::kTcpSockBufBytes));
      o.tcp.socketBufferBytes = static_cast<int>(v);
    }
    MERIDIAN_ASSIGN_OR_RETURN(o.fabric.mode, readKnobChoice(knobs::kFabric, o.fabric.mode));
    if (o.fabric.provider.empty()) o.fabric.provider = knobString(knobs::kFabricProvider);
    if (o.fabric.domain.empty()) o.fabric.domain = knobString(knobs::kFabricDomain);
    MERIDIAN_ASSIGN_OR_RETURN(o.fabric.tcp, readKnobChoice(knobs::kFabricTcp, o.fabric.tcp));
    MERIDIAN_ASSIGN_OR_RETURN(o.shm, readKnobChoice(knobs::kShm, o.shm));
    if (o.tcp.notsentLowatBytes < 0) {
      MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t v, readKnobInt(knobs::kTcpNotsentLowatBytes));
      o.tcp.notsentLowatBytes = static_cast<int>(v);
    }
  }
  return Status::ok();
}

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
