// Internal to Bbr3's files (bbr3*.cc): helpers they share. Nothing outside
// Bbr3 includes it.
#ifndef LONGHAUL_CONGESTION_BBR3_INTERNAL_H_
#define LONGHAUL_CONGESTION_BBR3_INTERNAL_H_

#include "common/units.h"

namespace longhaul::congestion::bbr3_internal {

// `bytes` x `gain`, rounded down.
inline ByteCount ScaleBytes(ByteCount bytes, double gain) {
  return static_cast<ByteCount>(static_cast<double>(bytes) * gain);
}

}  // namespace longhaul::congestion::bbr3_internal

#endif  // LONGHAUL_CONGESTION_BBR3_INTERNAL_H_
