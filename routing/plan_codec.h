// Plan announcements on the wire: rank 0 tells every rank, at each plan checkpoint, which
// plan table is in force from the next checkpoint on and when the one after it comes
// (collectives/plan_sync.h has the protocol). JSON text, bounded and fully checked: a
// malformed announcement is an error, never a plan that does not fit the communicator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "routing/planner.h"

namespace meridian::routing {

struct PlanAnnouncement {
  std::uint64_t epoch = 0;           // of the table below (0: the built-in choice, no table)
  std::uint64_t nextCheckpoint = 0;  // collective sequence number of the checkpoint after next
  std::optional<PlanTable> table;    // sent once per epoch (> 0); absent: the epoch's table is known
  std::string reason;                // why this epoch (for logs)
};

inline constexpr std::size_t kMaxAnnouncementBytes = std::size_t{4} << 20;
inline constexpr std::size_t kMaxPlanClasses = 64;

// Classes that share a plan are written once.
std::vector<std::uint8_t> encodeAnnouncement(const PlanAnnouncement& a);
// Checks the size bound, the structure, class sizes increasing, every plan valid for
// `ranks` (validatePlan), and no table with epoch 0.
Result<PlanAnnouncement> decodeAnnouncement(std::span<const std::uint8_t> bytes, int ranks);

}  // namespace meridian::routing
