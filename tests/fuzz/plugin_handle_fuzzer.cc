// libFuzzer target: arbitrary bytes as the NCCL plugin's 128-byte connection handle (it comes
// from the peer through NCCL's bootstrap), and the TCP endpoint name inside it. Decoding never
// crashes or reads past the handle, and whatever decodes re-encodes to the same thing.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "nccl_plugin/plugin_core.h"
#include "transport/tcp/endpoint.h"

using namespace meridian::plugin;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::array<std::uint8_t, ConnectHandle::kBytes> in{};
  std::memcpy(in.data(), data, size < in.size() ? size : in.size());
  auto h = decodeHandle(in);
  if (!h.isOk()) return 0;
  std::array<std::uint8_t, ConnectHandle::kBytes> again{};
  if (!encodeHandle(h.value(), again).isOk()) std::abort();
  auto back = decodeHandle(again);
  if (!back.isOk() || back->listenId != h->listenId || back->pending != h->pending ||
      back->endpoint != h->endpoint) {
    std::abort();
  }
  auto addresses = meridian::transport::tcp::decodeEndpoint(h->endpoint);
  if (!addresses.isOk()) return 0;
  auto name = meridian::transport::tcp::encodeEndpoint(addresses.value());
  if (!name.isOk() || name.value() != h->endpoint) std::abort();
  return 0;
}
