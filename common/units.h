// Strongly typed units for time, byte counts and bandwidth.
//
// TimeDelta and Timestamp count int64 nanoseconds; Bandwidth counts int64 bits per second; byte
// counts are plain uint64_t (ByteCount). All types are trivially copyable value types and every
// operation is constexpr and allocation-free, so they are safe on hot paths and in any thread.
//
// Conversions that mix units (bandwidth x time -> bytes, bytes / time -> bandwidth) use 128-bit
// intermediates so 100 Gbit/s x 10 s does not overflow, and round toward zero.
#ifndef LONGHAUL_COMMON_UNITS_H_
#define LONGHAUL_COMMON_UNITS_H_

#include <concepts>
#include <cstdint>
#include <limits>
#include <ostream>
#include <string>

namespace longhaul {

// A count of bytes. Unsigned: a negative byte count is a bug.
using ByteCount = uint64_t;

// `bytes` x `gain`, rounded down: a window or a quantum scaled by a gain.
constexpr ByteCount ScaleBytes(ByteCount bytes, double gain) {
  return static_cast<ByteCount>(static_cast<double>(bytes) * gain);
}

// A signed span of time with nanosecond resolution.
class TimeDelta {
 public:
  constexpr TimeDelta() = default;

  static constexpr TimeDelta Zero() { return TimeDelta(0); }
  static constexpr TimeDelta Infinite() { return TimeDelta(std::numeric_limits<int64_t>::max()); }
  static constexpr TimeDelta Nanoseconds(int64_t ns) { return TimeDelta(ns); }
  static constexpr TimeDelta Microseconds(int64_t us) { return TimeDelta(us * 1000); }
  static constexpr TimeDelta Milliseconds(int64_t ms) { return TimeDelta(ms * 1000 * 1000); }
  static constexpr TimeDelta Seconds(int64_t s) { return TimeDelta(s * 1000 * 1000 * 1000); }
  // Rounds toward zero.
  static constexpr TimeDelta SecondsF(double s) { return TimeDelta(static_cast<int64_t>(s * 1e9)); }

  constexpr int64_t ToNanoseconds() const { return ns_; }
  constexpr int64_t ToMicroseconds() const { return ns_ / 1000; }
  constexpr int64_t ToMilliseconds() const { return ns_ / 1000000; }
  constexpr double ToSecondsF() const { return static_cast<double>(ns_) * 1e-9; }
  constexpr double ToMillisecondsF() const { return static_cast<double>(ns_) * 1e-6; }

  constexpr bool IsZero() const { return ns_ == 0; }
  constexpr bool IsInfinite() const { return ns_ == std::numeric_limits<int64_t>::max(); }

  constexpr TimeDelta operator+(TimeDelta o) const { return TimeDelta(ns_ + o.ns_); }
  constexpr TimeDelta operator-(TimeDelta o) const { return TimeDelta(ns_ - o.ns_); }
  constexpr TimeDelta operator-() const { return TimeDelta(-ns_); }
  constexpr TimeDelta& operator+=(TimeDelta o) {
    ns_ += o.ns_;
    return *this;
  }
  constexpr TimeDelta& operator-=(TimeDelta o) {
    ns_ -= o.ns_;
    return *this;
  }
  template <std::integral T>
  constexpr TimeDelta operator*(T k) const {
    return TimeDelta(ns_ * static_cast<int64_t>(k));
  }
  // Scales by a real factor, rounding toward zero.
  constexpr TimeDelta operator*(double k) const {
    return TimeDelta(static_cast<int64_t>(static_cast<double>(ns_) * k));
  }
  template <std::integral T>
  constexpr TimeDelta operator/(T k) const {
    return TimeDelta(ns_ / static_cast<int64_t>(k));
  }
  constexpr double operator/(TimeDelta o) const {
    return static_cast<double>(ns_) / static_cast<double>(o.ns_);
  }

  constexpr auto operator<=>(const TimeDelta&) const = default;

  std::string ToString() const;

 private:
  constexpr explicit TimeDelta(int64_t ns) : ns_(ns) {}
  int64_t ns_ = 0;
};

template <std::integral T>
constexpr TimeDelta operator*(T k, TimeDelta d) {
  return d * k;
}
constexpr TimeDelta operator*(double k, TimeDelta d) { return d * k; }

// A point on a monotonic clock, in nanoseconds since an arbitrary epoch (the clock's start).
// Only differences between Timestamps of the same Clock are meaningful.
class Timestamp {
 public:
  constexpr Timestamp() = default;

  static constexpr Timestamp Zero() { return Timestamp(0); }
  static constexpr Timestamp Infinite() { return Timestamp(std::numeric_limits<int64_t>::max()); }
  static constexpr Timestamp FromNanoseconds(int64_t ns) { return Timestamp(ns); }

  constexpr int64_t ToNanoseconds() const { return ns_; }
  constexpr bool IsInfinite() const { return ns_ == std::numeric_limits<int64_t>::max(); }
  // Time since the clock's epoch.
  constexpr TimeDelta SinceEpoch() const { return TimeDelta::Nanoseconds(ns_); }

  constexpr Timestamp operator+(TimeDelta d) const { return Timestamp(ns_ + d.ToNanoseconds()); }
  constexpr Timestamp operator-(TimeDelta d) const { return Timestamp(ns_ - d.ToNanoseconds()); }
  constexpr TimeDelta operator-(Timestamp o) const { return TimeDelta::Nanoseconds(ns_ - o.ns_); }
  constexpr Timestamp& operator+=(TimeDelta d) {
    ns_ += d.ToNanoseconds();
    return *this;
  }

  constexpr auto operator<=>(const Timestamp&) const = default;

  std::string ToString() const;

 private:
  constexpr explicit Timestamp(int64_t ns) : ns_(ns) {}
  int64_t ns_ = 0;
};

// A data rate in bits per second.
class Bandwidth {
 public:
  constexpr Bandwidth() = default;

  static constexpr Bandwidth Zero() { return Bandwidth(0); }
  static constexpr Bandwidth Infinite() { return Bandwidth(std::numeric_limits<int64_t>::max()); }
  static constexpr Bandwidth BitsPerSecond(int64_t bps) { return Bandwidth(bps); }
  static constexpr Bandwidth KbitsPerSecond(int64_t k) { return Bandwidth(k * 1000); }
  static constexpr Bandwidth MbitsPerSecond(int64_t m) { return Bandwidth(m * 1000 * 1000); }
  static constexpr Bandwidth GbitsPerSecond(int64_t g) { return Bandwidth(g * 1000 * 1000 * 1000); }
  static constexpr Bandwidth BytesPerSecond(int64_t b) { return Bandwidth(b * 8); }
  // bytes delivered over `dt`. Zero if dt <= 0.
  static constexpr Bandwidth FromBytesAndTimeDelta(ByteCount bytes, TimeDelta dt) {
    if (dt.ToNanoseconds() <= 0) return Zero();
    const __int128 bits_ns = static_cast<__int128>(bytes) * 8 * 1000000000;
    return Bandwidth(static_cast<int64_t>(bits_ns / dt.ToNanoseconds()));
  }

  constexpr int64_t ToBitsPerSecond() const { return bps_; }
  constexpr int64_t ToBytesPerSecond() const { return bps_ / 8; }
  constexpr double ToMbitsPerSecondF() const { return static_cast<double>(bps_) * 1e-6; }
  constexpr bool IsZero() const { return bps_ == 0; }
  constexpr bool IsInfinite() const { return bps_ == std::numeric_limits<int64_t>::max(); }

  // Bytes sent at this rate over `dt` (rounded toward zero; 0 for dt <= 0).
  constexpr ByteCount BytesIn(TimeDelta dt) const {
    if (dt.ToNanoseconds() <= 0 || bps_ <= 0) return 0;
    const __int128 bits_ns = static_cast<__int128>(bps_) * dt.ToNanoseconds();
    return static_cast<ByteCount>(bits_ns / (static_cast<__int128>(8) * 1000000000));
  }
  // Time to send `bytes` at this rate. Infinite for a zero rate.
  constexpr TimeDelta TransferTime(ByteCount bytes) const {
    if (bps_ <= 0) return TimeDelta::Infinite();
    const __int128 ns = static_cast<__int128>(bytes) * 8 * 1000000000 / bps_;
    return TimeDelta::Nanoseconds(static_cast<int64_t>(ns));
  }

  constexpr Bandwidth operator+(Bandwidth o) const { return Bandwidth(bps_ + o.bps_); }
  constexpr Bandwidth operator-(Bandwidth o) const { return Bandwidth(bps_ - o.bps_); }
  constexpr Bandwidth operator*(double k) const {
    return Bandwidth(static_cast<int64_t>(static_cast<double>(bps_) * k));
  }
  template <std::integral T>
  constexpr Bandwidth operator/(T k) const {
    return Bandwidth(bps_ / static_cast<int64_t>(k));
  }
  constexpr double operator/(Bandwidth o) const {
    return static_cast<double>(bps_) / static_cast<double>(o.bps_);
  }

  constexpr auto operator<=>(const Bandwidth&) const = default;

  std::string ToString() const;

 private:
  constexpr explicit Bandwidth(int64_t bps) : bps_(bps) {}
  int64_t bps_ = 0;
};

constexpr Bandwidth operator*(double k, Bandwidth b) { return b * k; }
// bw * dt -> bytes.
constexpr ByteCount operator*(Bandwidth b, TimeDelta dt) { return b.BytesIn(dt); }
constexpr ByteCount operator*(TimeDelta dt, Bandwidth b) { return b.BytesIn(dt); }

std::ostream& operator<<(std::ostream& os, TimeDelta d);
std::ostream& operator<<(std::ostream& os, Timestamp t);
std::ostream& operator<<(std::ostream& os, Bandwidth b);

}  // namespace longhaul

#endif  // LONGHAUL_COMMON_UNITS_H_
