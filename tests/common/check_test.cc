#include "common/check.h"

#include <string>

#include "gtest/gtest.h"

namespace longhaul {
namespace {

TEST(CheckTest, HoldingConditionDoesNotEvaluateTheMessage) {
  int evaluated = 0;
  auto count = [&] { return ++evaluated; };
  LONGHAUL_CHECK(1 + 1 == 2) << count();
  EXPECT_EQ(evaluated, 0);
}

TEST(CheckTest, ConditionIsEvaluatedOnce) {
  int calls = 0;
  LONGHAUL_CHECK(++calls == 1) << "evaluated twice";
  EXPECT_EQ(calls, 1);
}

TEST(CheckDeathTest, FailedConditionAbortsWithPlaceConditionAndMessage) {
  const std::string what = "the invariant";
  EXPECT_DEATH(LONGHAUL_CHECK(what.empty()) << "broke " << what << " #" << 7,
               "check_test.cc:[0-9]+: check failed: what.empty\\(\\): broke the invariant #7");
}

TEST(CheckDeathTest, FailedConditionWithoutMessage) {
  EXPECT_DEATH(LONGHAUL_CHECK(sizeof(int) == 0), "check failed: sizeof\\(int\\) == 0");
}

}  // namespace
}  // namespace longhaul
