#include "daemon/exchange/reduce.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace longhaul::exchange {
namespace {

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t Load16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

float LoadElement(v1::ExchangeDType dtype, const uint8_t* p) {
  switch (dtype) {
    case v1::BFLOAT16:
      return BFloat16ToFloat(Load16(p));
    case v1::FLOAT16:
      return HalfToFloat(Load16(p));
    default: {
      float f;
      std::memcpy(&f, p, sizeof f);
      return f;
    }
  }
}

}  // namespace

size_t ElementSize(v1::ExchangeDType dtype) {
  switch (dtype) {
    case v1::FLOAT32:
      return 4;
    case v1::BFLOAT16:
    case v1::FLOAT16:
      return 2;
    default:
      return 0;
  }
}

float BFloat16ToFloat(uint16_t bits) { return BitsFloat(static_cast<uint32_t>(bits) << 16); }

uint16_t FloatToBFloat16(float value) {
  uint32_t u = FloatBits(value);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN, sign kept
  }
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return BitsFloat(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp == 0) {
    if (mant == 0) return BitsFloat(sign);
    // Subnormal: mant * 2^-24, exact in float32.
    float f = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -f : f;
  }
  return BitsFloat(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t FloatToHalf(float value) {
  uint32_t u = FloatBits(value);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    return sign | (abs > 0x7f800000u ? 0x7e00u : 0x7c00u);
  }
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): value / 2^-24, rounded to nearest even.
    // The scaling is exact and the conversion uses the default RNE mode.
    float scaled = BitsFloat(abs) * 16777216.0f;  // * 2^24
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  // Normal: rebias the exponent and round 13 mantissa bits away, RNE.
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
}

size_t QuantizedSize(size_t count) {
  size_t blocks = (count + kQuantBlock - 1) / kQuantBlock;
  return blocks * 2 * sizeof(float) + count;
}

void Quantize(v1::ExchangeDType dtype, absl::Span<const uint8_t> data, size_t count,
              absl::Span<uint8_t> out) {
  const size_t es = ElementSize(dtype);
  uint8_t* w = out.data();
  float values[kQuantBlock];
  for (size_t begin = 0; begin < count; begin += kQuantBlock) {
    const size_t n = std::min(kQuantBlock, count - begin);
    bool finite = true;
    for (size_t i = 0; i < n; ++i) {
      values[i] = LoadElement(dtype, data.data() + (begin + i) * es);
      finite = finite && std::isfinite(values[i]);
    }
    float lo = *std::min_element(values, values + n);
    float hi = *std::max_element(values, values + n);
    float step = (hi - lo) / 255.0f;
    if (!finite) lo = step = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(w, &lo, sizeof lo);
    std::memcpy(w + sizeof lo, &step, sizeof step);
    w += 2 * sizeof(float);
    for (size_t i = 0; i < n; ++i) {
      float code = step > 0 ? std::nearbyint((values[i] - lo) / step) : 0.0f;
      w[i] = static_cast<uint8_t>(std::clamp(code, 0.0f, 255.0f));
    }
    w += n;
  }
}

size_t ContributionSize(v1::ExchangeDType dtype, bool quantized, size_t count) {
  return quantized ? QuantizedSize(count) : count * ElementSize(dtype);
}

void Accumulate(v1::ExchangeDType dtype, bool quantized, absl::Span<const uint8_t> contribution,
                bool first, absl::Span<float> acc) {
  const size_t count = acc.size();
  if (quantized) {
    const uint8_t* r = contribution.data();
    for (size_t begin = 0; begin < count; begin += kQuantBlock) {
      const size_t n = std::min(kQuantBlock, count - begin);
      float lo, step;
      std::memcpy(&lo, r, sizeof lo);
      std::memcpy(&step, r + sizeof lo, sizeof step);
      r += 2 * sizeof(float);
      for (size_t i = 0; i < n; ++i) {
        float v = lo + static_cast<float>(r[i]) * step;
        acc[begin + i] = first ? v : acc[begin + i] + v;
      }
      r += n;
    }
    return;
  }
  const uint8_t* p = contribution.data();
  switch (dtype) {
    case v1::FLOAT32:
      for (size_t i = 0; i < count; ++i) {
        float v;
        std::memcpy(&v, p + 4 * i, sizeof v);
        acc[i] = first ? v : acc[i] + v;
      }
      break;
    case v1::BFLOAT16:
      for (size_t i = 0; i < count; ++i) {
        float v = BFloat16ToFloat(Load16(p + 2 * i));
        acc[i] = first ? v : acc[i] + v;
      }
      break;
    default:
      for (size_t i = 0; i < count; ++i) {
        float v = HalfToFloat(Load16(p + 2 * i));
        acc[i] = first ? v : acc[i] + v;
      }
      break;
  }
}

void AccumulateBefore(v1::ExchangeDType dtype, absl::Span<const uint8_t> contribution,
                      absl::Span<float> acc) {
  const size_t es = ElementSize(dtype);
  for (size_t i = 0; i < acc.size(); ++i) {
    acc[i] = LoadElement(dtype, contribution.data() + es * i) + acc[i];
  }
}

void Finish(v1::ExchangeDType dtype, v1::ReduceOp op, size_t members, absl::Span<const float> acc,
            absl::Span<uint8_t> out) {
  const float divisor = static_cast<float>(members);
  const bool avg = op == v1::AVG;
  uint8_t* w = out.data();
  for (size_t i = 0; i < acc.size(); ++i) {
    float v = avg ? acc[i] / divisor : acc[i];
    switch (dtype) {
      case v1::FLOAT32:
        std::memcpy(w + 4 * i, &v, sizeof v);
        break;
      case v1::BFLOAT16: {
        uint16_t b = FloatToBFloat16(v);
        std::memcpy(w + 2 * i, &b, sizeof b);
        break;
      }
      default: {
        uint16_t h = FloatToHalf(v);
        std::memcpy(w + 2 * i, &h, sizeof h);
        break;
      }
    }
  }
}

}  // namespace longhaul::exchange
