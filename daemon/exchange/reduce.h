#ifndef LONGHAUL_DAEMON_EXCHANGE_REDUCE_H_
#define LONGHAUL_DAEMON_EXCHANGE_REDUCE_H_

// The arithmetic of an all-reduce: element conversions, the deterministic
// reduction and the opt-in int8 min-max block quantization. Pure functions,
// no threads, no allocation except where a vector is returned.
//
// Bit-identical results at every site come from doing exactly the same
// float32 operations in exactly the same order everywhere: each site
// accumulates every member's contribution in the group's sorted site order,
// starting from the first member's value, then divides (avg) and rounds to
// the buffer's dtype with round-to-nearest-even. No site uses its own input
// differently from a peer's: with quantization a site reduces the decoded
// form of its own quantized buffer, as the peers do.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "longhaul/v1/exchange.pb.h"

namespace longhaul::exchange {

// Bytes per element; 0 for an unknown dtype.
size_t ElementSize(v1::ExchangeDType dtype);

float BFloat16ToFloat(uint16_t bits);
uint16_t FloatToBFloat16(float value);  // round to nearest even; NaN stays NaN
float HalfToFloat(uint16_t bits);
uint16_t FloatToHalf(float value);  // IEEE binary16, round to nearest even

// int8 min-max quantization: blocks of kQuantBlock elements, each stored as
// float32 min, float32 step, then one uint8 code per element, so that an
// element decodes to min + code * step. Non-finite inputs make their block
// decode to NaN.
inline constexpr size_t kQuantBlock = 256;
size_t QuantizedSize(size_t count);
// `data` holds `count` elements of `dtype`; `out` must be QuantizedSize(count) bytes.
void Quantize(v1::ExchangeDType dtype, absl::Span<const uint8_t> data, size_t count,
              absl::Span<uint8_t> out);

// Adds one contribution into `acc` (count floats). `first` assigns instead
// of adding, so a sum of n inputs makes exactly n - 1 additions.
// `contribution` is `count` elements of `dtype`, or, when `quantized`,
// QuantizedSize(count) bytes from Quantize. Sizes are the caller's to check
// (see ContributionSize).
void Accumulate(v1::ExchangeDType dtype, bool quantized, absl::Span<const uint8_t> contribution,
                bool first, absl::Span<float> acc);
// As Accumulate (not quantized, not first) for a contribution that comes
// *before* the one already in `acc`: acc[i] = contribution[i] + acc[i], the
// same float operation, operands in the same order, as accumulating
// `contribution` first and acc's values second.
void AccumulateBefore(v1::ExchangeDType dtype, absl::Span<const uint8_t> contribution,
                      absl::Span<float> acc);
size_t ContributionSize(v1::ExchangeDType dtype, bool quantized, size_t count);

// Writes acc (divided by `members` for AVG) into `out` as `dtype`.
void Finish(v1::ExchangeDType dtype, v1::ReduceOp op, size_t members, absl::Span<const float> acc,
            absl::Span<uint8_t> out);

}  // namespace longhaul::exchange

#endif  // LONGHAUL_DAEMON_EXCHANGE_REDUCE_H_
