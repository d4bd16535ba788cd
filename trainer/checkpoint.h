// Checkpoints: a training step and a list of named binary sections (parameters,
// optimizer state, data order...), written atomically and verified on reading, so a
// crash mid-write or a damaged file never resumes a run from garbage.
//
// A checkpoint directory holds ckpt-<step, 12+ digits>.mrc files; nothing else in it
// is looked at (temporary files of an interrupted write are ignored).
//
// File format (little-endian):
//   header   "MRDCKPT1" (8 bytes) | u32 version | u64 step | u32 sectionCount
//   sections sectionCount x (u16 nameBytes | name | u64 dataBytes | data)
//   digest   SHA-256 of everything before it (32 bytes); nothing may follow.
// Limits: at most kCheckpointMaxSections sections; names 1..kCheckpointMaxNameBytes
// bytes and unique. Every length is checked against the file size before it is used.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace meridian::trainer {

inline constexpr std::uint32_t kCheckpointVersion = 1;
inline constexpr std::size_t kCheckpointMaxSections = 4096;
inline constexpr std::size_t kCheckpointMaxNameBytes = 255;

struct CheckpointSection {
  std::string name;
  std::vector<std::uint8_t> data;
};

struct Checkpoint {
  std::uint64_t step = 0;
  std::vector<CheckpointSection> sections;
  std::string path;  // the file it was read from
  // The section called `name`, or nullptr.
  const CheckpointSection* find(std::string_view name) const;
};

// The file name of the checkpoint of `step` in dir: dir/ckpt-<step, zero-padded to 12>.mrc.
std::string checkpointPath(const std::string& dir, std::uint64_t step);

// Writes the checkpoint of `step`: to a temporary file in dir, fsync, rename, fsync the
// directory; creates dir (and its parents) when missing. Then deletes the checkpoints
// older than `step` beyond the newest `keep` (keep >= 1, the new one counted); a failed
// deletion is logged, not returned. Checkpoints newer than `step` (left by a run that
// was rolled back) are kept, with a WARN: loadLatestCheckpoint prefers them unless
// given a maxStep. Errors are kInvalidArgument: bad sections or keep, and I/O errors
// (disk full, permissions) naming the path and the errno text. A failed write leaves no
// new ckpt-*.mrc behind (an error after the rename, from fsync of the directory, leaves
// the complete checkpoint, not known to be durable).
Status writeCheckpoint(const std::string& dir, std::uint64_t step, const std::vector<CheckpointSection>& sections,
                       int keep = 2);

// Reads and verifies one file: magic, version, section bounds, the SHA-256 digest, no
// trailing bytes. Any defect: kInvalidArgument "<path>: corrupt checkpoint (<what>)";
// a file that cannot be read: kInvalidArgument "cannot read <path>: <errno text>".
Result<Checkpoint> readCheckpoint(const std::string& path);

// The steps of the checkpoints in dir that verify, newest first; each one that does not
// is logged at WARN with its reason and skipped. A missing dir gives an empty list; one
// that cannot be listed, kInvalidArgument. Reads every file in full.
Result<std::vector<std::uint64_t>> validCheckpointSteps(const std::string& dir);

// The newest verifying checkpoint at or below maxStep, falling back past corrupt ones
// (a WARN each, naming the file and reason). None: kInvalidArgument "no valid checkpoint
// in <dir>" followed by what was rejected.
Result<Checkpoint> loadLatestCheckpoint(const std::string& dir, std::uint64_t maxStep = UINT64_MAX);

}  // namespace meridian::trainer
