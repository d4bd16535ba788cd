// Status/Result, errnoText, idx and the MERIDIAN_CHECK macros.
#include <gtest/gtest.h>

#include <cerrno>

#include "core/check.h"
#include "core/index.h"
#include "core/status.h"

namespace meridian {
namespace {

TEST(StatusTest, OkByDefaultAndCarriesCodeAndMessage) {
  Status ok;
  EXPECT_TRUE(ok.isOk());
  Status st = pathError("path {} down", 2);
  EXPECT_FALSE(st.isOk());
  EXPECT_EQ(st.code(), StatusCode::kPathError);
  EXPECT_EQ(st.toString(), "path error: path 2 down");
  EXPECT_EQ(st.withContext("channel").message(), "channel: path 2 down");
}

Result<int> half(int x) {
  if (x % 2) return invalidArgument("{} is odd", x);
  return x / 2;
}

Status useHalf(int x, int* out) {
  MERIDIAN_ASSIGN_OR_RETURN(*out, half(x));
  return Status::ok();
}

TEST(StatusTest, ResultHoldsValueOrErrorAndPropagates) {
  EXPECT_EQ(half(8).value(), 4);
  EXPECT_EQ(half(3).status().code(), StatusCode::kInvalidArgument);
  int out = 0;
  EXPECT_TRUE(useHalf(10, &out).isOk());
  EXPECT_EQ(out, 5);
  EXPECT_EQ(useHalf(7, &out).code(), StatusCode::kInvalidArgument);
}

TEST(StatusTest, ResultFromOkStatusIsAnInternalError) {
  Result<int> r{Status::ok()};
  EXPECT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

TEST(StatusTest, ErrnoTextNamesTheError) {
  EXPECT_EQ(errnoText(ENOENT), "No such file or directory");
  EXPECT_EQ(errnoText(ECONNREFUSED), "Connection refused");
  EXPECT_FALSE(errnoText(99999).empty()) << "an unknown errno still reads as something";
}

TEST(IndexTest, IdxIsTheIndexOfAnInt) {
  static_assert(idx(7) == std::size_t{7});
  EXPECT_EQ(idx(0), 0u);
}

TEST(CheckTest, PrintsBothValues) {
  int a = 3, b = 4;
  try {
    MERIDIAN_CHECK_EQ(a, b);
    FAIL() << "should have thrown";
  } catch (const CheckError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("a == b"), std::string::npos) << what;
    EXPECT_NE(what.find("(3 vs 4)"), std::string::npos) << what;
    EXPECT_NE(what.find("status_test.cc"), std::string::npos) << what;
  }
  EXPECT_NO_THROW(MERIDIAN_CHECK_LT(a, b));
  EXPECT_THROW(MERIDIAN_CHECK(a > b), CheckError);
}

}  // namespace
}  // namespace meridian
