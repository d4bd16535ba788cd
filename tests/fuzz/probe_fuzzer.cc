// libFuzzer target for the probe datagram decoder (routing/probe_wire.h): whatever bytes
// arrive, decoding returns a message or a clear error and never reads out of bounds. The
// input is tried twice: as a datagram as it came (a stranger's: it must never open), and
// its first 40 bytes sealed with the job's key as a genuine peer would (so the checks behind
// the tag are fuzzed too): what decodes then must encode and decode to the same message.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "core/aead.h"
#include "routing/probe_wire.h"

using namespace meridian;
using namespace meridian::routing;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string kSecret = "fuzz-secret";
  static const ProbeKey key =
      probeKey(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(kSecret.data()), kSecret.size()));
  (void)decodeProbe(std::span<const std::uint8_t>(data, size), key);

  if (size < 40) return 0;
  std::uint8_t d[kProbeBytes] = {'M', 'R', 'P', 'B', kProbeVersion};
  DirectionKey dk;
  dk.key = key;
  std::memcpy(dk.iv.data(), d + 8, dk.iv.size());
  NumberedCipher(WireSecurity::kEncrypt, NumberedCipher::Role::kSeal, dk)
      .seal(0, std::span<const std::uint8_t>(data, 40), d + 20, d + 60);
  auto m = decodeProbe(d, key);
  if (!m.isOk()) return 0;
  auto again = decodeProbe(encodeProbe(m.value(), key), key);
  if (!again.isOk() || !(again.value() == m.value())) __builtin_trap();
  return 0;
}
