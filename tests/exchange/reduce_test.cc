#include "daemon/exchange/reduce.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace longhaul::exchange {
namespace {

TEST(ReduceTest, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(BFloat16ToFloat(0x3f80), 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even 1.0.
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  EXPECT_EQ(FloatToBFloat16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::nanf("")))));
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(-INFINITY)), -INFINITY);
}

TEST(ReduceTest, HalfConvertsEveryValueBothWays) {
  // Every finite half survives float -> half unchanged.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;  // inf / NaN
    float f = HalfToFloat(static_cast<uint16_t>(h));
    ASSERT_EQ(FloatToHalf(f), h) << std::hex << h;
  }
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);                // rounds up to inf
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::nanf("")))));
}

TEST(ReduceTest, SumAndAverageInOrder) {
  std::vector<float> a = {1.5f, -2.0f, 1e-8f}, b = {0.25f, 4.0f, 1.0f};
  std::vector<float> acc(3);
  Accumulate(v1::FLOAT32, false, {reinterpret_cast<const uint8_t*>(a.data()), 12}, true,
             absl::MakeSpan(acc));
  Accumulate(v1::FLOAT32, false, {reinterpret_cast<const uint8_t*>(b.data()), 12}, false,
             absl::MakeSpan(acc));
  std::vector<float> out(3);
  Finish(v1::FLOAT32, v1::AVG, 2, acc, {reinterpret_cast<uint8_t*>(out.data()), 12});
  EXPECT_EQ(out[0], (1.5f + 0.25f) / 2);
  EXPECT_EQ(out[1], (-2.0f + 4.0f) / 2);
  EXPECT_EQ(out[2], (1e-8f + 1.0f) / 2);
}

TEST(ReduceTest, QuantizationErrorIsWithinHalfAStepPerBlock) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0, 3);
  const size_t count = 1000;  // 3 full blocks and a short one
  std::vector<float> data(count);
  for (float& v : data) v = dist(rng);
  std::vector<uint8_t> q(QuantizedSize(count));
  Quantize(v1::FLOAT32, {reinterpret_cast<const uint8_t*>(data.data()), count * 4}, count,
           absl::MakeSpan(q));
  std::vector<float> decoded(count);
  Accumulate(v1::FLOAT32, true, q, true, absl::MakeSpan(decoded));
  for (size_t begin = 0; begin < count; begin += kQuantBlock) {
    size_t end = std::min(count, begin + kQuantBlock);
    float lo = data[begin], hi = data[begin];
    for (size_t i = begin; i < end; ++i) lo = std::min(lo, data[i]), hi = std::max(hi, data[i]);
    float half_step = (hi - lo) / 255 / 2;
    for (size_t i = begin; i < end; ++i) {
      ASSERT_NEAR(decoded[i], data[i], half_step * 1.01f + 1e-6f) << i;
    }
  }
}

TEST(ReduceTest, QuantizedConstantBlockIsExact) {
  std::vector<float> data(300, 2.5f);
  std::vector<uint8_t> q(QuantizedSize(data.size()));
  Quantize(v1::FLOAT32, {reinterpret_cast<const uint8_t*>(data.data()), data.size() * 4},
           data.size(), absl::MakeSpan(q));
  std::vector<float> decoded(data.size());
  Accumulate(v1::FLOAT32, true, q, true, absl::MakeSpan(decoded));
  for (float v : decoded) ASSERT_EQ(v, 2.5f);
}

}  // namespace
}  // namespace longhaul::exchange
