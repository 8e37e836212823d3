#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "client/cli/quantities.h"

namespace longhaul::cli {
namespace {

using ::testing::HasSubstr;

constexpr RateRange kAnyRate{.min_bits_per_second = 1,
                             .max_bits_per_second = 1'000'000'000'000'000};
constexpr SizeRange kAnySize{.min_bytes = 1, .max_bytes = uint64_t{1} << 60};

TEST(ParseRateTest, BitSuffixesCountBits) {
  EXPECT_EQ(*ParseRate("10Gbit", "RATE", kAnyRate), 10'000'000'000u);
  EXPECT_EQ(*ParseRate("1Gbps", "RATE", kAnyRate), 1'000'000'000u);
  EXPECT_EQ(*ParseRate("100Mbit", "RATE", kAnyRate), 100'000'000u);
  EXPECT_EQ(*ParseRate("100Mbps", "RATE", kAnyRate), 100'000'000u);
  EXPECT_EQ(*ParseRate("2.5Gbit/s", "RATE", kAnyRate), 2'500'000'000u);
  EXPECT_EQ(*ParseRate("500kbit", "RATE", kAnyRate), 500'000u);
}

TEST(ParseRateTest, OtherUnitsCountBytes) {
  EXPECT_EQ(*ParseRate("100M", "RATE", kAnyRate), 800'000'000u);
  EXPECT_EQ(*ParseRate("100MB/s", "RATE", kAnyRate), 800'000'000u);
  EXPECT_EQ(*ParseRate("100MBps", "RATE", kAnyRate), 800'000'000u);
  EXPECT_EQ(*ParseRate("50MiB/s", "RATE", kAnyRate), 50u * 1048576 * 8);
  EXPECT_EQ(*ParseRate("1G", "RATE", kAnyRate), 8'000'000'000u);
  EXPECT_EQ(*ParseRate("1TB/s", "RATE", kAnyRate), 8'000'000'000'000u);
}

TEST(ParseRateTest, BareNumberIsRefusedWithAHint) {
  auto r = ParseRate("100", "RATE", kAnyRate);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("write 100Mbit (bits) or 100MB/s (bytes)"));
}

TEST(ParseRateTest, LowerCaseBIsAmbiguous) {
  auto r = ParseRate("100Mb", "RATE", kAnyRate);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("100Mbit for bits or 100MB/s for bytes"));
}

TEST(ParseRateTest, UnknownUnitAndNonNumberAreRefused) {
  EXPECT_FALSE(ParseRate("100Xbit", "RATE", kAnyRate).ok());
  EXPECT_FALSE(ParseRate("fast", "RATE", kAnyRate).ok());
  EXPECT_FALSE(ParseRate("", "RATE", kAnyRate).ok());
  EXPECT_FALSE(ParseRate("1.2.3M", "RATE", kAnyRate).ok());
}

TEST(ParseRateTest, OutOfRangeStatesTheRangeInMbitPerSecond) {
  const RateRange range{.min_bits_per_second = 64'000, .max_bits_per_second = 10'000'000'000'000};
  auto low = ParseRate("10kbit", "RATE", range);
  ASSERT_FALSE(low.ok());
  EXPECT_EQ(low.status().message(),
            "RATE '10kbit' is 0.01 Mbit/s; accepted: 0.064 to 10000000 Mbit/s");
  auto high = ParseRate("2TB/s", "RATE", range);
  ASSERT_FALSE(high.ok());
  EXPECT_THAT(high.status().message(), HasSubstr("accepted: 0.064 to 10000000 Mbit/s"));
  EXPECT_TRUE(ParseRate("64kbit", "RATE", range).ok());
}

TEST(ParseSizeTest, DecimalAndBinaryPrefixes) {
  EXPECT_EQ(*ParseSize("100M", "--chunk-size", kAnySize), 100'000'000u);
  EXPECT_EQ(*ParseSize("1G", "--chunk-size", kAnySize), 1'000'000'000u);
  EXPECT_EQ(*ParseSize("1TB", "--chunk-size", kAnySize), 1'000'000'000'000u);
  EXPECT_EQ(*ParseSize("16MiB", "--chunk-size", kAnySize), 16u << 20);
  EXPECT_EQ(*ParseSize("64Ki", "--chunk-size", kAnySize), 64u << 10);
  EXPECT_EQ(*ParseSize("4096B", "--chunk-size", kAnySize), 4096u);
}

TEST(ParseSizeTest, BareNumberAndBitsAreRefusedWithAHint) {
  auto bare = ParseSize("4096", "--chunk-size", kAnySize);
  ASSERT_FALSE(bare.ok());
  EXPECT_THAT(bare.status().message(), HasSubstr("write 4096B for bytes, or 16MiB"));
  auto bits = ParseSize("16Mbit", "--chunk-size", kAnySize);
  ASSERT_FALSE(bits.ok());
  EXPECT_THAT(bits.status().message(), HasSubstr("a size counts bytes"));
  EXPECT_FALSE(ParseSize("16Mb", "--chunk-size", kAnySize).ok());
}

TEST(ParseSizeTest, OutOfRangeStatesTheRangeInKiB) {
  auto small = ParseSize("4KiB", "--chunk-size", {.min_bytes = 64 << 10, .max_bytes = 1 << 30});
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().message(), "--chunk-size '4KiB' is 4 KiB; accepted: 64 to 1048576 KiB");
}

TEST(ParseAgeTest, SecondsMinutesHoursDays) {
  EXPECT_EQ(*ParseAge("30m", "--since"), absl::Minutes(30));
  EXPECT_EQ(*ParseAge("12h", "--since"), absl::Hours(12));
  EXPECT_EQ(*ParseAge("7d", "--since"), absl::Hours(7 * 24));
  EXPECT_EQ(*ParseAge("90s", "--since"), absl::Seconds(90));
  auto bare = ParseAge("7", "--since");
  ASSERT_FALSE(bare.ok());
  EXPECT_THAT(bare.status().message(), HasSubstr("needs a unit s, m, h or d"));
  EXPECT_FALSE(ParseAge("1w", "--since").ok());
}

}  // namespace
}  // namespace longhaul::cli
