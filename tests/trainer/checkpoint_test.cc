// Checkpoints: round trip, pruning, refusal of every kind of damage, fallback to the
// previous good checkpoint, and clear errors from a directory that cannot be written.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/wire.h"
#include "trainer/checkpoint.h"
#include "trainer/integrity.h"

namespace meridian::trainer {
namespace {

namespace fs = std::filesystem;

std::vector<std::uint8_t> readBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void writeBytes(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::vector<CheckpointSection> sampleSections(std::uint8_t salt = 0) {
  std::vector<std::uint8_t> params(64);
  for (std::size_t i = 0; i < params.size(); ++i) params[i] = static_cast<std::uint8_t>(i * 13 + salt);
  return {{"params", params}, {"optimizer", {1, 2, 3, salt}}, {"empty", {}}};
}

// Sorted names of the files in dir.
std::vector<std::string> filesIn(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/checkpoint_test_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name() + "/a/b";
    fs::remove_all(root());
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(root(), fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(root(), ec);
  }
  std::string root() const { return fs::path(dir_).parent_path().parent_path().string(); }

  void expectCorrupt(const std::string& path, const std::string& fragment, const std::string& context) {
    Result<Checkpoint> c = readCheckpoint(path, key_);
    ASSERT_FALSE(c.isOk()) << context;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << context;
    EXPECT_NE(c.status().message().find(path + ": corrupt checkpoint ("), std::string::npos)
        << context << ": " << c.status().message();
    EXPECT_NE(c.status().message().find(fragment), std::string::npos) << context << ": " << c.status().message();
  }

  std::string dir_;
  const CheckpointKey key_ = checkpointKey("checkpoint-test secret");
};

TEST_F(CheckpointTest, RoundTripCreatesTheDirectory) {
  ASSERT_TRUE(writeCheckpoint(dir_, key_, 1234, sampleSections()).isOk());
  EXPECT_EQ(filesIn(dir_), std::vector<std::string>{"ckpt-000000001234.mrc"});
  const std::string path = checkpointPath(dir_, 1234);
  EXPECT_EQ(path, dir_ + "/ckpt-000000001234.mrc");
  Result<Checkpoint> c = readCheckpoint(path, key_);
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  EXPECT_EQ(c->step, 1234u);
  EXPECT_EQ(c->path, path);
  const std::vector<CheckpointSection> want = sampleSections();
  ASSERT_EQ(c->sections.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(c->sections[i].name, want[i].name);
    EXPECT_EQ(c->sections[i].data, want[i].data);
  }
  ASSERT_NE(c->find("optimizer"), nullptr);
  EXPECT_EQ(c->find("optimizer")->data, want[1].data);
  EXPECT_EQ(c->find("missing"), nullptr);

  ASSERT_TRUE(writeCheckpoint(dir_, key_, UINT64_MAX, {}).isOk());  // 20 digits, no sections
  Result<Checkpoint> last = loadLatestCheckpoint(dir_, key_);
  ASSERT_TRUE(last.isOk()) << last.status().toString();
  EXPECT_EQ(last->step, UINT64_MAX);
  EXPECT_TRUE(last->sections.empty());
}

TEST_F(CheckpointTest, KeepsTheNewestTwo) {
  for (std::uint64_t step = 1; step <= 5; ++step) {
    ASSERT_TRUE(writeCheckpoint(dir_, key_, step * 100, sampleSections(static_cast<std::uint8_t>(step))).isOk());
  }
  EXPECT_EQ(filesIn(dir_), (std::vector<std::string>{"ckpt-000000000400.mrc", "ckpt-000000000500.mrc"}));
  ASSERT_TRUE(writeCheckpoint(dir_, key_, 600, sampleSections(), 1).isOk());
  EXPECT_EQ(filesIn(dir_), std::vector<std::string>{"ckpt-000000000600.mrc"});
  // A write below the newest (a run rolled back to an earlier step) keeps the newer one
  // and never deletes itself.
  ASSERT_TRUE(writeCheckpoint(dir_, key_, 550, sampleSections(), 1).isOk());
  EXPECT_EQ(filesIn(dir_), (std::vector<std::string>{"ckpt-000000000550.mrc", "ckpt-000000000600.mrc"}));
  Result<std::vector<std::uint64_t>> steps = validCheckpointSteps(dir_, key_);
  ASSERT_TRUE(steps.isOk());
  EXPECT_EQ(*steps, (std::vector<std::uint64_t>{600, 550}));
}

TEST_F(CheckpointTest, EveryFlippedByteIsRefused) {
  ASSERT_TRUE(writeCheckpoint(dir_, key_, 7, {{"w", {1, 2, 3}}, {"opt", {4, 5}}}).isOk());
  const std::string path = checkpointPath(dir_, 7);
  const std::vector<std::uint8_t> good = readBytes(path);
  ASSERT_GT(good.size(), 56u);
  const std::string flipped = dir_ + "/flipped.mrc";
  for (std::size_t i = 0; i < good.size(); ++i) {
    for (int mask : {0x01, 0x80}) {
      std::vector<std::uint8_t> bad = good;
      bad[i] = static_cast<std::uint8_t>(bad[i] ^ mask);
      writeBytes(flipped, bad);
      expectCorrupt(flipped, "", "byte " + std::to_string(i) + " ^ " + std::to_string(mask));
    }
  }
  EXPECT_TRUE(readCheckpoint(path, key_).isOk());
}

TEST_F(CheckpointTest, TruncatedTrailingAndForeignFilesAreRefused) {
  ASSERT_TRUE(writeCheckpoint(dir_, key_, 7, sampleSections()).isOk());
  const std::vector<std::uint8_t> good = readBytes(checkpointPath(dir_, 7));
  const std::string bad = dir_ + "/bad.mrc";
  for (std::size_t len = 0; len < good.size(); ++len) {
    writeBytes(bad, std::vector<std::uint8_t>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len)));
    expectCorrupt(bad, "truncated", "cut to " + std::to_string(len) + " bytes");
  }
  std::vector<std::uint8_t> longer = good;
  longer.push_back(0);
  writeBytes(bad, longer);
  expectCorrupt(bad, "1 trailing bytes after the digest", "one byte appended");

  std::vector<std::uint8_t> foreign = good;
  foreign[0] = 'X';
  writeBytes(bad, foreign);
  expectCorrupt(bad, "bad magic", "bad magic");

  std::vector<std::uint8_t> future = good;
  future[8] = 3;  // version
  writeBytes(bad, future);
  expectCorrupt(bad, "format version 3, this build reads version 2", "future version");

  Result<Checkpoint> missing = readCheckpoint(dir_ + "/none.mrc", key_);
  ASSERT_FALSE(missing.isOk());
  EXPECT_NE(missing.status().message().find("cannot read " + dir_ + "/none.mrc: No such file"), std::string::npos)
      << missing.status().message();
}

// Issue 26: the digest was an unkeyed SHA-256, so a checkpoint could be edited (NaN
// weights) and its digest recomputed. Now it is an HMAC under the checkpoint key.
TEST_F(CheckpointTest, AnotherKeyOrTheOldUnkeyedDigestIsRefused) {
  ASSERT_TRUE(writeCheckpoint(dir_, key_, 7, sampleSections()).isOk());
  const std::string path = checkpointPath(dir_, 7);
  const CheckpointKey other = checkpointKey("another job's secret");
  Result<Checkpoint> foreign = readCheckpoint(path, other);
  ASSERT_FALSE(foreign.isOk());
  EXPECT_NE(foreign.status().message().find(path + ": corrupt checkpoint (HMAC-SHA256 does not verify"),
            std::string::npos)
      << foreign.status().message();
  // Under another key the directory holds nothing to resume from.
  EXPECT_TRUE(validCheckpointSteps(dir_, other)->empty());
  EXPECT_FALSE(loadLatestCheckpoint(dir_, other).isOk());

  // A version 1 file: the body with an unkeyed SHA-256 over it, which anyone can recompute.
  std::vector<std::uint8_t> v1 = readBytes(path);
  v1.resize(v1.size() - 32);
  wire::store(v1.data() + 8, std::uint32_t{1});
  const Sha256 digest = sha256({v1});
  v1.insert(v1.end(), digest.begin(), digest.end());
  writeBytes(path, v1);
  expectCorrupt(path, "format version 1 (an unkeyed SHA-256 digest, which anyone can recompute: not trusted)",
                "version 1");
}

TEST_F(CheckpointTest, PruningNeverCountsACheckpointThatDoesNotVerify) {
  ASSERT_TRUE(writeCheckpoint(dir_, key_, 10, sampleSections()).isOk());
  ASSERT_TRUE(writeCheckpoint(dir_, key_, 20, sampleSections()).isOk());
  std::vector<std::uint8_t> damaged = readBytes(checkpointPath(dir_, 20));
  damaged[damaged.size() / 2] ^= 0x01;
  writeBytes(checkpointPath(dir_, 20), damaged);
  // The damaged 20 takes no place among the two kept: 10, the good one, stays.
  ASSERT_TRUE(writeCheckpoint(dir_, key_, 30, sampleSections()).isOk());
  EXPECT_EQ(filesIn(dir_), (std::vector<std::string>{"ckpt-000000000010.mrc", "ckpt-000000000020.mrc",
                                                     "ckpt-000000000030.mrc"}));
  EXPECT_EQ(validCheckpointSteps(dir_, key_).value(), (std::vector<std::uint64_t>{30, 10}));
  // With two good ones newer, the damaged one goes as well.
  ASSERT_TRUE(writeCheckpoint(dir_, key_, 40, sampleSections()).isOk());
  EXPECT_EQ(filesIn(dir_), (std::vector<std::string>{"ckpt-000000000030.mrc", "ckpt-000000000040.mrc"}));
}

TEST_F(CheckpointTest, ACheckThatFailsCountsAsDamage) {
  for (std::uint64_t step : {10, 20}) ASSERT_TRUE(writeCheckpoint(dir_, key_, step, sampleSections()).isOk());
  const CheckpointCheck notTwenty = [](const Checkpoint& c) {
    return c.step == 20 ? invalidArgument("section 'params' holds nan at element 3") : Status();
  };
  EXPECT_EQ(validCheckpointSteps(dir_, key_, notTwenty).value(), std::vector<std::uint64_t>{10});
  Result<Checkpoint> c = loadLatestCheckpoint(dir_, key_, UINT64_MAX, notTwenty);
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  EXPECT_EQ(c->step, 10u);
  Result<Checkpoint> none = loadLatestCheckpoint(dir_, key_, 19, [](const Checkpoint&) {
    return invalidArgument("never");
  });
  ASSERT_FALSE(none.isOk());
  EXPECT_NE(none.status().message().find(checkpointPath(dir_, 10) + ": corrupt checkpoint (never)"), std::string::npos)
      << none.status().message();
}

TEST_F(CheckpointTest, HugeAnnouncedLengthsAreRefusedBeforeAllocating) {
  ASSERT_TRUE(writeCheckpoint(dir_, key_, 7, {{"w", {1, 2, 3}}}).isOk());
  const std::vector<std::uint8_t> good = readBytes(checkpointPath(dir_, 7));
  const std::string bad = dir_ + "/bad.mrc";
  std::vector<std::uint8_t> manySections = good;
  manySections[20] = 0xff;  // count 255: cannot fit
  writeBytes(bad, manySections);
  expectCorrupt(bad, "255 sections cannot fit", "section count");
  manySections[22] = 0xff;  // count > 4096
  writeBytes(bad, manySections);
  expectCorrupt(bad, "more than the limit of 4096", "section count");
  std::vector<std::uint8_t> hugeData = good;
  const std::size_t dataLengthAt = 24 + 2 + 1;
  for (std::size_t i = 0; i < 8; ++i) hugeData[dataLengthAt + i] = 0xff;
  writeBytes(bad, hugeData);
  expectCorrupt(bad, "announces 18446744073709551615 bytes", "data length");
}

TEST_F(CheckpointTest, FallsBackPastACorruptNewest) {
  for (std::uint64_t step : {10, 20, 30}) {
    ASSERT_TRUE(writeCheckpoint(dir_, key_, step, sampleSections(static_cast<std::uint8_t>(step)), 3).isOk());
  }
  std::vector<std::uint8_t> newest = readBytes(checkpointPath(dir_, 30));
  newest[newest.size() / 2] ^= 0x10;
  writeBytes(checkpointPath(dir_, 30), newest);

  Result<Checkpoint> c = loadLatestCheckpoint(dir_, key_);
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  EXPECT_EQ(c->step, 20u);
  EXPECT_EQ(c->find("optimizer")->data, sampleSections(20)[1].data);
  Result<std::vector<std::uint64_t>> steps = validCheckpointSteps(dir_, key_);
  ASSERT_TRUE(steps.isOk());
  EXPECT_EQ(*steps, (std::vector<std::uint64_t>{20, 10}));

  Result<Checkpoint> capped = loadLatestCheckpoint(dir_, key_, 19);
  ASSERT_TRUE(capped.isOk());
  EXPECT_EQ(capped->step, 10u);

  Result<Checkpoint> none = loadLatestCheckpoint(dir_, key_, 9);
  ASSERT_FALSE(none.isOk());
  EXPECT_EQ(none.status().message(), "no valid checkpoint in " + dir_ + " at or below step 9 (no checkpoint files)");

  fs::resize_file(checkpointPath(dir_, 20), 30);
  fs::resize_file(checkpointPath(dir_, 10), 0);
  Result<Checkpoint> allBad = loadLatestCheckpoint(dir_, key_);
  ASSERT_FALSE(allBad.isOk());
  const std::string& msg = allBad.status().message();
  EXPECT_EQ(allBad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(msg.rfind("no valid checkpoint in " + dir_ + "; rejected: ", 0), 0u) << msg;
  for (std::uint64_t step : {10, 20, 30}) {
    EXPECT_NE(msg.find(checkpointPath(dir_, step) + ": corrupt checkpoint"), std::string::npos) << msg;
  }
  EXPECT_TRUE(validCheckpointSteps(dir_, key_)->empty());
}

TEST_F(CheckpointTest, LeftoverTempAndForeignFilesAreIgnored) {
  ASSERT_TRUE(writeCheckpoint(dir_, key_, 10, sampleSections()).isOk());
  writeBytes(dir_ + "/.ckpt-000000000020.mrc.tmp-0123456789abcdef", {1, 2, 3});  // an interrupted write
  writeBytes(dir_ + "/ckpt-20.mrc", {1, 2, 3});                                  // not our name
  writeBytes(dir_ + "/ckpt-000000000020.mrc.bak", {1, 2, 3});
  Result<std::vector<std::uint64_t>> steps = validCheckpointSteps(dir_, key_);
  ASSERT_TRUE(steps.isOk());
  EXPECT_EQ(*steps, std::vector<std::uint64_t>{10});
  Result<Checkpoint> c = loadLatestCheckpoint(dir_, key_);
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  EXPECT_EQ(c->step, 10u);
  ASSERT_TRUE(writeCheckpoint(dir_, key_, 30, sampleSections(), 1).isOk());  // pruning leaves them alone too
  EXPECT_TRUE(fs::exists(dir_ + "/ckpt-20.mrc"));
  EXPECT_FALSE(fs::exists(checkpointPath(dir_, 10)));
}

TEST_F(CheckpointTest, MissingDirectory) {
  Result<std::vector<std::uint64_t>> steps = validCheckpointSteps(dir_, key_);
  ASSERT_TRUE(steps.isOk());
  EXPECT_TRUE(steps->empty());
  Result<Checkpoint> c = loadLatestCheckpoint(dir_, key_);
  ASSERT_FALSE(c.isOk());
  EXPECT_EQ(c.status().message(), "no valid checkpoint in " + dir_ + " (the directory does not exist)");
}

TEST_F(CheckpointTest, PathUnderAFileGivesAClearError) {
  // A path under a regular file fails with ENOTDIR, even for root.
  fs::create_directories(dir_);
  writeBytes(dir_ + "/file", {1});
  Status st = writeCheckpoint(dir_ + "/file/ckpts", key_, 1, sampleSections());
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find(dir_ + "/file/ckpts"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("Not a directory"), std::string::npos) << st.message();
  Result<std::vector<std::uint64_t>> steps = validCheckpointSteps(dir_ + "/file", key_);
  ASSERT_FALSE(steps.isOk());
  EXPECT_NE(steps.status().message().find("cannot list checkpoint directory"), std::string::npos);
}

TEST_F(CheckpointTest, ReadOnlyDirectoryGivesAClearErrorAndNoFile) {
  if (::geteuid() == 0) GTEST_SKIP() << "running as root, which may write to a read-only directory";
  fs::create_directories(dir_);
  writeBytes(dir_ + "/file", {1});
  fs::permissions(dir_, fs::perms::owner_read | fs::perms::owner_exec);
  Status st = writeCheckpoint(dir_, key_, 1, sampleSections());
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("cannot create " + dir_ + "/.ckpt-000000000001.mrc.tmp-"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("Permission denied"), std::string::npos) << st.message();
  EXPECT_EQ(filesIn(dir_), std::vector<std::string>{"file"});
}

TEST_F(CheckpointTest, BadArgumentsAreRefused) {
  auto refused = [&](const std::vector<CheckpointSection>& sections, int keep, const std::string& fragment) {
    Status st = writeCheckpoint(dir_, key_, 1, sections, keep);
    ASSERT_FALSE(st.isOk()) << fragment;
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find(fragment), std::string::npos) << st.message();
  };
  refused(sampleSections(), 0, "keep is 0");
  EXPECT_EQ(writeCheckpoint("", key_, 1, sampleSections()).message(), "checkpoint: the directory name is empty");
  refused({{"", {}}}, 2, "is 0 bytes, expected 1..255");
  refused({{std::string(256, 'n'), {}}}, 2, "is 256 bytes");
  refused({{"a", {}}, {"a", {1}}}, 2, "two sections are named 'a'");
  refused(std::vector<CheckpointSection>(4097, CheckpointSection{"x", {}}), 2, "4097 sections");
  EXPECT_FALSE(fs::exists(checkpointPath(dir_, 1)));

  std::vector<CheckpointSection> most;
  for (int i = 0; i < 4096; ++i) most.push_back({std::to_string(i), {static_cast<std::uint8_t>(i)}});
  most.push_back({std::string(255, 'n'), {}});
  most.erase(most.begin());
  ASSERT_TRUE(writeCheckpoint(dir_, key_, 1, most).isOk());
  Result<Checkpoint> c = readCheckpoint(checkpointPath(dir_, 1), key_);
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  EXPECT_EQ(c->sections.size(), 4096u);
  EXPECT_NE(c->find(std::string(255, 'n')), nullptr);
}

}  // namespace
}  // namespace meridian::trainer

namespace meridian::trainer {
namespace {

TEST_F(CheckpointTest, TheKeyFileIsMadeOnceOwnerOnlyAndALinkOrLooseModeIsRefused) {
  auto first = checkpointKeyFile(dir_);
  ASSERT_TRUE(first.isOk()) << first.status().toString();
  EXPECT_EQ(first->size(), 64u);
  struct stat st{};
  ASSERT_EQ(::stat((dir_ + "/checkpoint.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto again = checkpointKeyFile(dir_);
  ASSERT_TRUE(again.isOk());
  EXPECT_EQ(again.value(), first.value()) << "the next launch signs with the same key";
  ASSERT_EQ(::chmod((dir_ + "/checkpoint.key").c_str(), 0644), 0);
  EXPECT_FALSE(checkpointKeyFile(dir_).isOk()) << "a key others can read is refused";
  const std::string other = root() + "/other";
  fs::create_directories(other);
  std::ofstream(other + "/target") << std::string(64, 'a');
  ::chmod((other + "/target").c_str(), 0600);
  ASSERT_EQ(::symlink((other + "/target").c_str(), (other + "/checkpoint.key").c_str()), 0);
  auto linked = checkpointKeyFile(other);
  EXPECT_FALSE(linked.isOk()) << "a planted link is not followed";
}

}  // namespace
}  // namespace meridian::trainer
