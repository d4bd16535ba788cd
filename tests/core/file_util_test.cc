// writeFileAtomically: the whole new content or the old file, never a partial one, and no
// temporary left behind either way.
#include "core/file_util.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

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
  EXPECT_NE(st.message().find("cannot write"), std::string::npos) << st.toString();
}

}  // namespace
}  // namespace meridian
