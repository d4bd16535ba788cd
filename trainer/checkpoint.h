// Checkpoints: a training step and a list of named binary sections (parameters,
// optimizer state, data order...), written atomically and verified on reading, so a
// crash mid-write, a damaged file or one forged without the job's key never resumes a
// run from garbage.
//
// A checkpoint directory holds ckpt-<step, 12+ digits>.mrc files; nothing else in it
// is looked at (temporary files of an interrupted write are ignored).
//
// File format (little-endian):
//   header   "MRDCKPT1" (8 bytes) | u32 version | u64 step | u32 sectionCount
//   sections sectionCount x (u16 nameBytes | name | u64 dataBytes | data)
//   digest   HMAC-SHA256 of everything before it under the checkpoint key (32 bytes);
//            nothing may follow. Version 1 files (an unkeyed SHA-256 that anyone could
//            recompute) are refused.
// Limits: at most kCheckpointMaxSections sections; names 1..kCheckpointMaxNameBytes
// bytes and unique. Every length is checked against the file size before it is used.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/secret.h"
#include "core/status.h"

namespace meridian::trainer {

inline constexpr std::uint32_t kCheckpointVersion = 2;
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

// The key checkpoints are signed with: HMAC-SHA256(secret, "meridian checkpoint key v2"),
// a key of their own, so that no checkpoint digest equals an HMAC the job computes
// elsewhere with the same secret.
using CheckpointKey = Hmac256;
CheckpointKey checkpointKey(std::string_view secret);

// The secret behind this process's checkpoint key: MERIDIAN_CHECKPOINT_SECRET when set,
// else the job secret when one is set (MERIDIAN_SECRET / MERIDIAN_SECRET_FILE), else the
// key file of `dir` (checkpointKeyFile). kInvalidArgument when a secret file cannot be read
// or `dir` is empty where the key file is needed.
struct CheckpointSecret {
  std::string secret;
};
Result<CheckpointSecret> checkpointSecretFromEnvironment(const std::string& dir = {});
// `dir`/checkpoint.key: 32 random bytes (hex) made on first use, mode 0600, owned by this
// user and not a link (anything else is refused). For jobs without a lasting job secret
// (`meridian-train --ranks N` invents one per launch): the checkpoints of one launch must
// verify in the next, and only who can read the file can sign one.
Result<std::string> checkpointKeyFile(const std::string& dir);

// An extra test a caller puts on a checkpoint that verified (e.g. that its numbers are
// finite); a failure counts as damage: the checkpoint is skipped with that reason.
using CheckpointCheck = std::function<Status(const Checkpoint&)>;

// The file name of the checkpoint of `step` in dir: dir/ckpt-<step, zero-padded to 12>.mrc.
std::string checkpointPath(const std::string& dir, std::uint64_t step);

// Writes the checkpoint of `step`: to a temporary file in dir, fsync, rename, fsync the
// directory; creates dir (and its parents) when missing. Then deletes the checkpoints
// older than `step` beyond the newest `keep` that verify under `key` (keep >= 1, the new
// one counted): a damaged or foreign file never takes the place of a good one, and is
// deleted once `keep` good ones are newer; a failed deletion is logged, not returned. Checkpoints newer than `step` (left by a run that
// was rolled back) are kept, with a WARN: loadLatestCheckpoint prefers them unless
// given a maxStep. Errors are kInvalidArgument: bad sections or keep, and I/O errors
// (disk full, permissions) naming the path and the errno text. A failed write leaves no
// new ckpt-*.mrc behind (an error after the rename, from fsync of the directory, leaves
// the complete checkpoint, not known to be durable).
Status writeCheckpoint(const std::string& dir, const CheckpointKey& key, std::uint64_t step,
                       const std::vector<CheckpointSection>& sections, int keep = 2);

// Reads and verifies one file: magic, version, section bounds, the HMAC under `key`, no
// trailing bytes. Any defect: kInvalidArgument "<path>: corrupt checkpoint (<what>)"
// (an HMAC that does not verify: "... (HMAC-SHA256 does not verify: damaged, or signed
// with another key ...)"); a file that cannot be read: kInvalidArgument "cannot read
// <path>: <errno text>".
Result<Checkpoint> readCheckpoint(const std::string& path, const CheckpointKey& key);

// The steps of the checkpoints in dir that verify (and pass `check`, when given), newest
// first; each one that does not is logged at WARN with its reason and skipped. A missing
// dir gives an empty list; one that cannot be listed, kInvalidArgument. Reads every file
// in full.
Result<std::vector<std::uint64_t>> validCheckpointSteps(const std::string& dir, const CheckpointKey& key,
                                                        const CheckpointCheck& check = nullptr);

// The newest checkpoint at or below maxStep that verifies and passes `check`, falling
// back past the others (a WARN each, naming the file and reason). None: kInvalidArgument
// "no valid checkpoint in <dir>" followed by what was rejected.
Result<Checkpoint> loadLatestCheckpoint(const std::string& dir, const CheckpointKey& key,
                                        std::uint64_t maxStep = UINT64_MAX, const CheckpointCheck& check = nullptr);

}  // namespace meridian::trainer
