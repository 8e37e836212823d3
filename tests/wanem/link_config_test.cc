#include "tests/wanem/link_config.h"

#include "gtest/gtest.h"

namespace longhaul::wanem {
namespace {

TEST(LinkConfigTest, ParsesRates) {
  EXPECT_EQ(*ParseRate("1Gbit"), 1'000'000'000);
  EXPECT_EQ(*ParseRate("500mbit"), 500'000'000);
  EXPECT_EQ(*ParseRate("2.5Mbit"), 2'500'000);
  EXPECT_EQ(*ParseRate("64kbit"), 64'000);
  EXPECT_EQ(*ParseRate("0"), 0);
  EXPECT_FALSE(ParseRate("fast").ok());
  EXPECT_FALSE(ParseRate("1GB").ok());
}

TEST(LinkConfigTest, ParsesSizesAndLoss) {
  EXPECT_EQ(*ParseBytes("5MB"), 5'000'000);
  EXPECT_EQ(*ParseBytes("4MiB"), 4 * 1024 * 1024);
  EXPECT_EQ(*ParseBytes("1500"), 1500);
  EXPECT_DOUBLE_EQ(*ParseLoss("1%"), 0.01);
  EXPECT_DOUBLE_EQ(*ParseLoss("0.001"), 0.001);
  EXPECT_FALSE(ParseLoss("150%").ok());
  EXPECT_FALSE(ParseLoss("-1").ok());
}

TEST(LinkConfigTest, BdpQueueIsOneRoundTripAtTheRate) {
  DirectionSpec spec;
  ASSERT_TRUE(ApplyOverrides("rate=1Gbit,delay=20ms,queue=bdp,loss=1%", spec).ok());
  absl::StatusOr<DirectionParams> p = Resolve(spec);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->rate_bps, 1'000'000'000);
  EXPECT_EQ(p->delay, absl::Milliseconds(20));
  EXPECT_DOUBLE_EQ(p->loss, 0.01);
  EXPECT_EQ(p->queue_bytes, 5'000'000);  // 1 Gbit/s x 40 ms.
}

TEST(LinkConfigTest, RejectsUnknownKeysWithAUsefulMessage) {
  DirectionSpec spec;
  absl::Status s = ApplyOverrides("bandwidth=1Gbit", spec);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("bandwidth"), std::string::npos);
}

}  // namespace
}  // namespace longhaul::wanem
