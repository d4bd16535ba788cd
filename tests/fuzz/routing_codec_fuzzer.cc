// libFuzzer target for the control decoders (routing/link_state.h rows, routing/plan_codec.h
// announcements, bootstrap/membership.h messages and the bootstrap store's requests and
// answers, GET-MANY's packed values included), which parse what peers send: whatever the bytes,
// decoding returns a value or a clear error, never crashes or reads out of bounds, and a
// value that decodes re-encodes to something that decodes to the same value.
#include <cstddef>
#include <cstdint>
#include <span>

#include "bootstrap/membership.h"
#include "bootstrap/store.h"
#include "routing/link_state.h"
#include "routing/plan_codec.h"

namespace {

bool samePlans(const meridian::routing::PlanTable& a, const meridian::routing::PlanTable& b) {
  if (a.classBytes != b.classBytes || a.plans.size() != b.plans.size()) return false;
  for (std::size_t i = 0; i < a.plans.size(); ++i) {
    const auto &x = a.plans[i], &y = b.plans[i];
    if (x.algorithm != y.algorithm || x.ringOrder != y.ringOrder || x.groups != y.groups ||
        x.crossOrder != y.crossOrder || x.root != y.root) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace meridian::routing;
  const std::span<const std::uint8_t> in(data, size);
  // The first byte picks the communicator size, so that range checks meet many sizes.
  const int ranks = size > 0 ? 1 + data[0] % 16 : 4;
  if (auto row = decodeLinkRow(in, ranks); row.isOk()) {
    auto again = decodeLinkRow(encodeLinkRow(row.value()), ranks);
    if (!again.isOk() || again.value().links.size() != row.value().links.size() ||
        again.value().rank != row.value().rank) {
      __builtin_trap();
    }
  }
  if (auto a = decodeAnnouncement(in, ranks); a.isOk()) {
    auto again = decodeAnnouncement(encodeAnnouncement(a.value()), ranks);
    if (!again.isOk() || again.value().epoch != a.value().epoch || again.value().table.has_value() != a.value().table.has_value() ||
        (a.value().table && !samePlans(*a.value().table, *again.value().table))) {
      __builtin_trap();
    }
  }
  if (auto m = meridian::bootstrap::membership::decodeMessage(in); m.isOk()) {
    auto again = meridian::bootstrap::membership::decodeMessage(meridian::bootstrap::membership::encodeMessage(m.value()));
    if (!again.isOk() || !(again.value() == m.value())) __builtin_trap();
  }
  using meridian::bootstrap::StoreOp;
  if (auto request = meridian::bootstrap::decodeStoreRequest(in); request.isOk()) {
    auto frame = meridian::bootstrap::encodeStoreRequest(request.value());
    if (!frame.isOk()) __builtin_trap();  // what decodes is within every limit
    auto again = meridian::bootstrap::decodeStoreRequest(frame.value());
    if (!again.isOk() || again.value().keys != request.value().keys || again.value().value != request.value().value) {
      __builtin_trap();
    }
  }
  for (StoreOp op : {StoreOp::kGet, StoreOp::kGetMany, StoreOp::kAdd}) {
    if (auto response = meridian::bootstrap::decodeStoreResponse(in, op); response.isOk() && op == StoreOp::kGetMany) {
      auto again = meridian::bootstrap::decodeStoreResponse(meridian::bootstrap::encodeStoreResponse(response.value()), op);
      if (!again.isOk() || again.value().values != response.value().values) __builtin_trap();
    }
  }
  return 0;
}
