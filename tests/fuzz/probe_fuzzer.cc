// libFuzzer target for the probe datagram decoder (routing/probe_wire.h): whatever bytes
// arrive, decoding returns a message or a clear error, never reads out of bounds; a
// message that decodes re-encodes to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "routing/probe_wire.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string kSecret = "fuzz-secret";  // the seed corpus is signed with it
  const std::span<const std::uint8_t> secret(reinterpret_cast<const std::uint8_t*>(kSecret.data()), kSecret.size());
  auto m = meridian::routing::decodeProbe(std::span<const std::uint8_t>(data, size), secret);
  if (m.isOk()) {
    auto again = meridian::routing::encodeProbe(m.value(), secret);
    // Reserved bytes are not part of the message: compare what the decoder read.
    if (size != again.size() || std::memcmp(again.data(), data, 40) != 0 ||
        std::memcmp(again.data() + 48, data + 48, 16) != 0) {
      __builtin_trap();
    }
  }
  return 0;
}
