#ifndef LONGHAUL_TESTS_WANEM_RELAY_H_
#define LONGHAUL_TESTS_WANEM_RELAY_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "tests/wanem/link_shaper.h"
#include "tests/wanem/packet_ring.h"

namespace longhaul::wanem {

// What one direction of the link did. Written by the relay thread, read by
// anyone (relaxed atomics: each counter is exact, a snapshot of several is
// not atomic as a whole).
struct DirectionCounters {
  std::atomic<uint64_t> forwarded_packets{0};
  std::atomic<uint64_t> forwarded_bytes{0};
  std::atomic<uint64_t> dropped_queue{0};
  std::atomic<uint64_t> dropped_loss{0};
  std::atomic<uint64_t> dropped_cut{0};
  // The relay's own buffer was full (it is sized so this should stay 0).
  std::atomic<uint64_t> dropped_overflow{0};
  std::atomic<uint64_t> write_errors{0};
};

// CLOCK_MONOTONIC in nanoseconds: the one clock of the emulator's data path
// (relays and star sites), so departure times from different threads compare.
int64_t MonotonicNanos();

// Counts a packet the shaper did not forward (any verdict but kForward).
void CountDrop(Verdict verdict, DirectionCounters& counters);

// Bytes of PacketRing that one direction needs: its queue plus what is in
// flight during the delay, with headroom for per-packet overhead.
size_t RingCapacity(const DirectionParams& params);

// A JSON object with a direction's counters and parameters.
std::string DirectionStatsJson(const DirectionCounters& counters, const DirectionParams& params,
                               bool cut, int mtu);

// Carries IP packets from one TUN descriptor to another through a LinkShaper:
// it reads packets in batches into a preallocated PacketRing, stamps each with
// its departure time, and writes each out when it comes due. Nothing is
// allocated per packet.
//
// Run() is the body of the direction's own thread. set_cut() and the
// counters may be used from any thread. The descriptors are borrowed and must
// outlive Run().
class Relay {
 public:
  // `in_fd`, `out_fd`: non-blocking TUN descriptors; `stop_fd`: an eventfd
  // that becomes readable when Run() must return.
  Relay(std::string name, int in_fd, int out_fd, int stop_fd, const DirectionParams& params,
        uint64_t seed, int mtu);

  void Run();

  void set_cut(bool cut) { cut_.store(cut, std::memory_order_relaxed); }
  bool cut() const { return cut_.load(std::memory_order_relaxed); }
  // LinkShaper::set_burst_loss, from any thread.
  void set_burst_loss(double loss) { burst_loss_.store(loss, std::memory_order_relaxed); }
  const DirectionCounters& counters() const { return counters_; }
  const DirectionParams& params() const { return shaper_.params(); }
  const std::string& name() const { return name_; }

  // A JSON object with the counters and the parameters.
  std::string StatsJson() const;

 private:
  static constexpr int kReadBatch = 64;

  std::string name_;
  int in_fd_;
  int out_fd_;
  int stop_fd_;
  int mtu_;
  LinkShaper shaper_;
  PacketRing ring_;
  std::atomic<bool> cut_{false};
  std::atomic<double> burst_loss_{0.0};
  DirectionCounters counters_;
};

}  // namespace longhaul::wanem

#endif  // LONGHAUL_TESTS_WANEM_RELAY_H_
