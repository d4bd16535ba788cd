// Training integrity: the checks that stop a run before it trains on, or saves, garbage:
// numbers that are not finite, and ranks that hold different data or different weights.
//
// Everything here runs on the training thread. The cross-rank checks are collectives on
// the SyncComm they are given (null: a world of one, nothing to compare): every rank calls
// them at the same point, and every rank gets the same answer.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "trainer/checkpoint.h"
#include "trainer/dataset.h"
#include "trainer/sync.h"

namespace meridian::trainer {

using Sha256 = std::array<std::uint8_t, 32>;

// SHA-256 over the parts, one after the other.
Sha256 sha256(std::initializer_list<std::span<const std::uint8_t>> parts);
// The digest's first 8 bytes in hex (for messages).
std::string shortHex(const Sha256& digest);
// A data set's dimensions, classes, images and labels.
Sha256 datasetDigest(const Dataset& d);

// The index of the first NaN or infinity in `values`, or values.size() when all are finite.
std::size_t firstNonFinite(std::span<const float> values);

// Checkpoint sections other than "meta" hold floats (host bytes): kInvalidArgument
// "section '<name>' holds <value> at element <i>" for the first one that is not finite, or
// that is not a whole number of floats. Also the CheckpointCheck the trainer resumes with.
Status checkFiniteSections(const std::vector<CheckpointSection>& sections);

// Every rank's `mine`, in rank order (comm null: just mine).
Result<std::vector<std::int64_t>> gatherFromEveryRank(SyncComm* comm, std::int64_t mine);
// The ranks that report `failed`, in rank order: every rank learns who failed, so that all
// stop together instead of the others waiting in the next collective.
Result<std::vector<int>> ranksThatFailed(SyncComm* comm, bool failed);

// Compares every rank's digest with rank 0's (an allgather of 32 bytes per rank):
// kInvalidArgument "ranks hold different <what>: rank(s) <list> differ from rank 0 ..."
// on every rank when any differs.
Status checkSameOnEveryRank(SyncComm* comm, const Sha256& digest, std::string_view what);

}  // namespace meridian::trainer
