// Injected randomness for congestion control and simulation.
//
// Controllers take a `Random&` so tests and the simulator can seed them and replay a run exactly.
// Production code passes a SplitMix64Random seeded from the OS by the caller (not by this library).
#ifndef LONGHAUL_CONGESTION_RANDOM_H_
#define LONGHAUL_CONGESTION_RANDOM_H_

#include <cstdint>

namespace longhaul::congestion {

// A source of uniformly distributed 64-bit values. Not thread-safe; each user owns its instance or
// serialises access.
class Random {
 public:
  virtual ~Random() = default;
  virtual uint64_t NextUint64() = 0;

  // Uniform in [0, 1).
  double NextDouble() { return static_cast<double>(NextUint64() >> 11) * 0x1.0p-53; }
  // Uniform integer in [lo, hi] (inclusive). Requires lo <= hi.
  uint64_t UniformInt(uint64_t lo, uint64_t hi) {
    const uint64_t span = hi - lo + 1;
    return span == 0 ? NextUint64() : lo + NextUint64() % span;
  }
};

// SplitMix64: small, fast and fully determined by its seed. Not cryptographic.
// Not thread-safe.
class SplitMix64Random final : public Random {
 public:
  explicit SplitMix64Random(uint64_t seed) : state_(seed) {}
  uint64_t NextUint64() override {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

 private:
  uint64_t state_;
};

}  // namespace longhaul::congestion

#endif  // LONGHAUL_CONGESTION_RANDOM_H_
