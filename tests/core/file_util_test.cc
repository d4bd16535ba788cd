// writeFileAtomically: the whole new content or the old file, never a partial one, no
// temporary left behind either way, and never a write through a planted link; the private
// directory: made 0700, and refused when someone else could plant files in it.
#include "core/file_util.h"

#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include <fmt/format.h>

namespace meridian {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::size_t filesIn(const std::string& dir) {
  return static_cast<std::size_t>(std::distance(std::filesystem::directory_iterator(dir), {}));
}

TEST(FileUtilTest, ReplacesTheWholeFileAndLeavesNoTemporary) {
  const std::string dir = ::testing::TempDir() + "/file-util";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/state";
  const std::string binary("a\0b\nc", 5);
  ASSERT_TRUE(writeFileAtomically(path, binary).isOk());
  EXPECT_EQ(slurp(path), binary) << "bytes as given, NULs included";
  ASSERT_TRUE(writeFileAtomically(path, "second").isOk());
  EXPECT_EQ(slurp(path), "second");
  EXPECT_EQ(filesIn(dir), 1u);
}

TEST(FileUtilTest, AFailedWriteKeepsTheOldFileAndSaysWhere) {
  const std::string dir = ::testing::TempDir() + "/file-util-fail";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/target-is-a-directory/inside");
  // The rename cannot replace a non-empty directory: the old content stays and the
  // temporary goes.
  Status st = writeFileAtomically(dir + "/target-is-a-directory", "x");
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("cannot rename"), std::string::npos) << st.toString();
  EXPECT_TRUE(std::filesystem::is_directory(dir + "/target-is-a-directory"));
  EXPECT_EQ(filesIn(dir), 1u) << "the temporary was removed";
  st = writeFileAtomically(dir + "/no-such-dir/file", "x");
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("cannot create " + dir + "/no-such-dir/file.tmp."), std::string::npos) << st.toString();
}

// A fresh, empty directory for one test.
std::string freshDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

mode_t modeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

// Regression (issue 26): the temporary was <path>.tmp.<pid>, opened with O_TRUNC and no
// O_EXCL, so a symlink planted at that name made the writer (root) overwrite the link's target.
TEST(FileUtilTest, APlantedSymlinkIsNeverWrittenThrough) {
  const std::string dir = freshDir("file-util-planted");
  const std::string victim = dir + "/victim";
  { std::ofstream(victim) << "precious"; }
  const std::string path = dir + "/targets.json";
  std::filesystem::create_symlink(victim, path + ".tmp." + std::to_string(::getpid()));  // the old name
  ASSERT_TRUE(writeFileAtomically(path, "new").isOk());
  EXPECT_EQ(slurp(victim), "precious");
  EXPECT_EQ(slurp(path), "new");
  EXPECT_FALSE(std::filesystem::is_symlink(path));
  // A link at the target itself is replaced, not followed.
  const std::string linked = dir + "/linked.json";
  std::filesystem::create_symlink(victim, linked);
  ASSERT_TRUE(writeFileAtomically(linked, "replaced").isOk());
  EXPECT_EQ(slurp(victim), "precious");
  EXPECT_FALSE(std::filesystem::is_symlink(linked));
  EXPECT_EQ(slurp(linked), "replaced");
}

TEST(FileUtilTest, TemporaryNamesDifferFromWriteToWrite) {
  // The name cannot be known in advance: two writes from one process use two names, which
  // a failed rename shows (it names the temporary it removed).
  const std::string dir = freshDir("file-util-names");
  std::filesystem::create_directories(dir + "/busy/inside");
  const Status first = writeFileAtomically(dir + "/busy", "x");
  const Status second = writeFileAtomically(dir + "/busy", "x");
  ASSERT_FALSE(first.isOk());
  ASSERT_FALSE(second.isOk());
  EXPECT_NE(first.message(), second.message());
}

TEST(FileUtilTest, ADurableWriteLandsWithTheModeAsked) {
  const std::string dir = freshDir("file-util-durable");
  const std::string path = dir + "/checkpoint";
  ASSERT_TRUE(writeFileAtomically(path, "data", {.durable = true, .mode = 0600}).isOk());
  EXPECT_EQ(slurp(path), "data");
  EXPECT_EQ(modeOf(path), 0600u);
  EXPECT_EQ(filesIn(dir), 1u);
}

TEST(PrivateDirectoryTest, IsMadeOwnerOnly) {
  const std::string dir = freshDir("private-made") + "/a/b";
  ASSERT_TRUE(ensurePrivateDirectory(dir).isOk());
  EXPECT_EQ(modeOf(dir), 0700u);
  EXPECT_TRUE(ensurePrivateDirectory(dir).isOk()) << "an existing one is fine";
}

TEST(PrivateDirectoryTest, OneOthersCouldWriteOrALinkIsRefused) {
  const std::string base = freshDir("private-refused");
  const std::string open = base + "/open";
  std::filesystem::create_directories(open);
  ASSERT_EQ(::chmod(open.c_str(), 0777), 0);
  Status st = ensurePrivateDirectory(open);
  ASSERT_FALSE(st.isOk());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("refusing directory " + open + ": its mode 0777"), std::string::npos) << st.message();
  EXPECT_FALSE(ensurePrivateDirectory(open, 022).isOk()) << "others may write";
  ASSERT_EQ(::chmod(open.c_str(), 0755), 0);
  EXPECT_FALSE(ensurePrivateDirectory(open).isOk()) << "private means 0700";
  EXPECT_TRUE(ensurePrivateDirectory(open, 022).isOk()) << "others may read, not write";

  const std::string mine = base + "/mine";
  ASSERT_TRUE(ensurePrivateDirectory(mine).isOk());
  const std::string link = base + "/link";
  std::filesystem::create_directory_symlink(mine, link);
  st = ensurePrivateDirectory(link);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("symlink"), std::string::npos) << st.message();
}

TEST(PrivateDirectoryTest, OneOwnedBySomeoneElseIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a directory to another user";
  const std::string theirs = freshDir("private-theirs") + "/theirs";
  ASSERT_EQ(::mkdir(theirs.c_str(), 0700), 0);
  ASSERT_EQ(::chown(theirs.c_str(), 65534, 65534), 0);
  Status st = ensurePrivateDirectory(theirs);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("owned by uid 65534"), std::string::npos) << st.message();
}

TEST(PrivateDirectoryTest, RuntimeDirWhenItIsOursElseAPerUserOneInTmp) {
  const std::string base = freshDir("private-roots");
  const std::string runtime = base + "/run";
  ASSERT_EQ(::mkdir(runtime.c_str(), 0700), 0);
  const std::string tmp = base + "/tmp";
  ASSERT_EQ(::mkdir(tmp.c_str(), 01777), 0);
  ASSERT_EQ(::chmod(tmp.c_str(), 01777), 0);

  auto dir = privateRuntimeDir({runtime, "", tmp});
  ASSERT_TRUE(dir.isOk()) << dir.status().toString();
  EXPECT_EQ(dir.value(), runtime + "/meridian");
  EXPECT_EQ(modeOf(dir.value()), 0700u);

  ASSERT_EQ(::chmod(runtime.c_str(), 0755), 0);  // not a runtime directory of ours: skipped
  dir = privateRuntimeDir({runtime, base + "/missing", tmp});
  ASSERT_TRUE(dir.isOk()) << dir.status().toString();
  EXPECT_EQ(dir.value(), fmt::format("{}/meridian-{}", tmp, ::geteuid()));
  EXPECT_EQ(modeOf(dir.value()), 0700u);

  // Someone made the per-user name first, open to all: refused, not used.
  std::filesystem::remove_all(dir.value());
  ASSERT_EQ(::mkdir(dir.value().c_str(), 0777), 0);
  ASSERT_EQ(::chmod(dir.value().c_str(), 0777), 0);
  auto refused = privateRuntimeDir({"", "", tmp});
  ASSERT_FALSE(refused.isOk());
  EXPECT_NE(refused.status().message().find("refusing directory " + dir.value()), std::string::npos)
      << refused.status().message();
  // ...or planted as a link to a directory of theirs.
  std::filesystem::remove_all(dir.value());
  std::filesystem::create_directory_symlink(runtime, dir.value());
  EXPECT_FALSE(privateRuntimeDir({"", "", tmp}).isOk());
}

}  // namespace
}  // namespace meridian
